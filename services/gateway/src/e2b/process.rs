//! envd's `process.Process` service. `Start` runs the command as a shell execution in the
//! session and streams it in envd's events: `start{pid}` at once, `data{stdout|stderr}` as
//! the output comes, then `end{exitCode, exited, status, error}`.
//!
//! A run that waits for a person's approval says so at once on stderr
//! (`awaiting approval <confirmation id>`) and the stream stays open, with keepalives, until
//! the decision or the caller's deadline; a denial ends with exit code 126 and the reason.
//!
//! The pid is the facade's own number for the run: an execution of the mesh has no process of
//! its own to name.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::extract::Request;
use axum::http::HeaderMap;
use base64::Engine;
use bytes::Bytes;
use futures::channel::mpsc;
use futures::{SinkExt, StreamExt};
use messages::exec::{ExecRequest, ExecResult, ExecStatus, Language, OutputStream};
use serde::Deserialize;
use serde_json::{json, Value};

use super::connect::{self, Shape};
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
const BACKLOG: usize = 64;

/// The facade's run numbers (E2B's pids).
static PIDS: AtomicU32 = AtomicU32::new(1000);

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ProcessConfig {
    cmd: String,
    args: Vec<String>,
    envs: std::collections::BTreeMap<String, String>,
    cwd: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct StartRequest {
    process: ProcessConfig,
    pty: Option<Value>,
    stdin: Option<bool>,
}

/// `'…'` for a POSIX shell.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The shell code of a command: the script of `bash -l -c <script>` (how the SDKs send every
/// `commands.run`), anything else quoted word by word.
fn shell_code(process: &ProcessConfig) -> Result<String, E2bError> {
    let script = match (process.cmd.as_str(), process.args.as_slice()) {
        ("/bin/bash" | "bash" | "/bin/sh" | "sh", [.., flag, script])
            if flag == "-c" || flag == "-lc" =>
        {
            script.clone()
        }
        ("", _) => return Err(E2bError::invalid("process.cmd is empty")),
        (cmd, args) => std::iter::once(cmd)
            .chain(args.iter().map(String::as_str))
            .map(shell_quote)
            .collect::<Vec<_>>()
            .join(" "),
    };
    // The run starts in the workspace (`/home/user`); another directory is entered first.
    let cd = match process.cwd.as_deref() {
        None | Some("") => None,
        Some(cwd) if cwd == HOME || cwd.starts_with(&format!("{HOME}/")) => {
            Some(workspace_path(cwd)?).filter(|p| !p.is_empty())
        }
        Some(cwd) => Some(cwd.to_string()),
    };
    Ok(match cd {
        Some(dir) => format!("cd {} || exit 1\n{script}", shell_quote(&dir)),
        None => script,
    })
}

fn millis_header(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.trim().parse().ok()
}

/// One `process.Process` call.
pub async fn serve(app: &App, method: &str, req: Request) -> E2bReply {
    let sandbox = Sandbox::from_headers(app, req.headers()).await?;
    match method {
        "Start" => start(app, sandbox, req).await,
        other => Err(E2bError::unsupported(&format!(
            "process.Process/{other} (background commands, stdin, signals and PTYs need \
             long-lived processes in a session)"
        ))),
    }
}

async fn start(app: &App, sandbox: Sandbox, req: Request) -> E2bReply {
    let deadline = millis_header(req.headers(), "connect-timeout-ms");
    let keepalive = millis_header(req.headers(), "keepalive-ping-interval")
        .map(|s| Duration::from_secs(s.clamp(1, 300)))
        .unwrap_or(KEEPALIVE);
    let start: StartRequest = connect::request(req, Shape::ServerStream).await?;
    if start.pty.is_some() {
        return Err(E2bError::unsupported("PTYs"));
    }
    if start.stdin == Some(true) {
        return Err(E2bError::unsupported("stdin for commands"));
    }
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
    let wait = deadline
        .map(Duration::from_millis)
        .map_or(app.limits.exec_timeout, |d| d.min(app.limits.exec_timeout));
    let mut events = crate::stream::events(sandbox.agent.mesh.clone(), exec, wait).await?;
    let pid = PIDS.fetch_add(1, Ordering::Relaxed);
    let (mut frames, body) = mpsc::channel::<Bytes>(BACKLOG);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + keepalive, keepalive);
        let _ = frames.send(event(json!({"start": {"pid": pid}}))).await;
        loop {
            let next = tokio::select! {
                next = events.next() => Some(next),
                _ = tick.tick() => None,
            };
            let (frame, last) = match next {
                None => (event(json!({"keepalive": {}})), false),
                Some(Some(ExecEvent::Output(chunk))) => {
                    (data(chunk.stream, chunk.data.as_bytes()), false)
                }
                Some(Some(ExecEvent::Awaiting(notice))) => (
                    data(OutputStream::Stderr, awaiting_line(&notice).as_bytes()),
                    false,
                ),
                Some(Some(ExecEvent::Done(outcome))) => (closing(*outcome), true),
                Some(None) => (
                    closing(Err(E2bError::new(
                        super::Code::Internal,
                        "the execution's events ended without a result",
                    ))),
                    true,
                ),
            };
            // A failed send: the caller went away, and the run goes on to its result.
            if frames.send(frame).await.is_err() || last {
                return;
            }
        }
    });
    Ok(connect::stream_response(body))
}

/// The stream's last frames: the `end` event and a clean end of stream, or the failure the
/// stream ends with.
fn closing(outcome: Result<ExecResult, impl Into<E2bError>>) -> Bytes {
    match outcome {
        Ok(result) => {
            let mut frames = end(&result).to_vec();
            frames.extend_from_slice(&connect::end_of_stream(None));
            Bytes::from(frames)
        }
        Err(e) => connect::end_of_stream(Some(&e.into())),
    }
}

fn event(event: Value) -> Bytes {
    connect::envelope(0, &json!({ "event": event }))
}

fn data(stream: OutputStream, bytes: &[u8]) -> Bytes {
    let name = match stream {
        OutputStream::Stdout => "stdout",
        OutputStream::Stderr => "stderr",
    };
    let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
    event(json!({"data": { name: encoded }}))
}

/// envd's `end` event for a result: the exit code, and for runs that did not run to their own
/// exit, the code a shell would give and why.
fn end(result: &ExecResult) -> Bytes {
    let reason = || {
        result
            .confirmation
            .reason
            .clone()
            .or_else(|| result.error.as_ref().map(|e| e.message.clone()))
            .unwrap_or_else(|| result.status.as_str().to_string())
    };
    let (code, error) = match result.status {
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
    };
    let mut end = json!({
        "exitCode": code,
        "exited": true,
        "status": format!("exit status {code}"),
    });
    if let Some(error) = error {
        end["error"] = Value::String(error);
    }
    event(json!({ "end": end }))
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
        let frame = end(&result);
        let json: Value = serde_json::from_slice(&frame[5..]).unwrap();
        assert_eq!(json["event"]["end"]["exitCode"], 126);
        assert!(json["event"]["end"]["error"]
            .as_str()
            .unwrap()
            .contains("not today"));
    }
}
