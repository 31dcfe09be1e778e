//! envd's processes as the session's own background processes (`sandbox.v1.proc.*` over the
//! caller's tenant connection): how E2B names them, and `List`, `SendInput`, `SendSignal` and
//! `Update` (a PTY's size). Their streams, `Start` and `Connect`, are [`super::process_streams`].
//!
//! E2B names a process by its pid (or its tag). The facade gives every process it starts a pid
//! of its own and keeps it in the process's mesh tag (`e2b:<pid>`, or `e2b:<pid>:<tag>` with
//! the caller's tag), so `proc.list` maps a pid back to its process with no state in the
//! gateway: any gateway of the deployment, or one just restarted, finds the same process. The
//! pid is chosen before the start because envd's stream opens with it, and a start may first
//! wait for a person's approval. A process started another way (`/api/v1`, the CLI) goes by
//! its real pid. The ranges never meet: real pids stay below 2^22 (the kernel's limit), the
//! facade's processes get [2^30, 2^31), its executions count from 2^31.

use std::ops::Range;

use axum::extract::Request;
use base64::Engine;
use messages::error::ErrorKind;
use messages::exec::ContentEncoding;
use messages::proc::{ProcInfo, ProcInput, ProcSignalKind, ProcState, MAX_INPUT_BYTES};
use sandmesh_client::ClientError;
use serde::Deserialize;
use serde_json::{json, Value};

use super::connect::{self, Shape};
use super::process::Pty;
use super::{e2b_path, Code, E2bError, E2bReply, Sandbox, HOME};

/// The tag of a process the facade started: `e2b:<pid>[:<the caller's tag>]`.
const TAG_PREFIX: &str = "e2b:";
/// The pids the facade gives processes.
const PIDS: Range<u32> = (1 << 30)..(1 << 31);
/// The workspace's path inside the sandbox, as the mesh reports a process's directory.
const WORKSPACE: &str = "/workspace";

// === names ===

/// A pid drawn at random, so that gateways need not agree on a counter: two processes of one
/// sandbox meet at one in 2^30.
pub(super) fn new_pid() -> u32 {
    let drawn = getrandom::u32().expect("the OS random number generator");
    PIDS.start + drawn % (PIDS.end - PIDS.start)
}

pub(super) fn e2b_tag(pid: u32, tag: Option<&str>) -> String {
    match tag {
        Some(tag) => format!("{TAG_PREFIX}{pid}:{tag}"),
        None => format!("{TAG_PREFIX}{pid}"),
    }
}

/// How E2B names a process of the session: its pid and its tag.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Named {
    pub pid: u32,
    pub tag: Option<String>,
}

impl Named {
    pub fn of(info: &ProcInfo) -> Self {
        let facade = info.tag.as_deref().and_then(|tag| {
            let rest = tag.strip_prefix(TAG_PREFIX)?;
            let (pid, tag) = match rest.split_once(':') {
                Some((pid, tag)) => (pid, Some(tag.to_string())),
                None => (rest, None),
            };
            Some(Named {
                pid: pid.parse().ok().filter(|p| PIDS.contains(p))?,
                tag,
            })
        });
        facade.unwrap_or_else(|| Named {
            pid: info.pid,
            tag: info.tag.clone(),
        })
    }
}

/// envd's `ProcessSelector`: a pid or a tag.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct Selector {
    pid: Option<u32>,
    tag: Option<String>,
}

impl Selector {
    fn matches(&self, named: &Named) -> bool {
        match (self.pid, &self.tag) {
            (Some(pid), _) => named.pid == pid,
            (None, Some(tag)) => named.tag.as_ref() == Some(tag),
            (None, None) => false,
        }
    }

    fn describe(&self) -> String {
        match (self.pid, &self.tag) {
            (Some(pid), _) => format!("pid {pid}"),
            (None, Some(tag)) => format!("tag {tag:?}"),
            (None, None) => "no pid or tag".into(),
        }
    }
}

/// The session's process a selector names (the newest, when several did); `running`: only a
/// process that still runs (envd forgets the others).
pub(super) async fn find(
    sandbox: &Sandbox,
    selector: &Selector,
    running: bool,
) -> Result<ProcInfo, E2bError> {
    if selector.pid.is_none() && selector.tag.is_none() {
        return Err(E2bError::invalid("process: name a pid or a tag"));
    }
    let procs = sandbox.agent.mesh.procs().list(&sandbox.id).await?;
    procs
        .into_iter()
        .rev()
        .filter(|p| !running || p.state == ProcState::Running)
        .find(|p| selector.matches(&Named::of(p)))
        .ok_or_else(|| {
            E2bError::not_found(format!("process with {} not found", selector.describe()))
        })
}

/// A mesh refusal in envd's terms: a process that takes no input, or has no terminal, is a
/// failed precondition, not a conflict.
fn refusal(e: ClientError) -> E2bError {
    match e.kind() {
        ErrorKind::Conflict => E2bError::new(
            Code::FailedPrecondition,
            e.service_error()
                .map_or_else(|| e.to_string(), |b| b.message.clone()),
        ),
        _ => e.into(),
    }
}

// === the calls ===

/// `ListRequest` is empty; anything in it is ignored, as protobuf does.
#[derive(Debug, Default, Deserialize)]
struct ListRequest {}

/// `List`: the session's running processes, with the command as the SDKs sent it.
pub async fn list(sandbox: Sandbox, req: Request) -> E2bReply {
    let _: ListRequest = connect::request(req, Shape::Unary).await?;
    let procs = sandbox.agent.mesh.procs().list(&sandbox.id).await?;
    let processes: Vec<Value> = procs
        .iter()
        .filter(|p| p.state == ProcState::Running)
        .map(describe)
        .collect();
    Ok(connect::unary(&json!({ "processes": processes })))
}

/// envd's `ProcessInfo` of a process. Its env is not kept by the mesh: `envs` is empty.
fn describe(info: &ProcInfo) -> Value {
    let named = Named::of(info);
    let (cmd, args): (String, Vec<String>) = match info.argv.as_slice() {
        [bash, c, script] if bash == "bash" && c == "-c" => (
            "/bin/bash".into(),
            vec!["-l".into(), "-c".into(), script.clone()],
        ),
        [program, args @ ..] => (program.clone(), args.to_vec()),
        [] => (String::new(), Vec::new()),
    };
    let cwd = match info.cwd.as_deref() {
        None | Some("") => HOME.to_string(),
        Some(dir) if dir == WORKSPACE => HOME.to_string(),
        Some(dir) => match dir
            .strip_prefix(WORKSPACE)
            .and_then(|d| d.strip_prefix('/'))
        {
            Some(inside) => e2b_path(inside),
            None if dir.starts_with('/') => dir.to_string(),
            None => e2b_path(dir),
        },
    };
    let mut process = json!({
        "config": {"cmd": cmd, "args": args, "envs": {}, "cwd": cwd},
        "pid": named.pid,
    });
    if let Some(tag) = named.tag {
        process["tag"] = Value::String(tag);
    }
    process
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SendInputRequest {
    process: Selector,
    input: Input,
}

/// envd's `ProcessInput`: base64 bytes for stdin or the terminal.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Input {
    stdin: Option<String>,
    pty: Option<String>,
}

/// `SendInput`: bytes for a running process's stdin or terminal.
pub async fn send_input(sandbox: Sandbox, req: Request) -> E2bReply {
    let ask: SendInputRequest = connect::request(req, Shape::Unary).await?;
    let data = match (ask.input.stdin, ask.input.pty) {
        (Some(data), None) | (None, Some(data)) => data,
        _ => return Err(E2bError::invalid("input: send either stdin or pty bytes")),
    };
    let engine = base64::engine::general_purpose::STANDARD;
    let bytes = engine
        .decode(&data)
        .or_else(|_| base64::engine::general_purpose::URL_SAFE.decode(&data))
        .map_err(|e| E2bError::invalid(format!("input: not base64 ({e})")))?;
    if bytes.len() > MAX_INPUT_BYTES {
        return Err(E2bError::too_large(format!(
            "input: {} bytes; at most {MAX_INPUT_BYTES} a call",
            bytes.len()
        )));
    }
    let info = find(&sandbox, &ask.process, true).await?;
    let input = ProcInput {
        session_id: sandbox.id.clone(),
        proc_id: info.proc_id,
        data: engine.encode(&bytes),
        encoding: ContentEncoding::Base64,
        eof: false,
        seq: None,
    };
    sandbox
        .agent
        .mesh
        .procs()
        .input(&input)
        .await
        .map_err(refusal)?;
    Ok(connect::unary(&json!({})))
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SendSignalRequest {
    process: Selector,
    signal: Value,
}

/// envd's `Signal`: its name (proto3 JSON) or its number.
fn signal_of(signal: &Value) -> Result<ProcSignalKind, E2bError> {
    match signal {
        Value::String(name) if name == "SIGNAL_SIGKILL" => Ok(ProcSignalKind::Kill),
        Value::String(name) if name == "SIGNAL_SIGTERM" => Ok(ProcSignalKind::Term),
        Value::Number(n) if n.as_u64() == Some(9) => Ok(ProcSignalKind::Kill),
        Value::Number(n) if n.as_u64() == Some(15) => Ok(ProcSignalKind::Term),
        other => Err(E2bError::invalid(format!(
            "signal {other}: SIGNAL_SIGKILL or SIGNAL_SIGTERM"
        ))),
    }
}

/// `SendSignal`: SIGKILL or SIGTERM to a running process (its group).
pub async fn send_signal(sandbox: Sandbox, req: Request) -> E2bReply {
    let ask: SendSignalRequest = connect::request(req, Shape::Unary).await?;
    let signal = signal_of(&ask.signal)?;
    let info = find(&sandbox, &ask.process, true).await?;
    let procs = sandbox.agent.mesh.procs();
    procs
        .signal(&sandbox.id, &info.proc_id, signal)
        .await
        .map_err(refusal)?;
    Ok(connect::unary(&json!({})))
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct UpdateRequest {
    process: Selector,
    pty: Option<Pty>,
}

/// `Update`: a running terminal's new size.
pub async fn update(sandbox: Sandbox, req: Request) -> E2bReply {
    let ask: UpdateRequest = connect::request(req, Shape::Unary).await?;
    let size = ask
        .pty
        .as_ref()
        .ok_or_else(|| E2bError::invalid("pty: a terminal's size is all Update changes"))?
        .size()?;
    let info = find(&sandbox, &ask.process, true).await?;
    let procs = sandbox.agent.mesh.procs();
    procs
        .resize(&sandbox.id, &info.proc_id, size.cols, size.rows)
        .await
        .map_err(refusal)?;
    Ok(connect::unary(&json!({})))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(pid: u32, tag: Option<&str>, argv: &[&str], cwd: Option<&str>) -> ProcInfo {
        ProcInfo {
            proc_id: "p1".into(),
            pid,
            argv: argv.iter().map(|a| a.to_string()).collect(),
            tag: tag.map(str::to_string),
            cwd: cwd.map(str::to_string),
            pty: None,
            state: ProcState::Running,
            exit_code: None,
            signal: None,
            started_at: 0,
            ended_at: None,
            next_seq: 0,
        }
    }

    #[test]
    fn a_facade_pid_lives_in_the_tag_and_others_go_by_their_real_pid() {
        let pid = new_pid();
        assert!(PIDS.contains(&pid));
        let ours = info(42, Some(&e2b_tag(pid, Some("web:8080"))), &["x"], None);
        assert_eq!(
            Named::of(&ours),
            Named {
                pid,
                tag: Some("web:8080".into())
            }
        );
        let untagged = info(42, Some(&e2b_tag(pid, None)), &["x"], None);
        assert_eq!(Named::of(&untagged).tag, None);
        // Started over /api/v1, or a tag that only looks like ours: the real pid.
        for tag in [None, Some("web"), Some("e2b:7"), Some("e2b:nope")] {
            let other = info(42, tag, &["x"], None);
            assert_eq!(Named::of(&other).pid, 42, "{tag:?}");
        }
        let by_tag = Selector {
            pid: None,
            tag: Some("web:8080".into()),
        };
        assert!(by_tag.matches(&Named::of(&ours)));
        assert!(!Selector::default().matches(&Named::of(&ours)));
    }

    #[test]
    fn a_listed_process_shows_the_command_the_sdk_sent() {
        let p = info(
            7,
            None,
            &["bash", "-c", "npm run dev"],
            Some("/workspace/web"),
        );
        let listed = describe(&p);
        assert_eq!(listed["config"]["cmd"], "/bin/bash");
        assert_eq!(listed["config"]["args"], json!(["-l", "-c", "npm run dev"]));
        assert_eq!(listed["config"]["cwd"], "/home/user/web");
        assert_eq!(listed["pid"], 7);
        assert!(listed.get("tag").is_none());
        let argv = describe(&info(8, Some("t"), &["/bin/bash", "-i", "-l"], Some("src")));
        assert_eq!(argv["config"]["args"], json!(["-i", "-l"]));
        assert_eq!(argv["config"]["cwd"], "/home/user/src");
        assert_eq!(argv["tag"], "t");
    }

    #[test]
    fn signals_are_named_or_numbered_and_nothing_else() {
        assert_eq!(
            signal_of(&json!("SIGNAL_SIGKILL")),
            Ok(ProcSignalKind::Kill)
        );
        assert_eq!(signal_of(&json!(15)), Ok(ProcSignalKind::Term));
        for bad in [
            json!("SIGNAL_UNSPECIFIED"),
            json!(0),
            json!(-9),
            json!("KILL"),
            Value::Null,
            json!({"x": 1}),
        ] {
            assert_eq!(
                signal_of(&bad).unwrap_err().code,
                Code::InvalidArgument,
                "{bad}"
            );
        }
    }
}
