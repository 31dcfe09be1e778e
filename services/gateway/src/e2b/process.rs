//! envd's `process.Process` service: every command is a session process of the mesh
//! ([`super::process_streams`]), as every command is one of envd's. envd's `Start` does not say
//! whether the caller will wait for the end (`commands.run`) or keep a handle
//! (`background=True`): both are the same process, which outlives its stream, takes input and
//! signals, and can be re-attached to; what it writes reaches the session's workspace before
//! the next `files.*` read (the store asks the node to sync first). This module holds what the
//! streams share: envd's events (`start{pid}`, `data{stdout|stderr|pty}`, `end{exitCode, exited,
//! status, error}`), the relay with its keepalives, and how a command's words and directory map
//! into the sandbox.
//!
//! A run that waits for a person's approval says so at once on stderr
//! (`awaiting approval <confirmation id>`) and the stream stays open, with keepalives, until
//! the decision or the caller's deadline; a denial ends with exit code 126 and the reason.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::http::HeaderMap;
use axum::response::Response;
use base64::Engine;
use bytes::Bytes;
use futures::channel::mpsc;
use futures::{SinkExt, Stream, StreamExt};
use messages::proc::PtySize;
use serde::Deserialize;
use serde_json::{json, Value};

use super::connect;
use super::{workspace_path, E2bError, HOME};
use crate::api::App;

/// How often an idle stream says it is alive when the caller names no interval
/// (`Keepalive-Ping-Interval`, seconds; the SDKs send 50).
const KEEPALIVE: Duration = Duration::from_secs(50);
/// The exit code of a command a person (or the policy) refused, as a shell reports a command
/// it may not execute.
pub const EXIT_REFUSED: i32 = 126;
/// Frames a slow reader may fall behind before the relay waits for it.
pub const BACKLOG: usize = 64;

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

fn millis_header(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.trim().parse().ok()
}

/// The caller's keepalive interval (`Keepalive-Ping-Interval`, seconds).
pub fn keepalive(headers: &HeaderMap) -> Duration {
    millis_header(headers, "keepalive-ping-interval")
        .map(|s| Duration::from_secs(s.clamp(1, 300)))
        .unwrap_or(KEEPALIVE)
}

/// How long a start may wait (for a person's approval), bounded by the caller's deadline
/// (`Connect-Timeout-Ms`) within the gateway's own.
pub fn wait(app: &App, headers: &HeaderMap) -> Duration {
    millis_header(headers, "connect-timeout-ms")
        .map(Duration::from_millis)
        .map_or(app.limits.exec_timeout, |d| d.min(app.limits.exec_timeout))
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
    fn the_sdks_bash_script_runs_as_is_and_home_maps_to_the_workspace() {
        let run = config("/bin/bash", &["-l", "-c", "echo hi && ls"], None);
        assert_eq!(bash_script(&run), Some("echo hi && ls"));
        assert_eq!(bash_script(&config("python3", &["-c", "1"], None)), None);
        assert_eq!(
            run_dir(Some("/home/user/src")).unwrap().as_deref(),
            Some("src")
        );
        assert_eq!(run_dir(Some("/tmp")).unwrap().as_deref(), Some("/tmp"));
        assert_eq!(run_dir(Some(HOME)).unwrap(), None);
        assert_eq!(run_dir(None).unwrap(), None);
        assert!(run_dir(Some("/home/user/../etc")).is_err());
    }
}
