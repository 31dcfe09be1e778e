//! `Files`: the operations on a workspace's files — init, write, read, list, stat, delete,
//! usage.

use messages::audit::{FileDeleted, FileWritten};
use messages::exec::ContentEncoding;
use messages::tenancy::Caller;
use messages::workspace::{
    WsEntry, WsFile, WsInit, WsList, WsListing, WsPath, WsRead, WsUsage, WsUsageRequest, WsWrite,
    LAYOUT_DIRS, MEMORY_FILES,
};
use sha2::{Digest, Sha256};
use std::sync::Arc;

use crate::blobs::{self, content_name, Blobs};
use crate::error::{Result, StoreError};
use crate::index::{Node, NodeKind};
use crate::keys::{self, RelPath};
use crate::store::{entry_of, Accounting, Journal, Metrics, Tree, INLINE_MAX_BYTES};
use crate::uploads::Uploads;

/// An append re-reads the file when another writer changed it meanwhile; this bounds it.
const MAX_APPEND_ATTEMPTS: usize = 16;
const FILE_MODE: u32 = 0o644;
/// A listing page stays well inside one message; `next` says where the following one starts.
const LIST_PAGE_BYTES: usize = 900 * 1024;

pub use messages::workspace::wire_content;

pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

pub struct Files {
    tree: Arc<Tree>,
    blobs: Blobs,
    /// For a write that names an upload.
    uploads: Arc<Uploads>,
    journal: Journal,
}

impl Files {
    pub fn new(tree: Arc<Tree>, blobs: Blobs, uploads: Arc<Uploads>, journal: Journal) -> Self {
        Self {
            tree,
            blobs,
            uploads,
            journal,
        }
    }

    /// Creates the layout every workspace starts with: the directories and the `.memory` files,
    /// leaving anything that exists untouched (so init is idempotent).
    pub async fn init(&self, req: WsInit) -> Result<WsUsage> {
        let session = &req.session_id;
        keys::check_session(session)?;
        self.tree.touch(session).await?;
        for dir in LAYOUT_DIRS {
            self.tree
                .make_dir(session, &RelPath::from_parts(vec![dir.to_string()]))
                .await?;
        }
        for (path, header) in MEMORY_FILES {
            let (path, _) = RelPath::parse("path", path)?;
            if self.tree.index.node(session, &path).await?.is_some() {
                continue;
            }
            let object = content_name(session);
            self.blobs.put_bytes(&object, header.as_bytes()).await?;
            let node = file_node(header.len() as u64, sha256_hex(header.as_bytes()), object);
            match self
                .tree
                .commit_file(session, &path, &node, None, true)
                .await
            {
                Ok(_) => {}
                // Written by a concurrent init: theirs stays.
                Err(StoreError::Raced(_)) => self.blobs.remove(&node.object).await?,
                Err(e) => {
                    self.blobs.remove(&node.object).await?;
                    return Err(e);
                }
            }
        }
        self.tree.index.bump_revision(session).await?;
        self.usage(WsUsageRequest {
            session_id: session.clone(),
        })
        .await
    }

    /// Writes a file or makes a directory, then moves the session's revision on.
    pub async fn write(&self, by: &Caller, mut req: WsWrite) -> Result<WsEntry> {
        let mut measured = None;
        if let Some(upload) = req.upload.take() {
            if req.object.is_some() || !req.content.is_empty() || req.append {
                return Err(StoreError::BadRequest(
                    "a write names an upload or an object or carries content (and only content \
                     appends)"
                        .into(),
                ));
            }
            keys::check_session(&req.session_id)?;
            RelPath::parse("path", &req.path)?;
            let (name, size, sha) = self
                .uploads
                .commit(&self.blobs, &req.session_id, &upload, self.tree.quota_bytes)
                .await?;
            req.object = Some(name);
            measured = Some((size, sha));
        }
        let committed = measured.is_some();
        let outcome = self.write_node(by, &req, measured).await;
        // The object made from an upload is ours: one the write did not take over goes.
        if let (Err(_), true, Some(name)) = (&outcome, committed, &req.object) {
            self.blobs.remove(name).await?;
        }
        let entry = outcome?;
        self.tree.index.bump_revision(&req.session_id).await?;
        Ok(entry)
    }

    /// `measured`: the size and SHA-256 of `req.object` when the store made it itself.
    async fn write_node(
        &self,
        by: &Caller,
        req: &WsWrite,
        measured: Option<(u64, String)>,
    ) -> Result<WsEntry> {
        let session = &req.session_id;
        keys::check_session(session)?;
        let (path, is_dir) = RelPath::parse("path", &req.path)?;
        if is_dir {
            if !req.content.is_empty() || req.object.is_some() || req.append {
                return Err(StoreError::BadRequest(
                    "a path ending in '/' creates a directory and takes no content".into(),
                ));
            }
            self.tree
                .account(session, 0, 0, Accounting::Reserve)
                .await?;
            self.tree.ensure_parents(session, &path).await?;
            self.tree.make_dir(session, &path).await?;
            let node = self.tree.index.node(session, &path).await?;
            let node = node
                .map(|n| n.value)
                .unwrap_or_else(|| Node::dir(messages::now_ms()));
            return Ok(entry_of(&path, &node));
        }
        let inline = match &req.object {
            Some(name) => {
                if !blobs::is_upload_name(name) {
                    return Err(StoreError::BadRequest(format!(
                        "object must be named {}<token> with a token of [A-Za-z0-9_-]",
                        blobs::UPLOAD_PREFIX
                    )));
                }
                if !req.content.is_empty() || req.append {
                    return Err(StoreError::BadRequest(
                        "a write names an object or carries content (and only content appends)"
                            .into(),
                    ));
                }
                None
            }
            None => Some(
                messages::decode_content(&req.content, req.encoding)
                    .map_err(|e| StoreError::BadRequest(format!("content: {e}")))?,
            ),
        };
        for _ in 0..MAX_APPEND_ATTEMPTS {
            let current = self.tree.index.node(session, &path).await?;
            if current.as_ref().is_some_and(|c| c.value.is_dir()) {
                return Err(StoreError::Conflict(format!("{path} is a directory")));
            }
            let node = match (&inline, &req.object) {
                (Some(bytes), _) => {
                    let mut data = Vec::new();
                    if req.append {
                        if let Some(c) = &current {
                            data = self.blobs.read_all(&c.value.object).await?;
                        }
                    }
                    data.extend_from_slice(bytes);
                    if data.len() as u64 > self.tree.quota_bytes {
                        return Err(StoreError::Quota {
                            used: 0,
                            needed: data.len() as u64,
                            quota: self.tree.quota_bytes,
                        });
                    }
                    let object = content_name(session);
                    self.blobs.put_bytes(&object, &data).await?;
                    file_node(data.len() as u64, sha256_hex(&data), object)
                }
                (None, Some(upload)) => {
                    let object = content_name(session);
                    self.blobs.adopt(upload, &object).await?;
                    let measured = match &measured {
                        Some(known) => Ok(known.clone()),
                        None => self.blobs.measure(&object).await,
                    };
                    match measured {
                        Ok((size, sha)) => file_node(size, sha, object),
                        Err(e) => {
                            self.blobs.remove(&object).await?;
                            return Err(e);
                        }
                    }
                }
                (None, None) => unreachable!("content or object is checked above"),
            };
            match self
                .tree
                .commit_file(session, &path, &node, current, req.append)
                .await
            {
                Ok(old) => {
                    if let Some(old) = old {
                        self.blobs.remove(&old.object).await?;
                    }
                    Metrics::add(&self.journal.metrics.writes, 1);
                    Metrics::add(&self.journal.metrics.bytes_written, node.size);
                    let written = FileWritten {
                        path: path.to_string(),
                        size: node.size,
                        sha256: node.sha256.clone(),
                        append: req.append,
                    };
                    self.journal
                        .audit(session, Some(by), req.requested_by.clone(), written);
                    return Ok(entry_of(&path, &node));
                }
                Err(StoreError::Raced(_)) if req.append => {
                    self.blobs.remove(&node.object).await?;
                }
                Err(e) => {
                    self.blobs.remove(&node.object).await?;
                    return Err(e);
                }
            }
        }
        Err(StoreError::Raced(path.to_string()))
    }

    /// A file, or a range of it. A whole file too large for one message goes to a service as
    /// the object to fetch; an agent (`by` a tenant) is told to read it by ranges instead.
    pub async fn read(&self, by: &Caller, req: WsRead) -> Result<WsFile> {
        keys::check_session(&req.session_id)?;
        let (path, _) = RelPath::parse("path", &req.path)?;
        let node = self.file(&req.session_id, &path).await?;
        let offset = req.offset.unwrap_or(0);
        if offset > node.size {
            return Err(StoreError::BadRequest(format!(
                "offset {offset} is past the end of {path} ({} bytes)",
                node.size
            )));
        }
        let length = req
            .length
            .unwrap_or(node.size - offset)
            .min(node.size - offset);
        let whole = offset == 0 && length == node.size;
        let mut file = WsFile {
            path: path.to_string(),
            content: String::new(),
            encoding: ContentEncoding::Base64,
            size: node.size,
            object: None,
            sha256: Some(node.sha256.clone()),
        };
        if length > INLINE_MAX_BYTES {
            if !whole {
                return Err(StoreError::TooLarge(format!(
                    "a ranged read returns at most {INLINE_MAX_BYTES} bytes; ask for less, or \
                     read the whole file to get it through the object store"
                )));
            }
            if by.tenant().is_some() {
                return Err(StoreError::TooLarge(format!(
                    "{path} is {} bytes; read it by ranges of at most {INLINE_MAX_BYTES} bytes \
                     (offset and length)",
                    node.size
                )));
            }
            // Too large for one message: the (service) client fetches the object itself.
            file.object = Some(node.object);
            return Ok(file);
        }
        let bytes = if whole {
            self.blobs.read_all(&node.object).await?
        } else {
            self.blobs.read_range(&node.object, offset, length).await?
        };
        Metrics::add(&self.journal.metrics.reads, 1);
        Metrics::add(&self.journal.metrics.bytes_read, bytes.len() as u64);
        (file.content, file.encoding) = match req.encoding {
            Some(ContentEncoding::Base64) => {
                (messages::encode_base64(&bytes), ContentEncoding::Base64)
            }
            _ => wire_content(&bytes),
        };
        Ok(file)
    }

    pub async fn stat(&self, req: WsPath) -> Result<WsEntry> {
        keys::check_session(&req.session_id)?;
        let (path, _) = RelPath::parse("path", &req.path)?;
        match self.tree.index.node(&req.session_id, &path).await? {
            Some(n) => Ok(entry_of(&path, &n.value)),
            None => Err(not_found(&req.session_id, &path)),
        }
    }

    pub async fn list(&self, req: WsList) -> Result<WsListing> {
        let session = &req.session_id;
        keys::check_session(session)?;
        let dir = RelPath::parse_prefix("prefix", req.prefix.as_deref())?;
        // A workspace that was never made is a 404 like every other call on it (an empty list
        // would tell another tenant's id apart from nothing at all no better, but it would be
        // the one call that answers differently).
        if dir.is_root() && self.tree.index.meta(session).await?.is_none() {
            return Err(StoreError::NotFound(format!("no workspace {session}")));
        }
        if !dir.is_root() {
            match self.tree.index.node(session, &dir).await? {
                None => return Err(not_found(session, &dir)),
                Some(n) if !n.value.is_dir() => {
                    return Ok(WsListing {
                        entries: vec![entry_of(&dir, &n.value)],
                        next: None,
                    })
                }
                Some(_) => {}
            }
        }
        let nodes = self.tree.index.list(session, &dir, req.recursive).await?;
        let after = match &req.after {
            Some(a) => Some(RelPath::parse("after", a)?.0),
            None => None,
        };
        let limit = req.limit.map_or(usize::MAX, |l| l.max(1) as usize);
        let mut listing = WsListing::default();
        let mut size = 0;
        for (path, node) in nodes
            .iter()
            .filter(|(p, _)| after.as_ref().is_none_or(|a| p > a))
        {
            let entry = entry_of(path, &node.value);
            // The most the entry can cost in JSON: a path can double when escaped, the other
            // fields and their names take at most 190 bytes.
            let cost = 2 * entry.path.len() + 190;
            if listing.entries.len() == limit || size + cost > LIST_PAGE_BYTES {
                listing.next = listing.entries.last().map(|e| e.path.clone());
                break;
            }
            size += cost;
            listing.entries.push(entry);
        }
        Ok(listing)
    }

    /// Deletes a path, then moves the session's revision on.
    pub async fn delete(&self, by: &Caller, req: WsPath) -> Result<messages::workspace::Ack> {
        let ack = self.delete_node(by, &req).await?;
        self.tree.index.bump_revision(&req.session_id).await?;
        Ok(ack)
    }

    async fn delete_node(&self, by: &Caller, req: &WsPath) -> Result<messages::workspace::Ack> {
        let session = &req.session_id;
        keys::check_session(session)?;
        let (path, _) = RelPath::parse("path", &req.path)?;
        let Some(node) = self.tree.index.node(session, &path).await? else {
            return Err(not_found(session, &path));
        };
        let (files, bytes, objects) = if node.value.is_dir() {
            let below = self.tree.index.list(session, &path, true).await?;
            if !below.is_empty() && !req.recursive {
                return Err(StoreError::Conflict(format!(
                    "{path} is not empty; delete it with recursive: true"
                )));
            }
            // One purge removes the subtree without leaving a delete marker per key.
            self.tree
                .index
                .purge(&keys::children_filter(session, &path, true))
                .await?;
            self.tree
                .index
                .purge(&keys::node_key(session, &path))
                .await?;
            let files: Vec<&Node> = below
                .iter()
                .map(|(_, n)| &n.value)
                .filter(|n| !n.is_dir())
                .collect();
            let bytes: u64 = files.iter().map(|n| n.size).sum();
            let objects = files.iter().map(|n| n.object.clone()).collect();
            (files.len() as u64, bytes, objects)
        } else {
            match self
                .tree
                .index
                .delete_node(session, &path, node.revision)
                .await?
            {
                crate::index::Cas::Done(_) => {}
                crate::index::Cas::Stale => return Err(StoreError::Raced(path.to_string())),
            }
            (1, node.value.size, vec![node.value.object.clone()])
        };
        self.tree
            .account(
                session,
                -(bytes as i64),
                -(files as i64),
                Accounting::Settle,
            )
            .await?;
        self.blobs.remove_all(objects).await;
        let deleted = FileDeleted {
            path: path.to_string(),
            files,
            bytes,
        };
        self.journal
            .audit(session, Some(by), req.requested_by.clone(), deleted);
        Ok(messages::workspace::Ack { ok: true })
    }

    pub async fn usage(&self, req: WsUsageRequest) -> Result<WsUsage> {
        keys::check_session(&req.session_id)?;
        let meta = self.tree.index.meta(&req.session_id).await?;
        let meta = meta.map(|m| m.value).unwrap_or_default();
        Ok(WsUsage {
            session_id: req.session_id,
            bytes: meta.bytes,
            files: meta.files,
            quota_bytes: self.tree.quota_bytes,
            last_modified: meta.last_modified,
        })
    }

    /// The file at `path`: 404 when absent, 400 for a directory.
    pub async fn file(&self, session: &str, path: &RelPath) -> Result<Node> {
        match self.tree.index.node(session, path).await? {
            None => Err(not_found(session, path)),
            Some(n) if n.value.is_dir() => {
                Err(StoreError::BadRequest(format!("{path} is a directory")))
            }
            Some(n) => Ok(n.value),
        }
    }
}

pub fn file_node(size: u64, sha256: String, object: String) -> Node {
    Node {
        kind: NodeKind::File,
        size,
        sha256,
        object,
        mode: FILE_MODE,
        modified: messages::now_ms(),
    }
}

fn not_found(session: &str, path: &RelPath) -> StoreError {
    StoreError::NotFound(format!("{path} does not exist in workspace {session}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_that_escapes_badly_travels_as_base64() {
        assert_eq!(wire_content(b"print(1)\n").1, ContentEncoding::Utf8);
        assert_eq!(wire_content(&[b'"'; 300]).1, ContentEncoding::Base64);
        assert_eq!(wire_content(&[1u8; 300]).1, ContentEncoding::Base64);
        assert_eq!(wire_content(&[0xff, 0xfe]).1, ContentEncoding::Base64);
        for data in [&b"a\"b"[..], &[0xc3, 0x28], b"plain"] {
            let (text, enc) = wire_content(data);
            assert_eq!(messages::decode_content(&text, enc).unwrap(), data);
        }
    }
}
