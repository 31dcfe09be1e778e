//! `sandmesh exec`: run code through the mesh. Output is printed live as the executor streams
//! it (`output.<execution_id>`, subscribed before the request is sent so nothing is missed),
//! then a one-line summary goes to stderr, and the process exits with the program's exit code.
//! When the code needs a person's approval, the scheduler parks it and says so at once on the
//! inbox named in the `Sandmesh-Notify` header; the CLI prints how to approve it while it waits.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use messages::exec::{
    AwaitingConfirmation, ExecRequest, ExecResult, ExecStatus, Language, OutputKind, OutputStream,
    TierChoice,
};
use messages::network::NetworkPolicy;
use messages::session::SessionOpen;
use sandmesh_client::exec::OutputChunks;
use sandmesh_client::MeshClient;

#[derive(clap::Args, Debug, Clone)]
pub struct ExecArgs {
    /// python, javascript or shell.
    #[arg(long, default_value = "python")]
    pub lang: Language,
    /// Run in this session (its files and container persist between executions).
    #[arg(long)]
    pub session: Option<String>,
    /// Read the code from this file (`-` for stdin).
    #[arg(long, conflicts_with = "code")]
    pub file: Option<PathBuf>,
    /// The code to run.
    pub code: Option<String>,
    /// auto, ephemeral, session or aio (stricter than the risk policy requires only).
    #[arg(long, value_parser = parse_tier)]
    pub tier: Option<TierChoice>,
    /// Run in this template's image with its defaults (`sandmesh template list`); its first
    /// use on a node waits for the image to be built.
    #[arg(long)]
    pub template: Option<String>,
    /// Time limit for the program.
    #[arg(long)]
    pub timeout_ms: Option<u64>,
    /// Print the whole result as JSON instead of live output and a summary.
    #[arg(long)]
    pub json: bool,
    /// Run the code as a cell of the session's kernel (python or javascript): variables
    /// survive between cells, and values, `display()` and figures come back as typed outputs.
    #[arg(long, requires = "session")]
    pub kernel: bool,
    #[command(flatten)]
    pub network: NetworkArgs,
}

/// A network egress policy from flags (without any: no network at all). With `--session` it
/// becomes the session's policy when this command opens the session.
#[derive(clap::Args, Debug, Default, Clone)]
pub struct NetworkArgs {
    /// Let the program reach this host (`pkgs.example.org`, `*.example.org`); repeatable.
    #[arg(long = "allow-domain", value_name = "HOST")]
    pub allow_domains: Vec<String>,
    /// Never let it reach this host, even when an allow entry matches; repeatable.
    #[arg(long = "deny-domain", value_name = "HOST")]
    pub deny_domains: Vec<String>,
    /// Let it reach this address block, also internal ones (`127.0.0.1/32`); repeatable.
    #[arg(long = "allow-cidr", value_name = "CIDR")]
    pub allow_cidrs: Vec<String>,
    /// Destination ports (default 80 and 443); repeatable.
    #[arg(long = "allow-port", value_name = "PORT")]
    pub ports: Vec<u16>,
    /// Let it reach every public host not denied.
    #[arg(long = "allow-all-network")]
    pub allow_all: bool,
}

impl NetworkArgs {
    /// The policy the flags describe, or `None` when no flag was given.
    pub fn policy(&self) -> Option<NetworkPolicy> {
        let given = !self.allow_domains.is_empty()
            || !self.deny_domains.is_empty()
            || !self.allow_cidrs.is_empty()
            || !self.ports.is_empty()
            || self.allow_all;
        given.then(|| NetworkPolicy {
            allow_domains: self.allow_domains.clone(),
            deny_domains: self.deny_domains.clone(),
            allow_cidrs: self.allow_cidrs.clone(),
            allow_all: self.allow_all,
            ports: (!self.ports.is_empty()).then(|| self.ports.clone()),
        })
    }
}

fn parse_tier(s: &str) -> Result<TierChoice, String> {
    match s {
        "auto" => Ok(TierChoice::Auto),
        "ephemeral" => Ok(TierChoice::Ephemeral),
        "session" => Ok(TierChoice::Session),
        "aio" => Ok(TierChoice::Aio),
        other => Err(format!(
            "unknown tier {other:?}; expected auto, ephemeral, session or aio"
        )),
    }
}

fn read_code(args: &ExecArgs) -> anyhow::Result<String> {
    match (&args.file, &args.code) {
        (Some(path), _) if path.as_os_str() == "-" => {
            let mut code = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut code)
                .context("reading code from stdin")?;
            Ok(code)
        }
        (Some(path), _) => std::fs::read_to_string(path)
            .with_context(|| format!("reading code from {}", path.display())),
        (None, Some(code)) => Ok(code.clone()),
        (None, None) => anyhow::bail!("give the code as an argument, or --file F (- for stdin)"),
    }
}

/// What the output printer saw.
#[derive(Default)]
struct Printed {
    chunks: u64,
    eof: bool,
}

/// Prints chunks as they arrive until the `eof` chunk or until `stop`.
async fn print_output(
    mut chunks: OutputChunks,
    stop: tokio::sync::oneshot::Receiver<()>,
) -> Printed {
    let mut printed = Printed::default();
    tokio::pin!(stop);
    loop {
        let chunk = tokio::select! {
            _ = &mut stop => break,
            c = chunks.next() => match c { Some(c) => c, None => break },
        };
        // A chunk that does not decode is skipped: the result still carries all the output.
        let Ok(chunk) = chunk else { continue };
        printed.chunks += 1;
        match chunk.stream {
            OutputStream::Stdout => {
                let mut out = crate::out::stdout();
                let _ = out.write_all(chunk.data.as_bytes());
                let _ = out.flush();
            }
            OutputStream::Stderr => {
                let mut err = std::io::stderr().lock();
                let _ = err.write_all(chunk.data.as_bytes());
                let _ = err.flush();
            }
        }
        if chunk.eof {
            printed.eof = true;
            break;
        }
    }
    printed
}

/// `waiting for approval — sandmesh confirm approve <id> (expires in 4m 59s)`
pub fn waiting_line(a: &AwaitingConfirmation, now_ms: u64) -> String {
    let left = a.expires_at.saturating_sub(now_ms) / 1000;
    let expires = match left {
        0..=59 => format!("{left}s"),
        _ => format!("{}m {}s", left / 60, left % 60),
    };
    format!(
        "waiting for approval — sandmesh confirm approve {} (expires in {expires})",
        a.confirmation_id
    )
}

/// `ok · exit 0 · tier ephemeral · risk safe · 212 ms (queued 0, assess 4, confirm 0, exec 198) · node n1 · id 01J…`
pub fn summary(r: &ExecResult) -> String {
    let mut parts = vec![r.status.as_str().to_string()];
    if let Some(code) = r.exit_code {
        parts.push(format!("exit {code}"));
    }
    parts.push(format!("tier {}", r.tier.as_str()));
    parts.push(format!("risk {}", r.risk.level.as_str()));
    if r.confirmation.decision != messages::exec::Decision::NotRequired {
        let by = r.confirmation.by.as_deref().unwrap_or("?");
        parts.push(format!("confirmation {:?} by {by}", r.confirmation.decision).to_lowercase());
    }
    let t = &r.timing;
    parts.push(format!(
        "{} ms (queued {}, assess {}, confirm {}, exec {})",
        t.total_ms, t.queued_ms, t.assess_ms, t.confirm_ms, t.exec_ms
    ));
    if let Some(node) = &r.node {
        parts.push(format!("node {node}"));
    }
    if let Some(t) = &r.template {
        parts.push(format!("template {} ({})", t.name, t.image));
    }
    if r.session_restored {
        parts.push("session restored (process state was lost)".into());
    }
    if r.state_lost {
        parts.push("kernel restarted (variables of earlier cells are gone)".into());
    }
    parts.push(format!("id {}", r.execution_id));
    let mut line = parts.join(" · ");
    if let Some(n) = &r.network {
        let contacted: Vec<String> = n
            .contacted
            .iter()
            .map(|c| format!("{}:{}", c.host, c.port))
            .collect();
        line.push_str(&format!(
            "\n  network: contacted [{}]",
            contacted.join(", ")
        ));
        for refused in &n.refused {
            let (host, port, rule) = (&refused.host, refused.port, &refused.rule);
            line.push_str(&format!("\n  network: refused {host}:{port} — {rule}"));
        }
    }
    for o in &r.outputs {
        let kind = format!("{:?}", o.kind).to_lowercase();
        let at = match (&o.path, &o.content) {
            (Some(path), _) => format!("in the workspace at {path}"),
            (None, Some(content)) => format!("inline, {} bytes", content.len()),
            (None, None) => "empty".into(),
        };
        line.push_str(&format!("\n  output ({kind}): {} {at}", o.mime_type));
    }
    for f in &r.files_refused {
        // Escaped: a name may hold a newline or a terminal's control sequence.
        line.push_str(&format!("\n  file not saved: {:?} — {}", f.path, f.reason));
    }
    if let Some(e) = &r.error {
        line.push_str(&format!("\n  {}: {}", e.kind, e.message));
    }
    line
}

/// A kernel cell's text results (the value of its last expression), as a REPL prints them.
fn print_results(r: &ExecResult) {
    let mut out = crate::out::stdout();
    for o in &r.outputs {
        if o.kind == OutputKind::Result && o.mime_type == "text/plain" {
            if let Some(text) = &o.content {
                let _ = writeln!(out, "{text}");
            }
        }
    }
    let _ = out.flush();
}

/// The exit code for a result: the program's own (128 + N when signal N killed it), else 0 for
/// ok and 1 for anything else — never 0 for a run that did not end well.
pub fn exit_code(r: &ExecResult) -> i32 {
    let fallback = if r.status == ExecStatus::Ok { 0 } else { 1 };
    match r.exit_code {
        Some(code @ 1..=255) => code as i32,
        Some(0) => fallback,
        Some(code @ -64..=-1) => 128 - code as i32,
        _ => fallback,
    }
}

pub async fn run(mesh: &MeshClient, args: ExecArgs) -> anyhow::Result<i32> {
    let code = read_code(&args)?;
    let id = messages::new_id();
    let mut network = args.network.policy();
    // A session's executions run under the session's policy, set when it opens: with a
    // session the flags open it with theirs; without one they go with the request.
    let for_session = if args.session.is_some() {
        network.take()
    } else {
        None
    };
    if let (Some(session), Some(policy)) = (&args.session, for_session) {
        let open = SessionOpen {
            session_id: Some(session.clone()),
            network: Some(policy.clone()),
            ..Default::default()
        };
        let record = mesh
            .sessions()
            .open(&open)
            .await
            .map_err(|e| anyhow::anyhow!("opening session {session}: {}", e.into_body()))?;
        if record.network.as_ref().map(|p| &p.allow_domains) != Some(&policy.allow_domains) {
            eprintln!(
                "sandmesh: session {session} was already open; it keeps its network policy {}",
                serde_json::to_string(&record.network)?
            );
        }
    }
    let req = ExecRequest {
        network,
        execution_id: Some(id.clone()),
        session_id: args.session.clone(),
        language: args.lang,
        code,
        timeout_ms: args.timeout_ms,
        tier: args.tier.unwrap_or_default(),
        stream_output: !args.json,
        requested_by: std::env::var("USER").ok().map(|u| format!("cli:{u}")),
        template: args.template.clone(),
        kernel: args.kernel,
        ..Default::default()
    };
    // Subscribed before sending, so the first chunk cannot slip by.
    let printer = if args.json {
        None
    } else {
        let sub = mesh
            .exec()
            .output(&id)
            .await
            .context("subscribing to the output")?;
        let (stop, stopped) = tokio::sync::oneshot::channel();
        Some((stop, tokio::spawn(print_output(sub, stopped))))
    };
    // Room for the program's own time and a person deciding a confirmation.
    let wait = Duration::from_millis(args.timeout_ms.unwrap_or(30_000)) + Duration::from_secs(600);
    let reply = mesh
        .exec()
        .exec_notified(&req, wait, |notice| {
            eprintln!("{}", waiting_line(&notice, messages::now_ms()))
        })
        .await;
    let result = match reply {
        Ok(r) => r,
        Err(e) => {
            if let Some((stop, task)) = printer {
                let _ = stop.send(());
                let _ = task.await;
            }
            return Err(anyhow::anyhow!("{}", e.into_body()));
        }
    };
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&result)?);
        return Ok(exit_code(&result));
    }
    let printed = match printer {
        Some((stop, task)) => {
            // The executor sends the eof chunk before its reply; allow it a moment in transit.
            let mut task = task;
            match tokio::time::timeout(Duration::from_secs(1), &mut task).await {
                Ok(p) => p.unwrap_or_default(),
                Err(_) => {
                    let _ = stop.send(());
                    task.await.unwrap_or_default()
                }
            }
        }
        None => Printed::default(),
    };
    if printed.chunks == 0 {
        // Nothing streamed (rejected, denied, a stored result, or a non-streaming executor).
        out!("{}", result.stdout);
        eprint!("{}", result.stderr);
        let _ = crate::out::stdout().flush();
    }
    print_results(&result);
    if result.stdout_truncated || result.stderr_truncated {
        eprintln!("(output truncated at the limit)");
    }
    eprintln!("{}", summary(&result));
    Ok(exit_code(&result))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_program_then_the_status() {
        let mut r = ExecResult {
            status: ExecStatus::Error,
            exit_code: Some(3),
            ..Default::default()
        };
        assert_eq!(exit_code(&r), 3);
        r.exit_code = None;
        assert_eq!(exit_code(&r), 1);
        r.status = ExecStatus::Ok;
        assert_eq!(exit_code(&r), 0);
        r.status = ExecStatus::Killed;
        r.exit_code = Some(-9);
        assert_eq!(exit_code(&r), 137);
        r.status = ExecStatus::Timeout;
        r.exit_code = Some(0);
        assert_eq!(exit_code(&r), 1, "a timed-out run never exits 0");
    }

    #[test]
    fn the_waiting_line_says_how_to_approve_and_when_it_expires() {
        let a = AwaitingConfirmation {
            execution_id: "e".into(),
            confirmation_id: "01JC".into(),
            expires_at: 300_000,
        };
        assert_eq!(
            waiting_line(&a, 1_000),
            "waiting for approval — sandmesh confirm approve 01JC (expires in 4m 59s)"
        );
        assert!(waiting_line(&a, 290_000).ends_with("(expires in 10s)"));
    }

    #[test]
    fn the_summary_names_status_tier_risk_and_timings() {
        let r = ExecResult {
            execution_id: "01J".into(),
            status: ExecStatus::Ok,
            exit_code: Some(0),
            ..Default::default()
        };
        let s = summary(&r);
        for part in [
            "ok",
            "exit 0",
            "tier ephemeral",
            "risk safe",
            "ms (queued",
            "id 01J",
        ] {
            assert!(s.contains(part), "{part} in {s}");
        }
    }

    #[test]
    fn a_file_not_saved_is_named_escaped() {
        let r = ExecResult {
            files_refused: vec![messages::exec::RefusedFile {
                path: "weird\n\u{1b}[2Jname".into(),
                reason: "control character '\\n' in path".into(),
            }],
            ..Default::default()
        };
        let s = summary(&r);
        assert!(
            s.contains("file not saved: \"weird\\n\\u{1b}[2Jname\""),
            "{s}"
        );
        assert!(!s.contains('\u{1b}'), "{s}");
    }
}
