//! Test-driven execution: code and the tests for it in, per-test results out.
//! `sandbox.v1.test` takes a [`TestRequest`]; the scheduler runs the tests against the code in
//! the template's sandbox (pytest for Python, `node --test` for JavaScript) as an execution like
//! any other, and answers a [`TestReport`] parsed from the JUnit XML the runner wrote into the
//! workspace — never from stdout, which the tests' own prints could forge — and accepted only
//! under the seal the runner's parent made with a key the tests never reach.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::ErrorBody;
use crate::exec::{
    ConfirmationOutcome, ExecStatus, FileSpec, Language, Limits, Tier, Timing, Usage,
};
use crate::risk::RiskAssessment;
use crate::template::TemplateRan;
use crate::tenancy::{unscoped, Tenant};
use crate::validate::{
    check_size, validate_env, validate_relative_path, Ceilings, ValidationError,
};

/// The template a Python test run uses when it names none: the sandbox image
/// (`python-default`) has no pytest; `python-data` installs it from Debian.
pub const DEFAULT_PYTHON_TEMPLATE: &str = "python-data";
/// The template a JavaScript test run uses when it names none (`node --test` is built in).
pub const DEFAULT_JAVASCRIPT_TEMPLATE: &str = "node-default";

/// Where the code and tests are written in the workspace.
pub const TEST_DIR: &str = "code";
/// Where the runner's own files go (hidden, so they are not mistaken for the caller's); a
/// request's files may not go there.
pub const RUNNER_DIR: &str = ".sandmesh-test";

/// The largest JUnit report read back; a larger one is an `error` report, not a truncated one.
pub const MAX_REPORT_BYTES: u64 = 512 * 1024;
/// Most test cases one report may list.
pub const MAX_TEST_CASES: usize = 10_000;
/// A failure message is cut to this many bytes (the full text stays in stdout).
pub const MAX_MESSAGE_BYTES: usize = 4096;

/// `sandbox.v1.test` request.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TestRequest {
    /// The idempotency key of the underlying execution; a ULID is assigned when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_id: Option<String>,
    /// Run in this session (its workspace keeps the files and the report). Absent: an
    /// internal session is opened for the run and closed after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// `python` (pytest) or `javascript` (`node --test`).
    pub language: Language,
    /// The module under test.
    pub code: String,
    /// The test file's content.
    pub tests: String,
    /// The module's file name (`solution.py` / `solution.js` by default), which the tests
    /// import; a plain name, written under [`TEST_DIR`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code_file: Option<String>,
    /// The test file's name (`test_solution.py` / `solution.test.js` by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tests_file: Option<String>,
    /// More files (fixtures, data), placed as an execution's files are.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<FileSpec>,
    /// Absent: [`DEFAULT_PYTHON_TEMPLATE`] or [`DEFAULT_JAVASCRIPT_TEMPLATE`] (or the
    /// session's template).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// The whole run's budget; tests still running then are cut off, and those that finished
    /// are reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
}

impl TestRequest {
    /// The module's file name, as given or by default.
    pub fn code_file(&self) -> &str {
        self.code_file.as_deref().unwrap_or(match self.language {
            Language::Javascript => "solution.js",
            _ => "solution.py",
        })
    }

    /// The test file's name, as given or by default.
    pub fn tests_file(&self) -> &str {
        self.tests_file.as_deref().unwrap_or(match self.language {
            Language::Javascript => "solution.test.js",
            _ => "test_solution.py",
        })
    }

    /// The template to run in when the request and its session name none.
    pub fn default_template(&self) -> &'static str {
        match self.language {
            Language::Javascript => DEFAULT_JAVASCRIPT_TEMPLATE,
            _ => DEFAULT_PYTHON_TEMPLATE,
        }
    }

    /// Checks what is particular to a test run. The execution it becomes is checked besides,
    /// as any execution is (ids, files, env, limits against the ceilings).
    pub fn validate(&self, c: &Ceilings) -> Result<(), ValidationError> {
        if !matches!(self.language, Language::Python | Language::Javascript) {
            return Err(ValidationError::invalid(
                "language",
                "tests run for python (pytest) or javascript (node --test)",
            ));
        }
        for (field, text) in [("code", &self.code), ("tests", &self.tests)] {
            check_size(field, text.len(), c.max_code_bytes)?;
            if text.contains('\0') {
                return Err(ValidationError::invalid(field, "NUL bytes are not allowed"));
            }
        }
        if self.tests.trim().is_empty() {
            return Err(ValidationError::invalid("tests", "no tests given"));
        }
        for (field, name) in [
            ("code_file", self.code_file()),
            ("tests_file", self.tests_file()),
        ] {
            validate_relative_path(field, name)?;
            if name.contains('/') || name.starts_with('.') {
                return Err(ValidationError::invalid(
                    field,
                    "a plain file name (no directories, not hidden)",
                ));
            }
        }
        if self.code_file() == self.tests_file() {
            return Err(ValidationError::invalid(
                "tests_file",
                "the tests and the code need different file names",
            ));
        }
        let taken = [self.code_file(), self.tests_file()].map(|n| format!("{TEST_DIR}/{n}"));
        let runner = format!("{RUNNER_DIR}/");
        if let Some(i) = self
            .files
            .iter()
            .position(|f| taken.contains(&f.path) || f.path.starts_with(&runner))
        {
            return Err(ValidationError::invalid(
                format!("files[{i}].path"),
                format!("names the code, the tests or the runner's files (under {RUNNER_DIR}/)"),
            ));
        }
        // The environment is the tests' (the runner hands it to the test tool), so it is
        // checked here rather than as the execution's.
        validate_env(&self.env, c)
    }
}

/// How a test run ended as a whole.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TestRunStatus {
    /// Every test passed (and there was at least one).
    Passed,
    /// At least one test failed or errored.
    Failed,
    /// No usable report: the tests could not be collected, the runner crashed, the report was
    /// missing or unreadable, or the execution ended some other way (`exec_status` says).
    #[default]
    Error,
    /// The budget ran out; `tests` holds those that finished.
    Timeout,
    /// The risk policy refused to run it.
    Rejected,
    /// A person (or a confirmation timeout) denied it.
    Denied,
}

impl TestRunStatus {
    pub const fn as_str(self) -> &'static str {
        match self {
            TestRunStatus::Passed => "passed",
            TestRunStatus::Failed => "failed",
            TestRunStatus::Error => "error",
            TestRunStatus::Timeout => "timeout",
            TestRunStatus::Rejected => "rejected",
            TestRunStatus::Denied => "denied",
        }
    }
}

/// One test's outcome, as JUnit reports it: a `<failure>` is an assertion that did not hold
/// in the test itself, an `<error>` one that broke around it (a fixture, a hook, collection).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TestCaseStatus {
    #[default]
    Passed,
    Failed,
    Error,
    Skipped,
}

impl TestCaseStatus {
    pub const fn as_str(self) -> &'static str {
        match self {
            TestCaseStatus::Passed => "passed",
            TestCaseStatus::Failed => "failed",
            TestCaseStatus::Error => "error",
            TestCaseStatus::Skipped => "skipped",
        }
    }
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TestCase {
    pub name: String,
    /// The module or suite (JUnit's `classname`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub classname: Option<String>,
    pub status: TestCaseStatus,
    #[serde(default)]
    pub duration_ms: u64,
    /// Why it failed, errored or was skipped (at most [`MAX_MESSAGE_BYTES`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TestTotals {
    pub passed: u64,
    pub failed: u64,
    pub errors: u64,
    pub skipped: u64,
}

impl TestTotals {
    pub fn of(tests: &[TestCase]) -> Self {
        let mut t = TestTotals::default();
        for case in tests {
            match case.status {
                TestCaseStatus::Passed => t.passed += 1,
                TestCaseStatus::Failed => t.failed += 1,
                TestCaseStatus::Error => t.errors += 1,
                TestCaseStatus::Skipped => t.skipped += 1,
            }
        }
        t
    }
}

/// `sandbox.v1.test` reply.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct TestReport {
    pub execution_id: String,
    /// The caller's session, when it named one (an internal session is not reported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    pub status: TestRunStatus,
    #[serde(default)]
    pub tests: Vec<TestCase>,
    #[serde(default)]
    pub totals: TestTotals,
    /// Why the run has no (complete) report, for `error` and `timeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
    /// The underlying execution's status, exit code and output (the runner's and the tests').
    pub exec_status: ExecStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
    #[serde(default)]
    pub stdout: String,
    #[serde(default)]
    pub stderr: String,
    #[serde(default)]
    pub stdout_truncated: bool,
    #[serde(default)]
    pub stderr_truncated: bool,
    pub tier: Tier,
    #[serde(default)]
    pub risk: RiskAssessment,
    #[serde(default)]
    pub confirmation: ConfirmationOutcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<TemplateRan>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    #[serde(default)]
    pub timing: Timing,
}

impl TestReport {
    /// The report as `tenant`'s agents know it: ids without the tenant's scope prefix.
    pub fn unscoped(mut self, tenant: Option<&Tenant>) -> Self {
        self.execution_id = unscoped(tenant, &self.execution_id);
        self.session_id = self.session_id.map(|s| unscoped(tenant, &s));
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> TestRequest {
        TestRequest {
            language: Language::Python,
            code: "def add(a, b):\n    return a + b\n".into(),
            tests: "from solution import add\n\ndef test_add():\n    assert add(1, 2) == 3\n"
                .into(),
            ..Default::default()
        }
    }

    fn field(e: ValidationError) -> String {
        match e {
            ValidationError::Invalid { field, .. } | ValidationError::TooLarge { field, .. } => {
                field
            }
        }
    }

    #[test]
    fn a_plain_request_is_valid_and_named_by_language() {
        let c = Ceilings::default();
        let py = request();
        py.validate(&c).unwrap();
        assert_eq!(
            (py.code_file(), py.tests_file()),
            ("solution.py", "test_solution.py")
        );
        let js = TestRequest {
            language: Language::Javascript,
            ..request()
        };
        js.validate(&c).unwrap();
        assert_eq!(
            (js.code_file(), js.tests_file(), js.default_template()),
            (
                "solution.js",
                "solution.test.js",
                DEFAULT_JAVASCRIPT_TEMPLATE
            )
        );
    }

    #[test]
    fn malformed_requests_name_their_field() {
        let c = Ceilings::default();
        let cases: Vec<(TestRequest, &str)> = vec![
            (
                TestRequest {
                    language: Language::Shell,
                    ..request()
                },
                "language",
            ),
            // The tests' environment reaches the test tool through the runner, not as the
            // execution's: checked here.
            (
                TestRequest {
                    env: [("LD_PRELOAD".to_string(), "/tmp/x.so".to_string())].into(),
                    ..request()
                },
                "env.LD_PRELOAD",
            ),
            (
                TestRequest {
                    tests: " \n".into(),
                    ..request()
                },
                "tests",
            ),
            (
                TestRequest {
                    code: "x = 1\0".into(),
                    ..request()
                },
                "code",
            ),
            (
                TestRequest {
                    code: "#".repeat(c.max_code_bytes + 1),
                    ..request()
                },
                "code",
            ),
            (
                TestRequest {
                    tests_file: Some("../test_x.py".into()),
                    ..request()
                },
                "tests_file",
            ),
            (
                TestRequest {
                    code_file: Some("pkg/solution.py".into()),
                    ..request()
                },
                "code_file",
            ),
            (
                TestRequest {
                    code_file: Some(".pth".into()),
                    ..request()
                },
                "code_file",
            ),
            (
                TestRequest {
                    code_file: Some("test_solution.py".into()),
                    ..request()
                },
                "tests_file",
            ),
            (
                TestRequest {
                    files: vec![FileSpec {
                        path: "code/test_solution.py".into(),
                        content: "x".into(),
                        encoding: Default::default(),
                    }],
                    ..request()
                },
                "files[0].path",
            ),
            (
                TestRequest {
                    files: vec![FileSpec {
                        path: ".sandmesh-test/junit-reporter.mjs".into(),
                        content: "x".into(),
                        encoding: Default::default(),
                    }],
                    ..request()
                },
                "files[0].path",
            ),
        ];
        for (req, want) in cases {
            let e = req.validate(&c).expect_err(want);
            assert_eq!(field(e), want);
        }
    }

    #[test]
    fn totals_count_each_status() {
        let case = |status| TestCase {
            name: "t".into(),
            status,
            ..Default::default()
        };
        let tests = [
            case(TestCaseStatus::Passed),
            case(TestCaseStatus::Passed),
            case(TestCaseStatus::Failed),
            case(TestCaseStatus::Error),
            case(TestCaseStatus::Skipped),
        ];
        assert_eq!(
            TestTotals::of(&tests),
            TestTotals {
                passed: 2,
                failed: 1,
                errors: 1,
                skipped: 1
            }
        );
    }
}
