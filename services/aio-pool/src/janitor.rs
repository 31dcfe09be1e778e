//! What aio-pool leaves on the host and the janitor removes when nobody owns it
//! ([`AioSweeper`], the pool's [`Sweep`] for `kit::janitor`):
//! - this process's containers that no instance holds (a race or a bug);
//! - containers and control directories of other aio-pool processes of the same mesh whose
//!   heartbeat key is gone from `sandbox_nodes` (they crashed: `kill -9` runs no cleanup), and
//!   their bridges (earlier versions of the pool put instances on one).
//!
//! The judging, the watch on the pools' heartbeat keys (a crashed pool is reaped at once, not
//! at the next periodic pass) and the timing are the generic janitor's.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use async_nats::jetstream::kv;
use bollard::query_parameters::ListNetworksOptionsBuilder;
use bollard::Docker;
use containers::summary_name;
use kit::janitor::{node_alive, Sweep};
use messages::ServiceName;

use crate::docker::{remove_control_dir, remove_network, Registry, LABEL_MESH, LABEL_OWNER};

/// The service name aio-pools beat under (`aio-pool.<instance_id>`).
pub const SERVICE_NAME: &str = ServiceName::AioPool.as_str();

/// A foreign container younger than this is left alone: its owner beats before it creates
/// anything, so this only covers the moment between a listing and the look-up.
const FOREIGN_MIN_AGE: Duration = Duration::from_secs(2);

/// The pool's leftovers, judged by owner (the `LABEL_OWNER` of each container and bridge).
#[derive(Clone)]
pub struct AioSweeper {
    pub docker: Docker,
    pub mesh: String,
    pub me: String,
    pub registry: Registry,
    /// Where every pool of this host keeps its control directories (one per pool).
    pub socket_dir: PathBuf,
    pub nodes_kv: kv::Store,
}

impl AioSweeper {
    async fn owner_alive(&self, owner: &str) -> bool {
        node_alive(&self.nodes_kv, ServiceName::AioPool, owner).await
    }

    /// Removes the containers of this mesh that `orphan` judges unowned; returns how many, and
    /// the foreign owners found dead.
    async fn remove_containers(
        &self,
        label: &str,
        judge_foreign: bool,
    ) -> (usize, HashSet<String>) {
        let listed = match containers::list(&self.docker, label).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "janitor: listing AIO containers failed");
                return (0, HashSet::new());
            }
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        let mut removed = 0;
        let mut dead_owners = HashSet::new();
        for c in listed {
            let Some(name) = summary_name(&c) else {
                continue;
            };
            let labels = c.labels.as_ref();
            if labels.and_then(|l| l.get(LABEL_MESH)) != Some(&self.mesh) {
                continue;
            }
            let owner = labels
                .and_then(|l| l.get(LABEL_OWNER))
                .cloned()
                .unwrap_or_default();
            let orphan = if owner == self.me {
                !self.registry.contains(&name)
            } else if judge_foreign {
                let old_enough = now - c.created.unwrap_or(now) >= FOREIGN_MIN_AGE.as_secs() as i64;
                let dead = old_enough && !self.owner_alive(&owner).await;
                if dead {
                    dead_owners.insert(owner);
                }
                dead
            } else {
                false
            };
            if orphan {
                tracing::info!(
                    container = name,
                    "janitor: removing an unowned AIO container"
                );
                containers::remove(&self.docker, &name).await;
                removed += 1;
            }
        }
        (removed, dead_owners)
    }

    /// The control directories and bridges of owners found dead.
    async fn remove_owners_rest(&self, mut dead: HashSet<String>) {
        // An owner is a label, not a path: only a plain name is joined to the directory.
        for owner in dead
            .iter()
            .filter(|o| !o.is_empty() && !o.contains('/') && *o != "." && *o != "..")
        {
            remove_control_dir(&self.socket_dir.join(owner));
        }
        let label = format!("{LABEL_MESH}={}", self.mesh);
        let filters = std::collections::HashMap::from([("label", vec![label.as_str()])]);
        let Ok(networks) = self
            .docker
            .list_networks(Some(
                ListNetworksOptionsBuilder::new().filters(&filters).build(),
            ))
            .await
        else {
            return;
        };
        for n in networks {
            let owner = n.labels.as_ref().and_then(|l| l.get(LABEL_OWNER)).cloned();
            let Some(owner) = owner else { continue };
            if owner == self.me {
                continue;
            }
            // A bridge with no containers left is not found through them: look it up too.
            if !dead.contains(&owner) && self.owner_alive(&owner).await {
                continue;
            }
            dead.insert(owner);
            if let Some(name) = n.name {
                remove_network(&self.docker, &name).await;
            }
        }
    }
}

impl Sweep for AioSweeper {
    async fn sweep(&self) -> usize {
        let (removed, dead) = self
            .remove_containers(&format!("{LABEL_MESH}={}", self.mesh), true)
            .await;
        self.remove_owners_rest(dead).await;
        removed
    }

    async fn reap_node(&self, node: &str) -> usize {
        if node == self.me || self.owner_alive(node).await {
            return 0;
        }
        let (removed, mut dead) = self
            .remove_containers(&format!("{LABEL_OWNER}={node}"), true)
            .await;
        dead.insert(node.to_string());
        self.remove_owners_rest(dead).await;
        removed
    }

    async fn remove_all(&self) -> usize {
        let mut removed = 0;
        let owned = format!("{LABEL_OWNER}={}", self.me);
        for c in containers::list(&self.docker, &owned)
            .await
            .unwrap_or_default()
        {
            if let Some(name) = summary_name(&c) {
                tracing::warn!(container = name, "removing a container left at shutdown");
                containers::remove(&self.docker, &name).await;
                removed += 1;
            }
        }
        removed
    }
}
