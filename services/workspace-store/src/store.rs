//! The parts every operation shares: the owners of the operations
//! ([`crate::workspaces::Workspaces`]: files, snapshots, restores, cleanup) each hold what they
//! need of them, of the index, the blobs and the limits.
//!
//! [`Tree`] is a session's tree in the index (its nodes and totals) and the three steps every
//! change is made of:
//!
//! 1. `account` — the session's totals, compare-and-set, refusing growth past the quota;
//! 2. `ensure_parents` — directory nodes for every ancestor, refusing a file in the way;
//! 3. `commit_node` — the node itself, compare-and-set on the revision read before.
//!
//! Order matters for the quota: growth is reserved (1) before the node lands (3) and
//! shrinkage is released after, so a crash between steps over-counts and never lets a
//! session exceed its quota.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kit::{AuditScope, Auditor, QuotaBook};
use messages::audit::AuditDetails;
use messages::quota::Quota;
use messages::tenancy::{scoped, tenant_of_scoped, Caller, Tenant};
use messages::workspace::WsEntry;

use crate::error::{Result, StoreError};
use crate::index::{Cas, Index, Node, SessionMeta, Versioned};
use crate::keys::RelPath;

/// Compare-and-set retries before giving up with 409 (only reached under extreme contention).
const MAX_CAS_ATTEMPTS: usize = 1000;

pub use messages::workspace::INLINE_MAX_BYTES;

/// Counters reported in the heartbeat.
#[derive(Debug, Default)]
pub struct Metrics {
    pub in_flight: AtomicU64,
    pub writes: AtomicU64,
    pub reads: AtomicU64,
    pub bytes_written: AtomicU64,
    pub bytes_read: AtomicU64,
    pub snapshots: AtomicU64,
    pub restores: AtomicU64,
    pub sessions_cleaned: AtomicU64,
}

impl Metrics {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// How `account` treats a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accounting {
    /// New growth: refused past the quota or while the session is being removed.
    Reserve,
    /// Settling what already happened: always applied.
    Settle,
}

/// What an operation leaves behind besides its change: an audit event and the counters the
/// heartbeat reports.
#[derive(Clone)]
pub struct Journal {
    auditor: Auditor,
    pub metrics: Arc<Metrics>,
}

impl Journal {
    pub fn new(auditor: Auditor) -> Self {
        Self {
            auditor,
            metrics: Arc::new(Metrics::default()),
        }
    }

    /// An audit event of `session`, naming who asked (`by`; none for the store's own sweeps).
    pub fn audit(
        &self,
        session: &str,
        by: Option<&Caller>,
        actor: Option<String>,
        details: impl Into<AuditDetails>,
    ) {
        let mut scope = AuditScope {
            session_id: Some(session.to_string()),
            actor,
            ..Default::default()
        };
        if let Some(caller) = by {
            scope = scope.by(caller);
        }
        self.auditor.emit(&scope, details);
    }
}

/// A session's tree in the index (its nodes and its totals), changed in the three steps the
/// module doc lists.
pub struct Tree {
    pub index: Index,
    /// How many bytes one workspace may hold.
    pub quota_bytes: u64,
    /// Each tenant's bytes, for its quota over all its workspaces.
    tenants: TenantBytes,
}

/// Each tenant's bytes over all its workspaces, for its `workspace_bytes` quota: summed from
/// the sessions' totals (the authoritative counts) at most every [`TENANT_SUM_MAX_AGE`], with
/// what this instance reserved or released since added in. Nothing is summed for a tenant
/// without that quota, so the quota costs nothing where it is not set; with several store
/// instances a tenant may overshoot by what the others wrote within that window.
struct TenantBytes {
    quotas: Arc<QuotaBook>,
    sums: Mutex<HashMap<Tenant, (Instant, u64)>>,
}

/// How old a tenant's sum may be before it is taken again.
const TENANT_SUM_MAX_AGE: Duration = Duration::from_secs(2);

impl TenantBytes {
    fn new(quotas: Arc<QuotaBook>) -> Self {
        Self {
            quotas,
            sums: Mutex::default(),
        }
    }

    fn sums(&self) -> std::sync::MutexGuard<'_, HashMap<Tenant, (Instant, u64)>> {
        self.sums.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Refuses `bytes` of growth in `session` when its tenant would go over its quota.
    async fn reserve(&self, index: &Index, session: &str, bytes: u64) -> Result<()> {
        let Some(tenant) = tenant_of_scoped(session) else {
            return Ok(());
        };
        let Some(quota) = self.quotas.of(&tenant).limit(Quota::WorkspaceBytes) else {
            return Ok(());
        };
        let fresh = self
            .sums()
            .get(&tenant)
            .filter(|(at, _)| at.elapsed() < TENANT_SUM_MAX_AGE)
            .map(|(_, used)| *used);
        let used = match fresh {
            Some(used) => used,
            None => {
                let prefix = scoped(&tenant, "");
                let used = index
                    .sessions()
                    .await?
                    .into_iter()
                    .filter(|(s, _)| s.starts_with(&prefix))
                    .map(|(_, m)| m.value.bytes)
                    .sum();
                self.sums().insert(tenant.clone(), (Instant::now(), used));
                used
            }
        };
        if used.saturating_add(bytes) > quota {
            return Err(StoreError::TenantQuota {
                tenant,
                used,
                needed: bytes,
                quota,
            });
        }
        Ok(())
    }

    /// A change of `bytes` landed in `session`'s totals: the tenant's sum follows it.
    fn landed(&self, session: &str, bytes: i64) {
        if let Some(tenant) = tenant_of_scoped(session) {
            if let Some((_, used)) = self.sums().get_mut(&tenant) {
                *used = used.saturating_add_signed(bytes);
            }
        }
    }
}

impl Tree {
    /// The tree of every session in `index`, each holding at most `quota_bytes`, each tenant
    /// at most its `workspace_bytes` quota in `quotas`.
    pub fn new(index: Index, quota_bytes: u64, quotas: Arc<QuotaBook>) -> Self {
        Self {
            index,
            quota_bytes,
            tenants: TenantBytes::new(quotas),
        }
    }

    /// Applies `bytes`/`files` deltas to the session's totals (creating them on first use).
    pub async fn account(
        &self,
        session: &str,
        bytes: i64,
        files: i64,
        mode: Accounting,
    ) -> Result<SessionMeta> {
        for _ in 0..MAX_CAS_ATTEMPTS {
            let now = messages::now_ms();
            let (mut meta, revision) = match self.index.meta(session).await? {
                Some(v) => (v.value, Some(v.revision)),
                None => (
                    SessionMeta {
                        created: now,
                        ..Default::default()
                    },
                    None,
                ),
            };
            if mode == Accounting::Reserve {
                if meta.removing {
                    return Err(StoreError::Conflict(format!(
                        "workspace {session} is being cleaned up; retry in a moment"
                    )));
                }
                if bytes > 0 && meta.bytes.saturating_add(bytes as u64) > self.quota_bytes {
                    return Err(StoreError::Quota {
                        used: meta.bytes,
                        needed: bytes as u64,
                        quota: self.quota_bytes,
                    });
                }
                if bytes > 0 {
                    self.tenants
                        .reserve(&self.index, session, bytes as u64)
                        .await?;
                }
            }
            meta.bytes = meta.bytes.saturating_add_signed(bytes);
            meta.files = meta.files.saturating_add_signed(files);
            meta.last_modified = now;
            if let Cas::Done(_) = self.index.put_meta(session, &meta, revision).await? {
                self.tenants.landed(session, bytes);
                return Ok(meta);
            }
        }
        Err(StoreError::Raced(format!(
            "the totals of workspace {session}"
        )))
    }

    /// Marks the session as used now (snapshots count as use: executors take one per run).
    pub async fn touch(&self, session: &str) -> Result<()> {
        self.account(session, 0, 0, Accounting::Reserve)
            .await
            .map(|_| ())
    }

    /// Directory nodes for every ancestor of `path`; a file in the way is a conflict.
    pub async fn ensure_parents(&self, session: &str, path: &RelPath) -> Result<()> {
        let ancestors = path.ancestors();
        let found =
            futures::future::try_join_all(ancestors.iter().map(|a| self.index.node(session, a)))
                .await?;
        for (ancestor, node) in ancestors.iter().zip(found) {
            match node {
                Some(n) if n.value.is_dir() => {}
                Some(_) => {
                    return Err(StoreError::Conflict(format!(
                        "{ancestor} is a file, so {path} cannot be created"
                    )))
                }
                None => self.make_dir(session, ancestor).await?,
            }
        }
        Ok(())
    }

    /// Creates a directory node unless one exists; a file there is a conflict.
    pub async fn make_dir(&self, session: &str, path: &RelPath) -> Result<()> {
        let node = Node::dir(messages::now_ms());
        if let Cas::Done(_) = self.index.put_node(session, path, &node, None).await? {
            return Ok(());
        }
        match self.index.node(session, path).await? {
            Some(n) if !n.value.is_dir() => Err(StoreError::Conflict(format!(
                "{path} is a file, not a directory"
            ))),
            // A directory (made concurrently), or a node deleted again meanwhile: retry once.
            Some(_) => Ok(()),
            None => match self.index.put_node(session, path, &node, None).await? {
                Cas::Done(_) => Ok(()),
                Cas::Stale => Err(StoreError::Raced(path.to_string())),
            },
        }
    }

    /// Writes a file node expecting `expected` (what was read before). When another writer
    /// got there first: `strict` gives up (an append must re-read), otherwise the node is
    /// written over the newer one (last writer wins). Returns the node actually replaced.
    pub async fn commit_node(
        &self,
        session: &str,
        path: &RelPath,
        node: &Node,
        expected: Option<Versioned<Node>>,
        strict: bool,
    ) -> Result<Option<Node>> {
        let mut expected = expected;
        for _ in 0..MAX_CAS_ATTEMPTS {
            if let Some(e) = &expected {
                if e.value.is_dir() {
                    return Err(StoreError::Conflict(format!("{path} is a directory")));
                }
            }
            let revision = expected.as_ref().map(|e| e.revision);
            match self.index.put_node(session, path, node, revision).await? {
                Cas::Done(_) => return Ok(expected.map(|e| e.value)),
                Cas::Stale if strict => return Err(StoreError::Raced(path.to_string())),
                Cas::Stale => expected = self.index.node(session, path).await?,
            }
        }
        Err(StoreError::Raced(path.to_string()))
    }

    /// Stores one file: reserve growth, parents, node, settle. On failure nothing of it stays
    /// in the index and the totals are restored (the caller removes the uploaded object).
    pub async fn commit_file(
        &self,
        session: &str,
        path: &RelPath,
        node: &Node,
        expected: Option<Versioned<Node>>,
        strict: bool,
    ) -> Result<Option<Node>> {
        let expected_size = expected.as_ref().map_or(0, |e| e.value.size) as i64;
        let expected_new = expected.is_none() as i64;
        let growth = (node.size as i64 - expected_size).max(0);
        self.account(session, growth, expected_new, Accounting::Reserve)
            .await?;
        let committed = async {
            self.ensure_parents(session, path).await?;
            self.commit_node(session, path, node, expected, strict)
                .await
        }
        .await;
        match committed {
            Ok(old) => {
                // The whole change, minus what was reserved.
                let bytes = node.size as i64 - old.as_ref().map_or(0, |o| o.size) as i64 - growth;
                let files = old.is_none() as i64 - expected_new;
                if bytes != 0 || files != 0 {
                    self.account(session, bytes, files, Accounting::Settle)
                        .await?;
                }
                Ok(old)
            }
            Err(e) => {
                if growth != 0 || expected_new != 0 {
                    self.account(session, -growth, -expected_new, Accounting::Settle)
                        .await?;
                }
                Err(e)
            }
        }
    }
}

/// The wire form of a node.
pub fn entry_of(path: &RelPath, node: &Node) -> WsEntry {
    WsEntry {
        path: path.to_string(),
        size: node.size,
        is_dir: node.is_dir(),
        modified: node.modified,
        mode: node.mode,
        sha256: (!node.sha256.is_empty()).then(|| node.sha256.clone()),
    }
}
