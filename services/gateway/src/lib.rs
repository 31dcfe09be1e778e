//! gateway: the HTTP face of the mesh for callers that do not speak
//! NATS — browsers, serverless functions, `curl`. REST paths under `/api/v1`, Server-Sent Events
//! for live output, an OpenAPI 3.1 document at `/api/v1/openapi.json`, one problem shape for
//! every error ([`problem`]).
//!
//! HTTP on `SANDMESH_GATEWAY_ADDR` (default `127.0.0.1:4281`). No CORS headers: a browser page
//! of another origin cannot call it unless a proxy in front says so. With `SANDMESH_E2B_ADDR`
//! set, a second listener serves E2B's API to E2B's own SDKs ([`e2b`]), with the same keys,
//! tenants and limits.
//!
//! Identity: `Authorization: Bearer <key>`; a key belongs to one tenant ([`keys`], made by
//! `sandmesh tenant key create`). The gateway acts as that tenant's agent over a NATS connection
//! of its own per tenant ([`tenants`]), so the NATS server enforces every tenant boundary — the
//! gateway holds no rule of its own about whose session is whose. Its own service user
//! (`gateway`) only answers `$SRV`, beats, and reads heartbeats for `/api/v1/runtimes`.
//!
//! ```text
//! run ── kit::Runtime ($SRV, heartbeat: tenants connected)
//!    ├── axum server (E2B facade, optional) ── e2b::router ── the same App
//!    ├── axum server ── per request: Agent = KeyStore::verify ─► RateLimiter ─► Tenants::client
//!    │                  ── handler (api, files, templates) ── the tenant's MeshClient
//!    │                  execute + Accept: text/event-stream ── stream task (output, result)
//!    └── select!: shutdown → server drains, runtime stops
//! ```

pub mod api;
pub mod body;
pub mod config;
pub mod e2b;
pub mod files;
pub mod keys;
pub mod openapi;
pub mod ports;
pub mod problem;
pub mod procs;
pub mod rate;
pub mod routes;
pub mod stream;
pub mod templates;
pub mod tenants;

use std::net::SocketAddr;
use std::sync::Arc;

use kit::{CancellationToken, Runtime, ServiceInfo};

pub use config::{GatewayConfig, Limits};

pub const SERVICE_NAME: &str = messages::ServiceName::Gateway.as_str();

pub type GatewayError = kit::http::HttpServiceError;

/// The API's base URL for a gateway listening on `addr`.
pub fn url(addr: SocketAddr) -> String {
    format!("http://{addr}/api/v1")
}

/// Listens on the configured addresses and serves until `shutdown` fires.
pub async fn run(config: GatewayConfig, shutdown: CancellationToken) -> Result<(), GatewayError> {
    let e2b = match config.e2b_addr {
        Some(addr) => Some(kit::http::bind(addr).await?),
        None => None,
    };
    serve_with(kit::http::bind(config.addr).await?, e2b, config, shutdown).await
}

/// Serves on `listener` (tests bind port 0 and read the address first) until `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    config: GatewayConfig,
    shutdown: CancellationToken,
) -> Result<(), GatewayError> {
    serve_with(listener, None, config, shutdown).await
}

/// Serves the API on `listener` and, when given, the E2B facade on `e2b`, until `shutdown`.
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    e2b: Option<tokio::net::TcpListener>,
    config: GatewayConfig,
    shutdown: CancellationToken,
) -> Result<(), GatewayError> {
    let addr = kit::http::local_addr(&listener, config.addr)?;
    let info = ServiceInfo {
        name: SERVICE_NAME.into(),
        version: env!("CARGO_PKG_VERSION").into(),
        description: "the HTTP API".into(),
    };
    let mut runtime = Runtime::start(config.kit.clone(), info).await?;
    if config.kit.tenancy_file.is_none() {
        tracing::warn!(
            "no SANDMESH_TENANCY_FILE: every API key acts with the gateway's own NATS \
             credentials, so keys of different tenants are not kept apart (debugging only)"
        );
    }
    let own = runtime
        .mesh()
        .with_jetstream(runtime.js.clone())
        .with_timeout(config.limits.request_timeout);
    let app = Arc::new(api::App {
        keys: keys::KeyStore::new(config.keys_file.clone()),
        rate: rate::RateLimiter::new(config.limits.rate_per_second, config.limits.burst),
        tenants: tenants::Tenants::new(
            config.kit.tenancy_file.clone(),
            &config.kit.nats_url,
            runtime.subjects().clone(),
            config.limits.request_timeout,
        ),
        own,
        limits: config.limits,
    });
    let probe_app = app.clone();
    runtime
        .start_heartbeat(Arc::new(move || kit::heartbeat::Load {
            metrics: [(
                "gateway_tenants_connected".to_string(),
                probe_app.tenants.connected() as f64,
            )]
            .into(),
            ..Default::default()
        }))
        .await?;
    tracing::info!(url = %url(addr), "gateway serving");
    let configured = config.e2b_addr.unwrap_or(addr);
    let facade = async {
        let Some(listener) = e2b else {
            return Ok(());
        };
        let addr = kit::http::local_addr(&listener, configured)?;
        tracing::info!(url = %format!("http://{addr}"), "E2B facade serving");
        serve_router(listener, e2b::router(app.clone()), &shutdown).await
    };
    let served = tokio::try_join!(
        serve_router(listener, routes::router(app.clone()), &shutdown),
        facade
    );
    runtime.shutdown().await;
    served.map(|_| ())
}

async fn serve_router(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    shutdown: &CancellationToken,
) -> Result<(), GatewayError> {
    // Small answers go out at once, not after the client's delayed ACK.
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown.clone().cancelled_owned())
        .await
        .map_err(|source| GatewayError::Serve {
            service: SERVICE_NAME,
            source,
        })
}
