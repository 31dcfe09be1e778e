//! envd's `process.Process` service. A command the caller can come back to — one started with
//! `stdin`, a PTY or a tag — is a session process of the mesh ([`super::process_streams`]); any
//! other command is a shell execution in the session, streamed in envd's events: `start{pid}`
//! at once, `data{stdout|stderr}` as the output comes, then `end{exitCode, exited, status,
//! error}`.
//!
//! Why two: envd's `Start` does not say whether the caller will wait for the end
//! (`commands.run`) or keep a handle (`background=True`), and the two mesh paths differ in what
//! users rely on. An execution hands the files it changed to the session's workspace, which
//! `files.*` reads at once; a process does not, but outlives its stream, takes input and
//! signals, and can be re-attached to. The request's own fields pick the path.
//!
//! A run that waits for a person's approval says so at once on stderr
//! (`awaiting approval <confirmation id>`) and the stream stays open, with keepalives, until
//! the decision or the caller's deadline; a denial ends with exit code 126 and the reason.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::http::HeaderMap;
use axum::response::Response;
use base64::Engine;
use bytes::Bytes;
use futures::channel::mpsc;
use futures::{SinkExt, Stream, StreamExt};
use messages::exec::{ExecRequest, ExecResult, ExecStatus, Language, OutputStream};
use messages::proc::PtySize;
use serde::Deserialize;
use serde_json::{json, Value};

use super::connect;
use super::{awaiting_line, workspace_path, E2bError, E2bReply, Sandbox, HOME};
use crate::api::App;
use crate::stream::ExecEvent;

/// How often an idle stream says it is alive when the caller names no interval
/// (`Keepalive-Ping-Interval`, seconds; the SDKs send 50).
const KEEPALIVE: Duration = Duration::from_secs(50);
/// The exit code of a command a person (or the policy) refused, as a shell reports a command
/// it may not execute.
pub const EXIT_REFUSED: i32 = 126;
/// Frames a slow reader may fall behind before the relay waits for it.
pub const BACKLOG: usize = 64;

/// The pids of executions: numbers of the facade's own, counted from 2^31. Processes' pids
/// (below 2^31, [`processes`]) and the sandbox's real ones never reach this range, so no
/// selector names an execution: it cannot be signalled or re-attached to.
static EXEC_PIDS: AtomicU32 = AtomicU32::new(1 << 31);

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ProcessConfig {
    pub cmd: String,
    pub args: Vec<String>,
    pub envs: BTreeMap<String, String>,
    pub cwd: Option<String>,
}

/// envd's `PTY`: `{"size": {"cols", "rows"}}` (proto3 JSON leaves out zeros).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Pty {
    pub size: PtyCells,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct PtyCells {
    pub cols: u32,
    pub rows: u32,
}

impl Pty {
    /// The mesh's terminal size; out of its range: invalid.
    pub fn size(&self) -> Result<PtySize, E2bError> {
        let cells = |n: u32| u16::try_from(n).ok();
        let size = match (cells(self.size.cols), cells(self.size.rows)) {
            (Some(cols), Some(rows)) => PtySize { cols, rows },
            _ => return Err(E2bError::invalid("pty.size: cols and rows are 1..=1000")),
        };
        size.validate()
            .map_err(|e| E2bError::invalid(format!("pty.size: {e}")))?;
        Ok(size)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct StartRequest {
    pub process: ProcessConfig,
    pub pty: Option<Pty>,
    pub tag: Option<String>,
    pub stdin: Option<bool>,
}

impl StartRequest {
    /// Whether the caller can come back to the command (input, a terminal, a name): then it
    /// is a session process, else an execution.
    pub fn is_process(&self) -> bool {
        self.pty.is_some() || self.stdin == Some(true) || self.tag.is_some()
    }
}

/// `'…'` for a POSIX shell.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The script of `bash -l -c <script>` (how the SDKs send every `commands.run`), or `None` for
/// a program and its arguments.
pub fn bash_script(process: &ProcessConfig) -> Option<&str> {
    match (process.cmd.as_str(), process.args.as_slice()) {
        ("/bin/bash" | "bash" | "/bin/sh" | "sh", [.., flag, script])
            if flag == "-c" || flag == "-lc" =>
        {
            Some(script)
        }
        _ => None,
    }
}

/// The directory a command runs in, as the mesh names it: `None` for the workspace,
/// a workspace-relative path under `/home/user`, any other absolute path as it is.
pub fn run_dir(cwd: Option<&str>) -> Result<Option<String>, E2bError> {
    match cwd {
        None | Some("") => Ok(None),
        Some(cwd) if cwd == HOME || cwd.starts_with(&format!("{HOME}/")) => {
            Ok(Some(workspace_path(cwd)?).filter(|p| !p.is_empty()))
        }
        Some(cwd) => Ok(Some(cwd.to_string())),
    }
}

/// The shell code of a command run as an execution: its bash script, or its words quoted,
/// after a `cd` into another directory than the workspace (where a run starts).
fn shell_code(process: &ProcessConfig) -> Result<String, E2bError> {
    if process.cmd.is_empty() {
        return Err(E2bError::invalid("process.cmd is empty"));
    }
    let script = match bash_script(process) {
        Some(script) => script.to_string(),
        None => std::iter::once(&process.cmd)
            .chain(&process.args)
            .map(|word| shell_quote(word))
            .collect::<Vec<_>>()
            .join(" "),
    };
    Ok(match run_dir(process.cwd.as_deref())? {
        Some(dir) => format!("cd {} || exit 1\n{script}", shell_quote(&dir)),
        None => script,
    })
}

fn millis_header(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.trim().parse().ok()
}

/// The caller's keepalive interval (`Keepalive-Ping-Interval`, seconds).
pub fn keepalive(headers: &HeaderMap) -> Duration {
    millis_header(headers, "keepalive-ping-interval")
        .map(|s| Duration::from_secs(s.clamp(1, 300)))
        .unwrap_or(KEEPALIVE)
}

/// The caller's deadline (`Connect-Timeout-Ms`) bounding a wait, within the gateway's own.
pub fn deadline(app: &App, headers: &HeaderMap) -> (Option<u64>, Duration) {
    let ms = millis_header(headers, "connect-timeout-ms");
    let wait = ms
        .map(Duration::from_millis)
        .map_or(app.limits.exec_timeout, |d| d.min(app.limits.exec_timeout));
    (ms, wait)
}

/// `Start` of a command that is no session process: one execution of the mesh, streamed.
pub async fn start_exec(
    sandbox: Sandbox,
    start: StartRequest,
    deadline: Option<u64>,
    wait: Duration,
    keepalive: Duration,
) -> E2bReply {
    let exec = ExecRequest {
        session_id: Some(sandbox.id.clone()),
        language: Language::Shell,
        code: shell_code(&start.process)?,
        env: start.process.envs,
        timeout_ms: deadline,
        requested_by: Some(format!("e2b key {}", sandbox.agent.caller.key_id)),
        ..Default::default()
    };
    // The caller's deadline bounds the whole wait (approval included), within the gateway's.
    let events = crate::stream::events(sandbox.agent.mesh.clone(), exec, wait).await?;
    let pid = EXEC_PIDS.fetch_add(1, Ordering::Relaxed);
    let frames = events.map(|event| match event {
        ExecEvent::Output(chunk) => Frame::more(data(chunk.stream, chunk.data.as_bytes())),
        ExecEvent::Awaiting(notice) => Frame::more(data(
            OutputStream::Stderr,
            awaiting_line(&notice.confirmation_id).as_bytes(),
        )),
        ExecEvent::Done(outcome) => Frame::last(closing(*outcome)),
    });
    let first = futures::stream::iter([Frame::more(started(pid))]);
    Ok(relay(first.chain(frames), keepalive))
}

// === the stream ===

/// One frame for the caller, and whether it ends the stream.
pub struct Frame {
    bytes: Bytes,
    last: bool,
}

impl Frame {
    pub fn more(bytes: Bytes) -> Self {
        Self { bytes, last: false }
    }

    pub fn last(bytes: Bytes) -> Self {
        Self { bytes, last: true }
    }

    /// The stream ends with `e` (Connect's end-of-stream error).
    pub fn failed(e: impl Into<E2bError>) -> Self {
        Self::last(connect::end_of_stream(Some(&e.into())))
    }
}

/// The response relaying `frames` to the caller, with envd's keepalive whenever `keepalive`
/// passes after the first frame (the SDKs read the first as the stream's `start`). A source
/// that stops before its last frame ends the stream with an error, never silently. A caller
/// that goes away stops the relay, not what it relays.
pub fn relay(frames: impl Stream<Item = Frame> + Send + 'static, keepalive: Duration) -> Response {
    let (mut out, body) = mpsc::channel::<Bytes>(BACKLOG);
    tokio::spawn(async move {
        let mut frames = std::pin::pin!(frames);
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + keepalive, keepalive);
        let mut opened = false;
        loop {
            let frame = tokio::select! {
                next = frames.next() => next.unwrap_or_else(|| Frame::failed(E2bError::new(
                    super::Code::Internal,
                    "the command's events ended without its end",
                ))),
                _ = tick.tick(), if opened => Frame::more(event(json!({"keepalive": {}}))),
            };
            opened = true;
            if out.send(frame.bytes).await.is_err() || frame.last {
                return;
            }
        }
    });
    connect::stream_response(body)
}

/// The stream's last frames: the `end` event and a clean end of stream, or the failure the
/// stream ends with.
fn closing(outcome: Result<ExecResult, impl Into<E2bError>>) -> Bytes {
    match outcome {
        Ok(result) => {
            let (code, error) = exit_of(&result);
            finish(&End::exited(code, error))
        }
        Err(e) => connect::end_of_stream(Some(&e.into())),
    }
}

pub fn event(event: Value) -> Bytes {
    connect::envelope(0, &json!({ "event": event }))
}

/// The `start` event: the first of every process stream.
pub fn started(pid: u32) -> Bytes {
    event(json!({"start": {"pid": pid}}))
}

/// A `data` event: `stdout`, `stderr` or `pty` bytes.
pub fn output(name: &str, bytes: &[u8]) -> Bytes {
    let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
    event(json!({"data": { name: encoded }}))
}

fn data(stream: OutputStream, bytes: &[u8]) -> Bytes {
    let name = match stream {
        OutputStream::Stdout => "stdout",
        OutputStream::Stderr => "stderr",
    };
    output(name, bytes)
}

/// envd's `end` event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct End {
    pub exit_code: i32,
    /// Whether the program exited by itself (not by a signal).
    pub exited: bool,
    /// Go's `ProcessState.String()`, as envd reports it: `exit status 3`, `signal: killed`.
    pub status: String,
    pub error: Option<String>,
}

impl End {
    pub fn exited(code: i32, error: Option<String>) -> Self {
        Self {
            exit_code: code,
            exited: true,
            status: format!("exit status {code}"),
            error,
        }
    }
}

/// The `end` event and a clean end of stream: a stream's last frames.
pub fn finish(end: &End) -> Bytes {
    let mut body = json!({
        "exitCode": end.exit_code,
        "exited": end.exited,
        "status": end.status,
    });
    if let Some(error) = &end.error {
        body["error"] = Value::String(error.clone());
    }
    let mut frames = event(json!({ "end": body })).to_vec();
    frames.extend_from_slice(&connect::end_of_stream(None));
    Bytes::from(frames)
}

/// The exit code of a result, and for runs that did not run to their own exit, the code a
/// shell would give and why.
fn exit_of(result: &ExecResult) -> (i32, Option<String>) {
    let reason = || {
        result
            .confirmation
            .reason
            .clone()
            .or_else(|| result.error.as_ref().map(|e| e.message.clone()))
            .unwrap_or_else(|| result.status.as_str().to_string())
    };
    match result.status {
        ExecStatus::Ok | ExecStatus::Error => (result.exit_code.unwrap_or(1) as i32, None),
        ExecStatus::Denied | ExecStatus::Rejected => (
            EXIT_REFUSED,
            Some(format!("{}: {}", result.status.as_str(), reason())),
        ),
        ExecStatus::Timeout => (124, Some(format!("timeout: {}", reason()))),
        ExecStatus::Oom | ExecStatus::Killed => (137, Some(reason())),
        _ => (
            result.exit_code.unwrap_or(1) as i32,
            Some(format!("{}: {}", result.status.as_str(), reason())),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(cmd: &str, args: &[&str], cwd: Option<&str>) -> ProcessConfig {
        ProcessConfig {
            cmd: cmd.into(),
            args: args.iter().map(|a| a.to_string()).collect(),
            cwd: cwd.map(str::to_string),
            ..Default::default()
        }
    }

    #[test]
    fn the_sdks_bash_script_runs_as_is_and_other_commands_are_quoted() {
        let run = config("/bin/bash", &["-l", "-c", "echo hi && ls"], None);
        assert_eq!(shell_code(&run).unwrap(), "echo hi && ls");
        let argv = config("python3", &["-c", "print('a b')"], None);
        assert_eq!(
            shell_code(&argv).unwrap(),
            r#"'python3' '-c' 'print('\''a b'\'')'"#
        );
        let home = config("/bin/bash", &["-l", "-c", "pwd"], Some("/home/user/src"));
        assert_eq!(shell_code(&home).unwrap(), "cd 'src' || exit 1\npwd");
        let tmp = config("/bin/bash", &["-l", "-c", "pwd"], Some("/tmp"));
        assert_eq!(shell_code(&tmp).unwrap(), "cd '/tmp' || exit 1\npwd");
        assert_eq!(
            shell_code(&config("/bin/bash", &["-l", "-c", "pwd"], Some(HOME))).unwrap(),
            "pwd"
        );
        assert!(shell_code(&config("", &[], None)).is_err());
    }

    #[test]
    fn a_denied_run_ends_126_with_the_reason() {
        let result = ExecResult {
            status: ExecStatus::Denied,
            confirmation: messages::exec::ConfirmationOutcome {
                decision: messages::exec::Decision::Denied,
                reason: Some("not today".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let frame = closing(Ok::<_, E2bError>(result));
        let length = u32::from_be_bytes([frame[1], frame[2], frame[3], frame[4]]) as usize;
        let json: Value = serde_json::from_slice(&frame[5..5 + length]).unwrap();
        assert_eq!(json["event"]["end"]["exitCode"], 126);
        assert!(json["event"]["end"]["error"]
            .as_str()
            .unwrap()
            .contains("not today"));
        assert_eq!(frame[5 + length], connect::FLAG_END_STREAM);
    }
}
