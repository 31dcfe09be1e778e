//! [`MeshTools`]: the MCP tools, each one call (or two) of the mesh's client API made with
//! the tenant's connection: running code and its results, and a session's files here; the
//! browser in [`crate::browser`]. Nothing here decides what a service would not decide for a plain
//! NATS request: risk, approval, limits and ownership
//! stay with the services.

use std::time::Duration;

use base64::Engine;
use messages::exec::{
    AwaitingConfirmation, ExecRequest, Language, ResultGet, ResultLookup, MAX_RESULT_WAIT_MS,
};
use messages::testrun::TestRequest;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::{tool, tool_handler, tool_router, ErrorData, ServerHandler};
use sandmesh_client::MeshClient;
use tokio::sync::oneshot;

use crate::params::*;
use crate::render;

/// Beyond the program's own time limit, what an execution may spend queued and starting its
/// container before `run_code` gives up waiting (the run goes on: `get_result` fetches it).
const EXEC_MARGIN: Duration = Duration::from_secs(120);
/// The program's time limit when the caller gives none, for the wait above only (the mesh
/// applies its own default to the run).
const DEFAULT_RUN_MS: u64 = 30_000;
/// `get_result` waits this long for a result not stored yet, unless told otherwise.
const DEFAULT_RESULT_WAIT_MS: u64 = 10_000;
/// The largest file `read_file` returns: more would flood the model's context.
pub const READ_MAX_BYTES: u64 = 256 * 1024;

/// Who the services record as having asked (informational; identity is the connection's).
pub(crate) const REQUESTED_BY: &str = "mcp";

const INSTRUCTIONS: &str = "sandmesh runs code in isolated sandboxes and gives each session \
files and a web browser. run_code runs Python, JavaScript or shell and returns stdout, stderr, \
the exit status and the files it created; pass a session_id to keep files and state between \
calls, and use read_file / write_file / list_files with the same session_id. run_tests runs \
tests against code (pytest or node --test) and returns each test's status. browser_* tools \
drive the session's own browser: browser_elements lists what can be clicked or filled, by \
index. Code that looks risky waits for a person's approval: run_code then answers at once \
with a confirmation id instead of output; tell the user, and fetch the output later with \
get_result.";

/// The mesh, as MCP tools: one per MCP connection (stdio) or session (HTTP), all sharing the
/// tenant's NATS connection.
#[derive(Clone)]
pub struct MeshTools {
    pub(crate) mesh: MeshClient,
    /// Built once: every `tools/list` and `tools/call` consults it.
    tool_router: ToolRouter<MeshTools>,
}

impl MeshTools {
    pub fn new(mesh: MeshClient) -> Self {
        Self {
            mesh,
            tool_router: Self::code_and_file_tools()
                + Self::browser_tools()
                + Self::proc_tools()
                + Self::port_tools(),
        }
    }
}

/// The language a tool call names (Python when it names none), or the tool error saying which
/// it may name.
fn language(named: Option<&str>) -> Result<Language, CallToolResult> {
    match named.map(str::parse::<Language>) {
        None => Ok(Language::default()),
        Some(Ok(language)) => Ok(language),
        Some(Err(why)) => Err(render::error("bad_request", &why)),
    }
}

/// What a call that may wait for a person answered first.
enum Answer<T> {
    Done(T),
    /// A person must decide: the call ends at once, and the parked execution goes on without
    /// this caller (its result is stored).
    Awaiting(AwaitingConfirmation),
}

/// A hook the typed client calls when the execution is parked for a person.
type NoticeHook = Box<dyn FnMut(AwaitingConfirmation) + Send>;

/// Runs `call` with a notice hook and answers whichever comes first: its result, or the notice
/// that a person must decide.
async fn until_notice<T, Fut>(call: impl FnOnce(NoticeHook) -> Fut) -> Answer<T>
where
    Fut: std::future::Future<Output = T>,
{
    let (noticed, notice) = oneshot::channel();
    let mut noticed = Some(noticed);
    let run = call(Box::new(move |awaiting| {
        if let Some(tx) = noticed.take() {
            let _ = tx.send(awaiting);
        }
    }));
    tokio::select! {
        biased;
        result = run => Answer::Done(result),
        Ok(awaiting) = notice => Answer::Awaiting(awaiting),
    }
}

/// The image type of a file from its first bytes, for the formats MCP clients show.
fn image_type(bytes: &[u8]) -> Option<&'static str> {
    const SIGNATURES: &[(&[u8], &str)] = &[
        (b"\x89PNG\r\n\x1a\n", "image/png"),
        (b"\xff\xd8\xff", "image/jpeg"),
        (b"GIF87a", "image/gif"),
        (b"GIF89a", "image/gif"),
    ];
    SIGNATURES
        .iter()
        .find(|(magic, _)| bytes.starts_with(magic))
        .map(|(_, mime)| *mime)
        .or_else(|| {
            (bytes.len() > 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP")
                .then_some("image/webp")
        })
}

#[tool_router(router = code_and_file_tools)]
impl MeshTools {
    #[tool(
        description = "Run Python, JavaScript or shell code in an isolated sandbox and return \
        its stdout, stderr, exit status and the files it created. With session_id the files \
        and the sandbox stay for the next calls. Code that needs a person's approval is not \
        run yet: the answer then says 'awaiting approval' with a confirmation_id and an \
        execution_id; fetch the output later with get_result.",
        annotations(title = "Run code", open_world_hint = false)
    )]
    async fn run_code(
        &self,
        Parameters(p): Parameters<RunCode>,
    ) -> Result<CallToolResult, ErrorData> {
        let language = match language(p.language.as_deref()) {
            Ok(language) => language,
            Err(refused) => return Ok(refused),
        };
        let execution_id = messages::new_id();
        let req = ExecRequest {
            execution_id: Some(execution_id.clone()),
            session_id: p.session_id,
            language,
            code: p.code,
            timeout_ms: p.timeout_ms,
            requested_by: Some(REQUESTED_BY.into()),
            template: p.template,
            ..Default::default()
        };
        let wait = Duration::from_millis(p.timeout_ms.unwrap_or(DEFAULT_RUN_MS)) + EXEC_MARGIN;
        let exec = self.mesh.exec();
        Ok(
            match until_notice(|hook| exec.exec_notified(&req, wait, hook)).await {
                Answer::Done(Ok(result)) => render::exec_result(&result),
                Answer::Done(Err(e)) => {
                    let mut shown = render::client_error(&e);
                    shown.content.push(ContentBlock::text(format!(
                        "execution_id: {execution_id} (get_result may still find its result)"
                    )));
                    shown
                }
                Answer::Awaiting(awaiting) => render::awaiting(&awaiting, messages::now_ms()),
            },
        )
    }

    #[tool(
        description = "Run tests against code in an isolated sandbox: pytest for Python, \
        node --test for JavaScript. The tests import the code as the module `solution`. \
        Returns each test's status (passed, failed, error, skipped) with its failure message, \
        and the totals. Risky code or tests wait for a person's approval: the answer then says \
        'awaiting approval' with an execution_id; once approved, call run_tests again with the \
        same arguments and that execution_id to get the report.",
        annotations(title = "Run tests", open_world_hint = false)
    )]
    async fn run_tests(
        &self,
        Parameters(p): Parameters<RunTests>,
    ) -> Result<CallToolResult, ErrorData> {
        let language = match language(p.language.as_deref()) {
            Ok(language) => language,
            Err(refused) => return Ok(refused),
        };
        let execution_id = p.execution_id.unwrap_or_else(messages::new_id);
        let req = TestRequest {
            execution_id: Some(execution_id.clone()),
            session_id: p.session_id,
            language,
            code: p.code,
            tests: p.tests,
            template: p.template,
            timeout_ms: p.timeout_ms,
            requested_by: Some(REQUESTED_BY.into()),
            ..Default::default()
        };
        let wait = Duration::from_millis(p.timeout_ms.unwrap_or(DEFAULT_RUN_MS)) + EXEC_MARGIN;
        let exec = self.mesh.exec();
        Ok(
            match until_notice(|hook| exec.run_tests_notified(&req, wait, hook)).await {
                Answer::Done(Ok(report)) => render::test_report(&report),
                Answer::Done(Err(e)) => render::client_error(&e),
                Answer::Awaiting(awaiting) => {
                    let next = format!(
                        "call run_tests again with the same arguments and execution_id {} to \
                         get the report",
                        awaiting.execution_id
                    );
                    render::awaiting_then(&awaiting, messages::now_ms(), &next)
                }
            },
        )
    }

    #[tool(
        description = "Fetch the result of an earlier run_code by its execution_id: the \
        output once it has run, or that it still waits for approval or still runs. Waits up \
        to wait_ms (default 10 s) for a result that is not ready yet.",
        annotations(
            title = "Get a run's result",
            read_only_hint = true,
            open_world_hint = false
        )
    )]
    async fn get_result(
        &self,
        Parameters(p): Parameters<GetResult>,
    ) -> Result<CallToolResult, ErrorData> {
        let wait_ms = p
            .wait_ms
            .unwrap_or(DEFAULT_RESULT_WAIT_MS)
            .min(MAX_RESULT_WAIT_MS);
        let req = ResultGet {
            execution_id: p.execution_id.clone(),
            wait_ms: Some(wait_ms),
        };
        let subject = self.mesh.subjects().results_get();
        let timeout = Duration::from_millis(wait_ms) + self.mesh.timeout();
        let lookup: Result<ResultLookup, _> =
            self.mesh.request_timeout(subject, &req, timeout).await;
        Ok(match lookup {
            Ok(ResultLookup::Done { result }) => render::exec_result(&result),
            Ok(ResultLookup::Pending {
                awaiting_confirmation: Some(awaiting),
                ..
            }) => render::awaiting(&awaiting, messages::now_ms()),
            Ok(ResultLookup::Pending { execution_id, .. }) => render::still_running(&execution_id),
            Err(e) => render::client_error(&e),
        })
    }

    #[tool(
        description = "Read a file from a session's files (the working directory run_code \
        sees). Text comes back as text, images as images, other binary files as base64.",
        annotations(title = "Read a file", read_only_hint = true, open_world_hint = false)
    )]
    async fn read_file(
        &self,
        Parameters(p): Parameters<ReadFile>,
    ) -> Result<CallToolResult, ErrorData> {
        let workspace = self.mesh.workspace();
        let entry = match workspace.stat(&p.session_id, &p.path).await {
            Ok(entry) => entry,
            Err(e) => return Ok(render::client_error(&e)),
        };
        if entry.is_dir {
            return Ok(render::error(
                "bad_request",
                &format!("{} is a directory; list_files shows what it holds", p.path),
            ));
        }
        if entry.size > READ_MAX_BYTES {
            return Ok(render::error(
                "too_large",
                &format!(
                    "{} is {} bytes, more than the {READ_MAX_BYTES} read_file returns; look \
                     at parts of it with run_code in the session (e.g. head, or Python)",
                    p.path, entry.size
                ),
            ));
        }
        let bytes = match workspace.read(&p.session_id, &p.path).await {
            Ok(bytes) => bytes,
            Err(e) => return Ok(render::client_error(&e)),
        };
        let b64 = || base64::engine::general_purpose::STANDARD.encode(&bytes);
        let content = match (image_type(&bytes), std::str::from_utf8(&bytes)) {
            (Some(mime), _) => ContentBlock::image(b64(), mime),
            (None, Ok(text)) => ContentBlock::text(text),
            (None, Err(_)) => ContentBlock::text(format!(
                "{} is binary ({} bytes); its content in base64:\n{}",
                p.path,
                bytes.len(),
                b64()
            )),
        };
        Ok(CallToolResult::success(vec![content]))
    }

    #[tool(
        description = "Write a file into a session's files, where run_code in that session \
        finds it. Text by default; binary content as base64 with encoding 'base64'.",
        annotations(
            title = "Write a file",
            destructive_hint = true,
            open_world_hint = false
        )
    )]
    async fn write_file(
        &self,
        Parameters(p): Parameters<WriteFile>,
    ) -> Result<CallToolResult, ErrorData> {
        let bytes = match p.encoding.as_deref().unwrap_or("utf8") {
            "utf8" => p.content.into_bytes(),
            "base64" => match messages::decode_base64(&p.content) {
                Ok(bytes) => bytes,
                Err(why) => return Ok(render::error("bad_request", &why)),
            },
            other => {
                return Ok(render::error(
                    "bad_request",
                    &format!("unknown encoding {other:?}; expected utf8 or base64"),
                ))
            }
        };
        let workspace = self.mesh.workspace().requested_by(REQUESTED_BY);
        Ok(
            match workspace.write(&p.session_id, &p.path, &bytes).await {
                Ok(entry) => {
                    let text = format!("wrote {} ({} bytes)", entry.path, entry.size);
                    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
                    result.structured_content = serde_json::to_value(&entry).ok();
                    result
                }
                Err(e) => render::client_error(&e),
            },
        )
    }

    #[tool(
        description = "List the files of a session (all of them, or one directory), with \
        their sizes.",
        annotations(title = "List files", read_only_hint = true, open_world_hint = false)
    )]
    async fn list_files(
        &self,
        Parameters(p): Parameters<ListFiles>,
    ) -> Result<CallToolResult, ErrorData> {
        let listed = self
            .mesh
            .workspace()
            .list(&p.session_id, p.prefix.as_deref(), true)
            .await;
        Ok(match listed {
            Ok(listing) => render::listing(&listing.entries),
            Err(e) => render::client_error(&e),
        })
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for MeshTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("sandmesh", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_are_told_by_their_first_bytes() {
        assert_eq!(image_type(b"\x89PNG\r\n\x1a\n...."), Some("image/png"));
        assert_eq!(image_type(b"\xff\xd8\xff\xe0...."), Some("image/jpeg"));
        assert_eq!(image_type(b"RIFF\0\0\0\0WEBPVP8 "), Some("image/webp"));
        assert_eq!(image_type(b"hello, world"), None);
    }
}
