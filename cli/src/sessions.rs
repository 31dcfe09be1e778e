//! `sandmesh sessions`: open a session with what every execution in it gets (env, default
//! timeout, template, network policy) and how long it lives; show, list and close sessions.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use messages::filesystem::FilesystemPolicy;
use messages::session::{SessionOpen, SessionRecord};
use sandmesh_client::{ClientError, MeshClient};

use crate::exec::NetworkArgs;

#[derive(clap::Subcommand, Debug, Clone)]
pub enum SessionsCommand {
    /// Open a session (idempotent: an open session of that id is shown as it is).
    Open(Box<OpenArgs>),
    /// One session, as JSON.
    Get { session_id: String },
    /// Every session of yours.
    List {
        /// Print raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// Close a session: its container, AIO instance and browser go.
    Close { session_id: String },
}

#[derive(clap::Args, Debug, Clone)]
pub struct OpenArgs {
    /// The session's id (default: a new one).
    pub session_id: Option<String>,
    /// Every execution runs in this template's image (`sandmesh template list`).
    #[arg(long)]
    pub template: Option<String>,
    /// An environment variable of every execution, `NAME=VALUE` (an execution's own wins);
    /// repeatable.
    #[arg(long = "env", value_name = "NAME=VALUE", value_parser = parse_env)]
    pub env: Vec<(String, String)>,
    /// The time limit of an execution that sets none (clamped by the mesh's ceiling).
    #[arg(long)]
    pub timeout_ms: Option<u64>,
    /// Close the session this long after it opens: `90s`, `10m`, `2h`, `1d`, `500ms`.
    #[arg(long, value_parser = parse_duration)]
    pub ttl: Option<Duration>,
    /// Close the session when unused this long (default: the mesh's, one hour).
    #[arg(long, value_parser = parse_duration)]
    pub idle: Option<Duration>,
    /// Hide this directory from the code (an empty read-only one in its place); repeatable.
    #[arg(long = "deny-read", value_name = "DIR")]
    pub deny_read: Vec<String>,
    /// Let the code write this directory (empty at start) besides /tmp and the workspace;
    /// repeatable.
    #[arg(long = "allow-write", value_name = "DIR")]
    pub allow_write: Vec<String>,
    /// Keep this directory inside /tmp or an --allow-write one read-only (and empty);
    /// repeatable.
    #[arg(long = "deny-write", value_name = "DIR")]
    pub deny_write: Vec<String>,
    #[command(flatten)]
    pub network: NetworkArgs,
}

impl OpenArgs {
    /// The filesystem policy the flags describe, or `None` when no flag was given.
    fn filesystem(&self) -> Option<FilesystemPolicy> {
        let policy = FilesystemPolicy {
            deny_read: self.deny_read.clone(),
            allow_write: self.allow_write.clone(),
            deny_write: self.deny_write.clone(),
        };
        (!policy.is_empty()).then_some(policy)
    }

    fn request(&self) -> SessionOpen {
        let ms = |d: Duration| d.as_millis().min(u128::from(u64::MAX)) as u64;
        SessionOpen {
            session_id: self.session_id.clone(),
            template: self.template.clone(),
            env: self.env.iter().cloned().collect::<BTreeMap<_, _>>(),
            timeout_ms: self.timeout_ms,
            ttl_ms: self.ttl.map(ms),
            idle_ms: self.idle.map(ms),
            network: self.network.policy(),
            filesystem: self.filesystem(),
            requested_by: std::env::var("USER").ok().map(|u| format!("cli:{u}")),
            ..Default::default()
        }
    }
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_string(), value.to_string())),
        _ => Err(format!("{s:?}: expected NAME=VALUE")),
    }
}

/// `500ms`, `90s`, `10m`, `2h`, `1d`: a number and a unit (a bare number is ambiguous).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(digits);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{s:?}: expected a number and a unit (ms, s, m, h, d)"))?;
    let ms_per = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("{s:?}: the unit is one of ms, s, m, h, d")),
    };
    n.checked_mul(ms_per)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{s:?} is too long"))
}

pub async fn run(mesh: &MeshClient, cmd: SessionsCommand) -> anyhow::Result<i32> {
    let sessions = mesh.sessions();
    let mut out = crate::out::stdout();
    let done = match cmd {
        SessionsCommand::Open(args) => sessions.open(&args.request()).await.map(|r| vec![r]),
        SessionsCommand::Get { session_id } => sessions.get(&session_id).await.map(|r| vec![r]),
        SessionsCommand::Close { session_id } => sessions.close(&session_id).await.map(|r| vec![r]),
        SessionsCommand::List { json } => match sessions.list(None).await {
            Ok(list) if json => {
                writeln!(out, "{}", serde_json::to_string_pretty(&list)?)?;
                return Ok(0);
            }
            Ok(list) => {
                for r in &list {
                    writeln!(out, "{}", line(r))?;
                }
                return Ok(0);
            }
            Err(e) => Err(e),
        },
    };
    match done {
        Ok(records) => {
            for r in records {
                writeln!(out, "{}", serde_json::to_string_pretty(&r)?)?;
            }
            Ok(0)
        }
        Err(ClientError::Service { body, .. }) => {
            eprintln!("sandmesh sessions: {}", body.message);
            Ok(1)
        }
        Err(other) => Err(other.into()),
    }
}

/// `id  state  template  executions  expires`.
fn line(r: &SessionRecord) -> String {
    let state = serde_json::to_value(r.state).unwrap_or_default();
    let template = r.template.as_deref().unwrap_or("-");
    let expires = r
        .expires_at
        .map_or_else(|| "-".to_string(), |at| format!("expires_at={at}"));
    format!(
        "{:<28} {:<8} {template:<16} {:>5} runs  {expires}",
        r.session_id,
        state.as_str().unwrap_or("?"),
        r.executions
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_need_a_unit() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86_400)));
        for bad in ["10", "m", "1.5h", "-1s", "99999999999999999999d", "1w"] {
            assert!(parse_duration(bad).is_err(), "accepted {bad:?}");
        }
    }

    #[test]
    fn env_is_name_equals_value() {
        assert_eq!(parse_env("A=b=c"), Ok(("A".into(), "b=c".into())));
        assert_eq!(parse_env("EMPTY="), Ok(("EMPTY".into(), String::new())));
        assert!(parse_env("=x").is_err());
        assert!(parse_env("novalue").is_err());
    }
}
