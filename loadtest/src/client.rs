//! Executions through the mesh as any client does them, through `sandmesh-client`: sync
//! request-reply on `exec`, or an async job on `jobs.exec` whose result is awaited; each
//! turned into a [`Sample`].

use std::time::{Duration, Instant};

use messages::exec::{ExecRequest, ExecResult};
use messages::exec::{Language, Tier};
use messages::session::SessionOpen;
use sandmesh_client::ClientError;

use crate::driver::Sample;
use crate::mesh::Mesh;

/// The name a failed call is counted under.
pub fn error_status(e: &ClientError) -> String {
    format!("err:{}", e.kind())
}

/// A failed call as a sample: counted by kind, with its message as the detail.
pub fn call_failed(e: &ClientError) -> Sample {
    Sample::failed(error_status(e), e.to_string())
}

/// A sample from an execution's outcome: the result's status (`wrong_output` when it is `ok`
/// but printed something else), the executor's time as the inner time.
pub fn exec_sample(
    outcome: Result<ExecResult, ClientError>,
    latency: Duration,
    expect: Option<&str>,
) -> Sample {
    match outcome {
        Ok(r) => {
            let mut status = r.status.as_str().to_string();
            if status == "ok" && expect.is_some_and(|e| r.stdout != e) {
                status = "wrong_output".into();
            }
            let detail = r.error.as_ref().map(|e| e.message.clone());
            Sample {
                latency: Some(latency),
                status,
                inner: (r.timing.exec_ms > 0).then(|| Duration::from_millis(r.timing.exec_ms)),
                detail: detail.or_else(|| {
                    (!r.stderr.is_empty()).then(|| r.stderr.chars().take(200).collect())
                }),
            }
        }
        Err(e) => call_failed(&e),
    }
}

/// Sync: one request on `exec`, timed end to end.
pub async fn exec_sync(mesh: &Mesh, req: &ExecRequest, expect: Option<&str>) -> Sample {
    let mut req = req.clone();
    if !mesh.sync_ids {
        req.execution_id = None;
    }
    let start = Instant::now();
    let outcome = mesh.api.exec().exec_timeout(&req, mesh.api.timeout()).await;
    exec_sample(outcome, start.elapsed(), expect)
}

/// Async: submit the job (acked by JetStream), then wait for its stored result. Timed from
/// submit to result.
pub async fn exec_async(
    mesh: &Mesh,
    req: &ExecRequest,
    expect: Option<&str>,
    limit: Duration,
) -> Sample {
    let start = Instant::now();
    let exec = mesh.api.exec();
    let outcome = match exec.submit(req).await {
        Ok(job) => exec.wait_result(&job.execution_id, limit).await,
        Err(e) => Err(e),
    };
    exec_sample(outcome, start.elapsed(), expect)
}

/// Opens a session in tier `session`.
pub async fn open_session(mesh: &Mesh, language: Language) -> Result<String, ClientError> {
    let open = SessionOpen {
        tier: Some(Tier::Session),
        language: Some(language),
        requested_by: Some("loadtest".into()),
        ..Default::default()
    };
    Ok(mesh.api.sessions().open(&open).await?.session_id)
}

/// Closes a session (its container goes away); failures are reported, not fatal.
pub async fn close_session(mesh: &Mesh, session_id: &str) {
    if let Err(e) = mesh.api.sessions().close(session_id).await {
        eprintln!("loadtest: closing session {session_id}: {e}");
    }
}

#[cfg(test)]
mod tests {
    use messages::exec::{ExecStatus, Timing};

    use super::*;

    #[test]
    fn results_become_samples() {
        let ok = ExecResult {
            status: ExecStatus::Ok,
            stdout: "1\n".into(),
            timing: Timing {
                exec_ms: 40,
                ..Default::default()
            },
            ..Default::default()
        };
        let s = exec_sample(Ok(ok.clone()), Duration::from_millis(45), Some("1\n"));
        assert_eq!(s.status, "ok");
        assert_eq!(s.inner, Some(Duration::from_millis(40)));
        let wrong = exec_sample(Ok(ok), Duration::from_millis(45), Some("2\n"));
        assert_eq!(wrong.status, "wrong_output");
        let timeout = ExecResult {
            status: ExecStatus::Timeout,
            ..Default::default()
        };
        assert_eq!(
            exec_sample(Ok(timeout), Duration::from_secs(1), None).status,
            "timeout"
        );
        let busy = ClientError::Service {
            subject: "sandbox.v1.exec".into(),
            body: messages::ErrorBody::overloaded("busy"),
        };
        let failed = exec_sample(Err(busy), Duration::ZERO, None);
        assert_eq!(
            (failed.status.as_str(), failed.latency),
            ("err:overloaded", None)
        );
    }
}
