//! browser-router: one browser per session over `sandbox.v1.browser.<action>`.
//!
//! ```text
//! Router (session → BrowserSession, warm pool of started browser containers)
//! └── BrowserSession*   one per session: its Chromium container, egress proxy and CDP page;
//!                       actions one at a time; closed on close / session close / idle
//! (+ the kit's Heartbeat: sessions, warm browsers; a task forwarding session_closed events)
//! ```
//!
//! Each action: request checks (action, session id, sizes, backend) → for `navigate`, the URL
//! against the egress rules ([`guard`]) → the session's browser (warm, cold, or a replacement
//! for a dead one: `state_lost` in the reply) → the target element described → risk
//! assessment, and a person's confirmation for sensitive fields and `evaluate` ([`gate`]) →
//! the CDP work ([`crate::cdp`]) under the action's timeout → the page's URL and title in the reply.
//! Screenshots are written to the session workspace under `artifacts/`.
//!
//! The browser's only way out is the egress proxy the session binds for its container (see
//! [`container`] for the network and the hardening), so sub-resources and redirects are held
//! to the same policy as the navigation itself. Downloads are denied in the browser.
//!
//! Limits: requests reach whichever router instance the queue group picks, and a session's
//! browser lives in the instance that started it, so run one instance per mesh until sessions
//! are routed by owner (as the scheduler does for executors). The `aio` backend answers 503
//! until aio-pool exists. The egress policy is the instance's
//! (`SANDMESH_BROWSER_NETWORK_POLICY`), the same for every session, until sessions carry one.

pub mod chromium;
pub mod config;
pub mod container;
pub mod error;
pub mod gate;
pub mod guard;
pub mod image;
pub mod router;
pub mod session;

use std::sync::Arc;
use std::time::Duration;

use egress::EgressRules;
use futures::StreamExt;
use kit::{actor_handler, CancellationToken, EndpointOptions, KitError, Runtime, ServiceInfo};
use messages::audit::{AuditEvent, AuditKind};
use messages::{Encoding, ServiceName};
use ractor::{Actor, ActorRef};

pub use config::BrowserConfig;
use container::{ContainerError, Containers};
use gate::Gate;
use router::{Router, RouterMsg, RouterStats};
use session::Shared;

/// Largest request accepted (a script or text is at most 64 KiB; see `session`).
pub const MAX_REQUEST_BYTES: usize = 256 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    #[error(transparent)]
    Container(#[from] ContainerError),
    #[error(transparent)]
    Kit(#[from] KitError),
    #[error("invalid network policy")]
    Policy(#[source] messages::validate::ValidationError),
    #[error("starting the router actor")]
    Spawn(#[source] ractor::SpawnErr),
}

/// Runs the browser-router until `shutdown` is cancelled, then closes every browser of this
/// instance.
pub async fn run(
    mut config: BrowserConfig,
    shutdown: CancellationToken,
) -> Result<(), RouterError> {
    let info = ServiceInfo {
        name: ServiceName::BrowserRouter.as_str().into(),
        version: env!("CARGO_PKG_VERSION").into(),
        description: "One browser per session: navigate, click, fill, screenshot over CDP".into(),
    };
    if let Some(build) = config.image_build.take() {
        let subjects = vec![config.kit.subjects.browser("*")];
        match kit::pending::serve_while(&config.kit, &info, subjects, build, &shutdown).await? {
            Some(image) => config.image = image,
            None => return Ok(()),
        }
    }
    let mut runtime = Runtime::start(config.kit.clone(), info).await?;
    // Containers carry the mesh's label: the runtime knows which mesh it is.
    let (_, mesh_id) = runtime.nodes_and_mesh().await?;
    let containers = match Containers::connect(&config, &mesh_id).await {
        Ok(c) => c,
        Err(e) => {
            runtime.shutdown().await;
            return Err(e.into());
        }
    };
    let swept = containers.sweep().await;
    if swept > 0 {
        tracing::warn!(
            swept,
            "removed browser containers of an earlier run of this instance"
        );
    }
    let subjects = runtime.subjects().clone();
    let mesh = runtime.mesh();
    let rules = EgressRules::new(&config.network).map_err(RouterError::Policy)?;
    let shared = Arc::new(Shared {
        gate: Gate {
            mesh: mesh.clone(),
            auditor: runtime.auditor.clone(),
            confirm_timeout: config.confirm_timeout,
        },
        workspace: mesh.workspace(),
        auditor: runtime.auditor.clone(),
        rules,
        policy: config.network.clone(),
        quotas: runtime.quotas.clone(),
        containers: containers.clone(),
        config,
    });
    let (router, router_task) = Actor::spawn(None, Router, shared.clone())
        .await
        .map_err(RouterError::Spawn)?;

    let max = shared.config.max_browsers as u32;
    let stats = Arc::new(std::sync::Mutex::new(RouterStats::default()));
    let probe_stats = stats.clone();
    let metrics = runtime.metrics.clone();
    let at = kit::metrics::NodeLabels {
        service: ServiceName::BrowserRouter.as_str(),
        node: runtime.config.instance_id.clone(),
    };
    runtime
        .start_heartbeat(Arc::new(move || {
            // The probe is synchronous: it reports the figures the stats task last fetched.
            let s = *probe_stats.lock().expect("stats lock");
            metrics.warm_pool_size.get_or_create(&at).set(s.warm as i64);
            metrics
                .sessions_active
                .get_or_create(&at)
                .set(s.sessions as i64);
            kit::heartbeat::Load {
                capacity: max,
                load: s.sessions as u32,
                metrics: std::collections::BTreeMap::from([
                    ("browser_sessions".to_string(), s.sessions as f64),
                    ("browser_warm".to_string(), s.warm as f64),
                ]),
                ..Default::default()
            }
        }))
        .await?;
    let stats_task = tokio::spawn(refresh_stats(router.clone(), stats));
    let closed_task = tokio::spawn(forward_session_closed(
        runtime.client.clone(),
        subjects.audit_kind(AuditKind::SessionClosed.as_str()),
        router.clone(),
    ));

    let options = EndpointOptions {
        max_payload: MAX_REQUEST_BYTES,
        ..runtime.endpoint_options()
    };
    let served = runtime
        .serve_with(
            subjects.browser("*"),
            options,
            actor_handler(router.clone(), RouterMsg::act),
        )
        .await;
    if let Err(e) = served {
        router.stop(None);
        let _ = router_task.await;
        runtime.shutdown().await;
        return Err(e.into());
    }
    tracing::info!(instance = %shared.config.kit.instance_id, "browser-router ready");

    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = router.wait(None) => tracing::error!("the router actor stopped"),
    }
    runtime.shutdown().await;
    closed_task.abort();
    stats_task.abort();
    let _ = router
        .stop_and_wait(Some("shutdown".into()), Some(Duration::from_secs(60)))
        .await;
    containers.tasks.close();
    if tokio::time::timeout(Duration::from_secs(60), containers.tasks.wait())
        .await
        .is_err()
    {
        tracing::warn!("browser removals still running after 60 s");
    }
    let left = containers.sweep().await;
    if left > 0 {
        tracing::warn!(left, "removed browser containers left at shutdown");
    }
    containers.remove_socket_dir();
    Ok(())
}

/// Keeps the heartbeat's figures fresh (the heartbeat probe cannot await the actor).
async fn refresh_stats(router: ActorRef<RouterMsg>, into: Arc<std::sync::Mutex<RouterStats>>) {
    loop {
        if let Ok(ractor::rpc::CallResult::Success(s)) = router
            .call(RouterMsg::Stats, Some(Duration::from_secs(1)))
            .await
        {
            *into.lock().expect("stats lock") = s;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Every `session_closed` audit event (any tenant's; its session id is the stored, scoped one,
/// as the router keys sessions) closes that session's browser here.
async fn forward_session_closed(
    client: async_nats::Client,
    subject: String,
    router: ActorRef<RouterMsg>,
) {
    let mut events = match client.subscribe(subject.clone()).await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(subject, error = %e, "cannot watch closed sessions; browsers close on idle only");
            return;
        }
    };
    while let Some(msg) = events.next().await {
        match Encoding::Json.decode::<AuditEvent>(&msg.payload) {
            Ok(AuditEvent {
                session_id: Some(id),
                ..
            }) => {
                let _ = router.cast(RouterMsg::SessionClosed(id));
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "undecodable session_closed event"),
        }
    }
}
