//! The execution a test run becomes: the code and tests as workspace files under
//! [`TEST_DIR`], and as code a shell launcher that replaces itself with the runner's parent
//! (`python3 -I`, for pytest and `node --test` alike). The parent takes the run's key from its
//! stdin, runs the test tool as its child, takes each test's outcome from a pipe, and writes the
//! JUnit report into the workspace sealed with the key ([`super::seal`]); it stops the tests
//! before the execution's own deadline, so the tests that finished are still reported.
//!
//! Why a shell launcher: the executor starts a Python run's interpreter with the workspace on
//! its module path, so a `sitecustomize.py` or `encodings/` left in the workspace (by the code
//! of an earlier run, or a request's files) runs inside it before its first line; an isolated
//! interpreter (`-I`) reads nothing of the workspace or of `PYTHON*`. What is assessed and
//! approved is still the code and tests, in their own language ([`Reviewed`]).

use std::collections::BTreeMap;
use std::time::Duration;

use messages::exec::{ContentEncoding, ExecRequest, FileSpec, Language};
use messages::testrun::{TestRequest, MAX_TEST_CASES, RUNNER_DIR, TEST_DIR};
use messages::validate::Ceilings;
use serde_json::json;

use super::seal::{RunKey, SEAL_PREFIX};
use crate::execution::Reviewed;

const PARENT: &str = include_str!("runner.py");
const PYTEST_PLUGIN: &str = include_str!("sandmesh_records.py");
const NODE_REPORTER: &str = include_str!("records.mjs");
/// The runner's exit code when it stopped the tests at their budget (as `timeout(1)`'s).
pub const TIMEOUT_EXIT: i64 = 124;
/// The launcher's own lookups go only through the image's system directories (a session's
/// `PATH` could name a directory of the workspace).
const SYSTEM_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// How a test run is laid out and timed.
#[derive(Debug, Clone, PartialEq)]
pub struct RunPlan {
    pub request: ExecRequest,
    /// The workspace path of the JUnit report.
    pub report: String,
    /// What is assessed and shown to a person: the code and the tests, not the runner.
    pub reviewed: Reviewed,
}

/// The tests' budget within the execution's timeout: a margin before it is kept for
/// interrupting them and writing the report (a quarter, at least half a second, at most five),
/// half of that for the interrupted tool to write its report before it is killed.
pub fn budget(timeout: Duration) -> (Duration, Duration) {
    let margin = (timeout / 4).clamp(Duration::from_millis(500), Duration::from_secs(5));
    let margin = margin.min(timeout / 2);
    (timeout - margin, margin / 2)
}

/// The execution of `req` whose caller knows it as `execution_id`, its report sealed with
/// `key`. `template` is the template to name (`None`: the session's).
pub fn plan(
    req: TestRequest,
    execution_id: String,
    template: Option<String>,
    ceilings: &Ceilings,
    key: &RunKey,
) -> RunPlan {
    let timeout_ms = req
        .timeout_ms
        .unwrap_or(ceilings.default_timeout_ms)
        .clamp(1, ceilings.max_timeout_ms);
    let (tests_budget, grace) = budget(Duration::from_millis(timeout_ms));
    let report = format!("output/test-reports/{execution_id}.xml");
    let code_path = format!("{TEST_DIR}/{}", req.code_file());
    let tests_path = format!("{TEST_DIR}/{}", req.tests_file());
    let (language, records, source) = match req.language {
        Language::Javascript => ("javascript", "records.mjs", NODE_REPORTER),
        _ => ("python", "sandmesh_records.py", PYTEST_PLUGIN),
    };
    let config = json!({
        "language": language,
        "dir": TEST_DIR,
        "tests": req.tests_file(),
        "runner_dir": RUNNER_DIR,
        "records": records,
        // Relative to the workspace, where the runner starts.
        "report": report,
        "budget_ms": tests_budget.as_millis() as u64,
        "grace_ms": grace.as_millis() as u64,
        "timeout_exit": TIMEOUT_EXIT,
        "max_cases": MAX_TEST_CASES,
        "seal_prefix": SEAL_PREFIX,
        // The tests' environment, not the parent's.
        "env": req.env,
    });
    let text = |path: String, content: String| FileSpec {
        path,
        content,
        encoding: ContentEncoding::Utf8,
    };
    // The caller's files first, so an error about one names it by its index in the request.
    let mut files = req.files;
    files.push(text(code_path, req.code.clone()));
    files.push(text(tests_path, req.tests.clone()));
    files.push(text(format!("{RUNNER_DIR}/{records}"), source.to_string()));
    // A JSON string is a Python string literal (its escapes are Python's too).
    let parent = PARENT.replace("__CONFIG__", &json!(config.to_string()).to_string());
    let code = format!(
        "exec /usr/bin/python3 -I -c '{}'\n",
        parent.replace('\'', r"'\''")
    );
    let reviewed = Reviewed {
        language: req.language,
        code: format!("{}\n\n{}", req.code, req.tests),
    };
    RunPlan {
        request: ExecRequest {
            execution_id: Some(execution_id),
            session_id: req.session_id,
            language: Language::Shell,
            code,
            // Read by the parent once it cannot be inspected; the child gets /dev/null.
            stdin: Some(key.hex()),
            timeout_ms: Some(timeout_ms),
            limits: req.limits,
            env: BTreeMap::from([("PATH".to_string(), SYSTEM_PATH.to_string())]),
            files,
            requested_by: req.requested_by,
            template,
            ..Default::default()
        },
        report,
        reviewed,
    }
}

#[cfg(test)]
mod tests {
    use super::super::seal::Sealer;
    use super::*;

    fn request(language: Language) -> TestRequest {
        TestRequest {
            language,
            code: "code".into(),
            tests: "tests".into(),
            timeout_ms: Some(10_000),
            ..Default::default()
        }
    }

    #[test]
    fn the_budget_leaves_room_to_write_the_report() {
        let ms = Duration::from_millis;
        assert_eq!(budget(ms(10_000)), (ms(7_500), ms(1_250)));
        assert_eq!(budget(ms(1_000)), (ms(500), ms(250)));
        assert_eq!(budget(ms(600_000)), (ms(595_000), ms(2_500)));
        let (tests, grace) = budget(ms(1));
        assert!(tests + grace <= ms(1));
    }

    #[test]
    fn python_runs_pytest_on_the_files_and_reviews_code_and_tests() {
        let key = Sealer::new().key("01J");
        let plan = plan(
            request(Language::Python),
            "01J".into(),
            Some("python-data".into()),
            &Ceilings::default(),
            &key,
        );
        let paths: Vec<_> = plan.request.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "code/solution.py",
                "code/test_solution.py",
                ".sandmesh-test/sandmesh_records.py"
            ]
        );
        assert_eq!(plan.report, "output/test-reports/01J.xml");
        assert_eq!(
            plan.reviewed,
            Reviewed {
                language: Language::Python,
                code: "code\n\ntests".into()
            }
        );
        assert_eq!(plan.request.language, Language::Shell);
        assert!(plan
            .request
            .code
            .starts_with("exec /usr/bin/python3 -I -c '"));
        assert!(plan.request.code.contains("pytest"));
        assert!(plan
            .request
            .code
            .contains(r#""{\"budget_ms\":7500,\"dir\":\"code\""#));
        assert_eq!(plan.request.timeout_ms, Some(10_000));
    }

    #[test]
    fn the_key_reaches_only_stdin_and_the_callers_env_only_the_tests() {
        let key = Sealer::new().key("01J");
        let mut req = request(Language::Python);
        req.env.insert("MODE".into(), "it's".into());
        let plan = plan(req, "01J".into(), None, &Ceilings::default(), &key);
        assert_eq!(plan.request.stdin, Some(key.hex()));
        assert!(!plan.request.code.contains(&key.hex()));
        assert!(plan
            .request
            .files
            .iter()
            .all(|f| !f.content.contains(&key.hex())));
        // The launcher's environment is its own; the caller's goes to the tests, quoted.
        assert_eq!(plan.request.env.keys().collect::<Vec<_>>(), ["PATH"]);
        assert!(plan
            .request
            .code
            .contains(r#"\"env\":{\"MODE\":\"it'\''s\"}"#));
    }

    #[test]
    fn javascript_brings_its_reporter_and_a_timeout_is_clamped() {
        let ceilings = Ceilings {
            max_timeout_ms: 4_000,
            ..Default::default()
        };
        let key = Sealer::new().key("x");
        let plan = plan(
            request(Language::Javascript),
            "x".into(),
            None,
            &ceilings,
            &key,
        );
        let paths: Vec<_> = plan.request.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "code/solution.js",
                "code/solution.test.js",
                ".sandmesh-test/records.mjs"
            ]
        );
        assert_eq!(plan.request.timeout_ms, Some(4_000));
        assert_eq!(plan.reviewed.language, Language::Javascript);
        assert!(plan.request.code.contains(r#"\"budget_ms\":3000"#));
        assert!(plan.request.code.contains(r#"\"language\":\"javascript\""#));
    }

    #[test]
    fn a_test_run_is_a_plain_execution_never_a_kernel_cell() {
        // A kernel cell could rewrite the driver that reports it; the runner's process must
        // be a fresh interpreter, even in a session that has a kernel.
        for language in [Language::Python, Language::Javascript] {
            let mut req = request(language);
            req.session_id = Some("with-a-kernel".into());
            let key = Sealer::new().key("k");
            let plan = plan(req, "k".into(), None, &Ceilings::default(), &key);
            assert!(!plan.request.kernel, "{language:?}");
        }
    }
}
