//! The scheduler: the front door of the mesh (seed 000 §5.2, seed 003 §2.1). It validates an
//! exec request, asks the risk-assessor, asks for confirmation when required, picks a tier and
//! a node, dispatches to a docker executor, stores the result and audits every step. It keeps
//! the runtime registry (executor heartbeats) and the sessions (affinity and failover).
//!
//! Subjects: `exec` (sync), `jobs.exec` (async, stream `SANDBOX_JOBS`), `results.<id>` (stream
//! `SANDBOX_RESULTS`), `exec.result`, `sessions.{open,get,list,close}`. It calls `risk.assess`,
//! `confirm.request`, `workspace.init`, `executor.docker.run` and `executor.docker.<node>.*`.
//!
//! ```text
//! run ── Runtime (endpoints: exec, exec.result, sessions.*; heartbeat)
//!     ├─ Registry actor ◀── heartbeat watch task (KV sandbox_nodes)
//!     │        └─ lost nodes ──▶ session-loss task (marks their sessions Lost)
//!     ├─ jobs loop (pull consumer) ──▶ one task per job
//!     └─ Scheduler (shared by all): pipeline → dispatch / affinity; SessionTable, ResultStore,
//!        Claims; a semaphore of SANDMESH_SCHED_MAX_QUEUE permits is the bounded queue
//! ```

pub mod affinity;
pub mod config;
pub mod dispatch;
pub mod intake;
pub mod jobs;
pub mod pipeline;
pub mod placement;
pub mod registry;
pub mod results;
pub mod sessions;
pub mod tier;

use std::sync::Arc;
use std::time::Duration;

use kit::{AuditScope, KitError, Runtime, ServiceInfo};
use messages::audit::AuditKind;
use messages::subjects::SessionOp;
use ractor::Actor;
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use config::SchedulerConfig;
pub use pipeline::{Origin, Outcome, Scheduler};

use crate::pipeline::Parts;
use crate::registry::{Registry, RegistryArgs};
use crate::results::{Claims, ResultStore, StoreError};
use crate::sessions::SessionTable;

pub const SERVICE_NAME: &str = "scheduler";

#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    #[error(transparent)]
    Kit(#[from] KitError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("starting the {0} actor: {1}")]
    Actor(&'static str, String),
    #[error("async jobs: {0}")]
    Jobs(String),
}

/// Runs the scheduler until `shutdown`, then stops taking work and lets the executions in
/// flight finish (bounded by `SANDMESH_SHUTDOWN_GRACE_MS`).
pub async fn run(
    config: SchedulerConfig,
    shutdown: CancellationToken,
) -> Result<(), SchedulerError> {
    let info = ServiceInfo {
        name: SERVICE_NAME.into(),
        version: env!("CARGO_PKG_VERSION").into(),
        description: "validates, assesses, confirms, places and runs executions".into(),
    };
    let mut runtime = Runtime::start(config.kit.clone(), info).await?;
    let subjects = runtime.subjects().clone();
    let js = runtime.js.clone();
    let owner = format!("{SERVICE_NAME}.{}", config.kit.instance_id);
    let results = ResultStore::open(&js, &subjects).await?;
    let claims = Claims::open(&js, &subjects, &owner, config.claim_ttl).await?;
    let sessions = SessionTable::new(kit::bootstrap::sessions_kv(&js, &subjects).await?);
    let nodes = kit::bootstrap::nodes_kv(&js, &subjects).await?;

    let (lost_tx, lost_rx) = mpsc::unbounded_channel();
    let (registry, _) = Actor::spawn(
        None,
        Registry,
        RegistryArgs {
            strategy: config.placement,
            on_lost: lost_tx,
        },
    )
    .await
    .map_err(|e| SchedulerError::Actor("registry", e.to_string()))?;
    match registry::preload(&nodes, &registry).await {
        Ok(n) => tracing::info!(executors = n, "runtime registry loaded"),
        Err(e) => tracing::warn!(error = %e, "runtime registry not preloaded; the watch fills it"),
    }
    let background = CancellationToken::new();
    let watch = registry::spawn_watch(nodes, registry.clone(), background.clone());

    let max_queue = config.max_queue;
    let admission = Arc::new(Semaphore::new(max_queue));
    let sched = Scheduler(Arc::new(Parts {
        caller: runtime.caller(Duration::from_secs(30)),
        subjects: subjects.clone(),
        js,
        registry: registry.clone(),
        sessions: sessions.clone(),
        results,
        claims,
        auditor: runtime.auditor.clone(),
        admission: admission.clone(),
        config,
    }));
    let lost = tokio::spawn(mark_lost_sessions(sched.clone(), lost_rx));

    serve_endpoints(&runtime, &sched).await?;
    let probe = admission.clone();
    runtime
        .start_heartbeat(Arc::new(move || {
            let in_flight = max_queue - probe.available_permits();
            kit::heartbeat::Load {
                capacity: max_queue as u32,
                load: in_flight as u32,
                metrics: [("executions_in_flight".to_string(), in_flight as f64)].into(),
                ..Default::default()
            }
        }))
        .await?;

    let consumer = jobs::consumer(&sched).await.map_err(SchedulerError::Jobs)?;
    let jobs_stop = CancellationToken::new();
    let jobs_running = TaskTracker::new();
    let jobs_loop = tokio::spawn(jobs::run(
        sched.clone(),
        consumer,
        jobs_stop.clone(),
        jobs_running.clone(),
    ));
    tracing::info!(instance = %owner, "scheduler running");

    shutdown.cancelled().await;
    tracing::info!("scheduler stopping: finishing executions in flight");
    jobs_stop.cancel();
    let _ = jobs_loop.await;
    jobs_running.close();
    let grace = sched.config().kit.shutdown_grace;
    if tokio::time::timeout(grace, jobs_running.wait())
        .await
        .is_err()
    {
        tracing::warn!("async jobs still running after the grace period; they will be redelivered");
    }
    runtime.shutdown().await;
    background.cancel();
    let _ = watch.await;
    lost.abort();
    registry.stop(None);
    Ok(())
}

async fn serve_endpoints(runtime: &Runtime, sched: &Scheduler) -> Result<(), KitError> {
    let s = runtime.subjects();
    let me = sched.clone();
    runtime
        .serve(
            s.exec(),
            kit::handler(move |ctx, req| {
                let me = me.clone();
                async move { me.exec_sync(ctx, req).await }
            }),
        )
        .await?;
    let me = sched.clone();
    runtime
        .serve(
            s.results_get(),
            kit::handler(move |_, req| {
                let me = me.clone();
                async move { me.lookup(req).await }
            }),
        )
        .await?;
    let me = sched.clone();
    runtime
        .serve(
            s.sessions(SessionOp::Open),
            kit::handler(move |ctx, req| {
                let me = me.clone();
                async move { me.session_open(ctx, req).await }
            }),
        )
        .await?;
    let me = sched.clone();
    runtime
        .serve(
            s.sessions(SessionOp::Get),
            kit::handler(move |_, req| {
                let me = me.clone();
                async move { me.session_get(req).await }
            }),
        )
        .await?;
    let me = sched.clone();
    runtime
        .serve(
            s.sessions(SessionOp::List),
            kit::handler(move |_, req| {
                let me = me.clone();
                async move { me.session_list(req).await }
            }),
        )
        .await?;
    let me = sched.clone();
    runtime
        .serve(
            s.sessions(SessionOp::Close),
            kit::handler(move |ctx, req| {
                let me = me.clone();
                async move { me.session_close(ctx, req).await }
            }),
        )
        .await
}

/// Marks the sessions of every node whose heartbeat vanished as lost (seed 003 §3.3).
async fn mark_lost_sessions(sched: Scheduler, mut lost: mpsc::UnboundedReceiver<String>) {
    while let Some(node) = lost.recv().await {
        match sched.0.sessions.mark_node_lost(&node).await {
            Ok(ids) => {
                for id in ids {
                    let scope = AuditScope {
                        session_id: Some(id),
                        ..Default::default()
                    };
                    sched.audit(
                        AuditKind::SessionLost,
                        &scope,
                        serde_json::json!({"node": node, "cause": "heartbeat expired"}),
                    );
                }
            }
            Err(e) => tracing::warn!(node, error = %e, "could not mark the node's sessions lost"),
        }
    }
}
