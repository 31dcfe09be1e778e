//! `/v1/jupyter/*`, `/v1/code/*` and `/v1/nodejs/execute`: code in kernels that keep state
//! per session ([`crate::kernel`]), or in a fresh process per call (stateless
//! `/v1/code/execute` and `/v1/nodejs/execute`). Shapes as upstream's OpenAPI names them.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use hyper::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::api::Envelope;
use crate::exec::{Command, Interpreter};
use crate::files::error_chain;
use crate::kernel::{CellOutput, CellResult, CellStatus, KernelError, Language};
use crate::reply::{error, json, Reply};
use crate::Agent;
use sandbox_protocol::OutputKind;

/// Upstream's default cell timeout (seconds).
const DEFAULT_TIMEOUT_S: f64 = 30.0;
/// Most files a `/v1/nodejs/execute` call may create.
const MAX_EXTRA_FILES: usize = 64;

#[derive(Debug, Deserialize)]
pub struct JupyterExecuteRequest {
    pub code: String,
    #[serde(default)]
    pub timeout: Option<f64>,
    #[serde(default)]
    pub kernel_name: Option<String>,
    #[serde(default)]
    pub session_id: Option<String>,
    #[serde(default)]
    pub cwd: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct JupyterCreateSessionRequest {
    #[serde(default)]
    pub session_id: Option<String>,
    #[serde(default)]
    pub kernel_name: Option<String>,
    #[serde(default)]
    pub cwd: Option<String>,
}

/// `JupyterOutput` (and `NodeJSOutput`, the same fields).
#[derive(Debug, Serialize, Default)]
pub struct JupyterOutput {
    pub output_type: &'static str,
    pub name: Option<String>,
    pub text: Option<String>,
    pub data: Option<Map<String, Value>>,
    pub metadata: Option<Map<String, Value>>,
    pub execution_count: Option<u64>,
    pub ename: Option<String>,
    pub evalue: Option<String>,
    pub traceback: Option<Vec<String>>,
}

/// `JupyterExecuteResponse`; `state_lost` and `truncated` are sandmesh's: the session's
/// kernel had died, so this cell ran in a new one without the earlier state; output past the
/// cap (`AIO_MAX_OUTPUT_BYTES`) was dropped.
#[derive(Debug, Serialize)]
pub struct JupyterExecuteResponse {
    pub kernel_name: &'static str,
    pub session_id: String,
    pub status: &'static str,
    pub execution_count: u64,
    pub outputs: Vec<JupyterOutput>,
    pub code: String,
    pub msg_id: Option<String>,
    pub state_lost: bool,
    pub truncated: bool,
}

#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum CodeLanguage {
    Python,
    Javascript,
}

#[derive(Debug, Deserialize)]
pub struct CodeExecuteRequest {
    pub language: CodeLanguage,
    pub code: String,
    #[serde(default)]
    pub timeout: Option<f64>,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub stateful: bool,
    #[serde(default)]
    pub session_id: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct CodeExecuteResponse {
    pub language: &'static str,
    pub status: &'static str,
    pub outputs: Vec<JupyterOutput>,
    pub code: String,
    pub stdout: String,
    pub stderr: String,
    pub exit_code: Option<i32>,
    pub traceback: Option<Vec<String>>,
    pub session_id: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct NodeJsExecuteRequest {
    pub code: String,
    #[serde(default)]
    pub timeout: Option<f64>,
    #[serde(default)]
    pub stdin: Option<String>,
    #[serde(default)]
    pub files: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub stateful: Option<bool>,
    #[serde(default)]
    pub session_id: Option<String>,
    #[serde(default)]
    pub cwd: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct NodeJsExecuteResponse {
    pub language: &'static str,
    pub status: &'static str,
    pub execution_count: Option<u64>,
    pub outputs: Vec<JupyterOutput>,
    pub code: String,
    pub stdout: String,
    pub stderr: String,
    pub exit_code: i32,
    pub session_id: Option<String>,
}

// === requests' common parts ===

/// A refused request: 422 with the reason (upstream's validation status).
fn invalid(message: String) -> Reply {
    error(StatusCode::UNPROCESSABLE_ENTITY, message)
}

// The checks below say why they refuse; the handlers answer that with `invalid`.

fn timeout(agent: &Agent, seconds: Option<f64>) -> Result<Duration, String> {
    let s = seconds.unwrap_or(DEFAULT_TIMEOUT_S);
    if !(s.is_finite() && s > 0.0) {
        return Err("timeout must be a positive number of seconds".into());
    }
    Ok(Duration::from_secs_f64(s).min(agent.config.max_timeout))
}

fn cwd(agent: &Agent, requested: Option<&str>) -> Result<PathBuf, String> {
    agent
        .workspace
        .exec_dir(requested)
        .map_err(|e| error_chain(&e))
}

/// Only Python kernels here: `python3` or a versioned name (the image has one Python).
fn python_kernel(name: Option<&str>) -> Result<(), String> {
    match name {
        None | Some("") => Ok(()),
        Some(n) if n == "python" || n.starts_with("python3") => Ok(()),
        Some(n) => Err(format!("unknown kernel {n:?}: this image has python3")),
    }
}

fn kernel_error(e: KernelError) -> Reply {
    let status = match &e {
        KernelError::BadSessionId => StatusCode::UNPROCESSABLE_ENTITY,
        KernelError::TooManySessions(_) => StatusCode::TOO_MANY_REQUESTS,
        KernelError::NoSession(_) => StatusCode::NOT_FOUND,
        KernelError::Start { .. } => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(status, error_chain(&e))
}

/// A cell's outputs in Jupyter's shape.
fn jupyter_outputs(cell: &CellResult) -> Vec<JupyterOutput> {
    cell.outputs
        .iter()
        .map(|o| match o {
            CellOutput::Stream { name, text } => JupyterOutput {
                output_type: "stream",
                name: Some(name.clone()),
                text: Some(text.clone()),
                ..Default::default()
            },
            CellOutput::Rich { kind, data, paths } => {
                let result = *kind == OutputKind::Result;
                let mut metadata = Map::new();
                if !paths.is_empty() {
                    // Too large to inline: the kernel saved it under the workspace.
                    let saved: Map<String, Value> = paths
                        .iter()
                        .map(|(mime, path)| (mime.clone(), json!(path)))
                        .collect();
                    metadata.insert("sandmesh_saved_paths".into(), Value::Object(saved));
                }
                JupyterOutput {
                    output_type: if result {
                        "execute_result"
                    } else {
                        "display_data"
                    },
                    data: Some(data.iter().map(|(m, c)| (m.clone(), json!(c))).collect()),
                    metadata: Some(metadata),
                    execution_count: result.then_some(cell.execution_count),
                    ..Default::default()
                }
            }
            CellOutput::Error {
                name,
                value,
                traceback,
            } => JupyterOutput {
                output_type: "error",
                ename: Some(name.clone()),
                evalue: Some(value.clone()),
                traceback: Some(traceback.clone()),
                ..Default::default()
            },
        })
        .collect()
}

fn traceback(cell: &CellResult) -> Option<Vec<String>> {
    cell.outputs.iter().rev().find_map(|o| match o {
        CellOutput::Error { traceback, .. } => Some(traceback.clone()),
        _ => None,
    })
}

async fn run_cell(
    agent: &Agent,
    language: Language,
    session_id: Option<&str>,
    cwd: &Path,
    code: &str,
    timeout: Duration,
) -> Result<CellResult, Reply> {
    let _one_at_a_time = agent.exec_lock.lock().await;
    agent
        .kernels
        .execute(language, session_id, cwd, code, timeout)
        .await
        .map_err(kernel_error)
}

// === /v1/jupyter ===

pub async fn jupyter_execute(agent: &Agent, req: JupyterExecuteRequest) -> Reply {
    let prepared = python_kernel(req.kernel_name.as_deref()).and_then(|()| {
        Ok((
            timeout(agent, req.timeout)?,
            cwd(agent, req.cwd.as_deref())?,
        ))
    });
    let (timeout, cwd) = match prepared {
        Ok(p) => p,
        Err(message) => return invalid(message),
    };
    let cell = match run_cell(
        agent,
        Language::Python,
        req.session_id.as_deref(),
        &cwd,
        &req.code,
        timeout,
    )
    .await
    {
        Ok(c) => c,
        Err(reply) => return reply,
    };
    let response = JupyterExecuteResponse {
        kernel_name: Language::Python.kernel_name(),
        status: cell.status.as_str(),
        execution_count: cell.execution_count,
        outputs: jupyter_outputs(&cell),
        msg_id: Some(crate::api::next_id("msg")),
        state_lost: cell.state_lost,
        truncated: cell.truncated,
        session_id: cell.session_id,
        code: req.code,
    };
    json(StatusCode::OK, &Envelope::ok(response))
}

pub async fn jupyter_create(agent: &Agent, req: JupyterCreateSessionRequest) -> Reply {
    let cwd = match python_kernel(req.kernel_name.as_deref())
        .and_then(|()| cwd(agent, req.cwd.as_deref()))
    {
        Ok(c) => c,
        Err(message) => return invalid(message),
    };
    let opened = agent
        .kernels
        .open(Language::Python, req.session_id.as_deref(), &cwd);
    let (id, session, created) = match opened {
        Ok(o) => o,
        Err(e) => return kernel_error(e),
    };
    if let Err(e) = agent.kernels.warm(&session).await {
        return kernel_error(e);
    }
    json(
        StatusCode::OK,
        &Envelope::ok(json!({
            "session_id": id,
            "kernel_name": Language::Python.kernel_name(),
            "message": if created { "Session created" } else { "Session already exists" },
        })),
    )
}

pub fn jupyter_info(agent: &Agent) -> Reply {
    let config = agent.kernels.config();
    json(
        StatusCode::OK,
        &Envelope::ok(json!({
            "default_kernel": "python3",
            "available_kernels": ["python3"],
            "active_sessions": agent.kernels.list(Language::Python).len(),
            "session_timeout_seconds": config.idle_timeout.as_secs(),
            "max_sessions": config.max_sessions,
            "description": "stdlib Python kernels (sandmesh's kernel driver), one per session",
            "kernel_detection": "static",
        })),
    )
}

/// `ActiveSessionsResult` (Jupyter) or `NodeJSSessionListResponse`'s map, by language.
pub fn sessions(agent: &Agent, language: Language) -> Reply {
    let sessions: Map<String, Value> = agent
        .kernels
        .list(language)
        .into_iter()
        .map(|s| {
            let last_used = s
                .last_used
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0);
            let info = json!({
                "kernel_name": s.language.kernel_name(),
                "last_used": last_used,
                "age_seconds": s.idle.as_secs(),
            });
            (s.id, info)
        })
        .collect();
    json(
        StatusCode::OK,
        &Envelope::ok(json!({ "sessions": sessions })),
    )
}

pub fn close_session(agent: &Agent, language: Language, id: &str) -> Reply {
    match agent.kernels.close(language, id) {
        Ok(()) => json(StatusCode::OK, &Envelope::ok(json!({ "session_id": id }))),
        Err(e) => kernel_error(e),
    }
}

pub fn close_sessions(agent: &Agent, language: Language) -> Reply {
    let closed = agent.kernels.close_all(language);
    json(StatusCode::OK, &Envelope::ok(json!({ "closed": closed })))
}

// === /v1/code ===

pub async fn code_execute(agent: &Agent, req: CodeExecuteRequest) -> Reply {
    let prepared =
        timeout(agent, req.timeout).and_then(|t| Ok((t, cwd(agent, req.cwd.as_deref())?)));
    let (timeout, cwd) = match prepared {
        Ok(p) => p,
        Err(message) => return invalid(message),
    };
    let (language, name) = match req.language {
        CodeLanguage::Python => (Language::Python, "python"),
        CodeLanguage::Javascript => (Language::Javascript, "javascript"),
    };
    if req.stateful {
        let cell = match run_cell(
            agent,
            language,
            req.session_id.as_deref(),
            &cwd,
            &req.code,
            timeout,
        )
        .await
        {
            Ok(c) => c,
            Err(reply) => return reply,
        };
        let response = CodeExecuteResponse {
            language: name,
            status: cell.status.as_str(),
            outputs: jupyter_outputs(&cell),
            stdout: cell.stream("stdout"),
            stderr: cell.stream("stderr"),
            exit_code: None,
            traceback: traceback(&cell),
            session_id: Some(cell.session_id.clone()),
            code: req.code,
        };
        return json(StatusCode::OK, &Envelope::ok(response));
    }
    let interpreter = match language {
        Language::Python => Interpreter::Python,
        Language::Javascript => Interpreter::Node,
    };
    let run = match run_program(agent, interpreter, &req.code, cwd, timeout, None).await {
        Ok(r) => r,
        Err(reply) => return reply,
    };
    let response = CodeExecuteResponse {
        language: name,
        status: run.status.as_str(),
        outputs: run.outputs(),
        stdout: run.stdout,
        stderr: run.stderr,
        exit_code: run.exit_code,
        traceback: None,
        session_id: None,
        code: req.code,
    };
    json(StatusCode::OK, &Envelope::ok(response))
}

pub fn code_info(agent: &Agent) -> Reply {
    let max = agent.config.max_timeout.as_secs();
    let language = |language: &str, description: &str| {
        json!({
            "language": language,
            "description": description,
            "runtime_version": null,
            "default_timeout": DEFAULT_TIMEOUT_S as u64,
            "max_timeout": max,
            "details": { "stateful": true },
        })
    };
    json(
        StatusCode::OK,
        &Envelope::ok(json!({ "languages": [
            language("python", "python3; stateful sessions keep a kernel"),
            language("javascript", "node; stateful sessions keep a REPL kernel"),
        ]})),
    )
}

// === /v1/nodejs ===

pub async fn nodejs_execute(agent: &Agent, req: NodeJsExecuteRequest) -> Reply {
    let prepared =
        timeout(agent, req.timeout).and_then(|t| Ok((t, cwd(agent, req.cwd.as_deref())?)));
    let (timeout, cwd) = match prepared {
        Ok(p) => p,
        Err(message) => return invalid(message),
    };
    if let Some(files) = &req.files {
        if let Err(message) = write_files(&cwd, files, agent.config.max_body_bytes) {
            return invalid(message);
        }
    }
    if req.stateful == Some(true) {
        let cell = match run_cell(
            agent,
            Language::Javascript,
            req.session_id.as_deref(),
            &cwd,
            &req.code,
            timeout,
        )
        .await
        {
            Ok(c) => c,
            Err(reply) => return reply,
        };
        let response = NodeJsExecuteResponse {
            language: "javascript",
            status: cell.status.as_str(),
            execution_count: Some(cell.execution_count),
            outputs: jupyter_outputs(&cell),
            stdout: cell.stream("stdout"),
            stderr: cell.stream("stderr"),
            exit_code: i32::from(cell.status != CellStatus::Ok),
            session_id: Some(cell.session_id.clone()),
            code: req.code,
        };
        return json(StatusCode::OK, &Envelope::ok(response));
    }
    let stdin = req.stdin.clone().map(String::into_bytes);
    let run = match run_program(agent, Interpreter::Node, &req.code, cwd, timeout, stdin).await {
        Ok(r) => r,
        Err(reply) => return reply,
    };
    let response = NodeJsExecuteResponse {
        language: "javascript",
        status: run.status.as_str(),
        execution_count: None,
        outputs: run.outputs(),
        exit_code: run.exit_code.unwrap_or(-1),
        stdout: run.stdout,
        stderr: run.stderr,
        session_id: None,
        code: req.code,
    };
    json(StatusCode::OK, &Envelope::ok(response))
}

/// `files`: name → content, written below `cwd`; names are relative paths without `..`.
fn write_files(cwd: &Path, files: &BTreeMap<String, String>, max: usize) -> Result<(), String> {
    if files.len() > MAX_EXTRA_FILES {
        return Err(format!("at most {MAX_EXTRA_FILES} files"));
    }
    let total: usize = files.values().map(String::len).sum();
    if total > max {
        return Err(format!("files hold more than {max} bytes"));
    }
    for (name, content) in files {
        let relative = Path::new(name);
        let plain = !name.is_empty()
            && !name.contains('\0')
            && relative
                .components()
                .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
        if !plain {
            return Err(format!(
                "file name {name:?} must be a relative path without `..`"
            ));
        }
        let path = cwd.join(relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("creating {name}: {e}"))?;
        }
        std::fs::write(&path, content).map_err(|e| format!("writing {name}: {e}"))?;
    }
    Ok(())
}

/// A finished one-shot program.
struct ProgramRun {
    status: CellStatus,
    stdout: String,
    stderr: String,
    exit_code: Option<i32>,
}

impl ProgramRun {
    fn outputs(&self) -> Vec<JupyterOutput> {
        [("stdout", &self.stdout), ("stderr", &self.stderr)]
            .into_iter()
            .filter(|(_, text)| !text.is_empty())
            .map(|(name, text)| JupyterOutput {
                output_type: "stream",
                name: Some(name.into()),
                text: Some(text.clone()),
                ..Default::default()
            })
            .collect()
    }
}

async fn run_program(
    agent: &Agent,
    interpreter: Interpreter,
    code: &str,
    cwd: PathBuf,
    timeout: Duration,
    stdin: Option<Vec<u8>>,
) -> Result<ProgramRun, Reply> {
    let cmd = Command {
        interpreter,
        script: code.to_string(),
        cwd,
        env: Default::default(),
        timeout,
        cap: agent.config.max_output_bytes,
        merge_stderr: false,
        stdin,
    };
    let out = agent.run(cmd).await?;
    let status = match (out.timed_out, out.exit_code) {
        (true, _) => CellStatus::Timeout,
        (false, Some(0)) => CellStatus::Ok,
        (false, _) => CellStatus::Error,
    };
    Ok(ProgramRun {
        status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        exit_code: out.exit_code,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_files_stay_below_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let files = |name: &str| BTreeMap::from([(name.to_string(), "x".to_string())]);
        assert!(write_files(dir.path(), &files("a/b.js"), 100).is_ok());
        assert_eq!(
            std::fs::read_to_string(dir.path().join("a/b.js")).unwrap(),
            "x"
        );
        for bad in ["../x", "/etc/x", "a/../../x", "", "a\0b"] {
            assert!(
                write_files(dir.path(), &files(bad), 100).is_err(),
                "{bad:?}"
            );
        }
        assert!(write_files(dir.path(), &files("big"), 0).is_err());
    }
}
