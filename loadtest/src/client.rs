//! Executions through the mesh as any client does them: sync request-reply on `exec`, or an
//! async job on `jobs.exec` (JetStream, `Nats-Msg-Id` = execution id) whose result is read
//! from `results.<id>`.

use std::time::{Duration, Instant};

use futures::StreamExt;
use kit::CallError;
use messages::codec::{self, Encoding};
use messages::exec::{ExecRequest, ExecResult, ResultGet, ResultLookup};
use messages::exec::{Language, Tier};
use messages::session::{SessionOpen, SessionRecord, SessionRef};
use messages::subjects::SessionOp;

use crate::driver::Sample;
use crate::mesh::Mesh;

/// The name a failed call is counted under.
pub fn error_status(e: &CallError) -> String {
    format!("err:{}", e.kind().as_str())
}

/// A failed call as a sample: counted by kind, with its message as the detail.
pub fn call_failed(e: &CallError) -> Sample {
    Sample::failed(error_status(e), e.to_string())
}

/// An error as `err:<kind>: <message>` (this client's own form) as a sample: counted under
/// `err:<kind>`, the message kept as the detail.
pub fn failed_with(error: String) -> Sample {
    match error.strip_prefix("err:").and_then(|r| r.split_once(": ")) {
        Some((kind, message)) => Sample::failed(format!("err:{kind}"), message),
        None => Sample::failed(error.clone(), error),
    }
}

/// A sample from an execution's outcome: the result's status (`wrong_output` when it is `ok`
/// but printed something else), the executor's time as the inner time.
pub fn exec_sample(
    outcome: Result<ExecResult, String>,
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
        Err(e) => failed_with(e),
    }
}

/// Sync: one request on `exec`, timed end to end.
pub async fn exec_sync(mesh: &Mesh, req: &ExecRequest, expect: Option<&str>) -> Sample {
    let start = Instant::now();
    let outcome = mesh
        .caller
        .call::<ExecRequest, ExecResult>(mesh.subjects.exec(), req)
        .await
        .map_err(|e| format!("{}: {e}", error_status(&e)));
    exec_sample(outcome, start.elapsed(), expect)
}

/// Async: subscribe to the result subject, publish the job (acked by JetStream), wait for the
/// stored result; if the live message was missed, ask `exec.result`. Timed from publish to
/// result.
pub async fn exec_async(
    mesh: &Mesh,
    req: &ExecRequest,
    expect: Option<&str>,
    limit: Duration,
) -> Sample {
    let id = req.execution_id.clone().unwrap_or_else(messages::new_id);
    let start = Instant::now();
    let outcome = submit_and_wait(mesh, &id, req, limit).await;
    exec_sample(outcome, start.elapsed(), expect)
}

/// Publishes one job to `jobs.exec`; returns whether JetStream took it as new (not a
/// duplicate of an id it has seen).
pub async fn publish_job(mesh: &Mesh, id: &str, req: &ExecRequest) -> Result<bool, String> {
    let payload = Encoding::MsgPack
        .encode(req)
        .map_err(|e| format!("encode: {e}"))?;
    let message = async_nats::jetstream::message::PublishMessage::build()
        .payload(payload.into())
        .message_id(id)
        .header(codec::CONTENT_TYPE, codec::MSGPACK);
    let ack = mesh
        .js
        .send_publish(mesh.subjects.jobs_exec(), message)
        .await
        .map_err(|e| format!("err:publish: {e}"))?
        .await
        .map_err(|e| format!("err:publish-ack: {e}"))?;
    Ok(!ack.duplicate)
}

async fn submit_and_wait(
    mesh: &Mesh,
    id: &str,
    req: &ExecRequest,
    limit: Duration,
) -> Result<ExecResult, String> {
    // Subscribed before publishing, on the same connection: the server sees the interest
    // first, so the stored result's message cannot slip past.
    let mut sub = mesh
        .client
        .subscribe(mesh.subjects.result(id))
        .await
        .map_err(|e| format!("err:subscribe: {e}"))?;
    publish_job(mesh, id, req).await?;
    match tokio::time::timeout(limit, sub.next()).await {
        Ok(Some(msg)) => decode_result(msg.headers.as_ref(), &msg.payload),
        _ => lookup_until(mesh, id, Duration::from_secs(5)).await,
    }
}

/// Decodes a stored result message by its `Content-Type`.
pub fn decode_result(
    headers: Option<&async_nats::HeaderMap>,
    payload: &[u8],
) -> Result<ExecResult, String> {
    let content_type = headers
        .and_then(|h| h.get(codec::CONTENT_TYPE))
        .map(|v| v.as_str().to_string());
    let encoding = Encoding::from_content_type(content_type.as_deref())
        .map_err(|e| format!("err:decode: {e}"))?;
    encoding
        .decode(payload)
        .map_err(|e| format!("err:decode: {e}"))
}

/// Bounded poll of `exec.result` until the result is stored.
pub async fn lookup_until(mesh: &Mesh, id: &str, limit: Duration) -> Result<ExecResult, String> {
    let deadline = Instant::now() + limit;
    let req = ResultGet {
        execution_id: id.to_string(),
    };
    loop {
        match mesh
            .caller
            .call::<ResultGet, ResultLookup>(mesh.subjects.results_get(), &req)
            .await
        {
            Ok(ResultLookup::Done { result }) => return Ok(*result),
            Ok(ResultLookup::Pending { .. }) => {}
            Err(e) if e.kind() == messages::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("{}: {e}", error_status(&e))),
        }
        if Instant::now() > deadline {
            return Err("err:result-missing".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Opens a session in tier `session`.
pub async fn open_session(mesh: &Mesh, language: Language) -> Result<String, String> {
    let open = SessionOpen {
        tier: Some(Tier::Session),
        language: Some(language),
        requested_by: Some("loadtest".into()),
        ..Default::default()
    };
    mesh.caller
        .call::<SessionOpen, SessionRecord>(mesh.subjects.sessions(SessionOp::Open), &open)
        .await
        .map(|r| r.session_id)
        .map_err(|e| format!("opening a session: {e}"))
}

/// Closes a session (its container goes away); failures are reported, not fatal.
pub async fn close_session(mesh: &Mesh, session_id: &str) {
    let req = SessionRef {
        session_id: session_id.to_string(),
    };
    if let Err(e) = mesh
        .caller
        .call::<SessionRef, SessionRecord>(mesh.subjects.sessions(SessionOp::Close), &req)
        .await
    {
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
        let failed = exec_sample(Err("err:overloaded".into()), Duration::ZERO, None);
        assert_eq!(
            (failed.status.as_str(), failed.latency),
            ("err:overloaded", None)
        );
    }

    #[test]
    fn stored_results_decode_in_either_encoding() {
        let r = ExecResult {
            execution_id: "01J".into(),
            ..Default::default()
        };
        let json = Encoding::Json.encode(&r).unwrap();
        assert_eq!(decode_result(None, &json).unwrap().execution_id, "01J");
        let mut h = async_nats::HeaderMap::new();
        h.insert(codec::CONTENT_TYPE, codec::MSGPACK);
        let mp = Encoding::MsgPack.encode(&r).unwrap();
        assert_eq!(decode_result(Some(&h), &mp).unwrap().execution_id, "01J");
        assert!(decode_result(None, b"{not json").is_err());
    }
}
