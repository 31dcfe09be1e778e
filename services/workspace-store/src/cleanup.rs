//! Removing workspaces: one on request, or every workspace untouched for longer than the
//! TTL (`cleanup_after_hours`). A removal first marks the session's meta `removing` with a
//! compare-and-set — so a sweep never removes a workspace someone touched after it looked,
//! and writers arriving meanwhile get a 409 instead of writing into a vanishing workspace —
//! then removes the objects and purges every key of the session. A removal cut short by a
//! crash is finished by the next sweep (the mark stays).

use std::sync::Arc;
use std::time::Duration;

use messages::audit::{CleanReason, WorkspaceCleaned};
use messages::tenancy::Caller;
use messages::workspace::{WsCleaned, WsCleanup};

use crate::blobs::Blobs;
use crate::error::{Result, StoreError};
use crate::index::{Cas, SessionMeta, Versioned};
use crate::keys::{self, RelPath};
use crate::store::{Journal, Metrics, Tree};

/// Handed-over uploads and snapshots nobody fetched are removed after this long.
pub const STAGED_TTL: Duration = Duration::from_secs(3600);

/// Removes workspaces: the `cleanup` endpoint and the [`crate::sweeper::Sweeper`]'s rounds.
pub struct Cleanup {
    tree: Arc<Tree>,
    blobs: Blobs,
    /// The TTL: a workspace untouched this long is removed by a sweep.
    after: Duration,
    journal: Journal,
}

impl Cleanup {
    pub fn new(tree: Arc<Tree>, blobs: Blobs, after: Duration, journal: Journal) -> Self {
        Self {
            tree,
            blobs,
            after,
            journal,
        }
    }

    /// The TTL sweeps remove workspaces after.
    pub fn after(&self) -> Duration {
        self.after
    }

    /// The index, for the sweep's lock.
    pub fn index(&self) -> &crate::index::Index {
        &self.tree.index
    }

    pub async fn cleanup(&self, by: &Caller, req: WsCleanup) -> Result<WsCleaned> {
        let sessions_removed = match req.session_id {
            Some(session) => {
                keys::check_session(&session)?;
                match self.mark_removing(&session, None).await? {
                    true => {
                        self.remove_marked(&session, CleanReason::Request, Some(by))
                            .await?;
                        vec![session]
                    }
                    false => Vec::new(),
                }
            }
            None => {
                let age = req
                    .older_than_hours
                    .map(|h| Duration::from_secs(h.saturating_mul(3600)))
                    .unwrap_or(self.after);
                self.sweep(age).await?
            }
        };
        Ok(WsCleaned { sessions_removed })
    }

    /// Removes every workspace untouched for `age` (and finishes interrupted removals), then
    /// stale handed-over objects. Safe to run on several instances at once.
    pub async fn sweep(&self, age: Duration) -> Result<Vec<String>> {
        let cutoff = messages::now_ms().saturating_sub(age.as_millis() as u64);
        let mut removed = Vec::new();
        for (session, meta) in self.tree.index.sessions().await? {
            if !meta.value.removing && meta.value.last_modified >= cutoff {
                continue;
            }
            if !self.mark_removing(&session, Some(meta)).await? {
                continue; // touched since we looked
            }
            match self.remove_marked(&session, CleanReason::Ttl, None).await {
                Ok(()) => removed.push(session),
                Err(e) => tracing::warn!(%session, error = %e, "workspace not removed"),
            }
        }
        let stale = self.blobs.stale_staged(STAGED_TTL).await?;
        self.blobs.remove_all(stale).await;
        Ok(removed)
    }

    /// Sets `removing` on the session's meta. With `seen`, only if the meta is still what
    /// was seen; without, whatever it is. False when there is no such session (or, with
    /// `seen`, it changed).
    async fn mark_removing(
        &self,
        session: &str,
        seen: Option<Versioned<SessionMeta>>,
    ) -> Result<bool> {
        let conditional = seen.is_some();
        let mut current = match seen {
            Some(seen) => Some(seen),
            None => self.tree.index.meta(session).await?,
        };
        loop {
            let Some(meta) = current else {
                return Ok(false);
            };
            if meta.value.removing {
                return Ok(true);
            }
            let marked = SessionMeta {
                removing: true,
                ..meta.value
            };
            match self
                .tree
                .index
                .put_meta(session, &marked, Some(meta.revision))
                .await?
            {
                Cas::Done(_) => return Ok(true),
                Cas::Stale if conditional => return Ok(false),
                Cas::Stale => current = self.tree.index.meta(session).await?,
            }
        }
    }

    async fn remove_marked(
        &self,
        session: &str,
        reason: CleanReason,
        by: Option<&Caller>,
    ) -> Result<()> {
        let nodes = self
            .tree
            .index
            .list(session, &RelPath::root(), true)
            .await?;
        let objects: Vec<String> = nodes
            .iter()
            .filter(|(_, n)| !n.value.is_dir())
            .map(|(_, n)| n.value.object.clone())
            .collect();
        let (files, bytes) = (
            objects.len(),
            nodes.iter().map(|(_, n)| n.value.size).sum::<u64>(),
        );
        self.blobs.remove_all(objects).await;
        // The meta key goes last (with everything else in one purge), so an interrupted
        // removal is still marked and the next sweep finishes it.
        self.tree
            .index
            .purge(&keys::session_filter(session))
            .await
            .map_err(|e| StoreError::storage("removing the workspace index", e))?;
        Metrics::add(&self.journal.metrics.sessions_cleaned, 1);
        let cleaned = WorkspaceCleaned {
            reason,
            files: files as u64,
            bytes,
        };
        self.journal.audit(session, by, None, cleaned);
        Ok(())
    }
}
