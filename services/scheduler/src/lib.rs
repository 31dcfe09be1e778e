//! The scheduler: the front door of the mesh. It validates an
//! exec request, asks the risk-assessor, asks for confirmation when required, picks a tier and
//! a node, dispatches to a docker executor, stores the result and audits every step. It keeps
//! the runtime registry (executor heartbeats) and the sessions (affinity and failover).
//!
//! Subjects: `exec` (sync), `test` (a test-driven execution, [`testrun`]), `jobs.exec` (async,
//! stream `SANDBOX_JOBS`), `results.<id>` (stream `SANDBOX_RESULTS`), `exec.result`,
//! `sessions.{open,get,list,close,ttl}`, `proc.{start,list,output,input,signal,wait,resize}` (a
//! session's background processes, [`proc_api`]), `ports.{expose,list,unexpose,connect}`
//! (preview ports, [`ports`]). It calls `risk.assess`, `confirm.request` /
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
//! Tenancy: the caller is who the server says it is (`Nats-Request-Info`), ids it
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
//! A semaphore of `SANDMESH_SCHED_MAX_QUEUE` permits, shared by Intake, Jobs and Resumer, is
//! the bounded queue.
//!
//! **Layers.** Each module imports only modules listed before it here — in a lower layer, or
//! earlier in its own — so the code reads bottom-up (a layout test keeps the module graph free
//! of cycles):
//!
//! | layer | modules | what they own |
//! |---|---|---|
//! | errors and rules | `error`, `placement`, `tier`, `fairness` | the typed errors; pure placement, tier and admission rules |
//! | state | `execution`, `claims`, `results`, `sessions`, `registry`, `network`, `templates` | an execution in flight; the KV stores; the runtime registry actor |
//! | access | `placer`, `root`, `parking`, `confirm`, `aio` | placements (guards released on drop); the registry's supervisor; parked executions; calls to confirmation and aio-pool |
//! | runs | `executor_runner`, `affinity`, `dispatch` | one run on an executor, a session's node and failover, the place and run stages |
//! | pipeline | `pipeline` | an execution from validation to its stored result |
//! | doors | `intake`, `jobs`, `resumer`, `session_api`, `testrun`, `config`, `session_reaper` | the endpoints and loops that feed the pipeline; the configuration that builds its policy |

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
pub mod ports;
pub mod proc_api;
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

use async_nats::jetstream::consumer::{pull, Consumer};
use async_nats::jetstream::kv;
use kit::{KitError, Runtime, ServiceInfo};
use messages::subjects::{PortsOp, ProcOp, SessionOp};
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
use crate::proc_api::ProcApi;
use crate::registry::RegistryArgs;
use crate::results::ResultStore;
use crate::resumer::Resumer;
use crate::root::{Root, RootArgs};
use crate::session_api::SessionApi;
use crate::session_reaper::SessionReaper;
use crate::sessions::SessionTable;
use crate::testrun::TestRuns;

type JobsConsumer = Consumer<pull::Config>;

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
pub async fn run(config: SchedulerConfig, shutdown: CancellationToken) -> Result<(), RunError> {
    let info = ServiceInfo {
        name: SERVICE_NAME.into(),
        version: env!("CARGO_PKG_VERSION").into(),
        description: "validates, assesses, confirms, places and runs executions".into(),
    };
    let mut runtime = Runtime::start(config.kit.clone(), info).await?;
    let stores = Stores::open(&runtime, &config).await?;
    let (mut tree, placer, lost) = Supervision::start(&runtime, &config, &stores).await?;
    let (parts, jobs_consumer) = Parts::build(&runtime, &config, stores, placer).await?;
    let marking = tokio::spawn(parts.sessions.clone().mark_lost_sessions(lost));
    parts.serve(&mut runtime).await?;
    let loops = parts.start_loops(&runtime, &config, jobs_consumer).await?;
    tracing::info!(instance = %config.kit.instance_id, "scheduler running");

    let outcome = tokio::select! {
        _ = shutdown.cancelled() => Ok(()),
        _ = &mut tree.root_done => Err(RunError::RegistryLost),
    };
    tracing::info!("scheduler stopping: finishing executions in flight");
    parts.stop(loops, config.kit.shutdown_grace).await;
    runtime.shutdown().await;
    tree.stop(outcome.is_ok(), marking).await;
    outcome
}

/// The JetStream state the scheduler keeps, opened (or created) before anything runs.
struct Stores {
    results: ResultStore,
    claims: Claims,
    parked: ParkedStore,
    sessions: SessionTable,
    /// The executors' heartbeats, which the registry is loaded from and watches.
    nodes: kv::Store,
}

impl Stores {
    async fn open(runtime: &Runtime, config: &SchedulerConfig) -> Result<Self, RunError> {
        let (js, subjects) = (&runtime.js, runtime.subjects());
        let replicas = config.kit.js_replicas;
        let owner = format!("{SERVICE_NAME}.{}", config.kit.instance_id);
        Ok(Self {
            results: ResultStore::open(js, subjects, replicas, runtime.metrics.clone()).await?,
            claims: Claims::open(js, subjects, &owner, config.claim_ttl, replicas).await?,
            parked: ParkedStore::open(js, subjects, replicas).await?,
            sessions: SessionTable::new(
                kit::bootstrap::sessions_kv(js, subjects, replicas).await?,
                runtime.quotas.clone(),
            ),
            nodes: kit::bootstrap::nodes_kv(js, subjects, replicas).await?,
        })
    }
}

/// The supervision tree: the root actor keeping the registry running, and the task feeding
/// it the executors' heartbeats.
struct Supervision {
    root: ractor::ActorRef<root::RootMsg>,
    /// Ends when the root stops: the registry could not be kept running.
    root_done: tokio::task::JoinHandle<()>,
    registry: registry::RegistryHandle,
    watch: tokio::task::JoinHandle<()>,
    /// Stops the heartbeat watch, last: executions finishing may still learn of a lost node.
    watching: CancellationToken,
}

impl Supervision {
    /// Starts the tree; returns it with the placer asking its registry, and the names of the
    /// nodes the registry finds lost.
    async fn start(
        runtime: &Runtime,
        config: &SchedulerConfig,
        stores: &Stores,
    ) -> Result<(Self, Placer, mpsc::UnboundedReceiver<String>), RunError> {
        let nodes = stores.nodes.clone();
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
            registry_name: registry::actor_name(&config.kit.instance_id),
            nodes: nodes.clone(),
            handle: handle_tx,
        };
        let (root, root_done) = Actor::spawn(None, Root, root_args)
            .await
            .map_err(RunError::Actor)?;
        let registry = handle_rx.await.map_err(|_| RunError::RegistryLost)?;
        let watching = CancellationToken::new();
        let watch = registry::spawn_watch(nodes, registry.clone(), watching.clone());
        let placer = Placer::new(
            registry.clone(),
            slots,
            removed,
            config.placement,
            runtime.auditor.clone(),
        );
        let tree = Self {
            root,
            root_done,
            registry,
            watch,
            watching,
        };
        Ok((tree, placer, lost_rx))
    }

    /// Stops the heartbeat watch and the marking of lost nodes' sessions fed by it, then the
    /// actors (the root first when it still runs, so it does not restart the registry
    /// stopped after it).
    async fn stop(self, root_running: bool, marking: tokio::task::JoinHandle<()>) {
        self.watching.cancel();
        join_bounded("heartbeat watch", self.watch).await;
        marking.abort();
        if root_running {
            let _ = self
                .root
                .stop_and_wait(None, Some(Duration::from_secs(5)))
                .await;
        }
        self.registry.get().stop(None);
    }
}

/// The parts that serve requests and do the work, each a handle of its own.
struct Parts {
    pipeline: Pipeline,
    admission: Admission,
    intake: Intake,
    jobs: Jobs,
    sessions: SessionApi,
    ports: ports::PortsApi,
    procs: ProcApi,
    tests: TestRuns,
    claims: Claims,
    /// Everything an execution or a session does off a request's path — jobs, resumes, stores
    /// after a sync reply, session bookkeeping: the stop waits for it, bounded by the grace.
    in_flight: TaskTracker,
    /// Cancelled when the scheduler stops taking work: the job and resume loops and the reaper
    /// end, parked sync callers are answered.
    stopping: CancellationToken,
}

/// The loops that end when the scheduler stops taking work, joined on the way out.
struct Loops {
    jobs: tokio::task::JoinHandle<()>,
    resumer: tokio::task::JoinHandle<()>,
    reaping: tokio::task::JoinHandle<()>,
}

impl Parts {
    /// The parts, and the consumer of the jobs stream: the stream exists before anything
    /// answers, as a client that saw the scheduler answer may publish a job at once.
    async fn build(
        runtime: &Runtime,
        config: &SchedulerConfig,
        stores: Stores,
        placer: Placer,
    ) -> Result<(Self, JobsConsumer), RunError> {
        let mesh = runtime.mesh();
        let auditor = runtime.auditor.clone();
        let in_flight = TaskTracker::new();
        let stopping = CancellationToken::new();
        let executor = ExecutorRunner::new(mesh.executors(), auditor.clone());
        let aio = AioRunner::new(&mesh);
        let affinity = SessionAffinity::new(
            stores.sessions,
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
            results: stores.results,
            claims: stores.claims.clone(),
            confirmations: Confirmations::new(mesh.confirm(), config.confirm_timeout),
            parked: stores.parked,
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
        let jobs = Jobs::new(
            pipeline.clone(),
            runtime.subjects().clone(),
            admission.clone(),
            config.job_settings(),
        );
        let consumer = jobs
            .consumer(&runtime.js, runtime.subjects(), config.kit.js_replicas)
            .await?;
        let ports = ports::PortsApi::new(affinity.sessions().clone(), executor.clone());
        let procs = ProcApi {
            sessions: affinity.sessions().clone(),
            executors: mesh.executors(),
            risk: pipeline.risk.clone(),
            confirm: mesh.confirm(),
            confirm_timeout: config.confirm_timeout,
            intake: intake.clone(),
            auditor: auditor.clone(),
            policy: config.policy(),
            subjects: runtime.subjects().clone(),
        };
        let sessions = SessionApi::new(affinity, executor, aio, auditor, config.policy());
        let tests = TestRuns::new(
            intake.clone(),
            sessions.clone(),
            mesh,
            config.policy().ceilings,
        );
        let parts = Self {
            pipeline,
            admission,
            intake,
            jobs,
            sessions,
            ports,
            procs,
            tests,
            claims: stores.claims,
            in_flight,
            stopping,
        };
        Ok((parts, consumer))
    }

    /// The endpoints, and the heartbeat reporting the load.
    async fn serve(&self, runtime: &mut Runtime) -> Result<(), RunError> {
        let Parts {
            intake,
            tests,
            sessions,
            ports,
            procs,
            ..
        } = self;
        let s = runtime.subjects().clone();
        serve!(runtime,
            s.exec() => intake.exec,
            s.test() => tests.test,
            s.aio("exec") => intake.aio_exec,
            s.results_get() => intake.lookup,
            s.sessions(SessionOp::Open) => sessions.open,
            s.sessions(SessionOp::Get) => sessions.get,
            s.sessions(SessionOp::List) => sessions.list,
            s.sessions(SessionOp::Close) => sessions.close,
            s.sessions(SessionOp::SetTtl) => sessions.set_ttl,
            s.ports(PortsOp::Expose) => ports.expose,
            s.ports(PortsOp::List) => ports.list,
            s.ports(PortsOp::Unexpose) => ports.unexpose,
            s.ports(PortsOp::Connect) => ports.connect,
            s.proc(ProcOp::Start) => procs.start,
            s.proc(ProcOp::List) => procs.list,
            s.proc(ProcOp::Output) => procs.output,
            s.proc(ProcOp::Input) => procs.input,
            s.proc(ProcOp::Signal) => procs.signal,
            s.proc(ProcOp::Wait) => procs.wait,
            s.proc(ProcOp::Resize) => procs.resize,
        );
        let probe = self.admission.clone();
        let held = self.admission.tenants.clone();
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
        Ok(())
    }

    /// The job and resume loops and the session reaper.
    async fn start_loops(
        &self,
        runtime: &Runtime,
        config: &SchedulerConfig,
        consumer: JobsConsumer,
    ) -> Result<Loops, RunError> {
        let reaper = SessionReaper::new(self.sessions.clone(), config.sessions);
        let reaping = tokio::spawn(reaper.run(self.stopping.clone()));
        let resumer = Resumer::new(
            self.pipeline.clone(),
            self.admission.queue.clone(),
            &runtime.mesh(),
            config.parked_sweep,
            self.in_flight.clone(),
        )
        .start(self.stopping.clone())
        .await
        .map_err(RunError::Decisions)?;
        let jobs = tokio::spawn(jobs::run(
            self.jobs.clone(),
            consumer,
            self.stopping.clone(),
            self.in_flight.clone(),
        ));
        Ok(Loops {
            jobs,
            resumer,
            reaping,
        })
    }

    /// Stops taking work and waits (within `grace`) for the work in flight.
    async fn stop(&self, loops: Loops, grace: Duration) {
        // Parked sync callers are answered now (their executions stay parked), so the
        // endpoint shutdown after this does not wait for a person.
        self.stopping.cancel();
        join_bounded("jobs", loops.jobs).await;
        join_bounded("resumer", loops.resumer).await;
        join_bounded("session reaper", loops.reaping).await;
        let started = tokio::time::Instant::now();
        // Closed, it still takes what its tasks spawn (a job's store after its run), and waits
        // for that too.
        self.in_flight.close();
        if tokio::time::timeout(grace, self.in_flight.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                "executions still running after the grace period; they will be redelivered or \
                 resumed"
            );
        }
        // Claims released by the executions that just ended; each release is itself bounded.
        let left = grace.saturating_sub(started.elapsed());
        self.claims
            .finish_releases(left.max(kit::shutdown::NATS_STEP_LIMIT))
            .await;
    }
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
