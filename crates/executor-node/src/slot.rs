//! [`RunSlot`]: one accepted execution's share of the node's capacity, from admission until
//! its answer. A slot gives its count back however its execution ended (answered, dropped with
//! a message nobody received, a task that panicked): leaks are ruled out by the type.
//!
//! Slots are shared among tenants by [`SlotShares`] (see there): a tenant flooding the node
//! takes every free slot only while nobody else wants one, and another tenant's run is
//! admitted at once, up to its share, by borrowing the slots the flooder holds beyond its own.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use messages::slot_share::{SlotShares, NO_TENANT};
use messages::tenancy::Tenant;

use crate::node::NodeState;

/// How long a tenant refused under its share counts as waiting for a slot. A scheduler retries
/// a refused run every half second at most, so a tenant still waiting is seen again well
/// within it; one that gave up stops holding the next slot for itself soon after.
const WAITING_FOR: Duration = Duration::from_secs(2);

pub struct RunSlot {
    node: Arc<NodeState>,
    tenant: String,
}

impl RunSlot {
    /// A slot for a run of `tenant`, or `None` when the node's capacity, shared among the
    /// tenants, has none for it now.
    pub fn acquire(
        node: &Arc<NodeState>,
        capacity: usize,
        tenant: Option<&Tenant>,
    ) -> Option<Self> {
        let tenant = tenant.map_or(NO_TENANT, Tenant::as_str).to_string();
        let mut guard = node.tenant_slots();
        let slots = &mut *guard;
        let now = Instant::now();
        slots
            .waiting
            .retain(|_, at| now.duration_since(*at) < WAITING_FOR);
        let waiting: BTreeSet<String> = slots.waiting.keys().cloned().collect();
        let shares = SlotShares {
            capacity: u32::try_from(capacity).unwrap_or(u32::MAX),
            held: &slots.held,
            waiting: &waiting,
        };
        let running = node.running.load(Ordering::Acquire) as u32;
        if !shares.admits(running, &tenant) {
            if shares.under_share(&tenant) {
                slots.waiting.insert(tenant, now);
            }
            return None;
        }
        slots.waiting.remove(&tenant);
        *slots.held.entry(tenant.clone()).or_default() += 1;
        node.running.fetch_add(1, Ordering::AcqRel);
        Some(Self {
            node: node.clone(),
            tenant,
        })
    }

    /// The execution was answered.
    pub fn finished(self) {
        self.node.finished.fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for RunSlot {
    fn drop(&mut self) {
        let mut slots = self.node.tenant_slots();
        if let Some(n) = slots.held.get_mut(&self.tenant) {
            *n -= 1;
            if *n == 0 {
                slots.held.remove(&self.tenant);
            }
        }
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
        let a = RunSlot::acquire(&node, 2, None).expect("first");
        let b = RunSlot::acquire(&node, 2, None).expect("second");
        assert!(RunSlot::acquire(&node, 2, None).is_none(), "past capacity");
        drop(a);
        let c = RunSlot::acquire(&node, 2, None).expect("a dropped slot is free again");
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
    fn a_tenant_refused_under_its_share_takes_the_next_free_slot_before_the_flooder() {
        let node = Arc::new(NodeState::default());
        let tenant = |name: &str| Tenant::new(name).unwrap();
        let (a, b, c) = (tenant("a"), tenant("b"), tenant("c"));
        // a alone takes both slots; b borrows the one a holds beyond its share.
        let mut a_runs: Vec<_> = (0..2)
            .map(|_| RunSlot::acquire(&node, 2, Some(&a)).expect("a alone uses every slot"))
            .collect();
        let b_run = RunSlot::acquire(&node, 2, Some(&b)).expect("b borrows");
        assert!(
            RunSlot::acquire(&node, 2, Some(&a)).is_none(),
            "a is over its share"
        );
        // c finds nothing left to borrow and waits for a slot.
        assert!(RunSlot::acquire(&node, 2, Some(&c)).is_none());
        drop(a_runs.pop());
        assert!(RunSlot::acquire(&node, 2, Some(&c)).is_none(), "still full");
        drop(b_run);
        assert!(
            RunSlot::acquire(&node, 2, Some(&a)).is_none(),
            "a slot is free, but c waits under its share: it is c's"
        );
        let c_run = RunSlot::acquire(&node, 2, Some(&c)).expect("c's turn");
        assert_eq!(node.slots_held().get("c"), Some(&1));
        drop(c_run);
        assert_eq!(node.slots_held().get("c"), None, "given back");
    }

    #[tokio::test]
    async fn the_last_slot_back_wakes_a_drain() {
        let node = Arc::new(NodeState::default());
        let slot = RunSlot::acquire(&node, 1, None).unwrap();
        let idle = node.idle.notified();
        drop(slot);
        tokio::time::timeout(std::time::Duration::from_secs(5), idle)
            .await
            .expect("notified when running reaches zero");
    }
}
