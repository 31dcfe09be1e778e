//! `TenantSlots`: how many executions each tenant has in flight, capped so one tenant flooding
//! the mesh — hundreds of async jobs, or a burst of sync calls — cannot take every queue slot
//! and starve another. A sync call over the cap gets 429 with a `retry_after_ms` hint and the
//! quota's name; a job over it goes back to the stream for a moment while other tenants' jobs
//! behind it are taken. Internal callers are not counted.
//!
//! Two caps, counted differently:
//! - a tenant's own `concurrent_executions` quota (the tenancy file, `sandmesh tenant add NAME
//!   --max-executions N`) is a promise about the mesh: this instance's live count plus what
//!   the other schedulers reported in their last heartbeats ([`PeerCounts`]: at most one
//!   heartbeat interval old, see there for what that allows);
//! - a tenant without one gets `SANDMESH_SCHED_TENANT_MAX` (by default three quarters of the
//!   queue) of this instance's queue: that share protects this queue's slots, so it counts
//!   this instance alone.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use kit::{PeerCounts, QuotaBook};
use messages::quota::{OverQuota, Quota};
use messages::tenancy::Tenant;
use tokio::sync::Semaphore;

/// The bounded queue — one permit per execution in flight, shared by the intake, the jobs and
/// the resumer — and each tenant's share of it.
#[derive(Debug, Clone)]
pub struct Admission {
    pub queue: Arc<Semaphore>,
    /// `SANDMESH_SCHED_MAX_QUEUE`: the number of permits, for the 429 message and the heartbeat.
    pub size: usize,
    pub tenants: TenantSlots,
}

impl Admission {
    pub fn new(size: usize, tenants: TenantSlots) -> Self {
        Self {
            queue: Arc::new(Semaphore::new(size)),
            size,
            tenants,
        }
    }

    pub fn in_flight(&self) -> usize {
        self.size - self.queue.available_permits()
    }
}

#[derive(Debug, Clone)]
pub struct TenantSlots {
    /// The share of a tenant without a quota of its own.
    share: usize,
    quotas: Arc<QuotaBook>,
    /// The other schedulers' in-flight counts, for the quotas.
    peers: Arc<PeerCounts>,
    in_flight: Arc<Mutex<HashMap<Tenant, usize>>>,
}

/// One execution of a tenant in flight; dropping it gives the slot back.
#[derive(Debug)]
pub struct TenantSlot {
    slots: TenantSlots,
    tenant: Tenant,
}

impl TenantSlots {
    pub fn new(share: usize, quotas: Arc<QuotaBook>, peers: Arc<PeerCounts>) -> Self {
        Self {
            share: share.max(1),
            quotas,
            peers,
            in_flight: Arc::default(),
        }
    }

    /// This instance's in-flight count per tenant, for its heartbeat.
    pub fn held(&self) -> BTreeMap<String, u32> {
        let counts = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        counts
            .iter()
            .map(|(tenant, &n)| (tenant.as_str().to_string(), n as u32))
            .collect()
    }

    /// A slot for `tenant` (none needed without a tenant), or the 429 that says which quota.
    pub fn take(&self, tenant: Option<&Tenant>) -> Result<Option<TenantSlot>, OverQuota> {
        let Some(tenant) = tenant else {
            return Ok(None);
        };
        let quota = self.quotas.of(tenant).limit(Quota::ConcurrentExecutions);
        let elsewhere = match quota {
            Some(_) => self.peers.held(tenant),
            None => 0,
        };
        let limit = quota.unwrap_or(self.share as u64);
        let mut counts = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        let n = counts.entry(tenant.clone()).or_default();
        let used = *n as u64 + elsewhere;
        if used >= limit {
            return Err(OverQuota {
                tenant: tenant.clone(),
                quota: Quota::ConcurrentExecutions,
                limit,
                used,
            });
        }
        *n += 1;
        Ok(Some(TenantSlot {
            slots: self.clone(),
            tenant: tenant.clone(),
        }))
    }
}

impl Drop for TenantSlot {
    fn drop(&mut self) {
        let mut counts = self
            .slots
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = counts.get_mut(&self.tenant) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.tenant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_at_its_cap_is_refused_others_are_not_and_a_dropped_slot_comes_back() {
        let slots = TenantSlots::new(2, Arc::new(QuotaBook::none()), Arc::new(PeerCounts::none()));
        let (a, b) = (Tenant::new("a").unwrap(), Tenant::new("b").unwrap());
        let first = slots.take(Some(&a)).unwrap();
        let _second = slots.take(Some(&a)).unwrap();
        let e = slots.take(Some(&a)).unwrap_err();
        assert_eq!(
            (e.quota, e.limit, e.used),
            (Quota::ConcurrentExecutions, 2, 2)
        );
        assert!(slots.take(Some(&b)).unwrap().is_some(), "b is not a's");
        assert!(
            slots.take(None).unwrap().is_none(),
            "internal callers are not counted"
        );
        drop(first);
        assert!(slots.take(Some(&a)).unwrap().is_some());
    }

    #[test]
    fn a_tenants_own_quota_replaces_the_share_for_it_alone() {
        let (a, b) = (Tenant::new("a").unwrap(), Tenant::new("b").unwrap());
        let quotas = messages::quota::Quotas {
            concurrent_executions: Some(1),
            ..Default::default()
        };
        let book = QuotaBook::fixed([(a.clone(), quotas)].into());
        let slots = TenantSlots::new(3, Arc::new(book), Arc::new(PeerCounts::none()));
        let _one = slots.take(Some(&a)).unwrap();
        let e = slots.take(Some(&a)).unwrap_err();
        assert_eq!((e.limit, e.used), (1, 1));
        let _b: Vec<_> = (0..3).map(|_| slots.take(Some(&b)).unwrap()).collect();
        assert!(slots.take(Some(&b)).is_err(), "b has the share of 3");
    }
}
