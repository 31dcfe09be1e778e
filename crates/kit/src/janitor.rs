//! `Janitor`: on start and then periodically, a service's [`Sweep`] removes what it made on the
//! host (containers, cgroups, control directories) and nobody owns any more:
//!
//! - what this instance made that nothing it runs holds (left by a crash of an earlier
//!   process with the same instance id, or by a bug);
//! - what other instances of the same service and mesh made, once their heartbeat key is gone
//!   from `sandbox_nodes` (they crashed: `kill -9` runs no cleanup, and their sandboxes would
//!   otherwise live forever).
//!
//! What other meshes made (another NATS deployment on the same host, e.g. parallel test runs)
//! is never judged: their heartbeats are not in this mesh's bucket.
//!
//! A crashed instance is not left for the next periodic sweep: the janitor watches the
//! service's keys in `sandbox_nodes`, and the purge marker the server writes when a
//! heartbeat's TTL expires (or the delete of a clean stop) makes it reap that instance's
//! leftovers at once. The watch is the janitor's own: when it ends, the janitor fails and is
//! started anew (by the executor node's supervisor, or by [`run_until`]).
//!
//! The executor backends (docker, bubblewrap) and aio-pool each implement [`Sweep`] for what
//! they make; the judging, the watch and the timing are this one actor.

use std::future::Future;
use std::marker::PhantomData;
use std::time::Duration;

use async_nats::jetstream::kv;
use futures::StreamExt;
use messages::ServiceName;
use ractor::{Actor, ActorProcessingErr, ActorRef, SpawnErr};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long after another node's heartbeat key vanished the janitor looks again before it
/// removes that node's sandboxes. A live node whose beat came late (a starved machine) puts
/// its key back within this time, and its running executions must not be killed for that.
const GONE_GRACE: Duration = Duration::from_millis(1500);

/// What a service removes. Each method judges liveness itself, with [`node_alive`], at the
/// moment it removes: an instance restarted under the same id beats again at once.
pub trait Sweep: Clone + Send + Sync + 'static {
    /// Removes this node's unowned sandboxes and those of gone nodes of the mesh; returns how
    /// many it removed.
    fn sweep(&self) -> impl Future<Output = usize> + Send;
    /// Removes the sandboxes of `node` if its heartbeat is still gone; returns how many.
    fn reap_node(&self, node: &str) -> impl Future<Output = usize> + Send;
    /// At shutdown, when this node owns nothing any more: removes every sandbox still
    /// labelled with it (a leak of a race); returns how many.
    fn remove_all(&self) -> impl Future<Output = usize> + Send;
}

/// Whether `service`'s instance `node_id` has a heartbeat key now.
pub async fn node_alive(kv: &kv::Store, service: ServiceName, node_id: &str) -> bool {
    let key = service.heartbeat_key(node_id);
    match kv.get(&key).await {
        Ok(value) => value.is_some(),
        // Unknown is not dead: never remove on a failed look-up.
        Err(e) => {
            tracing::debug!(node = node_id, error = %e, "heartbeat look-up failed");
            true
        }
    }
}

pub enum JanitorMsg {
    Sweep,
    /// Another node's heartbeat key was deleted or expired.
    NodeGone(String),
    /// [`GONE_GRACE`] after `NodeGone`: reap the node's sandboxes if its key is still gone.
    ReapIfStillGone(String),
    /// The watch on the nodes bucket ended (with its error, if any).
    WatchEnded(ActorProcessingErr),
}

pub struct Janitor<S>(PhantomData<fn() -> S>);

impl<S> Default for Janitor<S> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

#[derive(Clone)]
pub struct JanitorArgs<S> {
    pub sweeper: S,
    /// The backend's service: whose heartbeat keys are watched.
    pub service: ServiceName,
    /// This node (its own key is never a gone node).
    pub node_id: String,
    pub nodes_kv: kv::Store,
    pub interval: Duration,
}

pub struct JanitorState<S> {
    args: JanitorArgs<S>,
    watch: JoinHandle<()>,
}

/// Forwards the deletions and expiries of other executors' heartbeat keys to the janitor,
/// and asks for the janitor's first sweep once the watch is in place: a key that vanishes after
/// that sweep looked at it is then always seen. Sweeping before the watch existed, a janitor
/// started just after a crash missed a key that expired in between and left the dead node's
/// sandboxes to the periodic sweep.
async fn watch_nodes<S>(args: JanitorArgs<S>, janitor: ActorRef<JanitorMsg>) {
    let prefix = args.service.heartbeat_key("");
    let mut entries = match args.nodes_kv.watch(format!("{prefix}>")).await {
        Ok(w) => w,
        Err(e) => {
            let _ = janitor.cast(JanitorMsg::WatchEnded(e.into()));
            return;
        }
    };
    let _ = janitor.cast(JanitorMsg::Sweep);
    let ended = loop {
        match entries.next().await {
            Some(Ok(entry)) => {
                let gone = matches!(
                    entry.operation,
                    kv::Operation::Delete | kv::Operation::Purge
                );
                let node = entry.key.strip_prefix(&prefix).unwrap_or_default();
                if gone && !node.is_empty() && node != args.node_id {
                    let _ = janitor.cast(JanitorMsg::NodeGone(node.to_string()));
                }
            }
            Some(Err(e)) => break e.into(),
            None => break "the watch on the nodes bucket ended".into(),
        }
    };
    let _ = janitor.cast(JanitorMsg::WatchEnded(ended));
}

impl<S: Sweep> Actor for Janitor<S> {
    type Msg = JanitorMsg;
    type State = JanitorState<S>;
    type Arguments = JanitorArgs<S>;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: JanitorArgs<S>,
    ) -> Result<Self::State, ActorProcessingErr> {
        // The first sweep comes from the watch, once it is in place.
        myself.send_interval(args.interval, || JanitorMsg::Sweep);
        let watch = tokio::spawn(watch_nodes(args.clone(), myself.clone()));
        Ok(JanitorState { args, watch })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // The sweep awaits its backend inside the handler on purpose: the janitor has nothing
        // else to do, and overlapping sweeps would only race each other.
        let sweeper = &state.args.sweeper;
        match msg {
            JanitorMsg::Sweep => {
                sweeper.sweep().await;
            }
            JanitorMsg::NodeGone(node) => {
                myself.send_after(GONE_GRACE, move || JanitorMsg::ReapIfStillGone(node));
            }
            JanitorMsg::ReapIfStillGone(node) => {
                sweeper.reap_node(&node).await;
            }
            // Failing makes the node restart the janitor, and with it the watch.
            JanitorMsg::WatchEnded(why) => return Err(why),
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.watch.abort();
        Ok(())
    }
}

/// How long a failed janitor waits before [`run_until`] starts it anew: a bucket that cannot
/// be watched (NATS restarting) is not hammered.
const RESTART_PAUSE: Duration = Duration::from_secs(1);

/// Runs a janitor until `shutdown`, starting it anew whenever it fails (its watch on the nodes
/// bucket ended), for a service whose actors have no supervisor of their own to do it. Fails
/// only when the actor cannot be spawned at all.
pub async fn run_until<S: Sweep>(
    args: JanitorArgs<S>,
    shutdown: CancellationToken,
) -> Result<(), SpawnErr> {
    loop {
        let (janitor, mut task) = Actor::spawn(None, Janitor::<S>::default(), args.clone()).await?;
        tokio::select! {
            () = shutdown.cancelled() => {
                janitor.stop(None);
                let _ = task.await;
                return Ok(());
            }
            _ = &mut task => tracing::error!(service = %args.service, "janitor failed; restarting it"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            () = tokio::time::sleep(RESTART_PAUSE) => {}
        }
    }
}
