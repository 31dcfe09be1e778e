//! Workspaces: files of any size and whole-workspace tar archives. Content larger than
//! [`INLINE_MAX_BYTES`] moves in one of two ways ([`Transfer`]): by requests only — `upload`
//! chunks in, ranged `read`s and `fetch`es out — which is all a tenant's agent may do; or,
//! for services with the workspace objects bucket, through that bucket directly.

/// How content larger than one message moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transfer {
    /// Chunked requests through the workspace store: works for every caller.
    #[default]
    Requests,
    /// Put and get in the workspace objects bucket (services in the SANDBOX account only).
    ObjectStore,
}

/// Chunks (or ranges) of one transfer in flight at once.
pub(crate) const TRANSFER_WINDOW: usize = 4;

use std::time::Duration;

use async_nats::jetstream::object_store::{self, ObjectStore};
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use messages::exec::ContentEncoding;
use messages::subjects::WorkspaceOp;
use messages::workspace::{
    upload_name, Ack, WsArchive, WsCleaned, WsCleanup, WsEntry, WsFetch, WsFile, WsInit, WsList,
    WsListing, WsPath, WsRead, WsRestore, WsRestored, WsSnapshot, WsUsage, WsUsageRequest, WsWrite,
    INLINE_MAX_BYTES, OBJECT_CHUNK_SIZE, READ_RANGE_BYTES,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::error::StreamError;
use crate::{ClientError, ErrorKind, MeshClient, Result};

/// Calls that move whole files or archives may take longer than the caller's default.
const BULK_TIMEOUT: Duration = Duration::from_secs(300);
/// A read whose object was replaced between the reply and the fetch is asked again this often.
const READ_ATTEMPTS: usize = 3;

#[derive(Debug, Clone)]
pub struct WorkspaceClient {
    mesh: MeshClient,
    pub(crate) requested_by: Option<String>,
    transfer: Transfer,
}

impl WorkspaceClient {
    pub fn new(mesh: MeshClient) -> Self {
        Self {
            mesh,
            requested_by: None,
            transfer: Transfer::default(),
        }
    }

    /// How large content moves (default: [`Transfer::Requests`]).
    pub fn transfer(mut self, transfer: Transfer) -> Self {
        self.transfer = transfer;
        self
    }

    /// Who changes files, for the store's audit events.
    pub fn requested_by(mut self, who: impl Into<String>) -> Self {
        self.requested_by = Some(who.into());
        self
    }

    pub(crate) async fn call<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        op: WorkspaceOp,
        req: &Req,
        bulk: bool,
    ) -> Result<Resp> {
        let subject = self.mesh.subjects().workspace(op);
        let timeout = if bulk {
            BULK_TIMEOUT
        } else {
            self.mesh.timeout()
        };
        self.mesh.request_timeout(subject, req, timeout).await
    }

    async fn objects(&self) -> Result<ObjectStore> {
        let bucket = self.mesh.subjects().workspace_objects_bucket();
        self.mesh
            .jetstream()
            .get_object_store(&bucket)
            .await
            .map_err(|e| {
                ClientError::transport(format!("opening {bucket} (is workspace-store running?)"), e)
            })
    }

    /// Reads `size` bytes by ranges of [`READ_RANGE_BYTES`] (`read` makes the read of the one
    /// at an offset), a few in flight, in order.
    async fn read_ranges<'a>(
        size: u64,
        read: impl Fn(u64) -> BoxFuture<'a, Result<Vec<u8>>>,
    ) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(size as usize);
        // Built before the stream runs (and boxed): a closure or an unboxed future held across
        // the awaits makes this future not provably `Send` to callers that spawn it.
        let reads: Vec<_> = (0..size)
            .step_by(READ_RANGE_BYTES as usize)
            .map(read)
            .collect();
        let mut ranges = futures::stream::iter(reads).buffered(TRANSFER_WINDOW);
        while let Some(part) = ranges.next().await {
            out.extend_from_slice(&part?);
        }
        Ok(out)
    }

    /// Puts `data` under a fresh `upload/<id>` name and returns the name.
    async fn upload(&self, data: &[u8]) -> Result<String> {
        let name = upload_name();
        let meta = object_store::ObjectMetadata {
            name: name.clone(),
            chunk_size: Some(OBJECT_CHUNK_SIZE),
            ..Default::default()
        };
        let mut reader = data;
        self.objects()
            .await?
            .put(meta, &mut reader)
            .await
            .map_err(|e| ClientError::transport(format!("uploading {name}"), e))?;
        Ok(name)
    }

    /// The bytes of an object a reply named, read chunk by chunk with direct gets (no consumer
    /// per read, see [`crate::objects`]) and checked against its size and digest.
    async fn fetch(&self, name: &str) -> Result<Vec<u8>> {
        let bucket = self.mesh.subjects().workspace_objects_bucket();
        crate::objects::read_all(self.mesh.jetstream(), &bucket, name)
            .await
            .map_err(|e| ClientError::transport(format!("fetching {name}"), e))?
            .ok_or_else(|| ClientError::Protocol {
                subject: self.mesh.subjects().workspace(WorkspaceOp::Snapshot),
                problem: format!("the object {name} a reply named is gone"),
            })
    }

    /// Creates the session's workspace layout (idempotent).
    pub async fn init(&self, session: &str) -> Result<WsUsage> {
        let req = WsInit {
            session_id: session.into(),
        };
        self.call(WorkspaceOp::Init, &req, false).await
    }

    /// Writes a file of any size: inline when it fits one message, else by upload chunks
    /// ([`Transfer::Requests`], see [`write_stream`](Self::write_stream)) or via the object
    /// store.
    pub async fn write(&self, session: &str, path: &str, data: &[u8]) -> Result<WsEntry> {
        if self.transfer == Transfer::ObjectStore && data.len() as u64 > INLINE_MAX_BYTES {
            let req = WsWrite {
                session_id: session.into(),
                path: path.into(),
                content: String::new(),
                encoding: ContentEncoding::Utf8,
                append: false,
                requested_by: self.requested_by.clone(),
                object: Some(self.upload(data).await?),
                upload: None,
            };
            return self.call(WorkspaceOp::Write, &req, true).await;
        }
        let whole = futures::stream::iter([Ok(Bytes::copy_from_slice(data))]);
        self.write_stream(session, path, whole)
            .await
            .map_err(StreamError::into_mesh)
    }

    /// Reads a whole file of any size.
    pub async fn read(&self, session: &str, path: &str) -> Result<Vec<u8>> {
        let subject = self.mesh.subjects().workspace(WorkspaceOp::Read);
        let req = WsRead {
            session_id: session.into(),
            path: path.into(),
            // By requests: as much as one message holds, so a file that fits comes whole.
            length: (self.transfer == Transfer::Requests).then_some(INLINE_MAX_BYTES),
            ..Default::default()
        };
        let decode = |file: &WsFile| {
            messages::decode_content(&file.content, file.encoding).map_err(|problem| {
                ClientError::Protocol {
                    subject: subject.clone(),
                    problem,
                }
            })
        };
        let mut attempt = 1;
        loop {
            let file: WsFile = self.call(WorkspaceOp::Read, &req, true).await?;
            if self.transfer == Transfer::Requests {
                let first = decode(&file)?;
                if first.len() as u64 == file.size {
                    return Ok(first);
                }
                let bytes = Self::read_ranges(file.size, |offset| {
                    let mut range = req.clone();
                    range.offset = Some(offset);
                    range.length = Some(READ_RANGE_BYTES);
                    let first = &first;
                    async move {
                        // The ranges follow the store's chunks; the first is in hand.
                        if offset == 0 {
                            let range = first.get(..READ_RANGE_BYTES as usize).unwrap_or(first);
                            return Ok(range.to_vec());
                        }
                        let part: WsFile = self.call(WorkspaceOp::Read, &range, true).await?;
                        decode(&part)
                    }
                    .boxed()
                })
                .await?;
                let whole = Some(hex::encode(Sha256::digest(&bytes)));
                match bytes.len() as u64 == file.size && whole == file.sha256 {
                    true => return Ok(bytes),
                    // Overwritten between two ranges: read the new version.
                    false if attempt < READ_ATTEMPTS => {
                        attempt += 1;
                        continue;
                    }
                    false => {
                        return Err(ClientError::Protocol {
                            subject,
                            problem: format!("{path} kept changing while it was read"),
                        })
                    }
                }
            }
            let Some(object) = &file.object else {
                return messages::decode_content(&file.content, file.encoding).map_err(|problem| {
                    ClientError::Protocol {
                        subject: subject.clone(),
                        problem,
                    }
                });
            };
            match self.fetch(object).await {
                Ok(bytes) => return Ok(bytes),
                // Overwritten between the reply and the fetch: read the new version.
                Err(_) if attempt < READ_ATTEMPTS => attempt += 1,
                Err(e) => return Err(e),
            }
        }
    }

    /// `length` bytes of a file from `offset` (at most [`READ_RANGE_BYTES`], one reply's worth)
    /// and the reply describing the whole file (`size`, `sha256`; its `content` emptied): for
    /// callers that stream a file or serve a byte range without holding all of it.
    pub async fn read_range(
        &self,
        session: &str,
        path: &str,
        offset: u64,
        length: u64,
    ) -> Result<(Vec<u8>, WsFile)> {
        let req = WsRead {
            session_id: session.into(),
            path: path.into(),
            offset: Some(offset),
            length: Some(length.min(READ_RANGE_BYTES)),
            ..Default::default()
        };
        let mut file: WsFile = self.call(WorkspaceOp::Read, &req, true).await?;
        let bytes = messages::decode_content(&file.content, file.encoding).map_err(|problem| {
            ClientError::Protocol {
                subject: self.mesh.subjects().workspace(WorkspaceOp::Read),
                problem,
            }
        })?;
        file.content.clear();
        Ok((bytes, file))
    }

    /// Lists a directory (or the whole workspace), following every page.
    pub async fn list(
        &self,
        session: &str,
        prefix: Option<&str>,
        recursive: bool,
    ) -> Result<WsListing> {
        let mut req = WsList {
            session_id: session.into(),
            prefix: prefix.map(str::to_string),
            recursive,
            ..Default::default()
        };
        let mut all = WsListing::default();
        loop {
            let page: WsListing = self.call(WorkspaceOp::List, &req, false).await?;
            all.entries.extend(page.entries);
            match page.next {
                Some(next) => req.after = Some(next),
                None => return Ok(all),
            }
        }
    }

    pub async fn stat(&self, session: &str, path: &str) -> Result<WsEntry> {
        let req = self.path_req(session, path, false);
        self.call(WorkspaceOp::Stat, &req, false).await
    }

    /// Whether `path` exists: `stat` with `NotFound` as `false`.
    pub async fn exists(&self, session: &str, path: &str) -> Result<bool> {
        match self.stat(session, path).await {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    pub async fn delete(&self, session: &str, path: &str, recursive: bool) -> Result<Ack> {
        let req = self.path_req(session, path, recursive);
        self.call(WorkspaceOp::Delete, &req, false).await
    }

    /// The workspace (or the directory `prefix`) as tar bytes.
    pub async fn snapshot(&self, session: &str, prefix: Option<&str>) -> Result<Vec<u8>> {
        Ok(self.snapshot_at(session, prefix).await?.0)
    }

    /// [`Self::snapshot`] and the workspace revision it was taken at (`None`: the workspace has
    /// not changed since it was created), for callers that cache a copy.
    pub async fn snapshot_at(
        &self,
        session: &str,
        prefix: Option<&str>,
    ) -> Result<(Vec<u8>, Option<u64>)> {
        let req = WsSnapshot {
            session_id: session.into(),
            prefix: prefix.map(str::to_string),
        };
        let archive: WsArchive = self.call(WorkspaceOp::Snapshot, &req, true).await?;
        let tar = match (&archive.tar_base64, &archive.object) {
            (Some(b64), _) => {
                messages::decode_base64(b64).map_err(|problem| ClientError::Protocol {
                    subject: self.mesh.subjects().workspace(WorkspaceOp::Snapshot),
                    problem,
                })
            }
            (None, Some(object)) if self.transfer == Transfer::Requests => {
                let subject = self.mesh.subjects().workspace(WorkspaceOp::Fetch);
                Self::read_ranges(archive.size, |offset| {
                    let req = WsFetch {
                        session_id: session.into(),
                        object: object.clone(),
                        offset,
                        length: READ_RANGE_BYTES,
                    };
                    let subject = subject.clone();
                    async move {
                        let part: WsFile = self.call(WorkspaceOp::Fetch, &req, true).await?;
                        messages::decode_base64(&part.content)
                            .map_err(|problem| ClientError::Protocol { subject, problem })
                    }
                    .boxed()
                })
                .await
            }
            (None, Some(object)) => {
                let tar = self.fetch(object).await?;
                // Fetched: the staged copy is of no further use (the store's sweep would
                // remove it later), so a failure to delete it now is not the caller's.
                if let Ok(store) = self.objects().await {
                    let _ = store.delete(object).await;
                }
                Ok(tar)
            }
            (None, None) => Err(ClientError::Protocol {
                subject: self.mesh.subjects().workspace(WorkspaceOp::Snapshot),
                problem: "a snapshot with neither tar bytes nor an object".into(),
            }),
        }?;
        Ok((tar, archive.revision))
    }

    /// Unpacks `tar` into the workspace (all or nothing), removing the `delete` paths too, and
    /// with `replace` every file the archive does not hold.
    pub async fn restore(
        &self,
        session: &str,
        tar: &[u8],
        replace: bool,
        delete: Vec<String>,
    ) -> Result<WsRestored> {
        let mut req = WsRestore {
            session_id: session.into(),
            tar_base64: None,
            object: None,
            upload: None,
            replace,
            delete,
            requested_by: self.requested_by.clone(),
        };
        if tar.is_empty() {
            // Only deletions: no archive at all.
        } else if tar.len() as u64 <= INLINE_MAX_BYTES {
            req.tar_base64 = Some(messages::encode_base64(tar));
        } else if self.transfer == Transfer::Requests {
            req.upload = Some(self.upload_chunks(session, tar).await?);
        } else {
            req.object = Some(self.upload(tar).await?);
        }
        self.call(WorkspaceOp::Restore, &req, true).await
    }

    pub async fn usage(&self, session: &str) -> Result<WsUsage> {
        let req = WsUsageRequest {
            session_id: session.into(),
        };
        self.call(WorkspaceOp::Usage, &req, false).await
    }

    /// Removes one workspace (`Some`), or sweeps those idle past the TTL (`None`).
    pub async fn cleanup(&self, session: Option<&str>) -> Result<WsCleaned> {
        let req = WsCleanup {
            session_id: session.map(str::to_string),
            older_than_hours: None,
        };
        self.call(WorkspaceOp::Cleanup, &req, true).await
    }

    fn path_req(&self, session: &str, path: &str, recursive: bool) -> WsPath {
        WsPath {
            session_id: session.into(),
            path: path.into(),
            recursive,
            requested_by: self.requested_by.clone(),
        }
    }
}
