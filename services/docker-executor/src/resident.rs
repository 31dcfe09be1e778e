//! A container's resident supervisor (`sandmesh-supervisor serve`): one `docker exec` for the
//! container's life. Each execution writes its request to that exec's stdin and reads its
//! frames, up to `Done`, from its stdout — instead of paying a `docker exec` of its own, which
//! costs tens of milliseconds of dockerd, containerd and runc work per run.
//!
//! The stream is owned by the container's [`crate::lease::ContainerLease`] and goes with it.
//! An execution that does not end cleanly (no report, a deadline, garbage) drops the stream,
//! and its container is not reused.

use std::pin::Pin;
use std::time::Duration;

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::Docker;
use futures::{Stream, StreamExt};
use sandbox_protocol::{FrameDecoder, FrameKind};
use tokio::io::AsyncWrite;

use crate::docker::{DockerError, SUPERVISOR_PATH};

/// How long a resident supervisor may take to say `Ready`: with `--warm`, three interpreters'
/// first starts through a cold overlay on a busy host.
const READY_WITHIN: Duration = Duration::from_secs(60);
/// How much of the supervisor's stderr before `Ready` is kept for the error message.
const MAX_START_LOG: usize = 4 * 1024;

pub type ExecInput = Pin<Box<dyn AsyncWrite + Send>>;
pub type ExecOutput = Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>;

/// The attached streams of a container's resident supervisor, at a run boundary.
pub struct Resident {
    pub exec_id: String,
    pub input: ExecInput,
    pub output: ExecOutput,
}

impl Resident {
    /// Starts `sandmesh-supervisor serve` in `container` and waits for its `Ready`. With
    /// `warm`, it first starts each interpreter once (a warm pool container's preparation,
    /// which also proves the container can run an execution).
    pub async fn start(docker: &Docker, container: &str, warm: bool) -> Result<Self, DockerError> {
        let mut cmd = vec![SUPERVISOR_PATH, "serve"];
        if warm {
            cmd.push("--warm");
        }
        let options = CreateExecOptions {
            cmd: Some(cmd),
            attach_stdin: Some(true),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            tty: Some(false),
            ..Default::default()
        };
        let exec = docker
            .create_exec(container, options)
            .await
            .map_err(|e| DockerError::api("supervisor exec", container, e))?;
        let started = docker
            .start_exec(&exec.id, None)
            .await
            .map_err(|e| DockerError::api("supervisor start", container, e))?;
        let StartExecResults::Attached { mut output, input } = started else {
            return Err(DockerError::failed(
                "supervisor start",
                container,
                "not attached",
            ));
        };
        let mut decoder = FrameDecoder::default();
        let mut log = String::new();
        let deadline = tokio::time::Instant::now() + READY_WITHIN;
        loop {
            let item = match tokio::time::timeout_at(deadline, output.next()).await {
                Err(_) => {
                    let why = format!("not ready within {READY_WITHIN:?}: {log}");
                    return Err(DockerError::failed("supervisor start", container, why));
                }
                Ok(None) => {
                    let code = docker
                        .inspect_exec(&exec.id)
                        .await
                        .ok()
                        .and_then(|i| i.exit_code);
                    let why = format!("ended before it was ready (exit code {code:?}): {log}");
                    return Err(DockerError::failed("supervisor start", container, why));
                }
                Ok(Some(item)) => {
                    item.map_err(|e| DockerError::api("supervisor start", container, e))?
                }
            };
            match item {
                LogOutput::StdOut { message } => {
                    decoder.push(&message);
                    match decoder.next_frame() {
                        Ok(None) => {}
                        // Nothing may follow `Ready` before the first request.
                        Ok(Some((FrameKind::Ready, _))) if decoder.is_empty() => {
                            return Ok(Self {
                                exec_id: exec.id,
                                input,
                                output,
                            })
                        }
                        other => {
                            let why = format!("said {other:?} instead of ready");
                            return Err(DockerError::failed("supervisor start", container, why));
                        }
                    }
                }
                LogOutput::StdErr { message } => {
                    let room = MAX_START_LOG.saturating_sub(log.len());
                    log.push_str(&String::from_utf8_lossy(
                        &message[..message.len().min(room)],
                    ));
                }
                _ => {}
            }
        }
    }
}
