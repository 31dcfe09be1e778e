//! How an executor node shares its run slots among tenants, so that one tenant flooding the
//! mesh with long runs cannot make another tenant's run wait for them to end. The node admits
//! by this rule; the scheduler's placement asks the same rule, with what the node's heartbeat
//! reports, whether a full node would still take a tenant's run.
//!
//! - A tenant's *share* is the node's capacity divided among the *active* tenants — those
//!   holding a slot, those the node refused lately while under their share, and the one
//!   asking — rounded up.
//! - Work-conserving: a free slot goes to whoever asks, unless a tenant under its share is
//!   waiting for one. A tenant alone (or beside tenants that want no more) may use every slot.
//! - No run is stopped to make room. A tenant under its share is admitted even by a full node,
//!   borrowing the slots the others hold beyond their shares; as those runs end the slots are
//!   paid back, since a tenant at or over its share is admitted only below capacity. So a node
//!   runs at most the borrowed slots over its capacity (never more than twice its capacity),
//!   for at most the longest of the lenders' runs — instead of the newcomer waiting that long.
//!
//! The rule holds across any number of schedulers: it is applied where the slots are counted,
//! on the node, which every scheduler's runs pass through.

use std::collections::{BTreeMap, BTreeSet};

/// The key of work sent without a tenant (the mesh's own): it shares like a tenant.
pub const NO_TENANT: &str = "";

/// One node's slots, as one admission sees them.
#[derive(Debug, Clone, Copy)]
pub struct SlotShares<'a> {
    pub capacity: u32,
    /// Slots held now, per tenant ([`NO_TENANT`] for work without one).
    pub held: &'a BTreeMap<String, u32>,
    /// Tenants refused lately while under their share: they get the next free slot before
    /// any tenant at or over its share. Only the node knows them.
    pub waiting: &'a BTreeSet<String>,
}

impl SlotShares<'_> {
    fn held_by(&self, tenant: &str) -> u32 {
        self.held.get(tenant).copied().unwrap_or(0)
    }

    /// The slots each active tenant is due when `tenant` asks for one.
    pub fn share(&self, tenant: &str) -> u32 {
        let mut active: BTreeSet<&str> = self
            .held
            .iter()
            .filter(|(_, &n)| n > 0)
            .map(|(t, _)| t.as_str())
            .collect();
        active.extend(self.waiting.iter().map(String::as_str));
        active.insert(tenant);
        self.capacity.div_ceil(active.len() as u32).max(1)
    }

    /// Whether `tenant` holds less than its share.
    pub fn under_share(&self, tenant: &str) -> bool {
        self.held_by(tenant) < self.share(tenant)
    }

    /// Whether a node running `running` executions takes one more of `tenant` now.
    pub fn admits(&self, running: u32, tenant: &str) -> bool {
        let share = self.share(tenant);
        if self.held_by(tenant) < share {
            let lent: u32 = self
                .held
                .iter()
                .filter(|(t, _)| t.as_str() != tenant)
                .map(|(_, &n)| n.saturating_sub(share))
                .sum();
            let ceiling = self.capacity.saturating_add(lent.min(self.capacity));
            return running < ceiling;
        }
        let someone_due = self
            .waiting
            .iter()
            .any(|t| t != tenant && self.held_by(t) < share);
        running < self.capacity && !someone_due
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn held(pairs: &[(&str, u32)]) -> BTreeMap<String, u32> {
        pairs.iter().map(|(t, n)| (t.to_string(), *n)).collect()
    }

    fn running(held: &BTreeMap<String, u32>) -> u32 {
        held.values().sum()
    }

    #[test]
    fn a_tenant_alone_uses_every_slot() {
        let mut h = BTreeMap::new();
        let none = BTreeSet::new();
        for _ in 0..8 {
            let shares = SlotShares {
                capacity: 8,
                held: &h,
                waiting: &none,
            };
            assert!(shares.admits(running(&h), "a"));
            *h.entry("a".to_string()).or_default() += 1;
        }
        let shares = SlotShares {
            capacity: 8,
            held: &h,
            waiting: &none,
        };
        assert!(!shares.admits(8, "a"), "capacity holds for a tenant alone");
    }

    #[test]
    fn a_newcomer_borrows_what_the_flooder_holds_beyond_its_share_and_the_flooder_waits() {
        let h = held(&[("a", 8)]);
        let none = BTreeSet::new();
        let shares = SlotShares {
            capacity: 8,
            held: &h,
            waiting: &none,
        };
        assert_eq!(shares.share("b"), 4);
        assert!(shares.admits(8, "b"), "b is under its share: it borrows");
        let h = held(&[("a", 8), ("b", 4)]);
        let shares = SlotShares {
            capacity: 8,
            held: &h,
            waiting: &none,
        };
        assert!(!shares.admits(12, "b"), "b borrows up to its share only");
        assert!(
            !shares.admits(12, "a"),
            "a is over its share on a full node"
        );
        // a's runs end; below capacity a may take a slot again, unless b is due one.
        let h = held(&[("a", 3), ("b", 4)]);
        let shares = SlotShares {
            capacity: 8,
            held: &h,
            waiting: &none,
        };
        assert!(shares.admits(7, "a"), "work-conserving: b wants no more");
        let waiting = BTreeSet::from(["c".to_string()]);
        let shares = SlotShares {
            capacity: 8,
            held: &h,
            waiting: &waiting,
        };
        assert_eq!(shares.share("a"), 3);
        assert!(
            !shares.admits(7, "a"),
            "c waits under its share: the slot is c's"
        );
        assert!(shares.admits(7, "c"));
    }

    proptest! {
        /// Any sequence of asks and ends, by up to four tenants: a full node admits only a
        /// tenant under its share, and never runs twice its capacity.
        #[test]
        fn a_full_node_admits_only_tenants_under_their_share_and_never_twice_its_capacity(
            capacity in 1u32..10,
            steps in proptest::collection::vec((0usize..4, any::<bool>()), 1..200),
        ) {
            let mut h: BTreeMap<String, u32> = BTreeMap::new();
            let none = BTreeSet::new();
            for (who, ask) in steps {
                let tenant = who.to_string();
                if ask {
                    let r = running(&h);
                    let shares = SlotShares { capacity, held: &h, waiting: &none };
                    if shares.admits(r, &tenant) {
                        prop_assert!(r < capacity || shares.under_share(&tenant));
                        *h.entry(tenant).or_default() += 1;
                    }
                } else if let Some(n) = h.get_mut(&tenant) {
                    *n = n.saturating_sub(1);
                }
                prop_assert!(running(&h) < 2 * capacity.max(1) + 1);
            }
        }
    }
}
