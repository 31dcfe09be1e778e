//! [`RunSlot`]: one accepted execution's share of the node's capacity, from admission until
//! its answer. A slot gives its count back however its execution ended (answered, dropped with
//! a message nobody received, a task that panicked): leaks are ruled out by the type.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::node::NodeState;

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
