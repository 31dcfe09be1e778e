//! Running one command for `/v1/shell/exec` and `/v1/bash/exec`, and one program for
//! stateless `/v1/code/execute` and `/v1/nodejs/execute`.
//!
//! The command text is written to a script file and run as `bash <file>` (or `python3`,
//! `node`), so its length is not bounded by the kernel's 128 KiB limit on one argument. It runs in its own process
//! group; when it exits, times out, or the request is dropped, the whole group is killed
//! (children it left running included). Output past the cap is counted, not kept.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt};

/// The API key never reaches the commands' environment.
pub const API_KEY_VAR: &str = "SANDBOX_API_KEY";

/// Which program runs the script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interpreter {
    Bash,
    Python,
    Node,
}

impl Interpreter {
    fn program(self) -> &'static str {
        match self {
            Interpreter::Bash => "bash",
            Interpreter::Python => "python3",
            Interpreter::Node => "node",
        }
    }

    fn extension(self) -> &'static str {
        match self {
            Interpreter::Bash => "sh",
            Interpreter::Python => "py",
            Interpreter::Node => "js",
        }
    }
}

/// What to run.
#[derive(Debug)]
pub struct Command {
    pub interpreter: Interpreter,
    pub script: String,
    pub cwd: PathBuf,
    pub env: BTreeMap<String, String>,
    pub timeout: Duration,
    /// Bytes kept per stream.
    pub cap: usize,
    /// One stream, as a terminal shows it (`/v1/shell/exec`; bash only).
    pub merge_stderr: bool,
    /// Given on standard input (else it is empty).
    pub stdin: Option<Vec<u8>>,
}

#[derive(Debug, Default)]
pub struct Outcome {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// `None` when killed by a signal or on timeout.
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    pub truncated: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("writing the command's script to {path}")]
    Script {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("starting bash")]
    Spawn(#[source] std::io::Error),
    #[error("waiting for the command")]
    Wait(#[source] std::io::Error),
}

/// Runs commands with scripts kept in `script_dir`.
#[derive(Debug)]
pub struct Runner {
    script_dir: PathBuf,
    next: AtomicU64,
}

impl Runner {
    pub fn new(script_dir: PathBuf) -> Self {
        Self {
            script_dir,
            next: AtomicU64::new(0),
        }
    }

    pub async fn run(&self, cmd: Command) -> Result<Outcome, ExecError> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let path = self.script_dir.join(format!(
            "cmd-{}-{n}.{}",
            std::process::id(),
            cmd.interpreter.extension()
        ));
        let script = if cmd.merge_stderr && cmd.interpreter == Interpreter::Bash {
            format!("exec 2>&1\n{}\n", cmd.script)
        } else {
            format!("{}\n", cmd.script)
        };
        tokio::fs::write(&path, script)
            .await
            .map_err(|source| ExecError::Script {
                path: path.clone(),
                source,
            })?;
        let result = run_script(&path, &cmd).await;
        tokio::fs::remove_file(&path).await.ok();
        result
    }
}

/// Kills the process group when dropped: a request that is cancelled (client gone) leaves
/// nothing running.
struct GroupGuard(Option<Pid>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            // ESRCH: the group is already gone.
            killpg(pid, Signal::SIGKILL).ok();
        }
    }
}

async fn run_script(path: &Path, cmd: &Command) -> Result<Outcome, ExecError> {
    let mut child = tokio::process::Command::new(cmd.interpreter.program())
        .arg(path)
        .current_dir(&cmd.cwd)
        .env_remove(API_KEY_VAR)
        .envs(&cmd.env)
        .stdin(if cmd.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(ExecError::Spawn)?;
    let guard = GroupGuard(child.id().map(|id| Pid::from_raw(id as i32)));
    if let (Some(mut pipe), Some(input)) = (child.stdin.take(), cmd.stdin.clone()) {
        // A program that does not read its input must not block the answer.
        tokio::spawn(async move {
            tokio::io::AsyncWriteExt::write_all(&mut pipe, &input)
                .await
                .ok();
        });
    }
    let stdout = Capped::new(cmd.cap);
    let stderr = Capped::new(cmd.cap);
    let readers = [
        tokio::spawn(drain(child.stdout.take(), stdout.clone())),
        tokio::spawn(drain(child.stderr.take(), stderr.clone())),
    ];
    let (exit_code, timed_out) = match tokio::time::timeout(cmd.timeout, child.wait()).await {
        Ok(status) => (status.map_err(ExecError::Wait)?.code(), false),
        Err(_) => (None, true),
    };
    // Kill what the command left behind, so the pipes close and the readers end.
    drop(guard);
    child.kill().await.ok();
    for reader in readers {
        // A process that left the group (setsid) may still hold a pipe open: do not wait
        // for it beyond a moment.
        if tokio::time::timeout(Duration::from_secs(1), reader)
            .await
            .is_err()
        {
            eprintln!("sandmesh-aio-agent: an output pipe stayed open after the command ended");
        }
    }
    let (stdout, out_cut) = stdout.take();
    let (stderr, err_cut) = stderr.take();
    Ok(Outcome {
        stdout,
        stderr,
        exit_code,
        timed_out,
        truncated: out_cut || err_cut,
    })
}

/// A byte buffer that keeps the first `cap` bytes and remembers whether more came.
#[derive(Clone)]
struct Capped(Arc<Mutex<(Vec<u8>, bool)>>, usize);

impl Capped {
    fn new(cap: usize) -> Self {
        Self(Arc::new(Mutex::new((Vec::new(), false))), cap)
    }

    fn push(&self, bytes: &[u8]) {
        let mut guard = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let room = self.1.saturating_sub(guard.0.len());
        if bytes.len() > room {
            guard.1 = true;
        }
        guard.0.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    fn take(&self) -> (Vec<u8>, bool) {
        let mut guard = self.0.lock().unwrap_or_else(|p| p.into_inner());
        (std::mem::take(&mut guard.0), guard.1)
    }
}

async fn drain(pipe: Option<impl AsyncRead + Unpin>, into: Capped) {
    let Some(mut pipe) = pipe else { return };
    let mut buf = vec![0u8; 16 * 1024];
    while let Ok(n) = pipe.read(&mut buf).await {
        if n == 0 {
            break;
        }
        into.push(&buf[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command(script: &str) -> Command {
        Command {
            interpreter: Interpreter::Bash,
            script: script.into(),
            cwd: std::env::temp_dir(),
            env: BTreeMap::new(),
            timeout: Duration::from_secs(10),
            cap: 1024,
            merge_stderr: false,
            stdin: None,
        }
    }

    #[tokio::test]
    async fn separates_streams_and_reports_the_exit_code() {
        let dir = tempfile::tempdir().unwrap();
        let runner = Runner::new(dir.path().into());
        let out = runner
            .run(command("echo out; echo err >&2; exit 3"))
            .await
            .unwrap();
        assert_eq!(out.stdout, b"out\n");
        assert_eq!(out.stderr, b"err\n");
        assert_eq!(out.exit_code, Some(3));
        assert!(!out.timed_out && !out.truncated);
        // The script file is gone.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[tokio::test]
    async fn merges_stderr_into_stdout_for_the_shell() {
        let dir = tempfile::tempdir().unwrap();
        let runner = Runner::new(dir.path().into());
        let mut cmd = command("echo a; echo b >&2");
        cmd.merge_stderr = true;
        let out = runner.run(cmd).await.unwrap();
        assert_eq!(out.stdout, b"a\nb\n");
        assert!(out.stderr.is_empty());
    }

    #[tokio::test]
    async fn runs_python_and_node_programs_with_stdin() {
        let dir = tempfile::tempdir().unwrap();
        let runner = Runner::new(dir.path().into());
        let mut cmd = command("import sys; print(sys.stdin.read().upper())");
        cmd.interpreter = Interpreter::Python;
        cmd.stdin = Some(b"abc".to_vec());
        let out = runner.run(cmd).await.unwrap();
        assert_eq!(out.stdout, b"ABC\n");
        let mut cmd = command("console.log(6 * 7); process.exit(2)");
        cmd.interpreter = Interpreter::Node;
        let out = runner.run(cmd).await.unwrap();
        assert_eq!(
            (out.stdout.as_slice(), out.exit_code),
            (&b"42\n"[..], Some(2))
        );
    }

    #[tokio::test]
    async fn caps_output_and_kills_on_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let runner = Runner::new(dir.path().into());
        let mut cmd = command("head -c 5000 /dev/zero; sleep 30 & sleep 30");
        cmd.timeout = Duration::from_millis(300);
        let out = runner.run(cmd).await.unwrap();
        assert!(out.timed_out);
        assert_eq!(out.exit_code, None);
        assert_eq!(out.stdout.len(), 1024);
        assert!(out.truncated);
    }
}
