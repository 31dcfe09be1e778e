//! Executions: sync (`exec`, one request, the result as reply), async (`submit` a JetStream
//! job with `Nats-Msg-Id` = execution id, then `result` / `wait_result`), the live output, and
//! test runs (`run_tests`: code and tests in, per-test results out).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Stream, StreamExt};
use messages::exec::{
    AwaitingConfirmation, ExecRequest, ExecResult, Language, OutputChunk, ResultGet, ResultLookup,
};

use messages::testrun::{TestReport, TestRequest};

use crate::{decode_reply, ClientError, ErrorKind, MeshClient, Result};

/// A sync execution may wait for a container, a person's approval and the run itself.
pub const EXEC_TIMEOUT: Duration = Duration::from_secs(600);

#[derive(Debug, Clone)]
pub struct ExecClient {
    mesh: MeshClient,
}

/// An accepted async job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitted {
    pub execution_id: String,
    /// JetStream had seen this id already (a retried submit): nothing new will run.
    pub duplicate: bool,
}

impl ExecClient {
    pub fn new(mesh: MeshClient) -> Self {
        Self { mesh }
    }

    /// Runs `req` and returns its result (waiting at most [`EXEC_TIMEOUT`]).
    pub async fn exec(&self, req: &ExecRequest) -> Result<ExecResult> {
        self.exec_timeout(req, EXEC_TIMEOUT).await
    }

    /// Runs `code` as a cell of session `session_id`'s kernel for `language` (python or javascript;
    /// see `docs/architecture.md#kernels`): variables persist between cells, and the result's
    /// `outputs` carry the cell's typed rich outputs (`state_lost` says when the kernel had to be
    /// restarted).
    pub async fn run_cell(
        &self,
        session_id: &str,
        language: Language,
        code: &str,
    ) -> Result<ExecResult> {
        let req = ExecRequest {
            session_id: Some(session_id.into()),
            language,
            code: code.into(),
            kernel: true,
            ..Default::default()
        };
        self.exec(&req).await
    }

    pub async fn exec_timeout(&self, req: &ExecRequest, timeout: Duration) -> Result<ExecResult> {
        let subject = self.mesh.subjects().exec();
        self.mesh.request_timeout(subject, req, timeout).await
    }

    /// Like [`Self::exec_timeout`], and when the execution is parked for a person's approval,
    /// `on_wait` hears of it at once (confirmation id and expiry) while the call goes on
    /// waiting for the result ([`MeshClient::request_notified`]).
    pub async fn exec_notified(
        &self,
        req: &ExecRequest,
        timeout: Duration,
        on_wait: impl FnMut(AwaitingConfirmation) + Send + 'static,
    ) -> Result<ExecResult> {
        let subject = self.mesh.subjects().exec();
        self.mesh
            .request_notified(subject, req, timeout, on_wait)
            .await
    }

    /// Runs the tests of `req` against its code (`sandbox.v1.test`: pytest for Python,
    /// `node --test` for JavaScript) and returns the per-test report. A test run is an
    /// execution: it may wait for a person's approval like any other (see
    /// [`Self::run_tests_notified`]).
    pub async fn run_tests(&self, req: &TestRequest) -> Result<TestReport> {
        let subject = self.mesh.subjects().test();
        self.mesh.request_timeout(subject, req, EXEC_TIMEOUT).await
    }

    /// Like [`Self::run_tests`], and `on_wait` hears at once of a pending approval.
    pub async fn run_tests_notified(
        &self,
        req: &TestRequest,
        timeout: Duration,
        on_wait: impl FnMut(AwaitingConfirmation) + Send + 'static,
    ) -> Result<TestReport> {
        let subject = self.mesh.subjects().test();
        self.mesh
            .request_notified(subject, req, timeout, on_wait)
            .await
    }

    /// Queues `req` as a job; JetStream's ack means it is accepted and will reach a result.
    /// The execution id (given, or a new one) is the job's `Nats-Msg-Id`, so a retried submit
    /// is a duplicate, not a second run.
    pub async fn submit(&self, req: &ExecRequest) -> Result<Submitted> {
        let subject = self.mesh.subjects().jobs_exec();
        let mut req = req.clone();
        let id = req
            .execution_id
            .get_or_insert_with(messages::new_id)
            .clone();
        let mut headers = self.mesh.headers();
        headers.insert(async_nats::header::NATS_MESSAGE_ID, id.as_str());
        let payload = self.mesh.encode(&subject, &req)?;
        let ack = self
            .mesh
            .jetstream()
            .publish_with_headers(subject.clone(), headers, payload.into())
            .await
            .map_err(|e| ClientError::transport(format!("publishing to {subject}"), e))?
            .await
            .map_err(|e| ClientError::transport(format!("JetStream ack on {subject}"), e))?;
        Ok(Submitted {
            execution_id: id,
            duplicate: ack.duplicate,
        })
    }

    /// The stored result, or `None` while the job is queued or runs. An id the mesh never saw
    /// is `NotFound`.
    pub async fn result(&self, execution_id: &str) -> Result<Option<ExecResult>> {
        let req = ResultGet {
            execution_id: execution_id.to_string(),
            wait_ms: None,
        };
        let lookup = self
            .mesh
            .request(self.mesh.subjects().results_get(), &req)
            .await?;
        Ok(match lookup {
            ResultLookup::Done { result } => Some(*result),
            ResultLookup::Pending { .. } => None,
        })
    }

    /// Waits for the result, asking the scheduler to hold each look-up until it is stored (a
    /// long poll of at most [`messages::exec::MAX_RESULT_WAIT_MS`]), so a client needs no
    /// access to the results stream. A job just submitted may not be known yet, so `NotFound`
    /// counts as pending here.
    pub async fn wait_result(&self, execution_id: &str, timeout: Duration) -> Result<ExecResult> {
        let subject = self.mesh.subjects().results_get();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let wait = left.min(Duration::from_millis(messages::exec::MAX_RESULT_WAIT_MS));
            let req = ResultGet {
                execution_id: execution_id.to_string(),
                wait_ms: Some(wait.as_millis() as u64),
            };
            let asked = self
                .mesh
                .request_timeout(subject.clone(), &req, wait + self.mesh.timeout())
                .await;
            match asked {
                Ok(ResultLookup::Done { result }) => return Ok(*result),
                Ok(ResultLookup::Pending { .. }) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    // Not seen yet (still in the job queue): ask again shortly.
                    tokio::time::sleep(Duration::from_millis(50).min(left)).await;
                }
                Err(e) => return Err(e),
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ClientError::TimedOut { subject, timeout });
            }
        }
    }

    /// The live output of an execution, chunk by chunk, ending after the `eof` chunk. Subscribe
    /// before the execution starts (output is not stored): pass your own `execution_id`.
    pub async fn output(&self, execution_id: &str) -> Result<OutputChunks> {
        let subject = self.mesh.subjects().output_any(execution_id);
        let messages = self.mesh.subscribe_live(subject.clone()).await?;
        Ok(OutputChunks {
            subject,
            messages,
            done: false,
        })
    }
}

/// The chunks of one execution's output, in order (`seq` says if one was lost).
#[derive(Debug)]
pub struct OutputChunks {
    subject: String,
    messages: async_nats::Subscriber,
    done: bool,
}

impl Stream for OutputChunks {
    type Item = Result<OutputChunk>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        match self.messages.poll_next_unpin(cx) {
            Poll::Ready(Some(msg)) => {
                let chunk: Result<OutputChunk> =
                    decode_reply(&self.subject, msg.headers.as_ref(), &msg.payload);
                self.done = chunk.as_ref().map_or(true, |c| c.eof);
                Poll::Ready(Some(chunk))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// One line per test (status, name, time, the first line of its message), then the totals and
/// the run's status.
pub fn report_table(report: &TestReport) -> String {
    let width = report
        .tests
        .iter()
        .map(|t| t.name.chars().count())
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for t in &report.tests {
        let why = t
            .message
            .as_deref()
            .and_then(|m| m.lines().find(|l| !l.trim().is_empty()))
            .map(|m| format!("  {}", m.trim()))
            .unwrap_or_default();
        out += &format!(
            "{:<7} {:<width$} {:>6} ms{why}\n",
            t.status.as_str().to_uppercase(),
            t.name,
            t.duration_ms,
        );
    }
    let n = report.totals;
    out += &format!(
        "{}: {} passed, {} failed, {} errors, {} skipped ({} ms)\n",
        report.status.as_str(),
        n.passed,
        n.failed,
        n.errors,
        n.skipped,
        report.timing.total_ms
    );
    if let Some(e) = &report.error {
        out += &format!("{}\n", e.message);
    }
    out
}

#[cfg(test)]
mod tests {
    use messages::testrun::{TestCase, TestCaseStatus, TestRunStatus, TestTotals};

    use super::*;

    #[test]
    fn the_report_table_lists_each_test_and_the_totals() {
        let tests = vec![
            TestCase {
                name: "test_add".into(),
                status: TestCaseStatus::Passed,
                duration_ms: 1,
                ..Default::default()
            },
            TestCase {
                name: "test_div".into(),
                status: TestCaseStatus::Failed,
                duration_ms: 3,
                message: Some("\nassert 2.0 == 3\n+ where".into()),
                ..Default::default()
            },
        ];
        let report = TestReport {
            status: TestRunStatus::Failed,
            totals: TestTotals::of(&tests),
            tests,
            ..Default::default()
        };
        assert_eq!(
            report_table(&report),
            "PASSED  test_add      1 ms\n\
             FAILED  test_div      3 ms  assert 2.0 == 3\n\
             failed: 1 passed, 1 failed, 0 errors, 0 skipped (0 ms)\n"
        );
    }
}
