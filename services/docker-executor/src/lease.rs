//! [`ContainerLease`]: the RAII guard of a container this node holds. Leaks are ruled out by
//! the type, not by pairs of calls: whoever drops a lease (an actor stopping, a message nobody
//! received, a task ending) removes its container. (An execution's place in the node's
//! capacity is `executor_node::RunSlot`.)

use std::sync::Arc;

use executor_node::workspace::Held;
use executor_node::{NodeState, UidLease};
use messages::filesystem::FilesystemPolicy;

use crate::docker::{
    is_name_conflict, ContainerId, ContainerKind, ContainerLimits, DockerError, Sandboxes,
};
use crate::egress::ContainerEgress;
use crate::ports::PortDoor;
use crate::resident::Resident;

/// Why a container could not be had.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Docker(#[from] DockerError),
    #[error(transparent)]
    Egress(#[from] crate::egress::EgressSetupError),
}

/// How many uids a start tries when the daemon already has containers of their names (another
/// node's, or a crashed node's not yet removed) before it gives up.
const UID_TRIES: usize = 16;

/// One sandbox container of this node, from the moment its name exists until Docker removed
/// it. The name is owned (the janitor leaves it alone) before the container is created, and
/// disowned only after its removal, which runs on the node's task tracker so that shutdown
/// waits for it. Its host uid goes back to the node's pool after that too, never before.
pub struct ContainerLease {
    pub name: String,
    /// The host uid the container runs as (its name is made from it), given back to the
    /// node's pool once the container is gone. Boxed like the egress.
    claim: Option<Box<UidLease>>,
    pub limits: ContainerLimits,
    /// The workspace revision the container holds (meaningful for session containers).
    pub held: Held,
    /// The last snapshot or push for it: each one also keeps the workspace alive in the store.
    pub synced: std::time::Instant,
    /// Its egress proxy and socket, when it was made for a network policy; they go with the
    /// lease (before the container itself is gone, never after). Boxed: leases travel in
    /// actor messages, and most have none.
    pub egress: Option<Box<ContainerEgress>>,
    /// Its ports socket (preview ports), shared with the node's [`crate::ports::Doors`] while
    /// it is a session's; it goes with the lease, and every tunnel through it with it.
    pub ports: Arc<PortDoor>,
    /// Its resident supervisor, started with the container (warm pool) or by its first run.
    /// Boxed like the egress, for the same reason.
    pub resident: Option<Box<Resident>>,
    sandboxes: Sandboxes,
    node: Arc<NodeState>,
}

impl ContainerLease {
    /// The one start sequence of the crate: uid → name → owned → create → start. A failed
    /// start drops the lease, which removes whatever Docker made of it; a name the daemon
    /// already has (that uid is another container's) is given up, and the next uid tried.
    pub async fn start(
        sandboxes: &Sandboxes,
        node: &Arc<NodeState>,
        kind: ContainerKind,
        session: Option<&str>,
        limits: ContainerLimits,
        egress: Option<ContainerEgress>,
        filesystem: Option<&FilesystemPolicy>,
    ) -> Result<Self, DockerError> {
        let mut egress = egress.map(Box::new);
        let ports = sandboxes
            .ports
            .bind()
            .map_err(|e| DockerError::failed("create", "a ports socket", kit::error_chain(&e)))?;
        let ports = Arc::new(ports);
        for _ in 0..UID_TRIES {
            let uid = sandboxes
                .uids
                .take()
                .map_err(|e| DockerError::failed("create", "a sandbox container", e.to_string()))?;
            let host_uid = uid.uid();
            let name = Sandboxes::name_for_uid(host_uid);
            node.own(&name);
            let lease = Self {
                name,
                claim: Some(Box::new(uid)),
                limits,
                held: Held::Nothing,
                synced: std::time::Instant::now(),
                egress: egress.take(),
                ports: ports.clone(),
                resident: None,
                sandboxes: sandboxes.clone(),
                node: node.clone(),
            };
            let mut binds = vec![lease.ports.bind_spec()];
            binds.extend(lease.egress.as_ref().map(|e| e.bind_spec()));
            let id = ContainerId {
                name: &lease.name,
                uid: host_uid,
            };
            let started = sandboxes
                .start(id, kind, session, limits, &binds, filesystem)
                .await;
            match started {
                Ok(_) => return Ok(lease),
                Err(e) if is_name_conflict(&e) => {
                    tracing::debug!(error = %e, "that uid's container exists; trying another");
                    egress = lease.give_up();
                }
                Err(e) => return Err(e),
            }
        }
        Err(DockerError::failed(
            "create",
            "a sandbox container",
            format!(
                "{UID_TRIES} uids of {} were taken by containers of other nodes",
                sandboxes.uids.range()
            ),
        ))
    }

    /// Forgets a lease whose container another node made (its name was taken): nothing is
    /// removed; the uid goes back to this node's pool and the egress comes back for the next try.
    fn give_up(mut self) -> Option<Box<ContainerEgress>> {
        let name = std::mem::take(&mut self.name);
        self.node.disown(&name);
        self.egress.take()
    }

    /// Removes the container now, for a caller that must know it is gone when this returns.
    pub async fn remove(mut self) {
        drop(self.egress.take());
        let name = std::mem::take(&mut self.name);
        self.sandboxes.remove(&name).await;
        self.node.disown(&name);
        drop(self.claim.take());
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
        let claim = self.claim.take();
        match tokio::runtime::Handle::try_current() {
            Ok(_) => {
                self.node.tasks.spawn(async move {
                    sandboxes.remove(&name).await;
                    node.disown(&name);
                    drop(claim);
                });
            }
            // No runtime left (process exit): the janitor of the next start removes it.
            Err(_) => tracing::warn!(container = name, "container left behind: no runtime"),
        }
    }
}
