//! executor-node: what every executor backend shares, so backends are pluggable. A backend says how
//! to make, run and remove a sandbox — a Docker container (`docker-executor`), a bubblewrap sandbox
//! (`bwrap-executor`) — by implementing [`Backend`]; this crate is the rest of the node:
//!
//! - admission: ids, the request's limits against the node's ceilings ([`NodeConfig`]), the
//!   backend's run kinds, capacity through RAII [`RunSlot`]s (429), draining (503);
//! - the executor subjects, served for the backend's kind:
//!   `sandbox.v1.executor.<backend>.run` (queue group of all nodes of the backend) and
//!   `sandbox.v1.executor.<backend>.<node_id>.{run,drain,status,proc}` (and `close` for a
//!   backend with sessions; `proc` answers 501 on a backend without background processes);
//! - one run per execution id, its answer kept a while for a caller whose reply was lost, and
//!   `status` ("what happened to X?") from that record ([`results`]);
//! - why a run or a call was refused ([`ExecutorError`], a backend's own reasons among them as
//!   [`BackendError`]s), a typed value until the endpoint answers with it;
//! - the heartbeat (capacity, running, the backend's own gauges), the janitor with its
//!   watch on other nodes' heartbeat keys, and its restart;
//! - the supervisor protocol's executor half ([`exchange`]), the run spec ([`job`]) and the
//!   classification of its report ([`outcome`]), so every backend answers alike;
//! - workspace sync with workspace-store ([`workspace`]) for backends that keep sessions, and
//!   the screening of a run's changes by the workspace's path rule before they are pushed
//!   ([`changes`]);
//! - the sandbox image and its check ([`image`]), and each template's image, built on first
//!   use ([`template_images`]): every backend runs a template in the same image;
//! - a host uid per sandbox ([`uids`]), so no per-user kernel budget is shared between two.
//!
//! ```text
//! ExecutorNode<B> (admission, drain, close; restarts the janitor, fails with the backend)
//! ├── Janitor<B::Sweeper>   removes sandboxes no live owner holds (this node, dead nodes)
//! └── (the backend's own actors, linked by `Backend::start`: pools, sessions)
//! (+ the kit's Heartbeat)
//! ```
//!
//! [`serve`] runs a node until shutdown *or until its root actor dies*: a node whose actor is
//! gone stops beating and `serve` fails, so the scheduler never sees a healthy node that
//! cannot run anything.

pub mod changes;
pub mod config;
pub mod error;
pub mod exchange;
pub mod executor;
pub mod image;
pub mod job;
pub mod node;
pub mod outcome;
pub mod results;
pub mod slot;
pub mod template_images;
pub mod uids;
pub mod workspace;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use kit::{actor_handler, CancellationToken, EndpointOptions, KitError, Runtime};
use messages::executor::ExecutorRun;
use messages::proc::{ProcCall, ProcReply};
use messages::subjects::ExecutorOp;
use messages::ServiceName;
use ractor::{Actor, ActorCell, ActorProcessingErr};

pub use config::NodeConfig;
pub use error::{BackendError, ExecutorError};
pub use executor::{ExecutorNode, NodeMsg};
pub use image::{check_image, ImageCheckError};
pub use job::{Admitted, Job, SUPERVISOR_PATH, WORKSPACE_DIR};
pub use kit::janitor::Sweep;
pub use node::NodeState;
pub use results::{KeepLimits, ResultStore};
pub use slot::RunSlot;
pub use template_images::TemplateImages;
pub use uids::{UidError, UidLease, UidPool, UidRange};

use executor::NodeArgs;
use kit::janitor::JanitorArgs;

/// Gauges a backend adds to the node's heartbeat metrics (warm pool size, sessions), read at
/// each beat.
pub type Gauges = Arc<dyn Fn(&mut BTreeMap<String, f64>) + Send + Sync>;

/// One kind of sandbox. The node admits a run, then hands it to [`Backend::execute`], which
/// answers it (from a task or an actor of its own, never by waiting in the node's handler).
pub trait Backend: Send + 'static {
    /// Removes the backend's sandboxes that nobody owns (the janitor's work).
    type Sweeper: Sweep;
    /// Which backend: its executor subjects and the heartbeat's `backends`.
    const KIND: messages::executor::Backend;
    /// Its service name: heartbeat keys, metrics labels, workspace requests.
    const SERVICE: ServiceName;
    /// Whether it keeps sessions (and so serves `close`).
    const SESSIONS: bool;

    /// The run kinds and options it takes (tier, kind, session, network); the rest of
    /// admission is the node's. A refusal is the backend's own [`BackendError`].
    fn accepts(&self, run: &ExecutorRun) -> Result<(), ExecutorError>;

    /// Starts the backend's own actors, linked to the node's root actor `node` (a failed one
    /// fails the node).
    fn start(
        &mut self,
        node: ActorCell,
    ) -> impl std::future::Future<Output = Result<(), ActorProcessingErr>> + Send;

    /// Runs an admitted execution. Must not wait for it: the run answers when it ends.
    fn execute(&mut self, run: Admitted) -> Result<(), ActorProcessingErr>;

    /// Closes a session; resolves to whether there was one.
    fn close(&self, session_id: String) -> BoxFuture<'static, bool>;

    /// The end of a drain, once nothing runs: closes every session.
    fn close_all(&self) -> BoxFuture<'static, ()>;

    /// One operation on a session's background processes (`messages::proc`); the caller's
    /// ids are scoped already. A backend without them keeps this default: 501.
    fn proc(&self, call: ProcCall) -> BoxFuture<'static, Result<ProcReply, ExecutorError>> {
        let _ = call;
        let refused = ExecutorError::NoProcesses {
            backend: Self::KIND,
        };
        Box::pin(async move { Err(refused) })
    }

    /// At stop: removes every sandbox the backend's actors hold.
    fn stop(&mut self) -> impl std::future::Future<Output = ()> + Send;

    /// The backend's own heartbeat gauges.
    fn gauges(&self) -> Gauges;
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Kit(#[from] KitError),
    #[error("starting the executor node's actor")]
    Spawn(#[source] ractor::SpawnErr),
    #[error("stopping the executor node's actor")]
    Stop(#[source] ractor::RactorErr<ractor::actor::messages::StopMessage>),
    #[error("the executor node's actor stopped: no executions can run here")]
    Died,
}

/// What [`serve`] needs besides the backend: the kit's runtime (started by the backend's
/// `run`, which needed its connection to build the backend), and the node's shared parts.
pub struct NodeParts {
    pub runtime: Runtime,
    pub config: Arc<NodeConfig>,
    pub node: Arc<NodeState>,
    /// Executions running at once; beyond it callers get 429.
    pub capacity: usize,
    /// `sandbox_nodes`, where the janitor judges other nodes.
    pub nodes_kv: async_nats::jetstream::kv::Store,
    /// Heartbeat labels besides `node`: the backend's image, mesh, ...
    pub labels: BTreeMap<String, String>,
}

/// The name the node's root actor is registered under in this process (ractor's registry):
/// one per service and node id, so operators and tests can find it.
pub fn root_actor_name(service: ServiceName, node_id: &str) -> String {
    format!("{}.{node_id}", service.as_str())
}

/// Runs a node of `backend` until `shutdown` is cancelled (or its root actor dies), then
/// stops it and removes every sandbox of the node.
pub async fn serve<B: Backend>(
    parts: NodeParts,
    backend: B,
    sweeper: B::Sweeper,
    shutdown: CancellationToken,
) -> Result<(), NodeError> {
    let NodeParts {
        mut runtime,
        config,
        node,
        capacity,
        nodes_kv,
        mut labels,
    } = parts;
    let me = config.node_id().to_string();
    labels.insert("node".into(), me.clone());

    let results = Arc::new(ResultStore::new(config.results));
    // The heartbeat first: other nodes' janitors judge this node's sandboxes by it.
    let probe_node = node.clone();
    let probe_results = results.clone();
    let gauges = backend.gauges();
    let host = kit::resources::HostSampler::default();
    let metrics = runtime.metrics.clone();
    let at = kit::metrics::NodeLabels {
        service: B::SERVICE.as_str(),
        node: me.clone(),
    };
    let held_node = node.clone();
    // Each beat says how many slots each tenant holds: placement asks the node's sharing rule
    // with it whether a full node would still take a tenant's run.
    let tenants: kit::heartbeat::TenantProbe = Arc::new(move || held_node.slots_held());
    runtime
        .start_heartbeat_reporting(
            Arc::new(move || {
                let resources = host.sample();
                if let Some(r) = &resources {
                    metrics.host_resources(&at, r);
                }
                let mut m = probe_node.metrics(capacity);
                let (kept, kept_bytes) = probe_results.usage();
                m.insert("kept_results".into(), kept as f64);
                m.insert("kept_result_bytes".into(), kept_bytes as f64);
                gauges(&mut m);
                kit::heartbeat::Load {
                    capacity: capacity as u32,
                    load: probe_node.running.load(Ordering::Relaxed) as u32,
                    metrics: m,
                    labels: labels.clone(),
                    backends: vec![B::KIND],
                    resources,
                }
            }),
            Some(tenants),
        )
        .await?;

    let janitor = JanitorArgs {
        sweeper: sweeper.clone(),
        service: B::SERVICE,
        node_id: me.clone(),
        nodes_kv,
        interval: config.janitor_interval,
    };
    let args = NodeArgs {
        backend,
        config: config.clone(),
        node: node.clone(),
        capacity,
        client: runtime.client.clone(),
        janitor,
        results,
    };
    let name = root_actor_name(B::SERVICE, &me);
    let (actor, mut actor_task) =
        match Actor::spawn(Some(name), ExecutorNode::<B>::default(), args).await {
            Ok(spawned) => spawned,
            Err(e) => {
                runtime.shutdown().await;
                return Err(NodeError::Spawn(e));
            }
        };

    let options = EndpointOptions {
        // Admission (429 past capacity) is the node's own; the kit only bounds memory.
        max_in_flight: config.kit.max_in_flight.max(capacity * 4),
        ..runtime.endpoint_options()
    };
    let subjects = runtime.subjects().clone();
    let kind = B::KIND;
    let served = async {
        let run = actor_handler(actor.clone(), NodeMsg::Run);
        runtime
            .serve_with(subjects.executor_run_on(kind), options, run.clone())
            .await?;
        runtime
            .serve_with(
                subjects.executor_node_on(kind, &me, ExecutorOp::Run),
                options,
                run,
            )
            .await?;
        runtime
            .serve_with(
                subjects.executor_node_on(kind, &me, ExecutorOp::Status),
                options,
                actor_handler(actor.clone(), NodeMsg::Status),
            )
            .await?;
        if B::SESSIONS {
            runtime
                .serve_with(
                    subjects.executor_node_on(kind, &me, ExecutorOp::Close),
                    options,
                    actor_handler(actor.clone(), NodeMsg::Close),
                )
                .await?;
        }
        runtime
            .serve_with(
                subjects.executor_node_on(kind, &me, ExecutorOp::Proc),
                options,
                actor_handler(actor.clone(), NodeMsg::Proc),
            )
            .await?;
        runtime
            .serve_with(
                subjects.executor_node_on(kind, &me, ExecutorOp::Drain),
                options,
                actor_handler(actor.clone(), NodeMsg::Drain),
            )
            .await
    };
    if let Err(e) = served.await {
        actor.stop_and_wait(None, None).await.ok();
        runtime.shutdown().await;
        return Err(e.into());
    }
    tracing::info!(
        node = me,
        service = B::SERVICE.as_str(),
        "executor node ready"
    );

    let died = tokio::select! {
        _ = shutdown.cancelled() => false,
        _ = &mut actor_task => true,
    };
    if died {
        tracing::error!("the executor node's actor stopped; the node stops beating");
    }
    // Requests in flight finish first (bounded by the grace period), then every sandbox of
    // this node is removed by the actors' post_stop.
    runtime.shutdown().await;
    let stopped = actor
        .stop_and_wait(Some("shutdown".into()), Some(Duration::from_secs(60)))
        .await;
    // Starts, runs and removals still in flight finish before `serve` returns.
    if !node.finish_tasks(Duration::from_secs(60)).await {
        tracing::warn!("sandbox work still running after 60 s; the janitor will clean up");
    }
    // Last line of defence: a node that stops owns nothing, so anything still labelled with
    // it is a leak of a race above.
    let left = sweeper.remove_all().await;
    if left > 0 {
        tracing::warn!(left, "removed sandboxes left at shutdown");
    }
    if died {
        return Err(NodeError::Died);
    }
    stopped.map_err(NodeError::Stop)
}
