//! `Janitor`: on start and then periodically, removes sandbox containers nobody owns:
//!
//! - containers labelled with this node that no live session, pool entry or running execution
//!   holds (left by a crash of an earlier process with the same node id, or by a bug);
//! - containers of other nodes of the same mesh whose heartbeat key is gone from
//!   `sandbox_nodes` (their executor crashed: its containers would otherwise live forever).
//!
//! Containers of other meshes (another NATS deployment on the same Docker host, e.g. parallel
//! test runs) are never judged: their heartbeats are not in this mesh's bucket.
//!
//! A crashed node is not left for the next periodic sweep: the janitor watches the executors'
//! keys in `sandbox_nodes`, and the purge marker the server writes when a heartbeat's TTL
//! expires (or the delete of a clean stop) makes it reap that node's containers at once. The
//! watch is the janitor's own: when it ends, the janitor fails and the executor restarts it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv;
use futures::StreamExt;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::task::JoinHandle;

use crate::docker::{summary_name, Sandboxes, LABEL_MESH, LABEL_NODE};
use crate::node::NodeState;

/// The service name under which executors beat (`docker-executor.<node_id>`).
pub const SERVICE_NAME: &str = messages::ServiceName::DockerExecutor.as_str();

/// A foreign container younger than this is left alone even if its node's heartbeat is not
/// visible yet. A node beats before it creates any container, so this only absorbs the
/// moment between a watcher's listing and the look-up.
const FOREIGN_MIN_AGE: Duration = Duration::from_secs(2);

/// How long after another node's heartbeat key vanished the janitor looks again before it
/// removes that node's containers. A live node whose beat came late (a starved machine) puts
/// its key back within this time, and its running executions must not be killed for that.
const GONE_GRACE: Duration = Duration::from_millis(1500);

pub enum JanitorMsg {
    Sweep,
    /// Sweeps now and answers with the number of containers removed.
    SweepNow(RpcReplyPort<usize>),
    /// Another node's heartbeat key was deleted or expired.
    NodeGone(String),
    /// [`GONE_GRACE`] after `NodeGone`: reap the node's containers if its key is still gone.
    ReapIfStillGone(String),
    /// The watch on the nodes bucket ended (with its error, if any).
    WatchEnded(ActorProcessingErr),
}

pub struct Janitor;

pub struct JanitorState {
    args: JanitorArgs,
    watch: JoinHandle<()>,
}

#[derive(Clone)]
pub struct JanitorArgs {
    pub sandboxes: Sandboxes,
    pub node: Arc<NodeState>,
    pub nodes_kv: kv::Store,
    pub interval: Duration,
}

/// Whether `service`'s instance `node_id` has a heartbeat key now (shared with the bwrap
/// executor's janitor).
pub async fn node_alive(kv: &kv::Store, service: &str, node_id: &str) -> bool {
    let key = messages::heartbeat::heartbeat_key(service, node_id);
    match kv.get(&key).await {
        Ok(value) => value.is_some(),
        // Unknown is not dead: never remove on a failed look-up.
        Err(e) => {
            tracing::debug!(node = node_id, error = %e, "heartbeat look-up failed");
            true
        }
    }
}

/// Containers of this mesh labelled with `node`, when that node's heartbeat is gone (checked
/// again: a node restarted under the same id beats again at once).
async fn reap_node(args: &JanitorArgs, node: &str) -> usize {
    let sandboxes = &args.sandboxes;
    let label = format!("{LABEL_NODE}={node}");
    let names: Vec<String> = match sandboxes.list(&label).await {
        Ok(list) => list
            .iter()
            .filter(|c| {
                c.labels.as_ref().and_then(|l| l.get(LABEL_MESH)) == Some(&sandboxes.spec.mesh)
            })
            .filter_map(summary_name)
            .collect(),
        Err(e) => {
            tracing::warn!(node, error = %e, "janitor: cannot list a gone node's containers");
            return 0;
        }
    };
    if names.is_empty() || node_alive(&args.nodes_kv, SERVICE_NAME, node).await {
        return 0;
    }
    tracing::info!(
        node,
        containers = names.len(),
        "janitor: node's heartbeat expired"
    );
    futures::future::join_all(names.iter().map(|name| sandboxes.remove(name))).await;
    names.len()
}

/// Forwards the deletions and expiries of other executors' heartbeat keys to the janitor.
async fn watch_nodes(args: JanitorArgs, janitor: ActorRef<JanitorMsg>) {
    let me = args.sandboxes.spec.node_id.clone();
    let prefix = messages::heartbeat::heartbeat_key(SERVICE_NAME, "");
    let mut entries = match args.nodes_kv.watch(format!("{prefix}>")).await {
        Ok(w) => w,
        Err(e) => {
            let _ = janitor.cast(JanitorMsg::WatchEnded(e.into()));
            return;
        }
    };
    let ended = loop {
        match entries.next().await {
            Some(Ok(entry)) => {
                let gone = matches!(
                    entry.operation,
                    kv::Operation::Delete | kv::Operation::Purge
                );
                let node = entry.key.strip_prefix(&prefix).unwrap_or_default();
                if gone && !node.is_empty() && node != me {
                    let _ = janitor.cast(JanitorMsg::NodeGone(node.to_string()));
                }
            }
            Some(Err(e)) => break e.into(),
            None => break "the watch on the nodes bucket ended".into(),
        }
    };
    let _ = janitor.cast(JanitorMsg::WatchEnded(ended));
}

/// One sweep; returns how many containers were removed.
pub async fn sweep(args: &JanitorArgs) -> usize {
    let sandboxes = &args.sandboxes;
    let me = sandboxes.spec.node_id.clone();
    let mut doomed = Vec::new();
    match sandboxes.list(&format!("{LABEL_NODE}={me}")).await {
        Ok(list) => doomed.extend(
            list.iter()
                .filter_map(summary_name)
                .filter(|name| !args.node.owns(name)),
        ),
        Err(e) => tracing::warn!(error = %e, "janitor: cannot list this node's containers"),
    }
    let now = messages::now_ms() as i64 / 1000;
    match sandboxes
        .list(&format!("{LABEL_MESH}={}", sandboxes.spec.mesh))
        .await
    {
        Ok(list) => {
            let mut by_node: HashMap<String, Vec<String>> = HashMap::new();
            for c in &list {
                let node = c.labels.as_ref().and_then(|l| l.get(LABEL_NODE)).cloned();
                let old_enough = now - c.created.unwrap_or(now) >= FOREIGN_MIN_AGE.as_secs() as i64;
                if let (Some(node), Some(name), true) = (node, summary_name(c), old_enough) {
                    if node != me {
                        by_node.entry(node).or_default().push(name);
                    }
                }
            }
            for (node, names) in by_node {
                if !node_alive(&args.nodes_kv, SERVICE_NAME, &node).await {
                    tracing::info!(node, containers = names.len(), "janitor: node is gone");
                    doomed.extend(names);
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "janitor: cannot list the mesh's containers"),
    }
    let count = doomed.len();
    if count > 0 {
        tracing::info!(count, "janitor: removing unowned containers");
    }
    futures::future::join_all(doomed.iter().map(|name| sandboxes.remove(name))).await;
    count
}

/// Removes every container labelled with this node (at shutdown, when it owns none).
pub async fn remove_node(sandboxes: &Sandboxes) -> usize {
    let label = format!("{LABEL_NODE}={}", sandboxes.spec.node_id);
    let names: Vec<String> = match sandboxes.list(&label).await {
        Ok(list) => list.iter().filter_map(summary_name).collect(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot list this node's containers");
            return 0;
        }
    };
    futures::future::join_all(names.iter().map(|n| sandboxes.remove(n))).await;
    names.len()
}

impl Actor for Janitor {
    type Msg = JanitorMsg;
    type State = JanitorState;
    type Arguments = JanitorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: JanitorArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        myself.cast(JanitorMsg::Sweep)?;
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
        // The sweep awaits Docker inside the handler on purpose: the janitor has nothing else
        // to do, and overlapping sweeps would only race each other.
        match msg {
            JanitorMsg::Sweep => {
                sweep(&state.args).await;
            }
            JanitorMsg::SweepNow(reply) => {
                let _ = reply.send(sweep(&state.args).await);
            }
            JanitorMsg::NodeGone(node) => {
                myself.send_after(GONE_GRACE, move || JanitorMsg::ReapIfStillGone(node));
            }
            JanitorMsg::ReapIfStillGone(node) => {
                reap_node(&state.args, &node).await;
            }
            // Failing makes the executor restart the janitor, and with it the watch.
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
