//! A [`TestReport`] from what ran: the execution's result and the JUnit report read back from
//! the workspace. A run always gets a terminal report: without a usable JUnit report it is
//! `error` (or `timeout`) with the reason, and the execution's output is kept either way.

use messages::exec::{ExecResult, ExecStatus};
use messages::testrun::{TestCase, TestCaseStatus, TestReport, TestRunStatus, TestTotals};
use messages::ErrorBody;

use super::runner::TIMEOUT_EXIT;

/// Did the execution get as far as running the tests, so a report may exist?
pub fn ran(result: &ExecResult) -> bool {
    matches!(
        result.status,
        ExecStatus::Ok | ExecStatus::Error | ExecStatus::Timeout
    )
}

/// The report of `result`, whose JUnit report read as `cases` (`None`: not read, nothing ran).
pub fn compose(result: ExecResult, cases: Option<Result<Vec<TestCase>, ErrorBody>>) -> TestReport {
    let timed_out = result.status == ExecStatus::Timeout || result.exit_code == Some(TIMEOUT_EXIT);
    let (tests, read_error) = match cases {
        Some(Ok(tests)) => (tests, None),
        Some(Err(e)) => (Vec::new(), Some(e)),
        None => (Vec::new(), None),
    };
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

    #[test]
    fn the_run_status_follows_the_tests() {
        use TestCaseStatus::*;
        let passing = vec![case("a", Passed), case("b", Skipped)];
        let r = compose(result(ExecStatus::Ok, 0), Some(Ok(passing.clone())));
        assert_eq!(
            (r.status, r.error, r.stdout.as_str()),
            (TestRunStatus::Passed, None, "out")
        );
        let failing = vec![case("a", Passed), case("b", Failed), case("c", Error)];
        let r = compose(result(ExecStatus::Error, 1), Some(Ok(failing)));
        assert_eq!(r.status, TestRunStatus::Failed);
        assert_eq!(
            (r.totals.passed, r.totals.failed, r.totals.errors),
            (1, 1, 1)
        );
        // A tool that fails with every test passing (pytest's internal error) is no pass.
        let r = compose(result(ExecStatus::Error, 3), Some(Ok(passing)));
        assert_eq!(r.status, TestRunStatus::Error);
        let r = compose(result(ExecStatus::Error, 5), Some(Ok(vec![])));
        assert_eq!(r.status, TestRunStatus::Error);
    }

    #[test]
    fn a_timeout_keeps_the_tests_that_finished() {
        let done = vec![case("a", TestCaseStatus::Passed)];
        let r = compose(result(ExecStatus::Error, TIMEOUT_EXIT), Some(Ok(done)));
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
        let r = compose(result(ExecStatus::Oom, 137), Some(Ok(vec![])));
        assert_eq!(r.status, TestRunStatus::Error);
        assert!(r.error.unwrap().message.contains("oom"));
        let unreadable = ErrorBody::bad_request("the test report declares a DTD");
        let r = compose(result(ExecStatus::Error, 1), Some(Err(unreadable)));
        assert_eq!((r.status, r.tests.len()), (TestRunStatus::Error, 0));
    }
}
