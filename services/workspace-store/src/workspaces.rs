//! [`Workspaces`]: the store's operations, each kind owned by its type — [`Files`],
//! [`Snapshots`], [`Restores`] and [`Cleanup`] — built over one shared [`Tree`] and [`Journal`].

use std::sync::Arc;

use kit::{Auditor, QuotaBook};

use crate::blobs::Blobs;
use crate::cleanup::Cleanup;
use crate::config::WorkspaceConfig;
use crate::files::Files;
use crate::index::Index;
use crate::restore::Restores;
use crate::snapshot::Snapshots;
use crate::store::{Journal, Metrics, Tree};
use crate::uploads::Uploads;

/// The store's operations, by the type that owns each kind: what the endpoints call.
pub struct Workspaces {
    pub files: Files,
    pub snapshots: Snapshots,
    pub restores: Restores,
    pub cleanup: Cleanup,
    /// Chunks of content too large for one message, committed by a write or a restore.
    pub uploads: Arc<Uploads>,
    pub metrics: Arc<Metrics>,
}

impl Workspaces {
    pub fn new(
        config: &WorkspaceConfig,
        index: Index,
        blobs: Blobs,
        uploads: Uploads,
        auditor: Auditor,
        quotas: Arc<QuotaBook>,
    ) -> Self {
        let tree = Arc::new(Tree::new(index, config.quota_bytes(), quotas));
        let journal = Journal::new(auditor);
        let uploads = Arc::new(uploads);
        Self {
            files: Files::new(
                tree.clone(),
                blobs.clone(),
                uploads.clone(),
                journal.clone(),
            ),
            snapshots: Snapshots::new(tree.clone(), blobs.clone(), journal.clone()),
            restores: Restores::new(
                tree.clone(),
                blobs.clone(),
                uploads.clone(),
                config,
                journal.clone(),
            ),
            cleanup: Cleanup::new(tree, blobs, config.cleanup_after(), journal.clone()),
            uploads,
            metrics: journal.metrics,
        }
    }
}
