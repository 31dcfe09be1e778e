//! RAII guards for what an execution holds on its node: the container it runs in
//! ([`ContainerLease`]) and its place in the node's capacity ([`RunSlot`]). Leaks are ruled out
//! by the types, not by pairs of calls: whoever drops a lease (an actor stopping, a message
//! nobody received, a task ending) removes its container, and a slot gives back its count
//! however its execution ended.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::docker::{ContainerKind, ContainerLimits, DockerError, Sandboxes};
use crate::egress::ContainerEgress;
use crate::node::NodeState;
use crate::resident::Resident;

/// Why a container could not be had.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Docker(#[from] DockerError),
    #[error(transparent)]
    Egress(#[from] crate::egress::EgressSetupError),
}

/// What a container's `/workspace` holds, compared with the session's workspace in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// A new container: an empty workspace.
    Nothing,
    /// Something that matches no known revision (a failed or raced push): cleared before use.
    Unknown,
    /// The workspace of a session without a revision: unknown to the store, or not changed
    /// since revisions exist (its first change makes one).
    Absent,
    /// The store's workspace as of this revision (`messages::workspace::revision_key`).
    At(u64),
}

impl Held {
    /// Whether this is the store's workspace at `revision` (`None`: the session has none).
    pub fn matches(self, revision: Option<u64>) -> bool {
        match (self, revision) {
            (Held::At(held), Some(current)) => held == current,
            (Held::Absent, None) => true,
            _ => false,
        }
    }
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
            .start(&lease.name, kind, session, limits, mount.as_deref())
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

/// One accepted execution's share of the node's capacity, from admission until its answer.
pub struct RunSlot {
    node: Arc<NodeState>,
}

impl RunSlot {
    /// A slot, or `None` when `capacity` executions already run.
    pub fn acquire(node: &Arc<NodeState>, capacity: usize) -> Option<Self> {
        node.running
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < capacity).then_some(n + 1)
            })
            .ok()
            .map(|_| Self { node: node.clone() })
    }

    /// The execution was answered.
    pub fn finished(self) {
        self.node.finished.fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for RunSlot {
    fn drop(&mut self) {
        if self.node.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.node.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_slots_stop_at_capacity_and_come_back_when_dropped() {
        let node = Arc::new(NodeState::default());
        let a = RunSlot::acquire(&node, 2).expect("first");
        let b = RunSlot::acquire(&node, 2).expect("second");
        assert!(RunSlot::acquire(&node, 2).is_none(), "past capacity");
        drop(a);
        let c = RunSlot::acquire(&node, 2).expect("a dropped slot is free again");
        b.finished();
        assert_eq!(node.running.load(Ordering::Relaxed), 1);
        assert_eq!(
            node.finished.load(Ordering::Relaxed),
            1,
            "only answers count"
        );
        drop(c);
        assert_eq!(node.running.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn only_a_known_revision_matches() {
        assert!(Held::At(7).matches(Some(7)));
        assert!(!Held::At(7).matches(Some(8)));
        assert!(!Held::At(7).matches(None), "a removed workspace");
        assert!(Held::Absent.matches(None));
        assert!(
            !Held::Absent.matches(Some(1)),
            "the first change of a session"
        );
        assert!(!Held::Nothing.matches(None) && !Held::Unknown.matches(None));
    }

    #[tokio::test]
    async fn the_last_slot_back_wakes_a_drain() {
        let node = Arc::new(NodeState::default());
        let slot = RunSlot::acquire(&node, 1).unwrap();
        let idle = node.idle.notified();
        drop(slot);
        tokio::time::timeout(std::time::Duration::from_secs(5), idle)
            .await
            .expect("notified when running reaches zero");
    }
}
