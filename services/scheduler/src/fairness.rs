//! `TenantSlots`: how many executions each tenant has in flight on this scheduler, capped at
//! `SANDMESH_SCHED_TENANT_MAX` (by default three quarters of the queue), so one tenant flooding
//! the mesh — hundreds of async jobs, or a burst of sync calls — cannot take every queue slot
//! and starve another: the rest of the queue stays free for the others. A sync call over the cap
//! gets 429 with a `retry_after_ms` hint and the quota's name; a job over it goes back to the
//! stream for a moment while other tenants' jobs behind it are taken. Internal callers are not
//! counted. The count is this instance's: N scheduler instances admit up to N times the cap.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use messages::tenancy::Tenant;
use messages::ErrorBody;

/// How long a caller over its quota is told to wait before it tries again.
pub const RETRY_AFTER_MS: u64 = 500;

#[derive(Debug, Clone)]
pub struct TenantSlots {
    max: usize,
    in_flight: Arc<Mutex<HashMap<Tenant, usize>>>,
}

/// One execution of a tenant in flight; dropping it gives the slot back.
#[derive(Debug)]
pub struct TenantSlot {
    slots: TenantSlots,
    tenant: Tenant,
}

impl TenantSlots {
    pub fn new(max: usize) -> Self {
        Self {
            max: max.max(1),
            in_flight: Arc::default(),
        }
    }

    /// A slot for `tenant` (none needed without a tenant), or the 429 that says which quota.
    pub fn take(&self, tenant: Option<&Tenant>) -> Result<Option<TenantSlot>, ErrorBody> {
        let Some(tenant) = tenant else {
            return Ok(None);
        };
        let mut counts = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        let n = counts.entry(tenant.clone()).or_default();
        if *n >= self.max {
            return Err(ErrorBody::overloaded(format!(
                "tenant {tenant} has {n} executions in flight, its quota \
                 (concurrent_executions); retry later"
            ))
            .with_details(serde_json::json!({
                "quota": "concurrent_executions",
                "limit": self.max,
                "retry_after_ms": RETRY_AFTER_MS,
            })));
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
    use messages::ErrorKind;

    #[test]
    fn a_tenant_at_its_cap_is_refused_others_are_not_and_a_dropped_slot_comes_back() {
        let slots = TenantSlots::new(2);
        let (a, b) = (Tenant::new("a").unwrap(), Tenant::new("b").unwrap());
        let first = slots.take(Some(&a)).unwrap();
        let _second = slots.take(Some(&a)).unwrap();
        let e = slots.take(Some(&a)).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Overloaded);
        assert_eq!(
            e.details.as_ref().unwrap()["quota"],
            "concurrent_executions"
        );
        assert!(slots.take(Some(&b)).unwrap().is_some(), "b is not a's");
        assert!(
            slots.take(None).unwrap().is_none(),
            "internal callers are not counted"
        );
        drop(first);
        assert!(slots.take(Some(&a)).unwrap().is_some());
    }
}
