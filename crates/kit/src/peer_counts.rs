//! `PeerCounts`: what the other instances of this service hold per tenant, so a per-tenant
//! quota holds mesh-wide however many instances serve it.
//!
//! Each instance reports its own holdings in its heartbeat (`Heartbeat::tenants`, from
//! [`crate::heartbeat::Load::tenants`]); a task watches the service's heartbeat keys and keeps
//! every peer's latest report; an admission adds them to the instance's own live count.
//! Staleness: a peer's report is at most one heartbeat interval old (plus delivery), and a
//! crashed peer's report goes when its key expires (three intervals). So two instances
//! admitting at the same moment may each let a request in before either has heard of the
//! other's: the mesh-wide count can exceed a quota by what the other instances admit within
//! one heartbeat interval, never more, and it is back within it at the next beat.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::kv;
use futures::StreamExt;
use messages::heartbeat::Heartbeat;
use messages::tenancy::Tenant;
use messages::Encoding;
use tokio::task::JoinHandle;

/// How long a broken watch waits before watching again.
const REWATCH_AFTER: Duration = Duration::from_secs(1);

/// The peers' latest per-tenant reports; the watch ends when this is dropped.
#[derive(Debug, Default)]
pub struct PeerCounts {
    /// Instance id → tenant → held.
    peers: Arc<Mutex<HashMap<String, BTreeMap<String, u32>>>>,
    watch: Option<JoinHandle<()>>,
}

impl PeerCounts {
    /// No peers (one instance, or a test of the instance alone).
    pub fn none() -> Self {
        Self::default()
    }

    /// Following the heartbeat keys `<service>.*` in `nodes` except `own`'s.
    pub fn watch(nodes: kv::Store, service: &str, own: &str) -> Self {
        let peers = Arc::new(Mutex::new(HashMap::new()));
        let prefix = messages::heartbeat::heartbeat_key(service, "");
        let task = tokio::spawn(follow(nodes, prefix, own.to_string(), peers.clone()));
        Self {
            peers,
            watch: Some(task),
        }
    }

    /// What the peers hold of `tenant`, summed.
    pub fn held(&self, tenant: &Tenant) -> u64 {
        let peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        peers
            .values()
            .filter_map(|counts| counts.get(tenant.as_str()))
            .map(|&n| u64::from(n))
            .sum()
    }
}

impl Drop for PeerCounts {
    fn drop(&mut self) {
        if let Some(task) = &self.watch {
            task.abort();
        }
    }
}

/// Keeps `peers` current; a broken watch is started again (with history, so the reports
/// are whole again at once).
async fn follow(
    nodes: kv::Store,
    prefix: String,
    own: String,
    peers: Arc<Mutex<HashMap<String, BTreeMap<String, u32>>>>,
) {
    loop {
        if let Ok(mut entries) = nodes.watch_with_history(format!("{prefix}*")).await {
            while let Some(Ok(entry)) = entries.next().await {
                let Some(instance) = entry.key.strip_prefix(&prefix) else {
                    continue;
                };
                if instance == own {
                    continue;
                }
                let report = match entry.operation {
                    kv::Operation::Put => Encoding::Json
                        .decode::<Heartbeat>(&entry.value)
                        .ok()
                        .map(|h| h.tenants),
                    kv::Operation::Delete | kv::Operation::Purge => None,
                };
                let mut peers = peers.lock().unwrap_or_else(|p| p.into_inner());
                match report {
                    Some(counts) if !counts.is_empty() => {
                        peers.insert(instance.to_string(), counts);
                    }
                    _ => {
                        peers.remove(instance);
                    }
                }
            }
        }
        tokio::time::sleep(REWATCH_AFTER).await;
    }
}
