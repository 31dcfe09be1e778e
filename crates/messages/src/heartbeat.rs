//! Heartbeats: one key `<service>.<instance_id>` per live instance in KV `sandbox_nodes`,
//! renewed on a timer with a per-key TTL, so a dead instance disappears by itself.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
    /// Service-specific gauges (warm pool size, sessions, memory...), named as in
    /// `docs/reference/configuration.md#metrics`.
    #[serde(default)]
    pub metrics: BTreeMap<String, f64>,
    /// Free-form facts (host name, image, ...).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The isolation backends an executor offers (empty for other services, and for
    /// executors older than the field: those are Docker executors).
    #[serde(default)]
    pub backends: Vec<crate::executor::Backend>,
    /// What the executor's host has and uses, for resource-aware placement; absent for other
    /// services and for executors older than the field (placement then goes by load alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
    /// What this instance holds per tenant of the resource a tenant quota counts (executions
    /// in flight, browsers, AIO instances): its peers add it to their own live count, so the
    /// quota holds mesh-wide. An executor node reports its run slots held per tenant
    /// ([`crate::slot_share::NO_TENANT`] for work without one), which placement weighs by the
    /// node's sharing rule. Empty for services without one, and for older instances.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tenants: BTreeMap<String, u32>,
}

/// CPU and memory of the host an executor's sandboxes run on, sampled at each heartbeat.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Resources {
    /// CPUs the host has.
    pub cpus: f64,
    /// How busy those CPUs were since the previous sample, 0–100.
    pub cpu_usage_percent: f64,
    pub memory_total_bytes: u64,
    /// Memory in use: total minus what the kernel reports available (page cache that can be
    /// dropped counts as free).
    pub memory_used_bytes: u64,
}

impl Resources {
    /// CPUs idle right now (never negative).
    pub fn cpus_free(&self) -> f64 {
        (self.cpus * (1.0 - self.cpu_usage_percent.clamp(0.0, 100.0) / 100.0)).max(0.0)
    }

    pub fn memory_free_bytes(&self) -> u64 {
        self.memory_total_bytes
            .saturating_sub(self.memory_used_bytes)
    }

    /// Whether the figures can be scored: a positive, finite CPU count and some memory.
    pub fn is_usable(&self) -> bool {
        self.cpus.is_finite()
            && self.cpus > 0.0
            && self.cpu_usage_percent.is_finite()
            && self.memory_total_bytes > 0
    }
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
