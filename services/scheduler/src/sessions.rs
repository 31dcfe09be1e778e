//! `SessionTable`: sessions in KV `sandbox_sessions` (session → state, node, tier). The KV is the
//! only copy — every scheduler instance reads and writes it, so each change is a
//! compare-and-set on the key's revision, retried on conflict. No in-process actor holds
//! session state: a second copy would only go stale against the other instances.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv;
use futures::TryStreamExt;
use kit::QuotaBook;
use messages::exec::Tier;
use messages::quota::{OverQuota, Quota};
use messages::session::{SessionOpen, SessionRecord, SessionState};
use messages::tenancy::{scoped, Tenant};

use crate::error::{SchedulerError, StoreError};

/// How often a compare-and-set is retried before giving up (each retry re-reads the record).
const CAS_ATTEMPTS: usize = 16;

/// How long the marker a removed session leaves in the bucket lives (the bucket's
/// `limit_markers` lets it expire).
pub const MARKER_TTL: Duration = Duration::from_secs(60);

#[derive(Clone)]
pub struct SessionTable {
    kv: kv::Store,
    quotas: Arc<QuotaBook>,
}

/// What an update closure decides.
pub enum Change {
    /// Write the modified record.
    Write,
    /// Leave the stored record as it is.
    Keep,
}

impl SessionTable {
    pub fn new(kv: kv::Store, quotas: Arc<QuotaBook>) -> Self {
        Self { kv, quotas }
    }

    /// Whether `tenant` may open one more session: 429 naming the `sessions` quota when its
    /// open sessions (not closed; a lost one may still be resumed) are at the limit. Counted
    /// from the table itself, so every scheduler instance sees the same number; two opens at
    /// the same instant may both pass — the quota bounds a tenant, it is not a lock.
    pub async fn admit_new(&self, tenant: &Tenant) -> Result<(), SchedulerError> {
        let Some(limit) = self.quotas.of(tenant).limit(Quota::Sessions) else {
            return Ok(());
        };
        let open = self
            .list(None, Some(tenant))
            .await?
            .iter()
            .filter(|r| r.state != SessionState::Closed)
            .count() as u64;
        if open >= limit {
            return Err(OverQuota {
                tenant: tenant.clone(),
                quota: Quota::Sessions,
                limit,
                used: open,
            }
            .into());
        }
        Ok(())
    }

    async fn entry(&self, id: &str) -> Result<Option<(SessionRecord, u64)>, StoreError> {
        let read = || self.kv.entry(id);
        match kit::retry("reading a session", kit::RetryPolicy::JETSTREAM, read).await {
            Ok(Some(e)) if e.operation == kv::Operation::Put => {
                let record = serde_json::from_slice(&e.value)
                    .map_err(StoreError::during("decoding a session record"))?;
                Ok(Some((record, e.revision)))
            }
            Ok(_) => Ok(None),
            Err(e) => Err(StoreError::new("reading a session", e)),
        }
    }

    pub async fn get(&self, id: &str) -> Result<Option<SessionRecord>, StoreError> {
        Ok(self.entry(id).await?.map(|(r, _)| r))
    }

    /// Creates the session when it does not exist. Returns the record and whether it was new.
    pub async fn open(
        &self,
        id: &str,
        open: &SessionOpen,
        tenant: Option<Tenant>,
    ) -> Result<(SessionRecord, bool), StoreError> {
        let now = messages::now_ms();
        let record = SessionRecord {
            tenant,
            session_id: id.to_string(),
            state: SessionState::Open,
            tier: open.tier.unwrap_or(Tier::Session),
            created_at: now,
            last_used_at: now,
            requested_by: open.requested_by.clone(),
            network: open.network.clone(),
            template: open.template.clone(),
            env: open.env.clone(),
            timeout_ms: open.timeout_ms,
            expires_at: open.ttl_ms.map(|ttl| now.saturating_add(ttl)),
            idle_ms: open.idle_ms,
            filesystem: open.filesystem.clone(),
            ..Default::default()
        };
        let value =
            serde_json::to_vec(&record).map_err(StoreError::during("encoding a session record"))?;
        // A create repeated after a lost ack finds its own record: `AlreadyExists` below.
        let value = bytes::Bytes::from(value);
        let create = || self.kv.create(id, value.clone());
        match kit::retry("opening a session", kit::RetryPolicy::JETSTREAM, create).await {
            Ok(_) => Ok((record, true)),
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => match self.get(id).await? {
                Some(existing) => Ok((existing, false)),
                None => Err(StoreError::new("opening a session", e)),
            },
            Err(e) => Err(StoreError::new("opening a session", e)),
        }
    }

    /// Applies `change` to the stored record with compare-and-set, re-reading and re-applying
    /// on conflict. Returns the record as stored afterwards (`None`: no such session).
    pub async fn update(
        &self,
        id: &str,
        mut change: impl FnMut(&mut SessionRecord) -> Change,
    ) -> Result<Option<SessionRecord>, StoreError> {
        for attempt in 0..CAS_ATTEMPTS {
            let Some((mut record, revision)) = self.entry(id).await? else {
                return Ok(None);
            };
            if let Change::Keep = change(&mut record) {
                return Ok(Some(record));
            }
            let value = serde_json::to_vec(&record)
                .map_err(StoreError::during("encoding a session record"))?;
            let value = bytes::Bytes::from(value);
            let write = || self.kv.update(id, value.clone(), revision);
            match kit::retry("updating a session", kit::RetryPolicy::JETSTREAM, write).await {
                Ok(_) => return Ok(Some(record)),
                Err(e) => {
                    tracing::debug!(session_id = id, attempt, error = %e, "session changed meanwhile; retrying");
                    tokio::time::sleep(Duration::from_millis(5 * (attempt as u64 + 1))).await;
                }
            }
        }
        Err(StoreError::new(
            "updating a session",
            format!("session {id} kept changing; gave up after {CAS_ATTEMPTS} attempts"),
        ))
    }

    /// Every session (those on `node` only, when given).
    /// The sessions on `node` (all without), of `tenant` only when given: its ids are scoped
    /// by it, so its keys are exactly those with its prefix.
    pub async fn list(
        &self,
        node: Option<&str>,
        tenant: Option<&Tenant>,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        let prefix = tenant.map(|t| scoped(t, ""));
        let keys: Vec<String> = match self.kv.keys().await {
            Ok(keys) => keys
                .try_collect()
                .await
                .map_err(StoreError::during("listing sessions"))?,
            Err(e) => return Err(StoreError::new("listing sessions", e)),
        };
        let mut out = Vec::with_capacity(keys.len());
        let mine = |key: &String| prefix.as_ref().is_none_or(|p| key.starts_with(p.as_str()));
        for key in keys.into_iter().filter(mine) {
            if let Some(record) = self.get(&key).await? {
                if node.is_none() || record.node.as_deref() == node {
                    out.push(record);
                }
            }
        }
        out.sort_by(|a, b| a.session_id.cmp(&b.session_id));
        Ok(out)
    }

    /// Removes the record of a session closed at least `retention` ago, so closed sessions do
    /// not stay in the bucket forever (its id may then be opened again). The removal leaves a
    /// marker that itself expires ([`MARKER_TTL`]). Returns whether it removed the record.
    pub async fn forget_closed(&self, id: &str, retention: Duration) -> Result<bool, StoreError> {
        let Some((record, revision)) = self.entry(id).await? else {
            return Ok(false);
        };
        if !retained_long_enough(&record, retention, messages::now_ms()) {
            return Ok(false);
        }
        // Only the revision read: a record changed meanwhile is looked at next time.
        match self
            .kv
            .purge_expect_revision_with_ttl(id, revision, MARKER_TTL)
            .await
        {
            Ok(()) => Ok(true),
            Err(e) => Err(StoreError::new("removing a closed session", e)),
        }
    }

    /// Marks every active session on `node` as lost. Returns those it changed.
    pub async fn mark_node_lost(&self, node: &str) -> Result<Vec<SessionRecord>, StoreError> {
        let mut changed = Vec::new();
        for record in self.list(Some(node), None).await? {
            if record.state != SessionState::Active {
                continue;
            }
            let mut did = false;
            self.update(&record.session_id, |r| {
                did = mark_lost(r, node);
                if did {
                    Change::Write
                } else {
                    Change::Keep
                }
            })
            .await?;
            if did {
                changed.push(record);
            }
        }
        Ok(changed)
    }
}

/// Whether `r` is closed and has been for `retention` at `now` (a record closed before it
/// kept the time counts from its last use).
pub fn retained_long_enough(r: &SessionRecord, retention: Duration, now: u64) -> bool {
    let closed_at = r.closed_at.unwrap_or(r.last_used_at);
    r.state == SessionState::Closed && closed_at.saturating_add(retention.as_millis() as u64) <= now
}

/// Marks `r` lost if it is still active on `node` (another scheduler may have moved it).
pub fn mark_lost(r: &mut SessionRecord, node: &str) -> bool {
    if r.state == SessionState::Active && r.node.as_deref() == Some(node) {
        r.state = SessionState::Lost;
        r.lost_from = r.node.take();
        r.container = None;
        true
    } else {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_active_session_on_that_node_is_marked_lost() {
        let mut r = SessionRecord {
            session_id: "s".into(),
            state: SessionState::Active,
            node: Some("n1".into()),
            ..Default::default()
        };
        assert!(!mark_lost(&mut r, "n2"));
        assert!(mark_lost(&mut r, "n1"));
        assert_eq!(r.state, SessionState::Lost);
        assert_eq!(r.lost_from.as_deref(), Some("n1"));
        assert_eq!(r.node, None);
        assert!(!mark_lost(&mut r, "n1"), "already lost");
    }
}
