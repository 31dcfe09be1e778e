//! The tools' arguments. Their doc comments become the JSON Schema descriptions an LLM reads
//! to call a tool, so they say what a value does, not how it is implemented.
//!
//! Values with a fixed set of choices (`language`, `encoding`, `format`) are strings whose
//! schema lists the choices: a wrong one then comes back as a tool error the model can read
//! and correct, not as a JSON-RPC "invalid params" failure most clients hide from it.
//!
//! An argument a tool does not have is refused, never ignored (`deny_unknown_fields`, so each
//! schema says `additionalProperties: false`): a misspelt `session_id` would otherwise run the
//! code outside its session without a word. The SDK answers an argument that does not decode
//! as a tool error naming it, which the model reads.

use rmcp::schemars::{self, JsonSchema};
use serde::Deserialize;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCode {
    /// The program to run. It sees its session's files in its working directory.
    pub code: String,
    /// The program's language: `python` (the default), `javascript` (Node.js) or `shell`
    /// (bash).
    #[schemars(extend("enum" = ["python", "javascript", "shell"]))]
    pub language: Option<String>,
    /// Run inside this session: its files and its container stay between calls, and
    /// `read_file`, `write_file` and `list_files` with the same id see the same files. Any
    /// short name works (`analysis-1`); the session starts on first use. Without it the code
    /// runs once in a fresh sandbox that keeps nothing.
    pub session_id: Option<String>,
    /// A sandbox template to run in: its image's preinstalled packages (`python-data`:
    /// numpy, pandas, matplotlib, scipy, pytest; `node-default`), its environment and
    /// defaults. Left out: the default sandbox (Python and Node.js standard libraries).
    pub template: Option<String>,
    /// The most milliseconds the program may run before it is stopped (the mesh's default
    /// when left out).
    pub timeout_ms: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunTests {
    /// The code under test. Tests import it as the module `solution` (Python:
    /// `from solution import f`; JavaScript: `require('./solution.js')`).
    pub code: String,
    /// The test file: pytest tests (`def test_…():` with `assert`) for Python, `node:test`
    /// tests for JavaScript.
    pub tests: String,
    /// `python` (pytest; the default) or `javascript` (node --test).
    #[schemars(extend("enum" = ["python", "javascript"]))]
    pub language: Option<String>,
    /// Run inside this (open) session: the files and the report stay in its files.
    pub session_id: Option<String>,
    /// A sandbox template (default: `python-data`, which has pytest, or `node-default`).
    pub template: Option<String>,
    /// The most milliseconds all the tests together may run; tests still running then are
    /// stopped and the finished ones reported.
    pub timeout_ms: Option<u64>,
    /// Ask again for the report of an earlier run_tests (after its approval) with the
    /// `execution_id` it answered; nothing runs twice.
    pub execution_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetResult {
    /// The `execution_id` an earlier `run_code` answered with.
    pub execution_id: String,
    /// How long to wait for the result if it is not ready yet, in milliseconds (default
    /// 10000, at most 30000). 0 answers at once.
    pub wait_ms: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFile {
    /// The session whose files to read (as given to `run_code`).
    pub session_id: String,
    /// The file's path relative to the session's working directory, e.g. `out/result.csv`.
    pub path: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFile {
    /// The session whose files to write (as given to `run_code`); it starts on first use.
    pub session_id: String,
    /// The file's path relative to the session's working directory; missing directories
    /// are created. An existing file is replaced.
    pub path: String,
    /// The file's content: text, or base64 when `encoding` is `base64`.
    pub content: String,
    /// `utf8` (the default) for text, `base64` for binary content.
    #[schemars(extend("enum" = ["utf8", "base64"]))]
    pub encoding: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListFiles {
    /// The session whose files to list (as given to `run_code`).
    pub session_id: String,
    /// Only this directory (relative path, e.g. `out`); the whole workspace when left out.
    pub prefix: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BrowserNavigate {
    /// The session whose browser to use; each session has its own browser, started on
    /// first use, with its own cookies and history.
    pub session_id: String,
    /// The address to open, e.g. `https://example.org/`.
    pub url: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BrowserSession {
    /// The session whose browser to use.
    pub session_id: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BrowserClick {
    /// The session whose browser to use.
    pub session_id: String,
    /// The element's index from the latest `browser_elements` answer for this page.
    pub index: Option<u32>,
    /// A CSS selector, instead of `index`.
    pub selector: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BrowserFill {
    /// The session whose browser to use.
    pub session_id: String,
    /// The field's index from the latest `browser_elements` answer for this page.
    pub index: Option<u32>,
    /// A CSS selector, instead of `index`.
    pub selector: Option<String>,
    /// The text to put in the field (it replaces what the field held).
    pub text: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BrowserScreenshot {
    /// The session whose browser to use.
    pub session_id: String,
    /// The whole page instead of the visible part.
    #[serde(default)]
    pub full_page: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BrowserContent {
    /// The session whose browser to use.
    pub session_id: String,
    /// `text` (the default): the page's visible text; `html`: the page's HTML.
    #[schemars(extend("enum" = ["text", "html"]))]
    pub format: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExposePort {
    /// The session whose server listens on the port.
    pub session_id: String,
    /// The TCP port the server listens on inside the session (1–65535).
    pub port: u32,
    /// How long the port stays reachable, in milliseconds (default an hour, at most a day).
    pub ttl_ms: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StartProcess {
    /// The session to run it in (its files, its container).
    pub session_id: String,
    /// The command line (run by bash), e.g. `python3 -m http.server 8000`.
    pub command: String,
    /// Its working directory (default: the session's files).
    pub cwd: Option<String>,
    /// A name for it, shown when processes are listed.
    pub tag: Option<String>,
    /// Kill it after this many milliseconds (default: it runs as long as the session).
    pub timeout_ms: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessOutput {
    pub session_id: String,
    /// The `proc_id` start_process answered.
    pub proc_id: String,
    /// Where to continue from: the `next from_seq` of the last answer (0 or absent: from the
    /// start).
    pub from_seq: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KillProcess {
    pub session_id: String,
    /// The `proc_id` start_process answered.
    pub proc_id: String,
}

#[cfg(test)]
mod tests {
    use rmcp::handler::server::common::schema_for_input;
    use rmcp::handler::server::wrapper::Parameters;
    use serde::de::DeserializeOwned;
    use serde_json::{json, Value};

    use super::*;

    /// `T` takes `valid`, refuses it with a misspelt argument (naming it), and its input
    /// schema, as the SDK lists it to clients, says so.
    fn strict<T: DeserializeOwned + JsonSchema + std::fmt::Debug + 'static>(valid: Value) {
        let name = std::any::type_name::<T>();
        if let Err(e) = serde_json::from_value::<T>(valid.clone()) {
            panic!("{name} refused {valid}: {e}");
        }
        let mut typo = valid;
        typo["sesion_id"] = json!("s1");
        let e = serde_json::from_value::<T>(typo).unwrap_err().to_string();
        assert!(e.starts_with("unknown field `sesion_id`"), "{name}: {e}");
        let schema = schema_for_input::<Parameters<T>>().unwrap();
        assert_eq!(
            schema.get("additionalProperties"),
            Some(&json!(false)),
            "{name}: {schema:?}"
        );
    }

    #[test]
    fn every_tool_refuses_an_argument_it_does_not_have() {
        let s = || json!({"session_id": "s1"});
        let with = |extra: Value| {
            let mut v = s();
            v.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            v
        };
        strict::<RunCode>(json!({"code": "print(1)"}));
        strict::<RunTests>(json!({"code": "x = 1", "tests": "def test(): pass"}));
        strict::<GetResult>(json!({"execution_id": "e1"}));
        strict::<ReadFile>(with(json!({"path": "a.txt"})));
        strict::<WriteFile>(with(json!({"path": "a.txt", "content": "hi"})));
        strict::<ListFiles>(s());
        strict::<BrowserNavigate>(with(json!({"url": "https://example.org/"})));
        strict::<BrowserSession>(s());
        strict::<BrowserClick>(with(json!({"index": 1})));
        strict::<BrowserFill>(with(json!({"index": 1, "text": "hi"})));
        strict::<BrowserScreenshot>(s());
        strict::<BrowserContent>(s());
        strict::<ExposePort>(with(json!({"port": 8000})));
        strict::<StartProcess>(with(json!({"command": "python3 -m http.server"})));
        strict::<ProcessOutput>(with(json!({"proc_id": "p1"})));
        strict::<KillProcess>(with(json!({"proc_id": "p1"})));
    }
}
