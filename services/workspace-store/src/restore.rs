//! `restore`: unpack a tar into a workspace, all or nothing. The archive is parsed and
//! checked whole (`archive::parse`), then planned against the current index (conflicts,
//! quota), and only a plan that passes touches the index: removals, directories, files,
//! each compare-and-set. Files whose content did not change are skipped, so an executor
//! pushing back a workspace it barely touched pays for what changed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use messages::audit::WorkspaceRestored;
use messages::tenancy::Caller;
use messages::workspace::{WsRestore, WsRestored};
use tokio::runtime::Handle;
use tokio_util::io::SyncIoBridge;

use crate::archive::{self, Content, Limits, Staged};
use crate::blobs::{self, content_name, Blobs};
use crate::config::WorkspaceConfig;
use crate::error::{Result, StoreError};
use crate::index::{Cas, Node, NodeKind, Versioned};
use crate::keys::{self, RelPath};
use crate::store::{Accounting, Journal, Metrics, Tree};
use crate::uploads::Uploads;

const UPLOAD_CONCURRENCY: usize = 16;

/// What a restore will do, decided before anything is written.
#[derive(Debug, Default)]
pub struct Plan {
    /// Files to write: path, node (object set once uploaded), what it replaces, content.
    pub puts: Vec<(RelPath, Node, Option<Versioned<Node>>, Content)>,
    pub dirs: Vec<RelPath>,
    /// Nodes to remove, files first, then directories deepest first.
    pub removes: Vec<(RelPath, Versioned<Node>)>,
    /// Objects uploaded while parsing for files that turned out unchanged.
    pub unused_objects: Vec<String>,
    pub growth: i64,
    pub files_delta: i64,
    pub result: WsRestored,
}

/// Plans `staged` (plus `deletes`, plus removing the rest when `replace`) over `current`.
pub fn plan(
    current: &BTreeMap<RelPath, Versioned<Node>>,
    staged: Staged,
    deletes: &[RelPath],
    replace: bool,
) -> Result<Plan> {
    let mut wanted: BTreeSet<RelPath> = staged.dirs.clone();
    for path in staged.files.keys().chain(staged.dirs.iter()) {
        wanted.extend(path.ancestors());
    }
    let mut removed: BTreeSet<RelPath> = BTreeSet::new();
    for d in deletes {
        if staged.files.contains_key(d) || wanted.contains(d) {
            return Err(StoreError::BadRequest(format!(
                "{d} is both restored and deleted"
            )));
        }
        removed.extend(current.keys().filter(|p| p.starts_with(d)).cloned());
    }
    if replace {
        removed.extend(
            current
                .keys()
                .filter(|p| !staged.files.contains_key(*p) && !wanted.contains(*p))
                .cloned(),
        );
    }
    let kept = |p: &RelPath| current.get(p).filter(|_| !removed.contains(p));
    for path in staged.files.keys() {
        if kept(path).is_some_and(|n| n.value.is_dir()) {
            return Err(StoreError::Conflict(format!(
                "{path} is a directory in the workspace"
            )));
        }
    }
    for dir in &wanted {
        if kept(dir).is_some_and(|n| !n.value.is_dir()) {
            return Err(StoreError::Conflict(format!(
                "{dir} is a file in the workspace, the archive needs a directory there"
            )));
        }
    }
    let mut plan = Plan::default();
    for (path, file) in staged.files {
        let old = kept(&path).cloned();
        if let Some(old) = &old {
            if old.value.sha256 == file.sha256 && old.value.mode == file.mode {
                if let Content::Stored(name) = file.content {
                    plan.unused_objects.push(name);
                }
                continue;
            }
            plan.growth -= old.value.size as i64;
            plan.result.files_modified.push(path.to_string());
        } else {
            plan.files_delta += 1;
            plan.result.files_created.push(path.to_string());
        }
        plan.growth += file.size as i64;
        let node = Node {
            kind: NodeKind::File,
            size: file.size,
            sha256: file.sha256,
            object: String::new(),
            mode: file.mode,
            modified: if file.modified > 0 {
                file.modified
            } else {
                messages::now_ms()
            },
        };
        plan.puts.push((path, node, old, file.content));
    }
    plan.dirs = wanted.into_iter().filter(|d| kept(d).is_none()).collect();
    let mut removes: Vec<(RelPath, Versioned<Node>)> = removed
        .into_iter()
        .map(|p| {
            let v = current[&p].clone();
            (p, v)
        })
        .collect();
    // Files first; then directories, children before parents.
    removes.sort_by_key(|(p, n)| (n.value.is_dir(), std::cmp::Reverse(p.depth())));
    for (path, node) in &removes {
        if !node.value.is_dir() {
            plan.growth -= node.value.size as i64;
            plan.files_delta -= 1;
            plan.result.files_deleted.push(path.to_string());
        }
    }
    plan.removes = removes;
    Ok(plan)
}

/// Unpacks archives into workspaces, all or nothing.
pub struct Restores {
    tree: Arc<Tree>,
    blobs: Blobs,
    /// For a restore that names an upload.
    uploads: Arc<Uploads>,
    /// The most entries and content bytes one archive may hold.
    limits: Limits,
    journal: Journal,
}

impl Restores {
    pub fn new(
        tree: Arc<Tree>,
        blobs: Blobs,
        uploads: Arc<Uploads>,
        config: &WorkspaceConfig,
        journal: Journal,
    ) -> Self {
        Self {
            tree,
            blobs,
            uploads,
            limits: Limits {
                max_entries: config.max_restore_entries,
                max_bytes: config.max_restore_bytes,
            },
            journal,
        }
    }

    pub async fn restore(&self, by: &Caller, mut req: WsRestore) -> Result<WsRestored> {
        keys::check_session(&req.session_id)?;
        if let Some(upload) = req.upload.take() {
            if req.object.is_some() || req.tar_base64.is_some() {
                return Err(StoreError::BadRequest(
                    "give the archive inline, as an object or as an upload: one of them".into(),
                ));
            }
            // Content plus a generous kilobyte of headers and padding per entry.
            let bound = self
                .limits
                .max_bytes
                .saturating_add(self.limits.max_entries.saturating_mul(1024));
            let (name, _, _) = self
                .uploads
                .commit(&self.blobs, &req.session_id, &upload, bound)
                .await?;
            req.object = Some(name);
        }
        if let Some(name) = &req.object {
            if !blobs::is_upload_name(name) {
                return Err(StoreError::BadRequest(format!(
                    "object must be named {}<token> with a token of [A-Za-z0-9_-]",
                    blobs::UPLOAD_PREFIX
                )));
            }
        }
        let outcome = self.restore_checked(&req).await;
        // An uploaded archive is consumed by its restore, whether it was accepted or not.
        if let Some(name) = &req.object {
            self.blobs.remove(name).await?;
        }
        let mut result = outcome?;
        let revisions = self.tree.index.bump_revision(&req.session_id).await?;
        result.previous_revision = revisions.previous;
        result.revision = Some(revisions.revision);
        Metrics::add(&self.journal.metrics.restores, 1);
        let restored = WorkspaceRestored {
            created: result.files_created.len() as u64,
            modified: result.files_modified.len() as u64,
            deleted: result.files_deleted.len() as u64,
            replace: req.replace,
        };
        self.journal.audit(
            &req.session_id,
            Some(by),
            req.requested_by.clone(),
            restored,
        );
        Ok(result)
    }

    async fn restore_checked(&self, req: &WsRestore) -> Result<WsRestored> {
        let session = req.session_id.clone();
        let deletes = req
            .delete
            .iter()
            .map(|d| RelPath::parse("delete", d).map(|(p, _)| p))
            .collect::<Result<Vec<_>, _>>()?;
        let limits = self.limits;
        let staged = match (&req.tar_base64, &req.object) {
            (Some(_), Some(_)) => {
                return Err(StoreError::BadRequest(
                    "give the archive inline (tar_base64) or as an object, not both".into(),
                ))
            }
            (None, None) if deletes.is_empty() => {
                return Err(StoreError::BadRequest(
                    "restore needs an archive (tar_base64 or object) or paths to delete".into(),
                ))
            }
            (None, None) => Staged::default(),
            (Some(b64), None) => {
                let tar = messages::decode_base64(b64)
                    .map_err(|e| StoreError::BadRequest(format!("tar_base64: {e}")))?;
                self.parse(&session, ArchiveSource::Inline(tar), limits)
                    .await?
            }
            (None, Some(name)) => {
                let source = ArchiveSource::Object(name.clone());
                self.parse(&session, source, limits).await?
            }
        };
        let current: BTreeMap<RelPath, Versioned<Node>> = self
            .tree
            .index
            .list(&session, &RelPath::root(), true)
            .await?
            .into_iter()
            .collect();
        let uploaded: Vec<String> = staged
            .files
            .values()
            .filter_map(|f| match &f.content {
                Content::Stored(name) => Some(name.clone()),
                Content::Inline(_) => None,
            })
            .collect();
        let plan = match plan(&current, staged, &deletes, req.replace) {
            Ok(plan) => plan,
            Err(e) => {
                self.blobs.remove_all(uploaded).await;
                return Err(e);
            }
        };
        self.apply(&session, plan).await
    }

    /// Parses on a blocking thread (the tar crate reads synchronously); large contents are
    /// uploaded as they are met and removed again if the archive is refused.
    async fn parse(&self, session: &str, source: ArchiveSource, limits: Limits) -> Result<Staged> {
        let handle = Handle::current();
        let blobs = self.blobs.clone();
        let session = session.to_string();
        let reader: Box<dyn std::io::Read + Send> = match source {
            ArchiveSource::Inline(tar) => Box::new(std::io::Cursor::new(tar)),
            ArchiveSource::Object(name) => {
                let (_, object) = self.blobs.open_reader(&name).await?;
                Box::new(SyncIoBridge::new_with_handle(object, handle.clone()))
            }
        };
        let (parsed, uploaded) = tokio::task::spawn_blocking(move || {
            let mut uploaded = Vec::new();
            let mut store = |data: &[u8]| -> Result<String> {
                let name = content_name(&session);
                handle.block_on(blobs.put_bytes(&name, data))?;
                uploaded.push(name.clone());
                Ok(name)
            };
            let parsed = archive::parse(reader, limits, &mut store);
            (parsed, uploaded)
        })
        .await
        .map_err(|e| StoreError::Internal(format!("archive task: {e}")))?;
        if parsed.is_err() {
            self.blobs.remove_all(uploaded).await;
        }
        parsed
    }

    async fn apply(&self, session: &str, mut plan: Plan) -> Result<WsRestored> {
        // Every file gets its object name up front, so a failure before the commit can
        // remove exactly what was uploaded.
        let mut uploads = Vec::new();
        let mut puts = Vec::with_capacity(plan.puts.len());
        for (path, mut node, old, content) in std::mem::take(&mut plan.puts) {
            node.object = match content {
                Content::Stored(name) => name,
                Content::Inline(data) => {
                    let name = content_name(session);
                    uploads.push((name.clone(), data));
                    name
                }
            };
            puts.push((path, node, old));
        }
        let mut stale = std::mem::take(&mut plan.unused_objects);
        let reserved = plan.growth.max(0);
        let prepared = async {
            self.tree
                .account(session, reserved, plan.files_delta, Accounting::Reserve)
                .await?;
            let blobs = self.blobs.clone();
            let uploaded = futures::stream::iter(uploads)
                .map(move |(name, data)| {
                    let blobs = blobs.clone();
                    async move { blobs.put_bytes(&name, &data).await }
                })
                .buffer_unordered(UPLOAD_CONCURRENCY)
                .try_collect::<Vec<()>>()
                .await;
            if let Err(e) = uploaded {
                self.tree
                    .account(session, -reserved, -plan.files_delta, Accounting::Settle)
                    .await?;
                return Err(e);
            }
            Ok(())
        }
        .await;
        if let Err(e) = prepared {
            stale.extend(puts.into_iter().map(|(_, node, _)| node.object));
            self.blobs.remove_all(stale).await;
            return Err(e);
        }
        // From here on the plan is committed step by step; what it changes is settled below.
        let (mut bytes, mut files) = (0i64, 0i64);
        for (path, node) in &plan.removes {
            if node.value.is_dir() {
                self.tree
                    .index
                    .purge(&keys::node_key(session, path))
                    .await?;
                continue;
            }
            if let Some(gone) = self.remove_file(session, path, node.clone()).await? {
                bytes -= gone.size as i64;
                files -= 1;
                stale.push(gone.object);
            }
        }
        for dir in &plan.dirs {
            self.tree.make_dir(session, dir).await?;
        }
        for (path, node, old) in &puts {
            let replaced = self
                .tree
                .commit_node(session, path, node, old.clone(), false)
                .await?;
            bytes += node.size as i64 - replaced.as_ref().map_or(0, |o| o.size as i64);
            files += replaced.is_none() as i64;
            stale.extend(replaced.map(|o| o.object));
        }
        let (dbytes, dfiles) = (bytes - reserved, files - plan.files_delta);
        if dbytes != 0 || dfiles != 0 {
            self.tree
                .account(session, dbytes, dfiles, Accounting::Settle)
                .await?;
        }
        self.blobs.remove_all(stale).await;
        Ok(plan.result)
    }

    /// Deletes a file node, following it if another writer replaced it meanwhile; returns
    /// what was removed (`None` if it is already gone).
    async fn remove_file(
        &self,
        session: &str,
        path: &RelPath,
        mut node: Versioned<Node>,
    ) -> Result<Option<Node>> {
        loop {
            if let Cas::Done(_) = self
                .tree
                .index
                .delete_node(session, path, node.revision)
                .await?
            {
                return Ok(Some(node.value));
            }
            match self.tree.index.node(session, path).await? {
                Some(n) if !n.value.is_dir() => node = n,
                _ => return Ok(None),
            }
        }
    }
}

enum ArchiveSource {
    Inline(Vec<u8>),
    Object(String),
}
