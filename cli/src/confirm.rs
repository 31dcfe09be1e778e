//! `sandmesh confirm`: the person in human-in-the-loop — see the queue, approve, deny, and
//! watch it live (the `confirm.pending.*` / `confirm.decided.*` events).

use std::collections::BTreeMap;
use std::future::Future;
use std::io::Write;

use futures::StreamExt;
use messages::confirm::{
    ConfirmDecide, ConfirmList, ConfirmListReply, ConfirmScope, ConfirmState, Confirmation,
};
use sandmesh_client::{ClientError, ConfirmClient, MeshClient};

#[derive(clap::Subcommand, Debug, Clone, PartialEq, Eq)]
pub enum ConfirmCommand {
    /// Confirmations waiting for a decision, newest first.
    List {
        /// Only this session's.
        #[arg(long)]
        session: Option<String>,
        /// Decided ones instead: approved, denied or timeout.
        #[arg(long, value_parser = parse_state)]
        state: Option<ConfirmState>,
        /// Print raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// Approve a pending confirmation.
    Approve {
        id: String,
        /// `session`: also approve the same rules for the rest of that session.
        #[arg(long, default_value = "once", value_parser = parse_scope)]
        scope: ConfirmScope,
        /// Who approves (default: $USER).
        #[arg(long)]
        by: Option<String>,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Deny a pending confirmation.
    Deny {
        id: String,
        #[arg(long)]
        reason: Option<String>,
        /// Who denies (default: $USER).
        #[arg(long)]
        by: Option<String>,
    },
    /// Print the pending queue, then every change to it as it happens (Ctrl-C stops).
    Watch {
        #[arg(long)]
        session: Option<String>,
    },
}

fn parse_state(s: &str) -> Result<ConfirmState, String> {
    match s {
        "pending" => Ok(ConfirmState::Pending),
        "approved" => Ok(ConfirmState::Approved),
        "denied" => Ok(ConfirmState::Denied),
        "timeout" => Ok(ConfirmState::Timeout),
        _ => Err("expected pending, approved, denied or timeout".into()),
    }
}

fn parse_scope(s: &str) -> Result<ConfirmScope, String> {
    match s {
        "once" => Ok(ConfirmScope::Once),
        "session" => Ok(ConfirmScope::Session),
        _ => Err("expected once or session".into()),
    }
}

/// Runs one `confirm` command. Exit codes: 0 done; 1 the service refused (the reason is
/// printed: unknown id, already decided, bad input); transport problems are errors.
pub async fn run(mesh: &MeshClient, cmd: ConfirmCommand) -> anyhow::Result<i32> {
    let confirm = mesh.confirm();
    match cmd {
        ConfirmCommand::List {
            session,
            state,
            json,
        } => {
            let filter = ConfirmList {
                session_id: session,
                state,
                limit: None,
            };
            let confirmations = match confirm.list(&filter).await {
                Ok(list) => list,
                Err(e) => return refused(e),
            };
            let mut out = crate::out::stdout();
            if json {
                let reply = ConfirmListReply { confirmations };
                writeln!(out, "{}", serde_json::to_string_pretty(&reply)?)?;
            } else if confirmations.is_empty() {
                writeln!(out, "no confirmations")?;
            } else {
                for c in &confirmations {
                    writeln!(out, "{}", line(c, messages::now_ms()))?;
                }
            }
            Ok(0)
        }
        ConfirmCommand::Approve {
            id,
            scope,
            by,
            reason,
        } => decide(&confirm, id, true, by, reason, scope).await,
        ConfirmCommand::Deny { id, reason, by } => {
            decide(&confirm, id, false, by, reason, ConfirmScope::Once).await
        }
        ConfirmCommand::Watch { session } => {
            watch_until(&confirm, session, crate::out::stdout(), async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await?;
            Ok(0)
        }
    }
}

async fn decide(
    confirm: &ConfirmClient,
    id: String,
    approve: bool,
    by: Option<String>,
    reason: Option<String>,
    scope: ConfirmScope,
) -> anyhow::Result<i32> {
    let by = by
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| "cli".into());
    let request = ConfirmDecide {
        by_account: None,
        id,
        approve,
        by,
        reason,
        scope,
    };
    match confirm.decide(&request).await {
        Ok(c) => {
            outln!("{}", line(&c, messages::now_ms()));
            Ok(0)
        }
        Err(e) => refused(e),
    }
}

/// A refusal by the service is the user's business (exit 1), anything else is an error.
fn refused(e: ClientError) -> anyhow::Result<i32> {
    match e {
        ClientError::Service { body, .. } => {
            eprintln!("sandmesh confirm: {}", body.message);
            if let Some(c) = body
                .details
                .as_ref()
                .and_then(|d| d.get("confirmation"))
                .and_then(|c| serde_json::from_value::<Confirmation>(c.clone()).ok())
            {
                eprintln!("  {}", line(&c, messages::now_ms()));
            }
            Ok(1)
        }
        other => Err(other.into()),
    }
}

/// Prints the pending queue, then each event with the queue size, until `stop` completes.
/// Subscribes before listing, so nothing between the two is missed.
pub async fn watch_until<W: Write>(
    confirm: &ConfirmClient,
    session: Option<String>,
    mut out: W,
    stop: impl Future<Output = ()>,
) -> anyhow::Result<W> {
    // Live before listing, so no decision falls between the list and the subscription.
    let mut events = confirm.watch().await?;
    let filter = ConfirmList {
        session_id: session.clone(),
        ..Default::default()
    };
    let mut queue: BTreeMap<String, Confirmation> = confirm
        .list(&filter)
        .await?
        .into_iter()
        .map(|c| (c.id.clone(), c))
        .collect();
    writeln!(out, "{} pending", queue.len())?;
    for c in queue.values().rev() {
        writeln!(out, "  {}", line(c, messages::now_ms()))?;
    }
    out.flush()?;
    tokio::pin!(stop);
    loop {
        let event = tokio::select! {
            _ = &mut stop => break,
            e = events.next() => match e { Some(e) => e, None => break },
        };
        // An event this version cannot read is skipped, not fatal to the watch.
        let Ok(c) = event else {
            continue;
        };
        if session.is_some() && c.session_id != session {
            continue;
        }
        if c.state.is_final() {
            queue.remove(&c.id);
            writeln!(out, "- {}", line(&c, messages::now_ms()))?;
        } else {
            writeln!(out, "+ {}", line(&c, messages::now_ms()))?;
            queue.insert(c.id.clone(), c);
        }
        writeln!(out, "  ({} pending)", queue.len())?;
        out.flush()?;
    }
    Ok(out)
}

fn state_name(s: ConfirmState) -> &'static str {
    match s {
        ConfirmState::Pending => "pending",
        ConfirmState::Approved => "approved",
        ConfirmState::Denied => "denied",
        ConfirmState::Timeout => "timeout",
    }
}

/// One confirmation on one line: id, state, level, who/when, session, rules, summary.
pub fn line(c: &Confirmation, now_ms: u64) -> String {
    let when = if c.state.is_final() {
        format!("by {}", c.by.as_deref().unwrap_or("?"))
    } else {
        format!("expires in {}s", c.expires_at.saturating_sub(now_ms) / 1000)
    };
    let rules: Vec<&str> = c.risk.findings.iter().map(|f| f.rule.as_str()).collect();
    let mut text = format!(
        "{} {:<8} {:<8} {} session={} rules=[{}] {:?}",
        c.id,
        state_name(c.state),
        c.risk.level.as_str(),
        when,
        c.session_id.as_deref().unwrap_or("-"),
        rules.join(","),
        c.summary
    );
    if !c.files.is_empty() {
        // The code may run these: each by path, size and the start of its digest (the whole
        // record, excerpts included, is in `--json`).
        let files: Vec<String> = c
            .files
            .iter()
            .map(|f| {
                let digest = f.sha256.get(..12).unwrap_or(&f.sha256);
                format!("{}({}B sha256:{digest})", f.path, f.bytes)
            })
            .collect();
        text.push_str(&format!(" files=[{}]", files.join(",")));
    }
    if let Some(reason) = &c.reason {
        text.push_str(&format!(" reason={reason:?}"));
    }
    text
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        cmd: ConfirmCommand,
    }

    fn parse(args: &[&str]) -> Result<ConfirmCommand, clap::Error> {
        Cli::try_parse_from(std::iter::once("confirm").chain(args.iter().copied())).map(|c| c.cmd)
    }

    #[test]
    fn a_line_names_the_files_the_code_brings() {
        let c = Confirmation {
            id: "c1".into(),
            files: vec![messages::confirm::ConfirmFile {
                path: "code/x.py".into(),
                bytes: 32,
                sha256: "0123456789abcdef".repeat(4),
                excerpt: "import pty".into(),
            }],
            ..Default::default()
        };
        let text = line(&c, 0);
        assert!(
            text.contains("files=[code/x.py(32B sha256:0123456789ab)]"),
            "{text}"
        );
        assert!(!line(&Confirmation::default(), 0).contains("files="));
    }

    #[test]
    fn arguments_parse_as_documented() {
        assert_eq!(
            parse(&["approve", "01J", "--scope", "session", "--by", "alice"]).unwrap(),
            ConfirmCommand::Approve {
                id: "01J".into(),
                scope: ConfirmScope::Session,
                by: Some("alice".into()),
                reason: None,
            }
        );
        assert_eq!(
            parse(&["deny", "01J", "--reason", "no"]).unwrap(),
            ConfirmCommand::Deny {
                id: "01J".into(),
                reason: Some("no".into()),
                by: None,
            }
        );
        assert!(parse(&["approve", "01J", "--scope", "forever"]).is_err());
        assert!(parse(&["list", "--state", "maybe"]).is_err());
        assert!(parse(&["deny"]).is_err());
    }
}
