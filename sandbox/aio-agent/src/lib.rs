//! sandmesh-aio-agent: the process inside the sandmesh AIO image.
//!
//! It serves the subset of the AIO sandbox HTTP API (`reference/aio-sandbox-openapi.json`)
//! that aio-pool and its users need (clients written for upstream's `ghcr.io/agent-infra/sandbox`
//! work unchanged), on one port for the instance's own code and on a Unix socket for the pool,
//! which reaches an instance with no network through a directory bind-mounted into it:
//!
//! | route | what |
//! |---|---|
//! | `GET /v1/sandbox` | health and info (`SandboxResponse`) |
//! | `POST /v1/shell/exec`, `POST /v1/bash/exec` | run a command (timeout, cwd, output cap) |
//! | `POST /v1/file/{read,write,list,upload}`, `GET /v1/file/download` | workspace files |
//! | `POST /v1/file/{replace,search,find,str_replace_editor}` | text tools ([`edit`]) |
//! | `/v1/jupyter/*`, `/v1/code/*`, `POST /v1/nodejs/execute` | code; stateful sessions keep a kernel ([`kernel`], [`code`]) |
//! | `GET /v1/browser/info` | the CDP URL (starts Chromium on first use) |
//! | `GET /v1/browser/screenshot`, `/v1/browser/page/*` | the current page over CDP ([`page`]); its console ([`console`]) and recording ([`record`]) |
//! | `GET /json/version` (and `/json/version/`), `/json/list` | Chromium's discovery, URLs rewritten to this agent |
//! | `GET /devtools/...` (WebSocket) | relayed to Chromium on 127.0.0.1 |
//!
//! Every request needs the instance's API key (`SANDBOX_API_KEY`) as `X-AIO-API-Key`,
//! `Authorization: Bearer <key>` or `?api_key=` — the three forms upstream accepts. With
//! `trust_loopback`, requests from 127.0.0.1 need none: inside the container only the
//! instance's own processes can come from there, and they already share its user (the
//! image turns it on so code in the instance can use its browser).
//!
//! Commands and kernel cells are serialised: one at a time per agent (upstream corrupts a
//! shell session under concurrent calls; the pool serialises too, this guards direct
//! callers). Page actions are serialised among themselves.

pub mod api;
pub mod avi;
pub mod browser;
pub mod code;
pub mod console;
pub mod edit;
pub mod exec;
pub mod files;
pub mod kernel;
pub mod page;
pub mod record;
mod reply;
mod routes;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, UnixListener};

pub use browser::BrowserConfig;

#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub api_key: String,
    pub workspace: PathBuf,
    /// Where command scripts are written (a private directory).
    pub script_dir: PathBuf,
    /// Largest request body; more is answered 413.
    pub max_body_bytes: usize,
    /// Bytes of output kept per stream of one command.
    pub max_output_bytes: usize,
    pub default_timeout: Duration,
    pub max_timeout: Duration,
    pub trust_loopback: bool,
    pub browser: BrowserConfig,
    /// Most kernel sessions at once (the least recently used idle one makes room).
    pub max_sessions: usize,
    /// A session unused this long is closed.
    pub session_idle: Duration,
}

/// Shared by all connections.
pub struct Agent {
    config: AgentConfig,
    workspace: files::Workspace,
    editor: edit::Editor,
    runner: exec::Runner,
    kernels: kernel::Kernels,
    /// Held for the whole of a command or cell: they run one at a time.
    exec_lock: tokio::sync::Mutex<()>,
    browser: browser::Browser,
    /// Held for the whole of a page action, so two never interleave on one page.
    page_lock: tokio::sync::Mutex<()>,
    /// The page's console, kept between calls by a listener of its own.
    console: Arc<console::Console>,
    /// The page's screen recording (one at a time).
    recorder: record::Recorder,
}

impl Agent {
    pub fn new(config: AgentConfig) -> std::io::Result<Self> {
        let workspace = files::Workspace::new(&config.workspace, config.max_body_bytes as u64)?;
        let kernels = kernel::Kernels::new(kernel::KernelConfig {
            workspace: workspace.root().to_path_buf(),
            max_output_bytes: config.max_output_bytes,
            max_sessions: config.max_sessions,
            idle_timeout: config.session_idle,
        });
        Ok(Self {
            runner: exec::Runner::new(config.script_dir.clone()),
            browser: browser::Browser::new(config.browser.clone()),
            exec_lock: tokio::sync::Mutex::new(()),
            page_lock: tokio::sync::Mutex::new(()),
            console: console::Console::new(),
            recorder: record::Recorder::default(),
            editor: edit::Editor::new(workspace.clone()),
            kernels,
            workspace,
            config,
        })
    }

    /// Runs a command, one at a time with the agent's other commands and cells.
    async fn run(&self, cmd: exec::Command) -> Result<exec::Outcome, reply::Reply> {
        let _one_at_a_time = self.exec_lock.lock().await;
        self.runner.run(cmd).await.map_err(|e| {
            reply::error(
                hyper::StatusCode::INTERNAL_SERVER_ERROR,
                format!("running the command: {}", files::error_chain(&e)),
            )
        })
    }

    /// Stops the browser (before the process exits).
    pub async fn stop(&self) {
        self.browser.stop().await;
    }
}

/// Who is on the other end of a connection.
#[derive(Debug, Clone, Copy)]
pub enum Peer {
    /// A TCP peer: in a container with no network, only the instance's own processes.
    Tcp(SocketAddr),
    /// The control socket: the pool, from the host, through the bind-mounted directory (and
    /// anything in the instance that opens the same path, which is why it needs the key).
    Control,
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::Tcp(addr) => addr.fmt(f),
            Peer::Control => f.write_str("the control socket"),
        }
    }
}

/// Serves connections from `listener` and, when given, the `control` Unix socket until
/// `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    control: Option<UnixListener>,
    agent: Arc<Agent>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a.map(|(s, peer)| (Stream::Tcp(s), Peer::Tcp(peer))),
            a = accept_control(control.as_ref()) => a.map(|s| (Stream::Unix(s), Peer::Control)),
            () = &mut shutdown => break,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                eprintln!("sandmesh-aio-agent: accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        match stream {
            Stream::Tcp(s) => tokio::spawn(serve_stream(s, agent.clone(), peer)),
            Stream::Unix(s) => tokio::spawn(serve_stream(s, agent.clone(), peer)),
        };
    }
    agent.stop().await;
}

enum Stream {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

/// The next control connection; never, without a control socket.
async fn accept_control(control: Option<&UnixListener>) -> std::io::Result<tokio::net::UnixStream> {
    match control {
        Some(l) => l.accept().await.map(|(s, _)| s),
        None => std::future::pending().await,
    }
}

async fn serve_stream<S>(stream: S, agent: Arc<Agent>, peer: Peer)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req| {
        let agent = agent.clone();
        async move { Ok::<_, std::convert::Infallible>(routes::handle(agent, peer, req).await) }
    });
    let conn = http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    if let Err(e) = conn.await {
        if !e.is_incomplete_message() {
            eprintln!("sandmesh-aio-agent: connection from {peer}: {e}");
        }
    }
}

/// Whether `peer` may skip the key.
fn trusted_peer(config: &AgentConfig, peer: Peer) -> bool {
    matches!(peer, Peer::Tcp(addr) if config.trust_loopback && addr.ip().is_loopback())
}
