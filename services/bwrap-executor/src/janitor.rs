//! `Janitor`: on start and then periodically
//!
//! - empties and removes sandbox cgroups of this node that no running execution holds (left
//!   by a cgroup that could not be removed at once, or by a crash of an earlier process);
//! - empties and removes the cgroups of other nodes of the same mesh whose heartbeat key is
//!   gone from `sandbox_nodes`: their executor died. Its sandboxes died with it
//!   (`--die-with-parent`), but a process that escaped that — it cannot leave its cgroup —
//!   is killed here, and the directories go;
//! - checks whether the image tag now names a new image, exports it and switches new
//!   sandboxes to it, and removes rootfs trees no sandbox runs on any more.
//!
//! Nodes of other meshes (another NATS deployment on this host, e.g. parallel test runs) are
//! never judged: their cgroups live below another mesh directory.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv;
use docker_executor::janitor::node_alive;
use docker_executor::node::NodeState;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::cgroup::Cgroups;
use crate::rootfs::RootfsCache;

/// The service name under which bwrap executors beat (`bwrap-executor.<node_id>`).
pub const SERVICE_NAME: &str = messages::ServiceName::BwrapExecutor.as_str();

pub enum JanitorMsg {
    Sweep,
    /// Sweeps now and answers with the number of cgroups removed.
    SweepNow(RpcReplyPort<usize>),
}

pub struct Janitor;

#[derive(Clone)]
pub struct JanitorArgs {
    pub cgroups: Cgroups,
    pub rootfs: Arc<RootfsCache>,
    pub node: Arc<NodeState>,
    pub node_id: String,
    pub nodes_kv: kv::Store,
    pub interval: Duration,
}

/// One sweep; returns how many cgroups were removed.
async fn sweep(args: &JanitorArgs) -> usize {
    let mut doomed = Vec::new();
    for name in args.cgroups.list(&args.node_id) {
        if !args.node.owns(&name) {
            doomed.push((args.node_id.clone(), name));
        }
    }
    let mut gone_nodes = Vec::new();
    for node in args.cgroups.nodes() {
        if node != args.node_id && !node_alive(&args.nodes_kv, SERVICE_NAME, &node).await {
            for name in args.cgroups.list(&node) {
                doomed.push((node.clone(), name));
            }
            gone_nodes.push(node);
        }
    }
    let cgroups = args.cgroups.clone();
    let removed = tokio::task::spawn_blocking(move || {
        let mut removed = 0;
        for (node, name) in &doomed {
            if cgroups.existing(node, name).remove() {
                removed += 1;
            }
        }
        for node in &gone_nodes {
            cgroups.remove_node(node);
        }
        removed
    })
    .await
    .unwrap_or(0);
    if removed > 0 {
        tracing::info!(removed, "janitor: removed stray sandbox cgroups");
    }
    match args.rootfs.refresh().await {
        Ok(true) => tracing::info!("janitor: the sandbox image changed; new sandboxes use it"),
        Ok(false) => {}
        Err(e) => tracing::warn!(error = %e, "janitor: cannot check the sandbox image"),
    }
    args.rootfs.sweep();
    removed
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
        myself.send_interval(args.interval, || JanitorMsg::Sweep);
        let _ = myself.cast(JanitorMsg::Sweep);
        Ok(args)
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
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
