//! What the actors of one node share without messages: the names of the sandboxes the node
//! owns (containers, cgroups: the janitor removes every other one labelled with this node),
//! the running count and the gauges the heartbeat reports. The running count changes only
//! through [`crate::RunSlot`]; ownership only through the backend's own guards (the Docker
//! backend's `ContainerLease`, the bwrap backend's sandbox cgroup).

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use tokio::sync::Notify;
use tokio_util::task::TaskTracker;

#[derive(Debug, Default)]
pub struct NodeState {
    /// Names are added *before* a sandbox is created and dropped only after it is removed, so
    /// the janitor can never take a sandbox that is being born for a leak.
    owned: Mutex<HashSet<String>>,
    /// Executions accepted and not yet answered (running or queued in a session).
    /// Changed only by [`crate::RunSlot`], with `tenant_slots` locked.
    pub running: AtomicUsize,
    /// Who holds the slots counted in `running`, and who waits for one.
    tenant_slots: Mutex<TenantSlots>,
    /// Notified when `running` drops to zero (a drain waits for it).
    pub idle: Notify,
    /// Executions answered since start.
    pub finished: AtomicUsize,
    /// Background work on sandboxes (starts, executions, removals): shutdown waits for it,
    /// so a stopped node has really removed everything it started.
    pub tasks: TaskTracker,
    /// Prometheus metrics (warm pool hits are counted where the pool hands containers out).
    pub metrics: std::sync::Arc<kit::metrics::Metrics>,
}

impl NodeState {
    pub fn new(metrics: std::sync::Arc<kit::metrics::Metrics>) -> Self {
        Self {
            metrics,
            ..Default::default()
        }
    }

    /// The slots per tenant, locked (only [`crate::RunSlot`] changes them).
    pub(crate) fn tenant_slots(&self) -> std::sync::MutexGuard<'_, TenantSlots> {
        self.tenant_slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Slots held per tenant now, for the heartbeat.
    pub fn slots_held(&self) -> BTreeMap<String, u32> {
        self.tenant_slots().held()
    }

    pub fn own(&self, name: &str) {
        self.owned
            .lock()
            .expect("owned set poisoned")
            .insert(name.to_string());
    }

    pub fn disown(&self, name: &str) {
        self.owned.lock().expect("owned set poisoned").remove(name);
    }

    pub fn owns(&self, name: &str) -> bool {
        self.owned
            .lock()
            .expect("owned set poisoned")
            .contains(name)
    }

    pub fn owned_count(&self) -> usize {
        self.owned.lock().expect("owned set poisoned").len()
    }

    /// Waits until no execution runs (a drain), or until `until`. Returns whether it did.
    pub async fn wait_idle(&self, until: tokio::time::Instant) -> bool {
        loop {
            // Registered before the check, so a run ending in between still wakes.
            let idle = self.idle.notified();
            if self.running.load(Ordering::Acquire) == 0 {
                return true;
            }
            if tokio::time::timeout_at(until, idle).await.is_err() {
                return false;
            }
        }
    }

    /// At shutdown: takes no more background work and waits (up to `limit`) for what runs.
    /// Returns whether it all finished.
    pub async fn finish_tasks(&self, limit: std::time::Duration) -> bool {
        self.tasks.close();
        tokio::time::timeout(limit, self.tasks.wait()).await.is_ok()
    }

    /// Gauges for the heartbeat, named as in `docs/reference/configuration.md#metrics`
    /// (`containers` counts whatever
    /// sandboxes the backend owns, under the name the scheduler and dashboards know).
    pub fn metrics(&self, capacity: usize) -> BTreeMap<String, f64> {
        let g = |a: &AtomicUsize| a.load(Ordering::Relaxed) as f64;
        BTreeMap::from([
            ("capacity".to_string(), capacity as f64),
            ("running_executions".to_string(), g(&self.running)),
            ("executions_total".to_string(), g(&self.finished)),
            ("containers".to_string(), self.owned_count() as f64),
        ])
    }
}

/// Who holds the node's slots and who waits for one: the state
/// [`messages::slot_share::SlotShares`] judges, changed only by [`crate::RunSlot`].
#[derive(Debug, Default)]
pub struct TenantSlots {
    pub(crate) held: BTreeMap<String, u32>,
    /// Tenants refused while under their share, and when last.
    pub(crate) waiting: BTreeMap<String, Instant>,
}

impl TenantSlots {
    /// Slots held per tenant, for the heartbeat (placement asks the same rule with it).
    pub fn held(&self) -> BTreeMap<String, u32> {
        self.held.clone()
    }
}
