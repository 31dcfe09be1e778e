//! sandmesh-mcp: the mesh as Model Context Protocol tools, for agents that speak MCP.
//!
//! A thin client: it holds one tenant's NATS connection ([`MeshClient`]) and calls the same
//! subjects any client calls — `exec` (with `Sandmesh-Notify`, so a run that waits for a
//! person is reported at once instead of holding the call), `exec.result`, `workspace.*`,
//! `browser.*`, `proc.*` and `ports.expose`. It owns no subject and no state, and is not a mesh service (no `$SRV`, no
//! heartbeat): the tenant's account could not serve one anyway.
//!
//! ```text
//! serve_stdio ── rmcp service over stdin/stdout ── MeshTools ──┐
//! serve_http ─── axum ── /mcp: rmcp StreamableHttpService      ├── MeshClient (the tenant's)
//!                        (one MeshTools per MCP session) ──────┘
//! ```
//!
//! The tools are in [`tools`] (code, results, files), [`browser`], [`procs`] (background processes) and
//! [`ports`]; their arguments and
//! the descriptions a model reads in [`params`]; what each answers, errors included, in
//! [`render`].

pub mod browser;
pub mod params;
pub mod ports;
pub mod procs;
pub mod render;
pub mod tools;

use std::net::SocketAddr;

use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::ServiceExt;
use sandmesh_client::MeshClient;
use tokio_util::sync::CancellationToken;

pub use tools::MeshTools;

/// Where the Streamable HTTP endpoint is served.
pub const HTTP_PATH: &str = "/mcp";

#[derive(Debug, thiserror::Error)]
pub enum McpError {
    /// The client never completed the MCP handshake (or stdin closed before it).
    #[error("the MCP handshake failed")]
    Handshake(#[source] Box<rmcp::service::ServerInitializeError>),
    #[error("the MCP service task failed")]
    Task(#[from] tokio::task::JoinError),
    #[error("the HTTP listener has no local address")]
    Listener(#[source] std::io::Error),
    #[error("cannot serve HTTP on {addr}")]
    Http {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Speaks MCP on stdin/stdout until the client closes stdin or `shutdown` fires. Nothing
/// else may write to stdout meanwhile: it carries the protocol's frames only.
pub async fn serve_stdio(mesh: MeshClient, shutdown: CancellationToken) -> Result<(), McpError> {
    let running = match MeshTools::new(mesh)
        .serve_with_ct(rmcp::transport::stdio(), shutdown)
        .await
    {
        Ok(running) => running,
        // Stopped before a client said hello: nothing went wrong.
        Err(rmcp::service::ServerInitializeError::Cancelled) => return Ok(()),
        Err(e) => return Err(McpError::Handshake(Box::new(e))),
    };
    let reason = running.waiting().await?;
    tracing::info!(?reason, "MCP client gone");
    Ok(())
}

/// Serves MCP over Streamable HTTP at [`HTTP_PATH`] on `listener` until `shutdown` fires.
/// Requests must name a loopback host (or the listener's own address) in `Host`: the SDK's
/// guard against DNS rebinding, which lets a web page reach a local server.
pub async fn serve_http(
    mesh: MeshClient,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
) -> Result<(), McpError> {
    let addr = listener.local_addr().map_err(McpError::Listener)?;
    let mut config =
        StreamableHttpServerConfig::default().with_cancellation_token(shutdown.child_token());
    if !addr.ip().is_loopback() && !addr.ip().is_unspecified() {
        config.allowed_hosts.push(addr.ip().to_string());
    }
    let service = StreamableHttpService::new(
        move || Ok(MeshTools::new(mesh.clone())),
        LocalSessionManager::default().into(),
        config,
    );
    let app = axum::Router::new().nest_service(HTTP_PATH, service);
    tracing::info!(%addr, path = HTTP_PATH, "serving MCP over Streamable HTTP");
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
        .map_err(|source| McpError::Http { addr, source })
}
