//! What the actors of one node share without messages: the names of the containers the node
//! owns (the janitor removes every other container labelled with this node) and the gauges
//! the heartbeat reports. Ownership and the running count change only through the guards in
//! `lease`.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use tokio::sync::Notify;
use tokio_util::task::TaskTracker;

#[derive(Debug, Default)]
pub struct NodeState {
    /// Changed only by `lease::ContainerLease`. Names are added *before* a container is created and dropped only after it is removed,
    /// so the janitor can never take a container that is being born for a leak.
    owned: Mutex<HashSet<String>>,
    /// Executions accepted and not yet answered (running or queued in a session).
    /// Changed only by `lease::RunSlot`.
    pub running: AtomicUsize,
    /// Notified when `running` drops to zero (a drain waits for it).
    pub idle: Notify,
    /// Ready containers in the warm pool.
    pub warm: AtomicUsize,
    /// Live session containers.
    pub sessions: AtomicUsize,
    /// Executions answered since start.
    pub finished: AtomicUsize,
    /// Background work on containers (starts, executions, removals): shutdown waits for it,
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

    /// Gauges for the heartbeat, named after seed 003 §8.
    pub fn metrics(&self, capacity: usize) -> BTreeMap<String, f64> {
        let g = |a: &AtomicUsize| a.load(Ordering::Relaxed) as f64;
        BTreeMap::from([
            ("capacity".to_string(), capacity as f64),
            ("running_executions".to_string(), g(&self.running)),
            ("warm_pool_size".to_string(), g(&self.warm)),
            ("active_sessions".to_string(), g(&self.sessions)),
            ("executions_total".to_string(), g(&self.finished)),
            ("containers".to_string(), self.owned_count() as f64),
        ])
    }
}
