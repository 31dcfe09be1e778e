//! aio-pool: a pool of AIO sandbox containers — warm instances, session binding, idle
//! reclaim, max use count, health (tier `aio`: `docs/architecture.md#tiers`).
//!
//! The pool owns containers, not HTTP clients: every instance is a container of its own,
//! bound to one session at most once and destroyed on release (never handed to another
//! session: one sandbox per agent, as AIO's maintainers say). Instances speak the AIO HTTP
//! API (`reference/aio-sandbox-openapi.json`): the project's `sandmesh/aio` image
//! (`deploy/images/aio`, agent in `sandbox/aio-agent`). Upstream's `ghcr.io/agent-infra/sandbox`
//! speaks the same API but only over TCP, which an instance with no network cannot offer.
//!
//! Subjects (request → reply): `sandbox.v1.aio.acquire` AioAcquire → AioLease ·
//! `release` AioRelease → AioReleased · `stats` → AioStats, and the internal
//! `sandbox.v1.executor.aio.exec` AioExec → AioExecResult. Agents' `aio.exec` is the
//! scheduler's (risk assessment and confirmation first:
//! `docs/architecture.md#every-door-checked`),
//! which calls the internal one; no tenant can reach it.
//!
//! Session ids are scoped by the caller's tenant (`messages::tenancy`): tenant `acme`'s `s1`
//! is `acme-s1` here, so two tenants naming `s1` get two instances, another tenant's id is a
//! 404 like an unknown one, and the agent's `s1` is the instance the scheduler bound for its
//! session `s1`. Internal callers (the scheduler) name scoped ids already.
//!
//! ```text
//! run ── Runtime (kit: endpoints, heartbeat with the pool's figures)
//!     ├─ Pool (owns PoolState: Creating → Warm → Bound(session) → Gone; warmer + reaper tick)
//!     │   └─ Instance* (one per container; calls serialised; health timer; removes its
//!     │                 container when it stops — the pool hears it and frees the slot)
//!     └─ Janitor (start + periodic: unowned containers of this mesh, their directories)
//! ```
//! `run` fails when the Pool or the Janitor stops; the Pool replaces dead instances through
//! the warmer, capacity allowing.
//!
//! Network: none. An instance has only its own loopback, so its code reaches neither the
//! host (no bridge gateway, no host address) nor another instance; the pool drives it over a
//! Unix socket in a directory of its own (see [`docker`]). No egress is wired here: instances
//! have no way out, and this crate adds none.

pub mod aio_client;
pub mod config;
pub mod docker;
pub mod error;
pub mod instance;
pub mod janitor;
pub mod pool;
pub mod state;

use std::sync::Arc;
use std::time::Duration;

use containers::DockerError;
use kit::{actor_handler, CancellationToken, KitError, Runtime, ServiceInfo};
use ractor::Actor;

pub use config::AioPoolConfig;
use docker::{remove_control_dir, InstanceSpec, Registry};
use janitor::{AioSweeper, SERVICE_NAME};
use kit::janitor::{JanitorArgs, Sweep};
use pool::{Gauges, Pool, PoolArgs, PoolMsg};
use state::PoolState;

#[derive(Debug, thiserror::Error)]
pub enum AioPoolError {
    #[error(transparent)]
    Docker(#[from] DockerError),
    #[error(transparent)]
    Kit(#[from] KitError),
    #[error("AIO image {image} not found; build it with `deploy/images/build.sh aio` (AGENT_BIN=<sandmesh-aio-agent>) or containers::image::AIO.ensure()")]
    ImageMissing {
        image: String,
        #[source]
        source: bollard::errors::Error,
    },
    #[error("starting the {0} actor")]
    Spawn(&'static str, #[source] ractor::SpawnErr),
    #[error("the {0} actor stopped")]
    ActorStopped(&'static str),
}

/// The message with its causes (`a: b: c`), for answers that must explain themselves.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        // thiserror's `{source}` in a message would otherwise repeat the cause.
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cause = c.source();
    }
    s
}

/// Runs the aio-pool until `shutdown` is cancelled, then removes every instance and its
/// control directory.
pub async fn run(
    mut config: AioPoolConfig,
    shutdown: CancellationToken,
) -> Result<(), AioPoolError> {
    let info = ServiceInfo {
        name: SERVICE_NAME.into(),
        version: env!("CARGO_PKG_VERSION").into(),
        description: "A pool of AIO sandbox containers bound to sessions".into(),
    };
    if let Some(build) = config.image_build.take() {
        let s = &config.kit.subjects;
        let subjects = ["acquire", "release", "stats"]
            .into_iter()
            .map(|op| s.aio(op))
            .chain([s.aio_instance_exec()])
            .collect();
        match kit::pending::serve_while(&config.kit, &info, subjects, build, &shutdown).await? {
            Some(image) => config.image = image,
            None => return Ok(()),
        }
    }
    let docker = containers::connect().await?;
    docker
        .inspect_image(&config.image)
        .await
        .map_err(|source| AioPoolError::ImageMissing {
            image: config.image.clone(),
            source,
        })?;
    let mut runtime = Runtime::start(config.kit.clone(), info).await?;
    let subjects = runtime.subjects().clone();
    let (nodes_kv, mesh) = runtime.nodes_and_mesh().await?;
    let spec = InstanceSpec::from_config(&config, &mesh);

    // The heartbeat first: other pools' janitors judge this one's containers by it.
    let gauges = Arc::new(Gauges::default());
    let limits = config.limits;
    let probe = gauges.clone();
    let labels = std::collections::BTreeMap::from([
        ("image".to_string(), config.image.clone()),
        ("mesh".to_string(), mesh.clone()),
    ]);
    let metrics = runtime.metrics.clone();
    let at = kit::metrics::NodeLabels {
        service: SERVICE_NAME,
        node: config.kit.instance_id.clone(),
    };
    let held = gauges.clone();
    runtime
        .start_heartbeat_reporting(
            Arc::new(move || {
                let s = probe.stats(limits.min_instances, limits.max_instances);
                // Refreshed with each beat: the same figures the heartbeat carries.
                metrics
                    .warm_pool_size
                    .get_or_create(&at)
                    .set(i64::from(s.warm));
                metrics
                    .sessions_active
                    .get_or_create(&at)
                    .set(i64::from(s.bound));
                kit::heartbeat::Load {
                    capacity: s.max,
                    load: s.bound,
                    metrics: [
                        ("aio_instances_total", s.total),
                        ("aio_instances_warm", s.warm),
                        ("aio_instances_bound", s.bound),
                        ("aio_instances_creating", s.creating),
                        ("aio_instances_retiring", s.retiring),
                        ("aio_acquires_waiting", s.waiting),
                        ("aio_instances_max", s.max),
                        ("aio_instances_min", s.min),
                    ]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), f64::from(v)))
                    .collect(),
                    labels: labels.clone(),
                    ..Default::default()
                }
            }),
            Some(Arc::new(move || {
                held.tenants
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone()
            })),
        )
        .await?;

    let registry = Registry::default();
    let sweeper = AioSweeper {
        docker: docker.clone(),
        mesh: mesh.clone(),
        me: config.kit.instance_id.clone(),
        registry: registry.clone(),
        socket_dir: config.socket_dir.clone(),
        nodes_kv: nodes_kv.clone(),
    };
    let janitor_args = JanitorArgs {
        sweeper: sweeper.clone(),
        service: messages::ServiceName::AioPool,
        node_id: config.kit.instance_id.clone(),
        nodes_kv,
        interval: config.janitor_interval,
    };
    let janitor_stop = CancellationToken::new();
    let mut janitor_task =
        tokio::spawn(kit::janitor::run_until(janitor_args, janitor_stop.clone()));
    let pool_args = PoolArgs {
        docker: docker.clone(),
        spec: spec.clone(),
        registry: registry.clone(),
        state: PoolState::new(config.limits),
        gauges,
        health_interval: config.health_interval,
        default_exec_timeout: config.default_exec_timeout,
        max_exec_timeout: config.max_exec_timeout,
        max_output_chars: config.max_output_chars,
        quotas: runtime.quotas.clone(),
        peers: Arc::new(runtime.peer_counts().await?),
    };
    let (pool, mut pool_task) = match Actor::spawn(None, Pool, pool_args).await {
        Ok(p) => p,
        Err(e) => {
            janitor_stop.cancel();
            return Err(AioPoolError::Spawn("pool", e));
        }
    };

    let served = async {
        runtime
            .serve(
                subjects.aio("acquire"),
                actor_handler(pool.clone(), PoolMsg::Acquire),
            )
            .await?;
        runtime
            .serve(
                subjects.aio("release"),
                actor_handler(pool.clone(), PoolMsg::Release),
            )
            .await?;
        runtime
            .serve(
                subjects.aio_instance_exec(),
                actor_handler(pool.clone(), PoolMsg::Exec),
            )
            .await?;
        runtime
            .serve(
                subjects.aio("stats"),
                actor_handler(pool.clone(), PoolMsg::Stats),
            )
            .await
    };
    let outcome = match served.await {
        Err(e) => Err(e.into()),
        Ok(()) => {
            tracing::info!(image = %config.image, control = %spec.control_root.display(), mesh, "aio-pool ready");
            tokio::select! {
                _ = shutdown.cancelled() => Ok(()),
                _ = &mut pool_task => Err(AioPoolError::ActorStopped("pool")),
                _ = &mut janitor_task => Err(AioPoolError::ActorStopped("janitor")),
            }
        }
    };
    runtime.shutdown().await;
    // The pool's post_stop stops every instance; each removes its container.
    pool.stop_and_wait(Some("shutdown".into()), Some(Duration::from_secs(60)))
        .await
        .ok();
    janitor_stop.cancel();
    if !janitor_task.is_finished() {
        let _ = janitor_task.await;
    }
    // Creations still in flight remove their containers when their answer finds no pool:
    // wait for them (bounded by an instance's start), or a container made after the pool
    // stopped would outlive the service. Anything else left with this owner is a leak of a
    // race above, removed by the sweep below.
    let drained = tokio::time::Instant::now() + Duration::from_secs(30);
    while !registry.is_empty() && tokio::time::Instant::now() < drained {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    sweeper.remove_all().await;
    remove_control_dir(&spec.control_root);
    outcome
}
