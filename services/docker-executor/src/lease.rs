//! [`ContainerLease`]: the RAII guard of a container this node holds. Leaks are ruled out by
//! the type, not by pairs of calls: whoever drops a lease (an actor stopping, a message nobody
//! received, a task ending) removes its container. (An execution's place in the node's
//! capacity is `executor_node::RunSlot`.)

use std::sync::Arc;

use executor_node::workspace::Held;
use executor_node::NodeState;
use messages::filesystem::FilesystemPolicy;

use crate::docker::{ContainerKind, ContainerLimits, DockerError, Sandboxes};
use crate::egress::ContainerEgress;
use crate::resident::Resident;

/// Why a container could not be had.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Docker(#[from] DockerError),
    #[error(transparent)]
    Egress(#[from] crate::egress::EgressSetupError),
}

/// One sandbox container of this node, from the moment its name exists until Docker removed
/// it. The name is owned (the janitor leaves it alone) before the container is created, and
/// disowned only after its removal, which runs on the node's task tracker so that shutdown
/// waits for it.
pub struct ContainerLease {
    pub name: String,
    pub limits: ContainerLimits,
    /// The workspace revision the container holds (meaningful for session containers).
    pub held: Held,
    /// The last snapshot or push for it: each one also keeps the workspace alive in the store.
    pub synced: std::time::Instant,
    /// Its egress proxy and socket, when it was made for a network policy; they go with the
    /// lease (before the container itself is gone, never after). Boxed: leases travel in
    /// actor messages, and most have none.
    pub egress: Option<Box<ContainerEgress>>,
    /// Its resident supervisor, started with the container (warm pool) or by its first run.
    /// Boxed like the egress, for the same reason.
    pub resident: Option<Box<Resident>>,
    sandboxes: Sandboxes,
    node: Arc<NodeState>,
}

impl ContainerLease {
    /// The one start sequence of the crate: name → owned → create → start. A failed start
    /// drops the lease, which removes whatever Docker made of it.
    pub async fn start(
        sandboxes: &Sandboxes,
        node: &Arc<NodeState>,
        kind: ContainerKind,
        session: Option<&str>,
        limits: ContainerLimits,
        egress: Option<ContainerEgress>,
        filesystem: Option<&FilesystemPolicy>,
    ) -> Result<Self, DockerError> {
        let name = sandboxes.new_name();
        node.own(&name);
        let mount = egress.as_ref().map(ContainerEgress::bind_spec);
        let lease = Self {
            name,
            limits,
            held: Held::Nothing,
            synced: std::time::Instant::now(),
            egress: egress.map(Box::new),
            resident: None,
            sandboxes: sandboxes.clone(),
            node: node.clone(),
        };
        sandboxes
            .start(
                &lease.name,
                kind,
                session,
                limits,
                mount.as_deref(),
                filesystem,
            )
            .await
            .map(|_| lease)
    }

    /// Removes the container now, for a caller that must know it is gone when this returns.
    pub async fn remove(mut self) {
        drop(self.egress.take());
        let name = std::mem::take(&mut self.name);
        self.sandboxes.remove(&name).await;
        self.node.disown(&name);
    }
}

impl Drop for ContainerLease {
    fn drop(&mut self) {
        let name = std::mem::take(&mut self.name);
        if name.is_empty() {
            return; // removed already
        }
        let sandboxes = self.sandboxes.clone();
        let node = self.node.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(_) => {
                self.node.tasks.spawn(async move {
                    sandboxes.remove(&name).await;
                    node.disown(&name);
                });
            }
            // No runtime left (process exit): the janitor of the next start removes it.
            Err(_) => tracing::warn!(container = name, "container left behind: no runtime"),
        }
    }
}
