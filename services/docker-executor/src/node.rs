//! What the actors of one node share without messages: the names of the containers the node
//! owns (the janitor removes every other container labelled with this node) and the gauges
//! the heartbeat reports.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio_util::task::TaskTracker;

#[derive(Debug, Default)]
pub struct NodeState {
    /// Names are added *before* a container is created and dropped only after it is removed,
    /// so the janitor can never take a container that is being born for a leak.
    owned: Mutex<HashSet<String>>,
    /// Executions accepted and not yet answered (running or queued in a session).
    pub running: AtomicUsize,
    /// Ready containers in the warm pool.
    pub warm: AtomicUsize,
    /// Live session containers.
    pub sessions: AtomicUsize,
    /// Executions answered since start.
    pub finished: AtomicUsize,
    /// Background work on containers (starts, executions, removals): shutdown waits for it,
    /// so a stopped node has really removed everything it started.
    pub tasks: TaskTracker,
}

impl NodeState {
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

/// Hands containers started by a background task to an actor that may stop meanwhile. A
/// message sent to an actor that is already stopping is dropped silently, so the name is
/// registered here first: whatever was offered and not received is returned by `close`, for
/// the actor's `post_stop` to remove.
#[derive(Debug, Default, Clone)]
pub struct Handoff(Arc<Mutex<HandoffState>>);

#[derive(Debug, Default)]
struct HandoffState {
    closed: bool,
    pending: HashSet<String>,
}

impl Handoff {
    /// Registers `name` as on its way to the actor. `false` when the actor is closed: the
    /// caller keeps the container (and removes it).
    pub fn offer(&self, name: &str) -> bool {
        let mut s = self.0.lock().expect("handoff poisoned");
        if s.closed {
            return false;
        }
        s.pending.insert(name.to_string());
        true
    }

    /// The actor took the container over.
    pub fn received(&self, name: &str) {
        self.0
            .lock()
            .expect("handoff poisoned")
            .pending
            .remove(name);
    }

    /// No more offers; returns the containers offered but never received.
    pub fn close(&self) -> Vec<String> {
        let mut s = self.0.lock().expect("handoff poisoned");
        s.closed = true;
        s.pending.drain().collect()
    }
}
