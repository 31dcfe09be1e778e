//! `Janitor`: on start and then periodically, removes sandbox containers nobody owns:
//!
//! - containers labelled with this node that no live session, pool entry or running execution
//!   holds (left by a crash of an earlier process with the same node id, or by a bug);
//! - containers of other nodes of the same mesh whose heartbeat key is gone from
//!   `sandbox_nodes` (their executor crashed: its containers would otherwise live forever).
//!
//! Containers of other meshes (another NATS deployment on the same Docker host, e.g. parallel
//! test runs) are never judged: their heartbeats are not in this mesh's bucket.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::docker::{summary_name, Sandboxes, LABEL_MESH, LABEL_NODE};
use crate::node::NodeState;

/// The service name under which executors beat (`docker-executor.<node_id>`).
pub const SERVICE_NAME: &str = "docker-executor";

/// A foreign container younger than this is left alone even if its node's heartbeat is not
/// visible yet. A node beats before it creates any container, so this only absorbs the
/// moment between a watcher's listing and the look-up.
const FOREIGN_MIN_AGE: Duration = Duration::from_secs(2);

pub enum JanitorMsg {
    Sweep,
    /// Sweeps now and answers with the number of containers removed.
    SweepNow(RpcReplyPort<usize>),
}

pub struct Janitor;

#[derive(Clone)]
pub struct JanitorArgs {
    pub sandboxes: Sandboxes,
    pub node: Arc<NodeState>,
    pub nodes_kv: kv::Store,
    pub interval: Duration,
}

async fn node_alive(kv: &kv::Store, node_id: &str) -> bool {
    let key = messages::heartbeat::heartbeat_key(SERVICE_NAME, node_id);
    match kv.get(&key).await {
        Ok(value) => value.is_some(),
        // Unknown is not dead: never remove on a failed look-up.
        Err(e) => {
            tracing::debug!(node = node_id, error = %e, "heartbeat look-up failed");
            true
        }
    }
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
                if !node_alive(&args.nodes_kv, &node).await {
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
    type State = JanitorArgs;
    type Arguments = JanitorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: JanitorArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        myself.cast(JanitorMsg::Sweep)?;
        myself.send_interval(args.interval, || JanitorMsg::Sweep);
        Ok(args)
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // The sweep awaits Docker inside the handler on purpose: the janitor has nothing else
        // to do, and overlapping sweeps would only race each other.
        match msg {
            JanitorMsg::Sweep => {
                sweep(state).await;
            }
            JanitorMsg::SweepNow(reply) => {
                let _ = reply.send(sweep(state).await);
            }
        }
        Ok(())
    }
}
