//! The streams of envd's processes: `Start` of a command with stdin, a PTY or a tag as a
//! session process, and `Connect` to one ([`super::processes`] names them).
//!
//! ```text
//! Start ── proc.start ── start{pid} (at once with `awaiting approval …` on stderr when it
//!          waits for a person)
//!       └─ follow: subscribe output.<tenant>.<proc_id>, page proc.output from 0, then live,
//!          until its `ended` event → end{exitCode | signal}
//! Connect ── start{pid} ── follow from the process's next seq (new output, as envd)
//! ```
//!
//! A stream that ends (the caller's deadline, `disconnect()`) leaves the process running: it
//! ends by itself, by a signal, or with its session.

use std::time::Duration;

use axum::extract::Request;
use futures::channel::mpsc;
use futures::{SinkExt, StreamExt};
use messages::confirm::ConfirmState;
use messages::error::ErrorKind;
use messages::proc::{
    ProcChunk, ProcCommand, ProcEvent, ProcInfo, ProcOutputRequest, ProcStart, ProcStarted,
    ProcState, ProcStream,
};
use messages::validate::Ceilings;
use sandmesh_client::MeshClient;
use serde::Deserialize;

use super::connect::{self, Shape};
use super::process::{
    bash_script, finish, keepalive, output, relay, run_dir, started, End, Frame, Pty, StartRequest,
    BACKLOG, EXIT_REFUSED,
};
use super::processes::{e2b_tag, find, new_pid, Named, Selector};
use super::{awaiting_line, Code, E2bError, E2bReply, Sandbox};

// === Start ===

/// Starts `start` as a session process and streams it: `start{pid}` at once, then its output
/// and its end.
pub fn start(
    sandbox: Sandbox,
    start: StartRequest,
    wait: Duration,
    keepalive: Duration,
) -> E2bReply {
    let pid = new_pid();
    let command = match bash_script(&start.process) {
        Some(script) => ProcCommand::Cmd(script.to_string()),
        None if start.process.cmd.is_empty() => {
            return Err(E2bError::invalid("process.cmd is empty"))
        }
        None => ProcCommand::Argv(
            std::iter::once(&start.process.cmd)
                .chain(&start.process.args)
                .cloned()
                .collect(),
        ),
    };
    let pty = start.pty.as_ref().map(Pty::size).transpose()?;
    let req = ProcStart {
        session_id: sandbox.id.clone(),
        command,
        cwd: run_dir(start.process.cwd.as_deref())?,
        env: start.process.envs,
        stdin: start.stdin == Some(true),
        pty,
        tag: Some(e2b_tag(pid, start.tag.as_deref())),
        // E2B's timeouts bound the caller's stream, never the process.
        timeout_ms: 0,
        // Unique, so the facade knows this start's confirmation among the tenant's.
        requested_by: Some(format!(
            "e2b key {} (process {pid})",
            sandbox.agent.caller.key_id
        )),
    };
    // The protocol's bounds checked before the stream starts, so a bad start is refused in
    // the unary shape. The env is the scheduler's to check, against the deployment's ceilings.
    let bounds = ProcStart {
        env: Default::default(),
        ..req.clone()
    };
    bounds.validate(&Ceilings::default()).map_err(|e| {
        let body = messages::ErrorBody::from(e);
        match body.kind {
            ErrorKind::TooLarge => E2bError::too_large(body.message),
            _ => E2bError::invalid(body.message),
        }
    })?;
    let (mut frames, source) = mpsc::channel::<Frame>(BACKLOG);
    let mesh = sandbox.agent.mesh.clone();
    tokio::spawn(async move {
        match start_watched(&mesh, &req, pid, wait, &mut frames).await {
            Ok(proc) => {
                let follow = Follow {
                    mesh: &mesh,
                    session: &req.session_id,
                    proc_id: &proc.proc_id,
                    pty: req.pty.is_some(),
                };
                follow.relay(0, frames).await;
            }
            Err(last) => {
                let _ = frames.send(last).await;
            }
        }
    });
    Ok(relay(source, keepalive))
}

/// Starts the process and opens the stream with `start{pid}` once it runs — or at once when
/// it waits for a person, saying so on stderr, so that the caller holds its handle meanwhile.
/// A refusal ends the stream as a refused command does (126 and why); another failure before
/// the stream opened is its only message, an error.
async fn start_watched(
    mesh: &MeshClient,
    req: &ProcStart,
    pid: u32,
    wait: Duration,
    frames: &mut mpsc::Sender<Frame>,
) -> Result<ProcStarted, Frame> {
    let mut opened = false;
    // Watched before the start, so its pending event cannot be missed. Without the watch the
    // start still runs; only the notice is lost.
    let mut confirmations = mesh.confirm().watch().await.ok();
    let procs = mesh.procs();
    let start = procs.start(req, Some(wait));
    tokio::pin!(start);
    let mut awaiting: Option<String> = None;
    let outcome = loop {
        tokio::select! {
            outcome = &mut start => break outcome,
            Some(event) = async {
                match confirmations.as_mut() {
                    Some(events) => events.next().await,
                    None => std::future::pending().await,
                }
            } => {
                let Ok(c) = event else { continue };
                if awaiting.is_none()
                    && c.state == ConfirmState::Pending
                    && c.requested_by == req.requested_by
                {
                    open(&mut opened, pid, frames).await;
                    let line = awaiting_line(&c.id);
                    let _ = frames.send(Frame::more(output("stderr", line.as_bytes()))).await;
                    awaiting = Some(c.id);
                }
            }
        }
    };
    match outcome {
        Ok(running) => {
            open(&mut opened, pid, frames).await;
            Ok(running)
        }
        Err(e) if e.kind() == ErrorKind::Denied => {
            open(&mut opened, pid, frames).await;
            let said = e
                .service_error()
                .map_or_else(|| e.to_string(), |b| b.message.clone());
            let decided = match &awaiting {
                Some(id) => mesh.confirm().get(id).await.ok(),
                None => None,
            };
            let why = match decided {
                Some(c) => format!(
                    "{}: {}",
                    serde_json::to_value(c.state)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_else(|| "refused".into()),
                    c.reason.unwrap_or(said)
                ),
                None => said,
            };
            Err(Frame::last(finish(&End::exited(EXIT_REFUSED, Some(why)))))
        }
        Err(e) => Err(Frame::failed(e)),
    }
}

/// Opens the stream with `start{pid}`, once. A caller gone away: the start goes on all the
/// same (a process outlives its stream).
async fn open(opened: &mut bool, pid: u32, frames: &mut mpsc::Sender<Frame>) {
    if !std::mem::replace(opened, true) {
        let _ = frames.send(Frame::more(started(pid))).await;
    }
}

// === following a process ===

/// A process whose output is relayed to a stream.
struct Follow<'a> {
    mesh: &'a MeshClient,
    session: &'a str,
    proc_id: &'a str,
    /// Its output goes out as `pty` bytes.
    pty: bool,
}

impl Follow<'_> {
    /// Relays the output from `from_seq`, then the end; or the failure, as the stream's error.
    async fn relay(&self, from_seq: u64, mut frames: mpsc::Sender<Frame>) {
        let last = match self.output(from_seq, &mut frames).await {
            Ok(Some(info)) => Frame::last(finish(&end_of(&info))),
            Ok(None) => return,
            Err(e) => Frame::failed(e),
        };
        let _ = frames.send(last).await;
    }

    /// The output from `from_seq` until the process ends (its final state), or `None` when the
    /// caller went away.
    async fn output(
        &self,
        from_seq: u64,
        frames: &mut mpsc::Sender<Frame>,
    ) -> Result<Option<ProcInfo>, E2bError> {
        let procs = self.mesh.procs();
        // Live first, then what came before: the seqs join the two without a gap.
        let mut events = procs.events(self.proc_id).await?;
        let mut next = from_seq;
        loop {
            let page = procs
                .output(&ProcOutputRequest {
                    session_id: self.session.to_string(),
                    proc_id: self.proc_id.to_string(),
                    from_seq: next,
                    max_bytes: None,
                })
                .await?;
            let caught_up = page.chunks.is_empty() || page.next_seq == next;
            for chunk in &page.chunks {
                if !self.send(chunk, frames).await? {
                    return Ok(None);
                }
            }
            next = next.max(page.next_seq);
            if !caught_up {
                continue;
            }
            if page.state != ProcState::Running {
                let info = procs
                    .wait(self.session, self.proc_id, Duration::ZERO)
                    .await?;
                return Ok(Some(info));
            }
            break;
        }
        while let Some(event) = events.next().await {
            match event? {
                ProcEvent::Output(chunk) if chunk.seq >= next => {
                    next = chunk.seq + 1;
                    if !self.send(&chunk, frames).await? {
                        return Ok(None);
                    }
                }
                ProcEvent::Output(_) => {}
                ProcEvent::Ended(info) => return Ok(Some(info)),
            }
        }
        Err(E2bError::new(
            Code::Unavailable,
            "the process's output stopped before its end (the mesh connection closed)",
        ))
    }

    /// One chunk to the caller; `false` when the caller went away.
    async fn send(
        &self,
        chunk: &ProcChunk,
        frames: &mut mpsc::Sender<Frame>,
    ) -> Result<bool, E2bError> {
        let bytes = chunk
            .bytes()
            .map_err(|e| E2bError::new(Code::Internal, format!("an output chunk's bytes: {e}")))?;
        let name = match (self.pty, chunk.stream) {
            (true, _) => "pty",
            (false, ProcStream::Stdout) => "stdout",
            (false, ProcStream::Stderr) => "stderr",
        };
        Ok(frames.send(Frame::more(output(name, &bytes))).await.is_ok())
    }
}

/// envd's end of a process that ended: its exit code, or the signal that ended it (exit code
/// -1 and `signal: killed`, as Go reports a process's state).
fn end_of(info: &ProcInfo) -> End {
    match (info.exit_code, info.signal) {
        (Some(code), _) => End::exited(code, None),
        (None, signal) => {
            let status = match signal {
                Some(1) => "signal: hangup".to_string(),
                Some(2) => "signal: interrupt".to_string(),
                Some(9) => "signal: killed".to_string(),
                Some(15) => "signal: terminated".to_string(),
                Some(n) => format!("signal: {n}"),
                // Its timeout, or its sandbox went away.
                None => "killed".to_string(),
            };
            End {
                exit_code: -1,
                exited: false,
                status: status.clone(),
                error: Some(status),
            }
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ConnectRequest {
    process: Selector,
}

/// `Connect`: re-attaches to a process, `start{pid}` then its new output and its end.
pub async fn connect(sandbox: Sandbox, req: Request) -> E2bReply {
    let keepalive = keepalive(req.headers());
    let ask: ConnectRequest = connect::request(req, Shape::ServerStream).await?;
    let info = find(&sandbox, &ask.process, false).await?;
    let pid = Named::of(&info).pid;
    let (mut frames, source) = mpsc::channel::<Frame>(BACKLOG);
    tokio::spawn(async move {
        if frames.send(Frame::more(started(pid))).await.is_err() {
            return;
        }
        let follow = Follow {
            mesh: &sandbox.agent.mesh,
            session: &sandbox.id,
            proc_id: &info.proc_id,
            pty: info.pty.is_some(),
        };
        follow.relay(info.next_seq, frames).await;
    });
    Ok(relay(source, keepalive))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_killed_process_ends_as_go_reports_a_signal() {
        let mut p = ProcInfo {
            proc_id: "p1".into(),
            pid: 1,
            argv: vec!["x".into()],
            tag: None,
            cwd: None,
            pty: None,
            state: ProcState::Killed,
            exit_code: None,
            signal: Some(9),
            started_at: 0,
            ended_at: Some(1),
            next_seq: 0,
        };
        let end = end_of(&p);
        assert_eq!((end.exit_code, end.exited), (-1, false));
        assert_eq!(end.status, "signal: killed");
        p.state = ProcState::Exited;
        p.signal = None;
        p.exit_code = Some(3);
        assert_eq!(end_of(&p), End::exited(3, None));
    }
}
