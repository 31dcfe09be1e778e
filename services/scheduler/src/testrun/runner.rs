//! The execution a test run becomes: the code and tests as workspace files under
//! [`TEST_DIR`], and as code a small runner (pytest, or `node --test` with our JUnit reporter)
//! that writes the JUnit report into the workspace and stops the tests before the execution's
//! own deadline, so the tests that finished are still reported.

use std::time::Duration;

use messages::exec::{ContentEncoding, ExecRequest, FileSpec, Language};
use messages::testrun::{TestRequest, RUNNER_DIR, TEST_DIR};
use messages::validate::Ceilings;
use serde_json::json;

const PYTHON_RUNNER: &str = include_str!("runner.py");
const JAVASCRIPT_RUNNER: &str = include_str!("runner.js");
const JUNIT_REPORTER: &str = include_str!("junit-reporter.mjs");
/// The runner's exit code when it stopped the tests at their budget (as `timeout(1)`'s).
pub const TIMEOUT_EXIT: i64 = 124;

/// How a test run is laid out and timed.
#[derive(Debug, Clone, PartialEq)]
pub struct RunPlan {
    pub request: ExecRequest,
    /// The workspace path of the JUnit report.
    pub report: String,
    /// What is assessed and shown to a person: the code and the tests, not the runner.
    pub reviewed: String,
}

/// The tests' budget within the execution's timeout: a margin before it is kept for
/// interrupting them and writing the report (a quarter, at least half a second, at most five),
/// half of that for the interrupted tool to write its report before it is killed.
pub fn budget(timeout: Duration) -> (Duration, Duration) {
    let margin = (timeout / 4).clamp(Duration::from_millis(500), Duration::from_secs(5));
    let margin = margin.min(timeout / 2);
    (timeout - margin, margin / 2)
}

/// The execution of `req` whose caller knows it as `execution_id`. `template` is the template
/// to name (`None`: the session's).
pub fn plan(
    req: TestRequest,
    execution_id: String,
    template: Option<String>,
    ceilings: &Ceilings,
) -> RunPlan {
    let timeout_ms = req
        .timeout_ms
        .unwrap_or(ceilings.default_timeout_ms)
        .clamp(1, ceilings.max_timeout_ms);
    let (tests_budget, grace) = budget(Duration::from_millis(timeout_ms));
    let report = format!("output/test-reports/{execution_id}.xml");
    let code_path = format!("{TEST_DIR}/{}", req.code_file());
    let tests_path = format!("{TEST_DIR}/{}", req.tests_file());
    let reporter = format!("{RUNNER_DIR}/junit-reporter.mjs");
    let mut config = json!({
        "dir": TEST_DIR,
        "tests": req.tests_file(),
        // Relative to the workspace, where the runner starts.
        "report": report,
        "budget_ms": tests_budget.as_millis() as u64,
        "grace_ms": grace.as_millis() as u64,
        "timeout_exit": TIMEOUT_EXIT,
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
    let code = match req.language {
        Language::Javascript => {
            config["reporter"] = json!(reporter);
            files.push(text(reporter, JUNIT_REPORTER.to_string()));
            // JSON is a JavaScript expression.
            JAVASCRIPT_RUNNER.replace("__CONFIG__", &config.to_string())
        }
        // A JSON string is a Python string literal (its escapes are Python's too).
        _ => PYTHON_RUNNER.replace("__CONFIG__", &json!(config.to_string()).to_string()),
    };
    let reviewed = format!("{}\n\n{}", req.code, req.tests);
    RunPlan {
        request: ExecRequest {
            execution_id: Some(execution_id),
            session_id: req.session_id,
            language: req.language,
            code,
            timeout_ms: Some(timeout_ms),
            limits: req.limits,
            env: req.env,
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
        let plan = plan(
            request(Language::Python),
            "01J".into(),
            Some("python-data".into()),
            &Ceilings::default(),
        );
        let paths: Vec<_> = plan.request.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["code/solution.py", "code/test_solution.py"]);
        assert_eq!(plan.report, "output/test-reports/01J.xml");
        assert_eq!(plan.reviewed, "code\n\ntests");
        assert!(plan.request.code.contains("pytest"));
        assert!(plan
            .request
            .code
            .contains(r#""{\"budget_ms\":7500,\"dir\":\"code\""#));
        assert_eq!(plan.request.timeout_ms, Some(10_000));
    }

    #[test]
    fn javascript_brings_its_reporter_and_a_timeout_is_clamped() {
        let ceilings = Ceilings {
            max_timeout_ms: 4_000,
            ..Default::default()
        };
        let plan = plan(request(Language::Javascript), "x".into(), None, &ceilings);
        let paths: Vec<_> = plan.request.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "code/solution.js",
                "code/solution.test.js",
                ".sandmesh-test/junit-reporter.mjs"
            ]
        );
        assert_eq!(plan.request.timeout_ms, Some(4_000));
        assert!(plan
            .request
            .code
            .contains(r#"const CONFIG = {"budget_ms":3000"#));
    }

    #[test]
    fn a_test_run_is_a_plain_execution_never_a_kernel_cell() {
        // A kernel cell could rewrite the driver that reports it; the runner's process must
        // be a fresh interpreter, even in a session that has a kernel.
        for language in [Language::Python, Language::Javascript] {
            let mut req = request(language);
            req.session_id = Some("with-a-kernel".into());
            let plan = plan(req, "k".into(), None, &Ceilings::default());
            assert!(!plan.request.kernel, "{language:?}");
        }
    }
}
