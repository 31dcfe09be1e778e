//! A session's background processes (`messages::proc`): each one a `docker exec` of
//! `sandmesh-supervisor proc` in the session's container, held here for the process's life.
//!
//! The session actor owns the table ([`Procs`]); each process has a task that reads its
//! frames — output into a bounded ring of seq-numbered chunks and, live, onto its output
//! subject; its end into the table — and a task that writes its controls (input, signals,
//! terminal sizes) in order. A process dies with its session: the container goes with the
//! session, and a proc host whose stream closes kills its program. A client's connection has
//! nothing to do with it.
//!
//! Nothing the proc host says is trusted beyond its frame format: a chunk is bounded by the
//! frame size, the ring by [`OUTPUT_RING_BYTES`], and the table by [`MAX_PROCS`].

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecResults};
use executor_node::WORKSPACE_DIR;
use futures::StreamExt;
use kit::{AuditScope, Auditor};
use messages::audit::ProcessEnded;
use messages::proc::{
    ProcCall, ProcChunk, ProcEvent, ProcInfo, ProcInput, ProcInputAck, ProcList, ProcOutput,
    ProcOutputRequest, ProcReply, ProcResize, ProcSignal, ProcStart, ProcStarted, ProcState,
    ProcStream, ProcWait, PtySize, MAX_OUTPUT_REPLY_BYTES, MAX_WAIT_MS, OUTPUT_RING_BYTES,
};
use messages::Encoding;
use sandbox_protocol::{
    self as protocol, FrameDecoder, FrameKind, ProcEnd, ProcSpec, PtyWinsize, PROTOCOL_VERSION,
};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, watch};

use crate::docker::SUPERVISOR_PATH;
use crate::egress::ProcessDoors;
use crate::proc_error::ProcError;
use crate::resident::{ExecInput, ExecOutput};

/// Processes a session holds, running and ended; the oldest ended one makes room.
pub const MAX_PROCS: usize = 32;
/// Controls waiting to be written to one proc host; past it an input is 429 (the proc host
/// reads its controls at once, so only a flood fills it).
const CONTROL_BACKLOG: usize = 256;
/// How long a proc host may take to say its program started.
const START_WITHIN: Duration = Duration::from_secs(30);

/// What a session's processes need of their container.
#[derive(Clone)]
pub struct ProcHost {
    pub docker: bollard::Docker,
    pub container: String,
    pub nofile: u64,
    pub fsize_bytes: u64,
    /// How a process binds its own egress proxy, when the session has a network policy.
    pub egress: Option<ProcessDoors>,
    pub nats: async_nats::Client,
    pub auditor: Auditor,
}

/// A control for a proc host, written in order.
enum Control {
    Input(Vec<u8>),
    InputEnd,
    Signal(i32),
    Resize(PtyWinsize),
}

/// Seq-numbered chunks, at most [`OUTPUT_RING_BYTES`] of them.
#[derive(Default)]
struct Ring {
    chunks: VecDeque<(u64, ProcStream, Vec<u8>)>,
    bytes: usize,
    next_seq: u64,
}

impl Ring {
    fn push(&mut self, stream: ProcStream, data: Vec<u8>) -> ProcChunk {
        let seq = self.next_seq;
        self.next_seq += 1;
        let chunk = ProcChunk::new(seq, stream, &data);
        self.bytes += data.len();
        self.chunks.push_back((seq, stream, data));
        while self.bytes > OUTPUT_RING_BYTES {
            match self.chunks.pop_front() {
                Some((_, _, old)) => self.bytes -= old.len(),
                None => break,
            }
        }
        chunk
    }

    /// The oldest seq still held (0 while nothing was dropped).
    fn first_seq(&self) -> u64 {
        self.chunks.front().map_or(self.next_seq, |c| c.0)
    }

    /// Chunks from `from` on (from the oldest held when `from` was dropped), at most
    /// `max_bytes` of them but at least one.
    fn read(&self, from: u64, max_bytes: u64) -> (Vec<ProcChunk>, u64) {
        let mut out = Vec::new();
        let mut taken = 0u64;
        let start = from.max(self.first_seq()).min(self.next_seq);
        let mut next = start;
        for (seq, stream, data) in self.chunks.iter().filter(|c| c.0 >= start) {
            if !out.is_empty() && taken + data.len() as u64 > max_bytes {
                break;
            }
            taken += data.len() as u64;
            out.push(ProcChunk::new(*seq, *stream, data));
            next = seq + 1;
        }
        (out, next)
    }
}

/// Why a process ended, as far as this side knows: a kill it asked for makes it `killed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    Natural,
    Requested,
}

struct Entry {
    info: ProcInfo,
    ring: Ring,
    /// Open while the process runs.
    control: Option<mpsc::Sender<Control>>,
    stdin: bool,
    input_next: u64,
    ending: Ending,
    /// Flips to `true` once it ended.
    ended: watch::Receiver<bool>,
}

impl Entry {
    fn snapshot(&self) -> ProcInfo {
        ProcInfo {
            next_seq: self.ring.next_seq,
            ..self.info.clone()
        }
    }
}

/// The processes of one session.
#[derive(Clone, Default)]
pub struct Procs {
    table: Arc<Mutex<Vec<Entry>>>,
}

fn no_proc(proc_id: &str) -> ProcError {
    ProcError::NoProc {
        proc_id: proc_id.to_string(),
    }
}

impl Procs {
    fn with<T>(&self, f: impl FnOnce(&mut Vec<Entry>) -> T) -> T {
        f(&mut self.table.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn with_proc<T>(
        &self,
        proc_id: &str,
        f: impl FnOnce(&mut Entry) -> Result<T, ProcError>,
    ) -> Result<T, ProcError> {
        self.with(|t| {
            let entry = t
                .iter_mut()
                .find(|e| e.info.proc_id == proc_id)
                .ok_or_else(|| no_proc(proc_id))?;
            f(entry)
        })
    }

    /// Whether any process still runs (the session is then not idle).
    pub fn any_running(&self) -> bool {
        self.with(|t| t.iter().any(|e| e.info.state == ProcState::Running))
    }

    /// Answers one call. `host` is the session's container, when it has one.
    pub async fn call(
        &self,
        call: ProcCall,
        host: Option<ProcHost>,
    ) -> Result<ProcReply, ProcError> {
        match call {
            ProcCall::Start {
                proc_id,
                tenant,
                output_subject,
                start,
            } => {
                let host = host.ok_or(ProcError::NotReady)?;
                let audit = AuditScope {
                    session_id: Some(start.session_id.clone()),
                    actor: start.requested_by.clone(),
                    tenant,
                    ..Default::default()
                };
                self.start(host, proc_id, output_subject, start, audit)
                    .await
                    .map(ProcReply::Started)
            }
            ProcCall::List { .. } => Ok(ProcReply::List(ProcList {
                procs: self.with(|t| t.iter().map(Entry::snapshot).collect()),
            })),
            ProcCall::Output(req) => self.output(&req).map(ProcReply::Output),
            ProcCall::Input(req) => self.input(&req).map(ProcReply::Input),
            ProcCall::Signal(req) => self.signal(&req).map(ProcReply::Info),
            ProcCall::Wait(req) => self.wait(&req).await.map(ProcReply::Info),
            ProcCall::Resize(req) => self.resize(&req).map(ProcReply::Info),
            // It needs the session's container between runs: the session actor runs it.
            ProcCall::Sync { .. } => Err(ProcError::SyncMisrouted),
        }
    }

    fn output(&self, req: &ProcOutputRequest) -> Result<ProcOutput, ProcError> {
        let max = req
            .max_bytes
            .unwrap_or(MAX_OUTPUT_REPLY_BYTES)
            .clamp(1, MAX_OUTPUT_REPLY_BYTES);
        self.with_proc(&req.proc_id, |e| {
            let (chunks, next_seq) = e.ring.read(req.from_seq, max);
            Ok(ProcOutput {
                chunks,
                next_seq,
                dropped_before: e.ring.first_seq(),
                state: e.info.state,
            })
        })
    }

    fn input(&self, req: &ProcInput) -> Result<ProcInputAck, ProcError> {
        let data = req.bytes()?;
        self.with_proc(&req.proc_id, |e| {
            match req.seq {
                // A retry of an input already written: answered again, not written twice.
                Some(seq) if seq < e.input_next => {
                    return Ok(ProcInputAck {
                        next_seq: e.input_next,
                    })
                }
                Some(seq) if seq > e.input_next => {
                    return Err(ProcError::InputOutOfOrder {
                        seq,
                        next: e.input_next,
                    })
                }
                _ => {}
            }
            if !e.stdin {
                return Err(ProcError::StdinClosed);
            }
            let control = e.control.as_ref().ok_or(ProcError::Ended)?;
            if control.capacity() < 2 {
                return Err(ProcError::InputBacklog);
            }
            if !data.is_empty() {
                control
                    .try_send(Control::Input(data))
                    .map_err(|_| ProcError::InputBacklog)?;
            }
            if req.eof {
                control
                    .try_send(Control::InputEnd)
                    .map_err(|_| ProcError::InputBacklog)?;
                if e.info.pty.is_none() {
                    e.stdin = false;
                }
            }
            e.input_next += 1;
            Ok(ProcInputAck {
                next_seq: e.input_next,
            })
        })
    }

    fn signal(&self, req: &ProcSignal) -> Result<ProcInfo, ProcError> {
        self.with_proc(&req.proc_id, |e| {
            if let Some(control) = &e.control {
                e.ending = Ending::Requested;
                send_signal(control, req.signal.number());
            }
            Ok(e.snapshot())
        })
    }

    fn resize(&self, req: &ProcResize) -> Result<ProcInfo, ProcError> {
        let size = PtySize {
            cols: req.cols,
            rows: req.rows,
        };
        size.validate()?;
        self.with_proc(&req.proc_id, |e| {
            if e.info.pty.is_none() {
                return Err(ProcError::NoTerminal);
            }
            if let Some(control) = &e.control {
                let _ = control.try_send(Control::Resize(PtyWinsize {
                    cols: req.cols,
                    rows: req.rows,
                }));
                e.info.pty = Some(size);
            }
            Ok(e.snapshot())
        })
    }

    async fn wait(&self, req: &ProcWait) -> Result<ProcInfo, ProcError> {
        let ms = req.timeout_ms.unwrap_or(MAX_WAIT_MS).min(MAX_WAIT_MS);
        let mut ended = self.with_proc(&req.proc_id, |e| Ok(e.ended.clone()))?;
        let _ = tokio::time::timeout(Duration::from_millis(ms), ended.wait_for(|done| *done)).await;
        self.with_proc(&req.proc_id, |e| Ok(e.snapshot()))
    }

    /// Makes room for one more process: at most [`MAX_PROCS`], of which the oldest ended one
    /// goes first; all running is 429.
    fn make_room(&self) -> Result<(), ProcError> {
        self.with(|t| {
            if t.len() < MAX_PROCS {
                return Ok(());
            }
            match t.iter().position(|e| e.info.state != ProcState::Running) {
                Some(i) => {
                    t.remove(i);
                    Ok(())
                }
                None => Err(ProcError::TooMany { max: MAX_PROCS }),
            }
        })
    }

    async fn start(
        &self,
        host: ProcHost,
        proc_id: String,
        subject: String,
        start: ProcStart,
        audit: AuditScope,
    ) -> Result<ProcStarted, ProcError> {
        self.make_room()?;
        let argv = start.command.argv();
        let cwd = match start.cwd.as_deref() {
            None | Some("") => WORKSPACE_DIR.to_string(),
            Some(abs) if abs.starts_with('/') => abs.to_string(),
            Some(rel) => format!("{WORKSPACE_DIR}/{rel}"),
        };
        let mut env = executor_node::job::base_env();
        if start.pty.is_some() {
            env.push(("TERM".into(), "xterm-256color".into()));
        }
        for (k, v) in &start.env {
            env.retain(|(name, _)| name != k);
            env.push((k.clone(), v.clone()));
        }
        // Its own proxy: what the process fetches is audited under it, and the proxy lives
        // as long as the process does, whatever runs come and go.
        let egress = match &host.egress {
            Some(doors) => Some(
                doors
                    .bind(&proc_id, audit.clone())
                    .map_err(ProcError::Egress)?,
            ),
            None => None,
        };
        let spec = ProcSpec {
            version: PROTOCOL_VERSION,
            argv: argv.clone(),
            env,
            cwd,
            stdin: start.stdin,
            pty: start.pty.map(|p| PtyWinsize {
                cols: p.cols,
                rows: p.rows,
            }),
            nofile: host.nofile,
            fsize_bytes: host.fsize_bytes,
            egress_socket: egress.as_ref().map(|e| e.socket_in_container()),
        };
        let (mut input, mut output) = open(&host).await?;
        let request = serde_json::to_vec(&spec).map_err(ProcError::Spec)?;
        let wire = protocol::encode_frame(FrameKind::Request, &request);
        input.write_all(&wire).await.map_err(ProcError::HostGone)?;
        let mut decoder = FrameDecoder::default();
        let mut early = Vec::new();
        let pid =
            tokio::time::timeout(START_WITHIN, started(&mut output, &mut decoder, &mut early))
                .await
                .map_err(|_| ProcError::StartTimeout)??;
        let started_at = messages::now_ms();
        let (ended_tx, ended_rx) = watch::channel(false);
        let (control_tx, control_rx) = mpsc::channel(CONTROL_BACKLOG);
        let info = ProcInfo {
            proc_id: proc_id.clone(),
            pid,
            argv,
            tag: start.tag.clone(),
            cwd: start.cwd.clone(),
            pty: start.pty,
            state: ProcState::Running,
            exit_code: None,
            signal: None,
            started_at,
            ended_at: None,
            next_seq: 0,
        };
        let mut entry = Entry {
            info,
            ring: Ring::default(),
            control: Some(control_tx),
            stdin: start.stdin || start.pty.is_some(),
            input_next: 0,
            ending: Ending::Natural,
            ended: ended_rx,
        };
        let publisher = Publisher {
            nats: host.nats.clone(),
            subject,
            auditor: host.auditor.clone(),
            audit,
        };
        let first: Vec<ProcChunk> = early
            .into_iter()
            .map(|(stream, data)| entry.ring.push(stream, data))
            .collect();
        self.with(|t| t.push(entry));
        tokio::spawn(write_controls(input, control_rx));
        let procs = self.clone();
        let id = proc_id.clone();
        tokio::spawn(async move {
            for chunk in first {
                publisher.publish(&ProcEvent::Output(chunk)).await;
            }
            let end = procs.follow(&id, output, decoder, &publisher).await;
            drop(egress);
            procs.finish(&id, end, &publisher).await;
            let _ = ended_tx.send(true);
        });
        if start.timeout_ms > 0 {
            let procs = self.clone();
            let id = proc_id.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(start.timeout_ms)).await;
                let _ = procs.with_proc(&id, |e| {
                    if let Some(control) = &e.control {
                        e.ending = Ending::Requested;
                        send_signal(control, 9);
                    }
                    Ok(())
                });
            });
        }
        Ok(ProcStarted {
            proc_id,
            pid,
            started_at,
        })
    }

    /// Reads the process's frames until it ended; `None`: the stream ended without saying
    /// how (its container went).
    async fn follow(
        &self,
        proc_id: &str,
        mut output: ExecOutput,
        mut decoder: FrameDecoder,
        publisher: &Publisher,
    ) -> Option<ProcEnd> {
        loop {
            loop {
                let frame = match decoder.next_frame() {
                    Ok(Some(frame)) => frame,
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(proc_id, error = %e, "garbage from a proc host");
                        return None;
                    }
                };
                let stream = match frame.0 {
                    FrameKind::Stdout => ProcStream::Stdout,
                    FrameKind::Stderr => ProcStream::Stderr,
                    FrameKind::Exited => return serde_json::from_slice(&frame.1).ok(),
                    _ => continue,
                };
                let chunk = self.with(|t| {
                    t.iter_mut()
                        .find(|e| e.info.proc_id == proc_id)
                        .map(|e| e.ring.push(stream, frame.1))
                });
                if let Some(chunk) = chunk {
                    publisher.publish(&ProcEvent::Output(chunk)).await;
                }
            }
            match output.next().await {
                Some(Ok(LogOutput::StdOut { message })) => decoder.push(&message),
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return None,
            }
        }
    }

    /// Records the process's end and says so live.
    async fn finish(&self, proc_id: &str, end: Option<ProcEnd>, publisher: &Publisher) {
        let info = self.with(|t| {
            let e = t.iter_mut().find(|e| e.info.proc_id == proc_id)?;
            e.control = None;
            e.stdin = false;
            e.info.ended_at = Some(messages::now_ms());
            let requested = e.ending == Ending::Requested;
            e.info.state = match &end {
                Some(ProcEnd::Exited { code }) => {
                    e.info.exit_code = Some(*code);
                    ProcState::Exited
                }
                Some(ProcEnd::Signaled { signal }) => {
                    e.info.signal = Some(*signal);
                    if requested {
                        ProcState::Killed
                    } else {
                        ProcState::Exited
                    }
                }
                // Failed after it started, or its container went: nobody else ends it.
                Some(ProcEnd::Failed { .. }) | None => ProcState::Killed,
            };
            Some(e.snapshot())
        });
        if let Some(info) = info {
            let ended = ProcessEnded {
                proc_id: info.proc_id.clone(),
                state: info.state,
                exit_code: info.exit_code,
                signal: info.signal,
            };
            publisher.auditor.emit(&publisher.audit, ended);
            publisher.publish(&ProcEvent::Ended(info)).await;
        }
    }
}

/// Queues a signal behind the controls before it, however full the backlog: a kill is never
/// dropped.
fn send_signal(control: &mpsc::Sender<Control>, signal: i32) {
    let control = control.clone();
    tokio::spawn(async move {
        let _ = control.send(Control::Signal(signal)).await;
    });
}

/// Starts `sandmesh-supervisor proc` in the container, attached.
async fn open(host: &ProcHost) -> Result<(ExecInput, ExecOutput), ProcError> {
    let options = CreateExecOptions {
        cmd: Some(vec![SUPERVISOR_PATH, "proc"]),
        attach_stdin: Some(true),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        tty: Some(false),
        ..Default::default()
    };
    let exec = host
        .docker
        .create_exec(&host.container, options)
        .await
        .map_err(ProcError::Exec)?;
    let started = host.docker.start_exec(&exec.id, None).await;
    match started.map_err(ProcError::Exec)? {
        StartExecResults::Attached { output, input } => Ok((input, output)),
        StartExecResults::Detached => Err(ProcError::NotAttached),
    }
}

/// Reads up to the proc host's `Started` (the pid), keeping output that came before it; a
/// program that could not start is 400 with the reason.
async fn started(
    output: &mut ExecOutput,
    decoder: &mut FrameDecoder,
    early: &mut Vec<(ProcStream, Vec<u8>)>,
) -> Result<u32, ProcError> {
    let mut log = String::new();
    loop {
        while let Some((kind, payload)) = decoder.next_frame().map_err(ProcError::Garbage)? {
            match kind {
                FrameKind::Started => {
                    return std::str::from_utf8(&payload)
                        .ok()
                        .and_then(|p| p.parse().ok())
                        .ok_or(ProcError::NoPid);
                }
                FrameKind::Stdout => early.push((ProcStream::Stdout, payload)),
                FrameKind::Stderr => early.push((ProcStream::Stderr, payload)),
                FrameKind::Exited => {
                    let why = match serde_json::from_slice::<ProcEnd>(&payload) {
                        Ok(ProcEnd::Failed { message }) => message,
                        other => format!("{other:?}"),
                    };
                    return Err(ProcError::DidNotStart { why });
                }
                _ => {}
            }
        }
        match output.next().await {
            Some(Ok(LogOutput::StdOut { message })) => decoder.push(&message),
            Some(Ok(LogOutput::StdErr { message })) if log.len() < 4096 => {
                log.push_str(&String::from_utf8_lossy(&message))
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(ProcError::HostStream(e)),
            None => {
                return Err(ProcError::HostEnded {
                    log: log.trim().to_string(),
                })
            }
        }
    }
}

/// Writes the controls in the order they were sent; ends (closing the proc host's stdin,
/// which kills its program) when the process's entry is gone or ended.
async fn write_controls(mut input: ExecInput, mut rx: mpsc::Receiver<Control>) {
    while let Some(control) = rx.recv().await {
        let frame = match control {
            Control::Input(data) => {
                let mut wire = Vec::with_capacity(data.len() + 16);
                let ok = protocol::write_chunked(&mut wire, FrameKind::Input, &data);
                if ok.is_err() {
                    continue;
                }
                wire
            }
            Control::InputEnd => protocol::encode_frame(FrameKind::InputEnd, b""),
            Control::Signal(n) => {
                protocol::encode_frame(FrameKind::Signal, n.to_string().as_bytes())
            }
            Control::Resize(size) => {
                let json = serde_json::to_vec(&size).expect("a size serialises");
                protocol::encode_frame(FrameKind::Resize, &json)
            }
        };
        if input.write_all(&frame).await.is_err() || input.flush().await.is_err() {
            return;
        }
    }
}

/// Publishes a process's live events on its output subject, and its end as an audit event.
struct Publisher {
    nats: async_nats::Client,
    subject: String,
    auditor: Auditor,
    audit: AuditScope,
}

impl Publisher {
    async fn publish(&self, event: &ProcEvent) {
        let Ok(payload) = Encoding::Json.encode(event) else {
            return;
        };
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(messages::codec::CONTENT_TYPE, Encoding::Json.content_type());
        if let Err(e) = self
            .nats
            .publish_with_headers(self.subject.clone(), headers, payload.into())
            .await
        {
            tracing::debug!(error = %e, "could not publish a process event");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_its_bound_and_says_what_it_dropped() {
        let mut ring = Ring::default();
        let chunk = vec![b'x'; 64 * 1024];
        for _ in 0..100 {
            ring.push(ProcStream::Stdout, chunk.clone());
        }
        assert!(ring.bytes <= OUTPUT_RING_BYTES, "{}", ring.bytes);
        let first = ring.first_seq();
        assert!(first > 0, "nothing dropped");
        // Asked from a dropped seq: from the oldest held on.
        let (chunks, next) = ring.read(0, 128 * 1024);
        assert_eq!(chunks[0].seq, first);
        assert_eq!(chunks.len(), 2);
        assert_eq!(next, first + 2);
        // At least one chunk, however small the page.
        assert_eq!(ring.read(first, 1).0.len(), 1);
        // Past the end: nothing, and the same place.
        assert_eq!(ring.read(100, 1024), (vec![], 100));
    }
}
