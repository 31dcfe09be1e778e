//! [`BwrapSweeper`]: what the node's janitor removes on a bwrap host, on start, periodically
//! and at once when another node's heartbeat key goes:
//!
//! - sandbox cgroups of this node that no running execution holds (left by a cgroup that
//!   could not be removed at once, or by a crash of an earlier process): emptied and removed;
//! - the cgroups of other nodes of the same mesh whose heartbeat key is gone from
//!   `sandbox_nodes`: their executor died. Its sandboxes died with it (`--die-with-parent`),
//!   but a process that escaped that — it cannot leave its cgroup — is killed here, and the
//!   directories go;
//! - in each periodic sweep, it also checks whether each image in use (the sandbox image,
//!   the templates' run here) now names a new image, exports it and switches new sandboxes to
//!   it, and removes rootfs trees no sandbox runs on any more.
//!
//! Nodes of other meshes (another NATS deployment on this host, e.g. parallel test runs) are
//! never judged: their cgroups live below another mesh directory.

use std::sync::Arc;

use async_nats::jetstream::kv;
use executor_node::{NodeState, Sweep};
use kit::janitor::node_alive;
use messages::ServiceName;

use crate::cgroup::Cgroups;
use crate::rootfs::RootfsCache;

#[derive(Clone)]
pub struct BwrapSweeper {
    pub cgroups: Cgroups,
    pub rootfs: Arc<RootfsCache>,
    pub node: Arc<NodeState>,
    pub node_id: String,
    pub nodes_kv: kv::Store,
    /// Whose heartbeat keys say a node is alive (the backend's service).
    pub service: ServiceName,
}

impl BwrapSweeper {
    /// Empties and removes the cgroups `doomed` (by node and name), and the directories of
    /// the `gone_nodes`, off the runtime (cgroup files are plain blocking I/O).
    async fn remove(&self, doomed: Vec<(String, String)>, gone_nodes: Vec<String>) -> usize {
        let cgroups = self.cgroups.clone();
        tokio::task::spawn_blocking(move || {
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
        .unwrap_or(0)
    }

    async fn gone(&self, node: &str) -> bool {
        !node_alive(&self.nodes_kv, self.service, node).await
    }
}

impl Sweep for BwrapSweeper {
    async fn sweep(&self) -> usize {
        let me = &self.node_id;
        let mut doomed = Vec::new();
        for name in self.cgroups.list(me) {
            if !self.node.owns(&name) {
                doomed.push((me.clone(), name));
            }
        }
        let mut gone_nodes = Vec::new();
        for node in self.cgroups.nodes() {
            if node != *me && self.gone(&node).await {
                for name in self.cgroups.list(&node) {
                    doomed.push((node.clone(), name));
                }
                gone_nodes.push(node);
            }
        }
        let removed = self.remove(doomed, gone_nodes).await;
        if removed > 0 {
            tracing::info!(removed, "janitor: removed stray sandbox cgroups");
        }
        match self.rootfs.refresh().await {
            Ok(0) => {}
            Ok(changed) => {
                tracing::info!(
                    changed,
                    "janitor: images changed; new sandboxes use their new trees"
                )
            }
            Err(e) => {
                tracing::warn!(error = %e, "janitor: cannot check the images in use");
                self.rootfs.sweep();
            }
        }
        removed
    }

    async fn reap_node(&self, node: &str) -> usize {
        let names = self.cgroups.list(node);
        if node == self.node_id || !self.gone(node).await {
            return 0;
        }
        tracing::info!(
            node,
            cgroups = names.len(),
            "janitor: node's heartbeat expired"
        );
        let doomed = names.into_iter().map(|n| (node.to_string(), n)).collect();
        self.remove(doomed, vec![node.to_string()]).await
    }

    async fn remove_all(&self) -> usize {
        let me = &self.node_id;
        let doomed = self
            .cgroups
            .list(me)
            .into_iter()
            .map(|n| (me.clone(), n))
            .collect();
        self.remove(doomed, vec![me.clone()]).await
    }
}
