//! The scheduler: the front door of the mesh (seed 000 §5.2, seed 003 §2.1). It validates an
//! exec request, asks the risk-assessor, asks for confirmation when required, picks a tier and
//! a node, dispatches to a docker executor, stores the result and audits every step. It keeps
//! the runtime registry (executor heartbeats) and the sessions (affinity and failover).
//!
//! Subjects: `exec` (sync), `test` (a test-driven execution, [`testrun`]), `jobs.exec` (async,
//! stream `SANDBOX_JOBS`), `results.<id>` (stream `SANDBOX_RESULTS`), `exec.result`,
//! `sessions.{open,get,list,close}`. It calls `risk.assess`, `confirm.request` /
//! `confirm.get`, `workspace.init`, `workspace.read` (test reports), `executor.docker.run` and
//! `executor.docker.<node>.*`, and listens to `confirm.decided.*`.
//!
//! **Waiting for a person never holds capacity.** An execution that needs approval is parked
//! in the KV bucket `Subjects::parked_executions_bucket()` (state `awaiting_confirmation`, the
//! confirmation id and expiry, the request, tier and limits), its admission permit is released,
//! and it resumes on `confirm.decided.<tenant>.<id>` — on whichever instance claims it first,
//! also after a restart — or is denied when the confirmation expires. An async job is acked
//! once parked. A sync caller keeps waiting for the final reply; to be told at once, it sends
//! the request header `Sandmesh-Notify` (any value) and receives on its reply subject, before
//! the result, one message with header `Sandmesh-Status: awaiting-confirmation` and the JSON
//! body `{execution_id, confirmation_id, expires_at}` (opt-in, because a plain request-reply
//! client would take that first message for the reply).
//!
//! Tenancy (DESIGN.md §5): the caller is who the server says it is (`Nats-Request-Info`), ids it
//! names are scoped by its tenant, and a job's tenant is in its subject (`jobs.<tenant>.exec`).
//!
//! ```text
//! run ── Runtime (endpoints: exec, aio.exec, exec.result, sessions.*; heartbeat)
//!     ├─ Root actor ──supervises──▶ Registry actor (restarted and re-preloaded; run() fails
//!     │                              when it keeps dying) ◀── heartbeat watch task (KV)
//!     │                              └─ lost nodes ──▶ SessionApi::mark_lost_sessions
//!     ├─ SessionReaper (closes sessions past their TTL or idle time, removes old records)
//!     ├─ TestRuns ──▶ Intake (a test run is an execution; its report read from the workspace)
//!     ├─ Intake (sync) ─┐
//!     ├─ Jobs (async) ──┼──▶ Pipeline ── Placer (registry + slots Notify), SessionAffinity,
//!     └─ Resumer ───────┘    ExecutorRunner (Dispatcher), AioRunner, Confirmations, ResultStore,
//!                            Claims, ParkedStore
//! ```
//! Other services are called through `sandmesh-client`'s typed clients, as users call the
//! mesh (`kit::Runtime::mesh`); the scheduler's policy (retries, recovery of a lost reply, the
//! AIO command) sits on top of them. Errors travel up as [`SchedulerError`], their causes kept,
//! and become the wire's `ErrorBody` at the endpoint.
//!
//! ```text
//! ```
//! A semaphore of `SANDMESH_SCHED_MAX_QUEUE` permits, shared by Intake, Jobs and Resumer, is
//! the bounded queue.

pub mod affinity;
pub mod aio;
pub mod claims;
pub mod config;
pub mod confirm;
pub mod dispatch;
pub mod error;
pub mod execution;
pub mod executor_runner;
pub mod fairness;
pub mod intake;
pub mod jobs;
pub mod network;
pub mod parking;
pub mod pipeline;
pub mod placement;
pub mod placer;
pub mod registry;
pub mod results;
pub mod resumer;
pub mod root;
pub mod session_api;
pub mod session_reaper;
pub mod sessions;
pub mod templates;
pub mod testrun;
pub mod tier;

use std::sync::Arc;
use std::time::Duration;

use kit::{KitError, Runtime, ServiceInfo};
use messages::subjects::SessionOp;
use ractor::Actor;
use tokio::sync::{mpsc, oneshot, Notify};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use config::SchedulerConfig;
pub use error::{SchedulerError, StoreError};
pub use execution::{Origin, Outcome};

use crate::affinity::SessionAffinity;
use crate::aio::AioRunner;
use crate::claims::Claims;
use crate::confirm::Confirmations;
use crate::dispatch::Dispatcher;
use crate::executor_runner::ExecutorRunner;
use crate::fairness::{Admission, TenantSlots};
use crate::intake::Intake;
use crate::jobs::{Jobs, JobsError};
use crate::parking::ParkedStore;
use crate::pipeline::Pipeline;
use crate::placer::Placer;
use crate::registry::RegistryArgs;
use crate::results::ResultStore;
use crate::resumer::Resumer;
use crate::root::{Root, RootArgs};
use crate::session_api::SessionApi;
use crate::session_reaper::SessionReaper;
use crate::sessions::SessionTable;
use crate::testrun::TestRuns;

pub const SERVICE_NAME: &str = messages::ServiceName::Scheduler.as_str();

/// Why [`run`] could not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Kit(#[from] KitError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("starting the supervision tree")]
    Actor(#[source] ractor::SpawnErr),
    #[error(transparent)]
    Jobs(#[from] JobsError),
    #[error("subscribing to confirmation decisions")]
    Decisions(#[source] async_nats::SubscribeError),
    #[error("the root actor stopped: the runtime registry could not be kept running")]
    RegistryLost,
}

/// Serves `$method(ctx, req)` of `$target` on `$subject`. Its error (a [`SchedulerError`], or
/// the refusal of an endpoint that only checks its input) becomes the wire's `ErrorBody` here.
macro_rules! serve {
    ($runtime:expr, $($subject:expr => $target:ident . $method:ident),+ $(,)?) => {$(
        let target = $target.clone();
        $runtime
            .serve(
                $subject,
                kit::handler(move |ctx, req| {
                    let target = target.clone();
                    async move { target.$method(ctx, req).await.map_err(messages::ErrorBody::from) }
                }),
            )
            .await?;
    )+};
}

/// Runs the scheduler until `shutdown`, then stops taking work and lets the executions in
/// flight finish (bounded by `SANDMESH_SHUTDOWN_GRACE_MS`). Every NATS wait on the way out is
/// bounded too, so it stops even with its server gone. Fails when the registry actor cannot be
/// kept running.
///
/// Boxed ([`kit::ServiceFuture`]): the `sandmesh` binary starts every service.
#[inline(never)]
pub fn run(config: SchedulerConfig, shutdown: CancellationToken) -> kit::ServiceFuture<RunError> {
    Box::pin(run_until_shutdown(config, shutdown))
}

async fn run_until_shutdown(
    config: SchedulerConfig,
    shutdown: CancellationToken,
) -> Result<(), RunError> {
    let info = ServiceInfo {
        name: SERVICE_NAME.into(),
        version: env!("CARGO_PKG_VERSION").into(),
        description: "validates, assesses, confirms, places and runs executions".into(),
    };
    let mut runtime = Runtime::start(config.kit.clone(), info).await?;
    let subjects = runtime.subjects().clone();
    let js = runtime.js.clone();
    let auditor = runtime.auditor.clone();
    let mesh = runtime.mesh();
    let instance = &config.kit.instance_id;
    let owner = format!("{SERVICE_NAME}.{instance}");
    let replicas = config.kit.js_replicas;
    let results = ResultStore::open(&js, &subjects, replicas, runtime.metrics.clone()).await?;
    let claims = Claims::open(&js, &subjects, &owner, config.claim_ttl, replicas).await?;
    let parked = ParkedStore::open(&js, &subjects, replicas).await?;
    let sessions = SessionTable::new(
        kit::bootstrap::sessions_kv(&js, &subjects, replicas).await?,
        runtime.quotas.clone(),
    );
    let nodes = kit::bootstrap::nodes_kv(&js, &subjects, replicas).await?;

    let (lost_tx, lost_rx) = mpsc::unbounded_channel();
    let slots = Arc::new(Notify::new());
    // Lagging receivers look the node up instead, so a small buffer is enough.
    let (removed, _) = tokio::sync::broadcast::channel(64);
    let (handle_tx, handle_rx) = oneshot::channel();
    let root_args = RootArgs {
        registry: RegistryArgs {
            strategy: config.placement,
            on_lost: lost_tx,
            slots: slots.clone(),
            removed: removed.clone(),
            metrics: runtime.metrics.clone(),
        },
        registry_name: registry::actor_name(instance),
        nodes: nodes.clone(),
        handle: handle_tx,
    };
    let (root, mut root_done) = Actor::spawn(None, Root, root_args)
        .await
        .map_err(RunError::Actor)?;
    let registry = handle_rx.await.map_err(|_| RunError::RegistryLost)?;
    let background = CancellationToken::new();
    let watch = registry::spawn_watch(nodes, registry.clone(), background.clone());

    let placer = Placer::new(
        registry.clone(),
        slots,
        removed,
        config.placement,
        auditor.clone(),
    );
    let executor = ExecutorRunner::new(mesh.executors(), auditor.clone());
    let aio = AioRunner::new(&mesh);
    // Everything an execution or a session does off a request's path — jobs, resumes, stores
    // after a sync reply, session bookkeeping: the stop waits for it, bounded by the grace.
    let in_flight = TaskTracker::new();
    // Cancelled when the scheduler stops taking work: the job and resume loops and the reaper
    // end, parked sync callers are answered.
    let stopping = CancellationToken::new();
    let affinity = SessionAffinity::new(
        sessions,
        placer.clone(),
        executor.clone(),
        &mesh,
        auditor.clone(),
        in_flight.clone(),
    );
    let policy = config.policy();
    let pipeline = Pipeline {
        risk: mesh.clone().with_timeout(policy.assess_timeout).risk(),
        templates: mesh.templates(),
        results,
        claims: claims.clone(),
        confirmations: Confirmations::new(mesh.confirm(), config.confirm_timeout),
        parked,
        dispatcher: Dispatcher::new(
            placer,
            executor.clone(),
            affinity.clone(),
            aio.clone(),
            config.exec_grace,
            config.template_build_grace,
            config.ephemeral_backend,
        ),
        auditor: auditor.clone(),
        stores: in_flight.clone(),
        policy,
    };
    let admission = Admission::new(
        config.max_queue,
        TenantSlots::new(
            config.tenant_max,
            runtime.quotas.clone(),
            Arc::new(runtime.peer_counts().await?),
        ),
    );
    let intake = Intake::new(pipeline.clone(), admission.clone(), &mesh, stopping.clone());
    // The jobs stream exists before anything answers: a client that saw the scheduler answer
    // may publish a job at once.
    let jobs = Jobs::new(
        pipeline.clone(),
        subjects.clone(),
        admission.clone(),
        config.job_settings(),
    );
    let consumer = jobs.consumer(&js, &subjects, replicas).await?;
    let sessions = SessionApi::new(affinity, executor, aio, auditor, config.policy());
    let lost = tokio::spawn(sessions.clone().mark_lost_sessions(lost_rx));
    let reaper = SessionReaper::new(sessions.clone(), config.sessions);
    let reaping = tokio::spawn(reaper.run(stopping.clone()));
    let tests = TestRuns::new(
        intake.clone(),
        sessions.clone(),
        mesh.clone(),
        config.policy().ceilings,
    );

    let s = subjects.clone();
    serve!(runtime,
        s.exec() => intake.exec,
        s.test() => tests.test,
        s.aio("exec") => intake.aio_exec,
        s.results_get() => intake.lookup,
        s.sessions(SessionOp::Open) => sessions.open,
        s.sessions(SessionOp::Get) => sessions.get,
        s.sessions(SessionOp::List) => sessions.list,
        s.sessions(SessionOp::Close) => sessions.close,
    );
    let probe = admission.clone();
    let held = admission.tenants.clone();
    runtime
        .start_heartbeat_reporting(
            Arc::new(move || {
                let in_flight = probe.in_flight();
                kit::heartbeat::Load {
                    capacity: probe.size as u32,
                    load: in_flight as u32,
                    metrics: [("executions_in_flight".to_string(), in_flight as f64)].into(),
                    ..Default::default()
                }
            }),
            Some(Arc::new(move || held.held())),
        )
        .await?;

    let resumer = Resumer::new(
        pipeline,
        admission.queue.clone(),
        &mesh,
        config.parked_sweep,
        in_flight.clone(),
    );
    let resumer = resumer
        .start(stopping.clone())
        .await
        .map_err(RunError::Decisions)?;
    let jobs_loop = tokio::spawn(jobs::run(
        jobs,
        consumer,
        stopping.clone(),
        in_flight.clone(),
    ));
    tracing::info!(instance = %owner, "scheduler running");

    let outcome = tokio::select! {
        _ = shutdown.cancelled() => Ok(()),
        _ = &mut root_done => Err(RunError::RegistryLost),
    };
    tracing::info!("scheduler stopping: finishing executions in flight");
    // Parked sync callers are answered now (their executions stay parked), so the endpoint
    // shutdown below does not wait for a person.
    stopping.cancel();
    join_bounded("jobs", jobs_loop).await;
    join_bounded("resumer", resumer).await;
    join_bounded("session reaper", reaping).await;
    let grace = config.kit.shutdown_grace;
    let started = tokio::time::Instant::now();
    // Closed, it still takes what its tasks spawn (a job's store after its run), and waits
    // for that too.
    in_flight.close();
    if tokio::time::timeout(grace, in_flight.wait()).await.is_err() {
        tracing::warn!(
            "executions still running after the grace period; they will be redelivered or resumed"
        );
    }
    // Claims released by the executions that just ended; each release is itself bounded.
    let left = grace.saturating_sub(started.elapsed());
    claims
        .finish_releases(left.max(kit::shutdown::NATS_STEP_LIMIT))
        .await;
    runtime.shutdown().await;
    // The heartbeat watch runs until here: executions finishing above may still need to learn
    // that their node was lost.
    background.cancel();
    join_bounded("heartbeat watch", watch).await;
    lost.abort();
    if outcome.is_ok() {
        // The root first, so it does not restart the registry stopped after it.
        let _ = root.stop_and_wait(None, Some(Duration::from_secs(5))).await;
    }
    registry.get().stop(None);
    outcome
}

/// Joins a background loop of the stop path. Each races its NATS waits with its token and
/// ends at once; the bound only keeps the stop from hanging should one not.
async fn join_bounded(name: &str, task: tokio::task::JoinHandle<()>) {
    if tokio::time::timeout(kit::shutdown::NATS_STEP_LIMIT, task)
        .await
        .is_err()
    {
        tracing::warn!(task = name, "background task did not stop; left behind");
    }
}
