//! `AioRunner`: the run stage of tier `aio`. The session's AIO instance
//! comes from the aio-pool (`aio.acquire`, idempotent: the session keeps its bound instance),
//! and the code runs there through `aio.exec` as one shell command. Affinity lives in the
//! pool, which owns the binding; when the instance was lost between acquire and exec (idle
//! reclaim, retired, died), the session acquires a fresh one and the run is tried once more.
//! An execution without a session gets an instance of its own, released (destroyed) after.

use std::time::Duration;

use messages::browser::{AioAcquire, AioExec, AioExecResult, AioLease, AioRelease};
use messages::exec::{ExecRequest, ExecResult, ExecStatus, Language, Tier, TierChoice, Timing};
use messages::{ErrorBody, ErrorKind, ServiceName};
use sandmesh_client::{AioClient, ClientError, MeshClient};

use crate::error::SchedulerError;
use crate::execution::Execution;

/// Waiting for an instance (the pool may queue the acquire, then answers 429); also the least
/// an `aio.exec` is waited for.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(60);

/// The scheduler's policy on top of the client's [`AioClient`]: the command an execution is,
/// the instance per session, once more when the instance went away.
#[derive(Clone)]
pub struct AioRunner {
    pool: AioClient,
}

/// Why a request cannot run as an AIO shell command; the execution ends `rejected` with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotACommand {
    #[error("tier aio takes no request files; write them with the workspace API or the code")]
    Files,
    /// The risk policy sent the cell to an AIO sandbox, which has no kernel of the session's:
    /// running it as a fresh program would silently lose the cell's state.
    #[error(
        "this cell needs tier aio (the risk policy), where the session's kernel is not; run it \
         without kernel"
    )]
    Kernel,
    #[error("env name {0:?} is not a shell variable name")]
    EnvName(String),
}

/// The shell command that runs `req` (code and stdin in quoted heredocs with a delimiter the
/// text does not contain; environment exported first).
pub fn command_for(req: &ExecRequest, id: &str) -> Result<String, NotACommand> {
    if !req.files.is_empty() {
        return Err(NotACommand::Files);
    }
    if req.kernel {
        return Err(NotACommand::Kernel);
    }
    let mut delimiter = format!("SANDMESH_{}", id.to_ascii_uppercase());
    while req.code.contains(&delimiter)
        || req.stdin.as_deref().is_some_and(|s| s.contains(&delimiter))
    {
        delimiter.push('_');
    }
    let mut cmd = String::new();
    for (name, value) in &req.env {
        let valid = !name.is_empty()
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(NotACommand::EnvName(name.clone()));
        }
        cmd.push_str(&format!(
            "export {name}='{}'\n",
            value.replace('\'', r"'\''")
        ));
    }
    let (ext, program) = match req.language {
        Language::Python => ("py", "python3"),
        Language::Javascript => ("js", "node"),
        Language::Shell => ("sh", "bash"),
    };
    let file = format!("/tmp/sandmesh-{id}.{ext}");
    cmd.push_str(&format!(
        "cat > {file} <<'{delimiter}'\n{}\n{delimiter}\n",
        req.code
    ));
    match &req.stdin {
        Some(stdin) => cmd.push_str(&format!(
            "{program} {file} <<'{delimiter}'\n{stdin}\n{delimiter}\n"
        )),
        None => cmd.push_str(&format!("{program} {file} </dev/null\n")),
    }
    // The script's exit code is the program's: remove the file without changing it.
    cmd.push_str(&format!("status=$?; rm -f {file}; exit $status\n"));
    Ok(cmd)
}

/// An agent's `aio.exec` as the execution it is: its command is shell code, run in the
/// caller's session's instance (the session's own id, so it is the instance the agent
/// acquired), with the same risk assessment, confirmation, limits and audit as `exec`.
pub fn request_of(req: AioExec) -> ExecRequest {
    ExecRequest {
        session_id: Some(req.session_id),
        language: Language::Shell,
        code: req.command,
        timeout_ms: req.timeout_ms,
        tier: TierChoice::Aio,
        ..ExecRequest::default()
    }
}

/// The `aio.exec` answer for what the execution ended as: the command's own outcome (`ok`,
/// `error`, `timeout`), or the error that stopped it — denied by a person or rejected by the
/// policy is `Denied`, never a result that looks as if the command ran.
pub fn answer_of(session_id: String, r: ExecResult) -> Result<AioExecResult, SchedulerError> {
    let status = match r.status {
        ExecStatus::Ok => "ok",
        ExecStatus::Error => "error",
        ExecStatus::Timeout => "timeout",
        ExecStatus::Denied | ExecStatus::Rejected => {
            return Err(SchedulerError::CommandNotRun {
                status: r.status,
                why: r.error.map(|e| e.message).unwrap_or(r.risk.reason),
            });
        }
        // The stored result's error says why; passed on as it was stored.
        status => {
            return Err(match r.error {
                Some(error) => SchedulerError::Refused(error),
                None => SchedulerError::CommandEnded { status },
            });
        }
    };
    Ok(AioExecResult {
        session_id,
        instance_id: r.node.unwrap_or_default(),
        status: status.to_string(),
        exit_code: r.exit_code.and_then(|c| i32::try_from(c).ok()),
        stdout: r.stdout,
        stderr: r.stderr,
        exec_ms: r.timing.exec_ms,
        retired: false,
    })
}

fn result_of(exec: &Execution, r: AioExecResult) -> ExecResult {
    let status = match r.status.as_str() {
        "ok" => ExecStatus::Ok,
        "timeout" => ExecStatus::Timeout,
        _ => ExecStatus::Error,
    };
    ExecResult {
        execution_id: exec.id.clone(),
        session_id: exec.request.session_id.clone(),
        status,
        exit_code: r.exit_code.map(i64::from),
        stdout: r.stdout,
        stderr: r.stderr,
        tier: Tier::Aio,
        node: Some(r.instance_id),
        timing: Timing {
            exec_ms: r.exec_ms,
            ..Timing::default()
        },
        ..ExecResult::default()
    }
}

impl AioRunner {
    pub fn new(mesh: &MeshClient) -> Self {
        Self {
            pool: mesh.clone().with_timeout(ACQUIRE_TIMEOUT).aio(),
        }
    }

    async fn acquire(&self, session_id: &str) -> Result<AioLease, ClientError> {
        let req = AioAcquire {
            session_id: session_id.to_string(),
            browser: false,
        };
        self.pool.acquire(&req).await
    }

    /// Destroys the instance bound to `session` (scoped), if there is one. A failure only
    /// delays it: the pool reclaims idle instances.
    pub async fn release(&self, session: &str) {
        let release = AioRelease {
            session_id: session.to_string(),
            instance_id: None,
        };
        match self.pool.release(&release).await {
            Ok(_) => {}
            // No instance (never acquired, reclaimed) or no aio-pool in this mesh.
            Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::Unavailable) => {}
            Err(e) => {
                tracing::warn!(session_id = %session, error = %e, "AIO instance not released; idle reclaim will")
            }
        }
    }

    /// Runs the execution in its session's AIO instance. `Err` is a failure of the pool
    /// (unavailable, overloaded), not of the code.
    pub async fn run(&self, exec: &Execution) -> Result<ExecResult, SchedulerError> {
        let command = match command_for(&exec.request, &exec.id) {
            Ok(c) => c,
            Err(e) => {
                let error = ErrorBody::bad_request(e.to_string());
                return Ok(exec.refused(ExecStatus::Rejected, Tier::Aio, error));
            }
        };
        let (session, own) = match &exec.request.session_id {
            Some(s) => (s.clone(), false),
            None => (format!("exec-{}", exec.id), true),
        };
        let req = AioExec {
            session_id: session.clone(),
            command,
            timeout_ms: Some(exec.limits.timeout_ms),
            instance_id: None,
        };
        let calling = SchedulerError::calling(ServiceName::AioPool);
        self.acquire(&session).await.map_err(calling)?;
        let mut ran = self.pool.exec_instance(&req).await;
        // The instance went away in between (reclaimed, retired, died): once more.
        if matches!(&ran, Err(e) if e.kind() == ErrorKind::NotFound) {
            self.acquire(&session).await.map_err(calling)?;
            ran = self.pool.exec_instance(&req).await;
        }
        if own {
            self.release(&session).await;
        }
        match ran {
            Ok(r) => Ok(result_of(exec, r)),
            Err(ClientError::Service { body, .. })
                if matches!(body.kind, ErrorKind::BadRequest | ErrorKind::TooLarge) =>
            {
                Ok(exec.refused(ExecStatus::Rejected, Tier::Aio, body))
            }
            Err(e) => Err(calling(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(language: Language, code: &str) -> ExecRequest {
        ExecRequest {
            language,
            code: code.into(),
            ..Default::default()
        }
    }

    #[test]
    fn code_goes_into_a_quoted_heredoc() {
        let cmd = command_for(&request(Language::Python, "print('$HOME')"), "x1").unwrap();
        assert!(
            cmd.contains("<<'SANDMESH_X1'\nprint('$HOME')\nSANDMESH_X1\n"),
            "{cmd}"
        );
        assert!(
            cmd.contains("python3 /tmp/sandmesh-x1.py </dev/null"),
            "{cmd}"
        );
    }

    #[test]
    fn a_delimiter_in_the_code_is_avoided() {
        let cmd = command_for(&request(Language::Shell, "echo\nSANDMESH_X1\necho"), "x1").unwrap();
        assert!(cmd.contains("<<'SANDMESH_X1_'"), "{cmd}");
    }

    #[test]
    fn env_is_quoted_and_names_are_checked() {
        let mut req = request(Language::Javascript, "1");
        req.env.insert("A".into(), "it's $x".into());
        let cmd = command_for(&req, "x").unwrap();
        assert!(cmd.starts_with("export A='it'\\''s $x'\n"), "{cmd}");
        req.env.insert("B; rm -rf /".into(), "1".into());
        assert_eq!(
            command_for(&req, "x").unwrap_err(),
            NotACommand::EnvName("B; rm -rf /".into())
        );
    }
}
