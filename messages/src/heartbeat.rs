//! Heartbeats: one key `<service>.<instance_id>` per live instance in KV `sandbox_nodes`,
//! renewed on a timer with a per-key TTL, so a dead instance disappears by itself.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Heartbeat {
    pub service: String,
    pub instance_id: String,
    pub version: String,
    /// Unix milliseconds.
    pub started_at: u64,
    pub sent_at: u64,
    /// How much concurrent work the instance takes.
    pub capacity: u32,
    /// How much it holds now.
    pub load: u32,
    /// Service-specific gauges (warm pool size, sessions, memory...), named after seed 003 §8.
    #[serde(default)]
    pub metrics: BTreeMap<String, f64>,
    /// Free-form facts (host name, image, ...).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The isolation backends an executor offers (empty for other services, and for
    /// executors older than the field: those are Docker executors).
    #[serde(default)]
    pub backends: Vec<crate::executor::Backend>,
}

impl Heartbeat {
    /// Whether this instance runs executions on `backend`; an executor that names none is a
    /// Docker executor.
    pub fn offers(&self, backend: crate::executor::Backend) -> bool {
        if self.backends.is_empty() {
            backend == crate::executor::Backend::Docker
        } else {
            self.backends.contains(&backend)
        }
    }
}

impl Heartbeat {
    pub fn key(&self) -> String {
        heartbeat_key(&self.service, &self.instance_id)
    }
}

pub fn heartbeat_key(service: &str, instance_id: &str) -> String {
    format!("{service}.{instance_id}")
}
