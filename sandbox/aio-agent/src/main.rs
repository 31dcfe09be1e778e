//! `sandmesh-aio-agent`: the command of the sandmesh AIO image.
//!
//! Environment (upstream AIO's names where it has one):
//! `SANDBOX_API_KEY` (required), `SANDBOX_SRV_PORT` (8080; 0 picks a free port),
//! `AIO_BIND_ADDR` (0.0.0.0), `WORKSPACE` (else `HOME`), `AIO_MAX_BODY_BYTES` (16 MiB),
//! `AIO_MAX_OUTPUT_BYTES` (1 MiB per stream), `AIO_DEFAULT_TIMEOUT_S` (60),
//! `AIO_MAX_TIMEOUT_S` (600), `AIO_TRUST_LOOPBACK` (0), `AIO_MAX_SESSIONS` (16 kernel
//! sessions), `AIO_SESSION_IDLE_S` (1800, upstream's), `CHROMIUM_BIN` (chromium),
//! `CHROMIUM_PORT` (9222), `BROWSER_EXTRA_ARGS` (space separated), `AIO_CONTROL_SOCKET` (a
//! Unix socket path to serve the same API on, for a pool that reaches an instance with no
//! network through a bind-mounted directory; unset, none).
//!
//! Prints `listening on <addr>` on stdout once it accepts connections. Exit code 64 on bad
//! configuration (every problem reported at once).

use std::net::SocketAddr;
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use aio_agent::{Agent, AgentConfig, BrowserConfig};

fn config() -> Result<(AgentConfig, SocketAddr, Option<PathBuf>), Vec<String>> {
    let mut problems = Vec::new();
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let number = |problems: &mut Vec<String>, name: &str, default: u64| match var(name) {
        None => default,
        Some(v) => v.parse().unwrap_or_else(|_| {
            problems.push(format!("{name}={v} is not a number"));
            default
        }),
    };
    let port = number(&mut problems, "SANDBOX_SRV_PORT", 8080);
    let max_body = number(&mut problems, "AIO_MAX_BODY_BYTES", 16 << 20);
    let max_output = number(&mut problems, "AIO_MAX_OUTPUT_BYTES", 1 << 20);
    let default_timeout = number(&mut problems, "AIO_DEFAULT_TIMEOUT_S", 60);
    let max_timeout = number(&mut problems, "AIO_MAX_TIMEOUT_S", 600);
    let chromium_port = number(&mut problems, "CHROMIUM_PORT", 9222);
    let max_sessions = number(&mut problems, "AIO_MAX_SESSIONS", 16);
    let session_idle = number(&mut problems, "AIO_SESSION_IDLE_S", 1800);
    if max_sessions == 0 {
        problems.push("AIO_MAX_SESSIONS must be at least 1".into());
    }
    let api_key = var("SANDBOX_API_KEY").unwrap_or_else(|| {
        problems.push("SANDBOX_API_KEY is required (every request must carry it)".into());
        String::new()
    });
    let bind = var("AIO_BIND_ADDR").unwrap_or_else(|| "0.0.0.0".into());
    let addr = match format!("{bind}:{port}").parse::<SocketAddr>() {
        Ok(a) => Some(a),
        Err(_) => {
            problems.push(format!(
                "AIO_BIND_ADDR={bind} / SANDBOX_SRV_PORT={port} is not an address"
            ));
            None
        }
    };
    if u16::try_from(chromium_port).is_err() {
        problems.push(format!("CHROMIUM_PORT={chromium_port} is not a port"));
    }
    let workspace = var("WORKSPACE").or_else(|| var("HOME")).map(PathBuf::from);
    if workspace.is_none() {
        problems.push("WORKSPACE (or HOME) must name the workspace directory".into());
    }
    let trust_loopback = match var("AIO_TRUST_LOOPBACK").as_deref() {
        None | Some("0") | Some("false") => false,
        Some("1") | Some("true") => true,
        Some(v) => {
            problems.push(format!("AIO_TRUST_LOOPBACK={v} is not 0 or 1"));
            false
        }
    };
    if !problems.is_empty() {
        return Err(problems);
    }
    let tmp = std::env::temp_dir();
    let script_dir = tmp.join(format!("aio-agent-{}", std::process::id()));
    let config = AgentConfig {
        api_key,
        workspace: workspace.unwrap_or_default(),
        script_dir,
        max_body_bytes: max_body as usize,
        max_output_bytes: max_output as usize,
        default_timeout: Duration::from_secs(default_timeout),
        max_timeout: Duration::from_secs(max_timeout),
        trust_loopback,
        max_sessions: max_sessions as usize,
        session_idle: Duration::from_secs(session_idle),
        browser: BrowserConfig {
            bin: var("CHROMIUM_BIN")
                .unwrap_or_else(|| "chromium".into())
                .into(),
            port: chromium_port as u16,
            data_root: tmp,
            extra_args: var("BROWSER_EXTRA_ARGS")
                .map(|v| v.split_whitespace().map(str::to_string).collect())
                .unwrap_or_default(),
        },
    };
    let control = var("AIO_CONTROL_SOCKET").map(PathBuf::from);
    Ok((
        config,
        addr.unwrap_or_else(|| ([0, 0, 0, 0], 8080).into()),
        control,
    ))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let (config, addr, control_path) = match config() {
        Ok(c) => c,
        Err(problems) => {
            for p in problems {
                eprintln!("sandmesh-aio-agent: {p}");
            }
            std::process::exit(64);
        }
    };
    if let Err(e) = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&config.script_dir)
    {
        eprintln!(
            "sandmesh-aio-agent: creating {}: {e}",
            config.script_dir.display()
        );
        std::process::exit(1);
    }
    let agent = match Agent::new(config) {
        Ok(a) => Arc::new(a),
        Err(e) => {
            eprintln!("sandmesh-aio-agent: workspace: {e}");
            std::process::exit(1);
        }
    };
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("sandmesh-aio-agent: binding {addr}: {e}");
            std::process::exit(1);
        }
    };
    let control = match control_path.as_deref().map(bind_control).transpose() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sandmesh-aio-agent: control socket: {e}");
            std::process::exit(1);
        }
    };
    match listener.local_addr() {
        Ok(a) => println!("listening on {a}"),
        Err(e) => eprintln!("sandmesh-aio-agent: local address: {e}"),
    }
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    aio_agent::serve(listener, control, agent, shutdown).await;
}

/// Binds the control socket, open to every user: the pool may run as another user than the
/// instance, and who reaches the path at all is decided by the directories above it (on the
/// host, the pool's own; in the instance, every request needs the key anyway).
fn bind_control(path: &std::path::Path) -> std::io::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let listener = tokio::net::UnixListener::bind(path)
        .map_err(|e| std::io::Error::new(e.kind(), format!("binding {}: {e}", path.display())))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
    Ok(listener)
}
