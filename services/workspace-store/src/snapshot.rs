//! `snapshot`: a workspace (or one directory of it) as a tar, with the revision it holds at
//! least. Executors take one when a container is new or behind, so the small case is one listing plus concurrent object reads, built in
//! memory and returned inline; a workspace too large for one message is streamed into the
//! object store (`snapshot/<id>`) and the reply names that object.

use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use messages::exec::ContentEncoding;
use messages::workspace::{WsArchive, WsFetch, WsFile, WsSnapshot};
use tokio::runtime::Handle;
use tokio_util::io::SyncIoBridge;

use crate::archive;
use crate::blobs::{snapshot_name, snapshot_prefix, Blobs};
use crate::error::{Result, StoreError};
use crate::index::Node;
use crate::keys::{self, RelPath};
use crate::store::{Journal, Metrics, Tree, INLINE_MAX_BYTES};

/// Object reads in flight while building an inline snapshot.
const READ_CONCURRENCY: usize = 16;

/// Upper bound of the tar size for these nodes: a header and up to a block of padding per
/// entry, a GNU long-name entry for long paths, two end blocks.
fn tar_size_bound(nodes: &[(RelPath, Node)]) -> u64 {
    nodes
        .iter()
        .map(|(p, n)| {
            let long = if p.to_string().len() >= 100 {
                1024 + p.to_string().len() as u64
            } else {
                0
            };
            512 + n.size + 511 + long
        })
        .sum::<u64>()
        + 1024
}

/// Takes workspaces (or a directory of one) as tars, and hands out the staged ones by range.
pub struct Snapshots {
    tree: Arc<Tree>,
    blobs: Blobs,
    journal: Journal,
}

impl Snapshots {
    pub fn new(tree: Arc<Tree>, blobs: Blobs, journal: Journal) -> Self {
        Self {
            tree,
            blobs,
            journal,
        }
    }

    /// A range of a staged snapshot of the session: how a caller without the objects bucket
    /// (a tenant's agent) downloads a large snapshot. Another session's snapshot is not found.
    pub async fn fetch(&self, req: WsFetch) -> Result<WsFile> {
        keys::check_session(&req.session_id)?;
        let gone = || {
            StoreError::NotFound(format!(
                "no snapshot {} of workspace {} (staged snapshots expire)",
                req.object, req.session_id
            ))
        };
        let own = req
            .object
            .strip_prefix(&snapshot_prefix(&req.session_id))
            .is_some_and(|id| messages::validate::validate_id("object", id).is_ok());
        if !own {
            return Err(gone());
        }
        if req.length > INLINE_MAX_BYTES {
            return Err(StoreError::TooLarge(format!(
                "a fetch returns at most {INLINE_MAX_BYTES} bytes; ask for less"
            )));
        }
        let size = self.blobs.info(&req.object).await?.ok_or_else(gone)?.size as u64;
        if req.offset > size {
            return Err(StoreError::BadRequest(format!(
                "offset {} is past the end of the snapshot ({size} bytes)",
                req.offset
            )));
        }
        let bytes = self
            .blobs
            .read_range(&req.object, req.offset, req.length)
            .await?;
        Metrics::add(&self.journal.metrics.bytes_read, bytes.len() as u64);
        Ok(WsFile {
            path: req.object,
            content: messages::encode_base64(&bytes),
            encoding: ContentEncoding::Base64,
            size,
            object: None,
            sha256: None,
        })
    }

    pub async fn snapshot(&self, req: WsSnapshot) -> Result<WsArchive> {
        let session = &req.session_id;
        keys::check_session(session)?;
        let dir = RelPath::parse_prefix("prefix", req.prefix.as_deref())?;
        // Read before the listing: the archive holds at least every change up to it.
        let revision = self.tree.index.revision(session).await?;
        if self.tree.index.meta(session).await?.is_some() {
            self.tree.touch(session).await?;
        }
        let mut nodes: Vec<(RelPath, Node)> = Vec::new();
        if !dir.is_root() {
            match self.tree.index.node(session, &dir).await? {
                None => {
                    return Err(StoreError::NotFound(format!(
                        "{dir} does not exist in workspace {session}"
                    )))
                }
                Some(n) => nodes.push((dir.clone(), n.value)),
            }
        }
        if nodes.first().is_none_or(|(_, n)| n.is_dir()) {
            let below = self.tree.index.list(session, &dir, true).await?;
            nodes.extend(below.into_iter().map(|(p, v)| (p, v.value)));
        }
        let files = nodes.iter().filter(|(_, n)| !n.is_dir()).count() as u64;
        Metrics::add(&self.journal.metrics.snapshots, 1);
        if tar_size_bound(&nodes) <= INLINE_MAX_BYTES {
            let tar = self.build_inline(&nodes).await?;
            return Ok(WsArchive {
                session_id: session.clone(),
                size: tar.len() as u64,
                tar_base64: Some(messages::encode_base64(&tar)),
                object: None,
                files,
                revision,
            });
        }
        let name = snapshot_name(session);
        match build_into_object(&self.blobs, &name, nodes).await {
            Ok(size) => Ok(WsArchive {
                session_id: session.clone(),
                tar_base64: None,
                object: Some(name),
                size,
                files,
                revision,
            }),
            Err(e) => {
                self.blobs.remove(&name).await?;
                Err(e)
            }
        }
    }

    async fn build_inline(&self, nodes: &[(RelPath, Node)]) -> Result<Vec<u8>> {
        // Owned inputs: the futures must be `Send` without borrowing from `nodes`.
        let objects: Vec<Option<String>> = nodes
            .iter()
            .map(|(_, n)| (!n.is_dir()).then(|| n.object.clone()))
            .collect();
        let blobs = self.blobs.clone();
        let contents: Vec<Vec<u8>> = futures::stream::iter(objects)
            .map(move |object| {
                let blobs = blobs.clone();
                async move {
                    match object {
                        None => Ok(Vec::new()),
                        Some(name) => blobs.read_all(&name).await.map_err(changed),
                    }
                }
            })
            .buffered(READ_CONCURRENCY)
            .try_collect()
            .await?;
        let mut builder = tar::Builder::new(Vec::new());
        for ((path, node), data) in nodes.iter().zip(contents) {
            archive::append(&mut builder, path, node, &data[..]).map_err(internal)?;
        }
        builder.into_inner().map_err(internal)
    }
}

/// Streams the tar into the object store: a blocking task writes the tar (reading each file
/// from the object store) into one end of a pipe while the object store reads the other.
async fn build_into_object(blobs: &Blobs, name: &str, nodes: Vec<(RelPath, Node)>) -> Result<u64> {
    let (mut reader, writer) = tokio::io::duplex(1 << 20);
    let handle = Handle::current();
    let source = blobs.clone();
    let build = tokio::task::spawn_blocking(move || -> Result<()> {
        let mut builder = tar::Builder::new(SyncIoBridge::new_with_handle(writer, handle.clone()));
        for (path, node) in &nodes {
            if node.is_dir() {
                archive::append(&mut builder, path, node, std::io::empty()).map_err(internal)?;
                continue;
            }
            let (_, object) = handle
                .block_on(source.open_reader(&node.object))
                .map_err(changed)?;
            let data = SyncIoBridge::new_with_handle(object, handle.clone());
            archive::append(&mut builder, path, node, data).map_err(internal)?;
        }
        // Dropping the writer ends the pipe, so the object store sees the end of the tar.
        builder.into_inner().map_err(internal)?;
        Ok(())
    });
    let (built, stored) = tokio::join!(build, blobs.put(name, &mut reader));
    let built = built.map_err(|e| StoreError::Internal(format!("snapshot task: {e}")))?;
    // A failed upload also breaks the pipe under the builder: report the upload's error.
    let size = stored?;
    built?;
    Ok(size)
}

/// A file whose object vanished was overwritten or deleted while the snapshot ran.
fn changed(e: StoreError) -> StoreError {
    match e {
        StoreError::NotFound(_) => {
            StoreError::Raced("the workspace (a file changed during the snapshot; retry)".into())
        }
        other => other,
    }
}

fn internal(e: std::io::Error) -> StoreError {
    StoreError::Internal(format!("building the tar: {e}"))
}
