//! A [`TestReport`] from what ran: the execution's result and the sealed JUnit report read
//! back from the workspace. A run always gets a terminal report: without a report the runner's
//! parent sealed, or with one whose records it refused, it is `error` (or `timeout`) with the
//! reason — never `passed` — and the execution's output is kept either way.

use messages::exec::{ExecResult, ExecStatus};
use messages::testrun::{TestCase, TestCaseStatus, TestReport, TestRunStatus, TestTotals};
use messages::ErrorBody;

use super::junit::Junit;

/// How the runner's parent saw the run end (the root of the report it sealed says).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunEnd {
    /// The tool ran to its end, every collected test reported once, its closing record agreeing
    /// with them and with its exit code.
    Complete,
    /// The tests were stopped at their budget; those that finished are reported.
    Timeout,
    /// The records did not hold together (a test reported twice or never collected, no closing
    /// record, counts or exit code that disagree): nothing of them is trusted.
    Refused(String),
}

/// What the sealed report says.
#[derive(Debug, Clone, PartialEq)]
pub struct Sealed {
    pub cases: Vec<TestCase>,
    pub end: RunEnd,
}

impl TryFrom<Junit> for Sealed {
    type Error = ErrorBody;

    fn try_from(report: Junit) -> Result<Self, ErrorBody> {
        let end = match (report.run.as_deref(), report.reason) {
            (Some("complete"), None) => RunEnd::Complete,
            (Some("timeout"), None) => RunEnd::Timeout,
            (Some("refused"), Some(reason)) => RunEnd::Refused(reason),
            _ => {
                return Err(ErrorBody::bad_request(
                    "the test report does not say how the run ended: it is not the runner's",
                ))
            }
        };
        Ok(Self {
            cases: report.cases,
            end,
        })
    }
}

/// Did the execution get as far as running the tests, so a report may exist?
pub fn ran(result: &ExecResult) -> bool {
    matches!(
        result.status,
        ExecStatus::Ok | ExecStatus::Error | ExecStatus::Timeout
    )
}

/// The report of `result`, whose sealed report read as `read` (`None`: not read, nothing ran).
pub fn compose(result: ExecResult, read: Option<Result<Sealed, ErrorBody>>) -> TestReport {
    let (tests, end, read_error) = match read {
        Some(Ok(Sealed {
            end: RunEnd::Refused(reason),
            ..
        })) => (
            Vec::new(),
            None,
            Some(ErrorBody::bad_request(format!(
                "the test run's records were refused, so none of its results stand: {reason}"
            ))),
        ),
        Some(Ok(sealed)) => (sealed.cases, Some(sealed.end), None),
        Some(Err(e)) => (Vec::new(), None, Some(e)),
        None => (Vec::new(), None, None),
    };
    let timed_out = result.status == ExecStatus::Timeout || end == Some(RunEnd::Timeout);
    let totals = TestTotals::of(&tests);
    let broken = tests
        .iter()
        .any(|t| matches!(t.status, TestCaseStatus::Failed | TestCaseStatus::Error));
    let (status, error) = match result.status {
        ExecStatus::Rejected => (TestRunStatus::Rejected, result.error.clone()),
        ExecStatus::Denied => (TestRunStatus::Denied, result.error.clone()),
        _ if timed_out => (
            TestRunStatus::Timeout,
            Some(read_error.unwrap_or_else(|| {
                ErrorBody::timeout(format!(
                    "the tests ran out of time; {} finished and are reported",
                    tests.len()
                ))
            })),
        ),
        ExecStatus::Ok | ExecStatus::Error => match read_error {
            Some(e) => (TestRunStatus::Error, Some(e)),
            None if tests.is_empty() => (
                TestRunStatus::Error,
                Some(ErrorBody::bad_request(
                    "no tests ran: none were found in the tests file (see stdout)",
                )),
            ),
            None if broken => (TestRunStatus::Failed, None),
            None if result.status == ExecStatus::Ok => (TestRunStatus::Passed, None),
            None => (
                TestRunStatus::Error,
                Some(ErrorBody::internal(format!(
                    "every test passed, but the test tool exited with {} (see stderr)",
                    result.exit_code.unwrap_or(-1)
                ))),
            ),
        },
        other => (
            TestRunStatus::Error,
            Some(result.error.clone().unwrap_or_else(|| {
                ErrorBody::internal(format!("the execution ended with {}", other.as_str()))
            })),
        ),
    };
    TestReport {
        execution_id: result.execution_id,
        session_id: result.session_id,
        status,
        tests,
        totals,
        error,
        exec_status: result.status,
        exit_code: result.exit_code,
        stdout: result.stdout,
        stderr: result.stderr,
        stdout_truncated: result.stdout_truncated,
        stderr_truncated: result.stderr_truncated,
        tier: result.tier,
        risk: result.risk,
        confirmation: result.confirmation,
        template: result.template,
        usage: result.usage,
        timing: result.timing,
    }
}

#[cfg(test)]
mod tests {
    use messages::ErrorKind;

    use super::*;

    fn case(name: &str, status: TestCaseStatus) -> TestCase {
        TestCase {
            name: name.into(),
            status,
            ..Default::default()
        }
    }

    fn result(status: ExecStatus, exit_code: i64) -> ExecResult {
        ExecResult {
            execution_id: "e1".into(),
            status,
            exit_code: Some(exit_code),
            stdout: "out".into(),
            ..Default::default()
        }
    }

    fn sealed(cases: Vec<TestCase>, end: RunEnd) -> Option<Result<Sealed, ErrorBody>> {
        Some(Ok(Sealed { cases, end }))
    }

    #[test]
    fn the_run_status_follows_the_tests() {
        use TestCaseStatus::*;
        let passing = vec![case("a", Passed), case("b", Skipped)];
        let r = compose(
            result(ExecStatus::Ok, 0),
            sealed(passing.clone(), RunEnd::Complete),
        );
        assert_eq!(
            (r.status, r.error, r.stdout.as_str()),
            (TestRunStatus::Passed, None, "out")
        );
        let failing = vec![case("a", Passed), case("b", Failed), case("c", Error)];
        let r = compose(
            result(ExecStatus::Error, 1),
            sealed(failing, RunEnd::Complete),
        );
        assert_eq!(r.status, TestRunStatus::Failed);
        assert_eq!(
            (r.totals.passed, r.totals.failed, r.totals.errors),
            (1, 1, 1)
        );
        // A tool that fails with every test passing (pytest's internal error) is no pass.
        let r = compose(
            result(ExecStatus::Error, 3),
            sealed(passing, RunEnd::Complete),
        );
        assert_eq!(r.status, TestRunStatus::Error);
        let r = compose(
            result(ExecStatus::Error, 5),
            sealed(vec![], RunEnd::Complete),
        );
        assert_eq!(r.status, TestRunStatus::Error);
    }

    #[test]
    fn refused_records_are_an_error_whatever_they_say() {
        let all_passed = vec![case("a", TestCaseStatus::Passed)];
        let refused = RunEnd::Refused("test 'a' reported twice".into());
        let r = compose(result(ExecStatus::Ok, 0), sealed(all_passed, refused));
        assert_eq!((r.status, r.tests.len()), (TestRunStatus::Error, 0));
        let error = r.error.unwrap();
        assert_eq!(error.kind, ErrorKind::BadRequest);
        assert!(
            error.message.contains("reported twice"),
            "{}",
            error.message
        );

        let unsaid = Junit {
            cases: vec![case("a", TestCaseStatus::Passed)],
            ..Default::default()
        };
        assert!(Sealed::try_from(unsaid).is_err());
        let refused_without_reason = Junit {
            run: Some("refused".into()),
            ..Default::default()
        };
        assert!(Sealed::try_from(refused_without_reason).is_err());
    }

    #[test]
    fn a_timeout_keeps_the_tests_that_finished() {
        let done = vec![case("a", TestCaseStatus::Passed)];
        let r = compose(
            result(ExecStatus::Error, 124),
            sealed(done, RunEnd::Timeout),
        );
        assert_eq!((r.status, r.tests.len()), (TestRunStatus::Timeout, 1));
        assert_eq!(r.error.unwrap().kind, ErrorKind::Timeout);
        let missing = ErrorBody::not_found("no report");
        let r = compose(result(ExecStatus::Timeout, -1), Some(Err(missing)));
        assert_eq!(
            (r.status, r.error.unwrap().kind),
            (TestRunStatus::Timeout, ErrorKind::NotFound)
        );
    }

    #[test]
    fn what_did_not_run_says_why() {
        let mut denied = result(ExecStatus::Denied, 0);
        denied.error = Some(ErrorBody::denied("confirmation denied: no"));
        let r = compose(denied, None);
        assert_eq!(
            (r.status, r.error.unwrap().kind),
            (TestRunStatus::Denied, ErrorKind::Denied)
        );
        let r = compose(
            result(ExecStatus::Oom, 137),
            sealed(vec![], RunEnd::Complete),
        );
        assert_eq!(r.status, TestRunStatus::Error);
        assert!(r.error.unwrap().message.contains("oom"));
        let unreadable = ErrorBody::bad_request("the test report declares a DTD");
        let r = compose(result(ExecStatus::Error, 1), Some(Err(unreadable)));
        assert_eq!((r.status, r.tests.len()), (TestRunStatus::Error, 0));
    }
}
