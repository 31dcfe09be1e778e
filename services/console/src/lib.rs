//! console: the operators' web page. Operators see pending
//! confirmations live and decide them — approve once, approve for the session, deny with a
//! reason that reaches the agent — and read recent executions and a session's audit tail.
//!
//! HTTP on `SANDMESH_CONSOLE_ADDR` (default `127.0.0.1:4280`): server-rendered HTML, one small
//! script, no build step, no third-party assets (works offline); live updates over
//! Server-Sent Events ([`web`]).
//!
//! Identity: an operator logs in with its NATS operator credentials and the console keeps a
//! NATS connection *as that operator* for the login ([`logins`]): decisions go over it, so the
//! confirmation service records the authenticated operator (never "console"), and the live
//! feed is whatever that operator's account imports — `confirm.{pending,decided}.<tenant>.*`
//! and `audit.<tenant>.*` of its scope. The console's own service user (`console`) only
//! reads the audit stream for the activity view ([`history`], filtered to the operator's
//! scope) and answers `$SRV.*`.
//!
//! ```text
//! run ── kit::Runtime ($SRV, heartbeat: logins open)
//!    ├── axum server ── per request: Logins::find(cookie) ── Login (operator's NATS client)
//!    │                  /events: SSE ◄── broadcast ◄── Login's feed task (NATS subscriptions)
//!    ├── sweep (every minute: logins past their time end)
//!    └── select!: shutdown → event streams end, server drains, runtime stops
//! ```

pub mod app;
pub mod config;
pub mod escape;
pub mod highlight;
pub mod history;
pub mod live;
pub mod logins;
pub mod render;
pub mod web;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kit::{CancellationToken, Runtime, ServiceInfo};
use messages::Encoding;

pub use config::{ConsoleConfig, Operators};

pub const SERVICE_NAME: &str = messages::ServiceName::Console.as_str();

/// How often logins past their time are ended.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

pub type ConsoleError = kit::http::HttpServiceError;

/// The page's address for a console listening on `addr`.
pub fn url(addr: SocketAddr) -> String {
    format!("http://{addr}/")
}

/// Listens on the configured address and serves until `shutdown` fires.
pub async fn run(config: ConsoleConfig, shutdown: CancellationToken) -> Result<(), ConsoleError> {
    serve(kit::http::bind(config.addr).await?, config, shutdown).await
}

/// Serves on `listener` (tests bind port 0 and read the address first) until `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    config: ConsoleConfig,
    shutdown: CancellationToken,
) -> Result<(), ConsoleError> {
    let addr = kit::http::local_addr(&listener, config.addr)?;
    let info = ServiceInfo {
        name: SERVICE_NAME.into(),
        version: env!("CARGO_PKG_VERSION").into(),
        description: "the operators' web page".into(),
    };
    let mut runtime = Runtime::start(config.kit.clone(), info).await?;
    let subjects = runtime.subjects().clone();
    if config.operators.is_anyone() {
        tracing::warn!(
            "no operators configured (SANDMESH_OPERATOR_SCOPES or SANDMESH_TENANCY_FILE): \
             whoever NATS lets in may use the console"
        );
    }
    let own = runtime
        .mesh()
        .with_jetstream(runtime.js.clone())
        .with_encoding(Encoding::Json);
    let app = Arc::new(app::App {
        logins: logins::Logins::new(
            &config.kit.nats_url,
            subjects,
            config.operators.clone(),
            config.session_ttl,
            config.state_dir.clone(),
        ),
        history: history::History::new(own),
        hosts: app::App::hosts_for(addr, &config.extra_origins),
        extra_origins: config.extra_origins.clone(),
        session_ttl: config.session_ttl,
        shutdown: shutdown.clone(),
    });
    let probe_app = app.clone();
    runtime
        .start_heartbeat(Arc::new(move || kit::heartbeat::Load {
            metrics: [(
                "console_logins".to_string(),
                probe_app.logins.live_count() as f64,
            )]
            .into(),
            ..Default::default()
        }))
        .await?;
    tracing::info!(url = %url(addr), "console serving");
    let server = axum::serve(listener, web::router(app.clone()))
        .with_graceful_shutdown(shutdown.clone().cancelled_owned());
    let sweeper = {
        let app = app.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(SWEEP_EVERY);
            loop {
                every.tick().await;
                app.logins.sweep();
            }
        })
    };
    let served = server.await.map_err(|source| ConsoleError::Serve {
        service: SERVICE_NAME,
        source,
    });
    sweeper.abort();
    runtime.shutdown().await;
    served
}
