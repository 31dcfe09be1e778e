//! [`DockerSweeper`]: what the node's janitor removes on a Docker host — containers labelled
//! with this node that no live session, pool entry or running execution holds, and the
//! containers of other nodes of the same mesh whose heartbeat key is gone (their executor
//! crashed). Containers of other meshes are never judged: they carry another mesh label.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv;
use executor_node::{NodeState, Sweep};
use kit::janitor::node_alive;
use messages::ServiceName;

use crate::docker::{summary_name, Sandboxes, LABEL_MESH, LABEL_NODE};

/// A foreign container younger than this is left alone even if its node's heartbeat is not
/// visible yet. A node beats before it creates any container, so this only absorbs the
/// moment between a watcher's listing and the look-up.
const FOREIGN_MIN_AGE: Duration = Duration::from_secs(2);

#[derive(Clone)]
pub struct DockerSweeper {
    pub sandboxes: Sandboxes,
    pub node: Arc<NodeState>,
    pub nodes_kv: kv::Store,
    /// Whose heartbeat keys say a node is alive (the backend's service).
    pub service: ServiceName,
}

impl Sweep for DockerSweeper {
    async fn sweep(&self) -> usize {
        sweep(self).await
    }

    async fn reap_node(&self, node: &str) -> usize {
        reap_node(self, node).await
    }

    async fn remove_all(&self) -> usize {
        remove_node(&self.sandboxes).await
    }
}

/// Containers of this mesh labelled with `node`, when that node's heartbeat is gone (checked
/// again: a node restarted under the same id beats again at once).
async fn reap_node(args: &DockerSweeper, node: &str) -> usize {
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
    if names.is_empty() || node_alive(&args.nodes_kv, args.service, node).await {
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

/// One sweep; returns how many containers were removed.
async fn sweep(args: &DockerSweeper) -> usize {
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
                if !node_alive(&args.nodes_kv, args.service, &node).await {
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
