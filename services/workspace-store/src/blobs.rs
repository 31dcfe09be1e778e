//! File contents in the JetStream object store `<prefix>_workspace_blobs`.
//!
//! Names: `ws/<session>/<ulid>` for contents (a fresh name for every write, so an overwrite
//! never races a reader of the old version, and a session's objects are found from its
//! index), `snapshot/<ulid>` for tar snapshots too large to travel inline, and
//! `upload/<token>` for what clients put there themselves to hand over large writes and
//! archives. The object store chunks everything, so no message ever exceeds the NATS max
//! payload.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::object_store::{self, ObjectInfo, ObjectMetadata, ObjectStore};
use async_nats::jetstream::{self, stream};
use base64::engine::general_purpose::URL_SAFE;
use base64::Engine as _;
use futures::StreamExt;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt};

use sandmesh_client::objects::{ChunkIndex, ObjectChunks, ObjectReader};

use crate::error::{Result, StoreError};

use messages::workspace::OBJECT_CHUNK_SIZE;
pub use messages::workspace::UPLOAD_PREFIX;

pub const SNAPSHOT_PREFIX: &str = "snapshot/";
pub const CONTENT_PREFIX: &str = "ws/";
/// Chunk indexes kept for range reads.
const MAX_CACHED_INDEXES: usize = 256;

#[derive(Clone)]
pub struct Blobs {
    /// Chunk indexes of objects read by ranges, by the object's nuid (a new version of an
    /// object gets a new nuid, so an entry never goes stale).
    indexes: Arc<Mutex<HashMap<String, Arc<ChunkIndex>>>>,
    store: ObjectStore,
    /// The bucket's stream (`OBJ_<bucket>`): deleting an object leaves a "deleted" meta
    /// message behind; purging its subject keeps the stream from growing with every write.
    stream: stream::Stream,
    chunks: ObjectChunks,
    bucket: String,
}

pub fn content_name(session: &str) -> String {
    format!("{CONTENT_PREFIX}{session}/{}", messages::new_id())
}

/// A staged snapshot of `session`: the session is part of the name so that `fetch` serves it
/// to that session (and tenant) only.
pub fn snapshot_name(session: &str) -> String {
    format!("{}{}", snapshot_prefix(session), messages::new_id())
}

pub fn snapshot_prefix(session: &str) -> String {
    format!("{SNAPSHOT_PREFIX}{session}/")
}

/// A name a client may hand over: `upload/` and 1–64 of `[A-Za-z0-9_-]`.
pub fn is_upload_name(name: &str) -> bool {
    name.strip_prefix(UPLOAD_PREFIX)
        .is_some_and(|token| messages::validate::validate_id("object", token).is_ok())
}

/// Staged objects: client uploads not yet used, snapshots not yet fetched.
pub fn is_staged_name(name: &str) -> bool {
    name.starts_with(UPLOAD_PREFIX) || name.starts_with(SNAPSHOT_PREFIX)
}

impl Blobs {
    pub async fn open(js: &jetstream::Context, bucket: &str, replicas: usize) -> Result<Self> {
        let store = match js.get_object_store(bucket).await {
            Ok(store) => store,
            Err(_) => match js
                .create_object_store(object_store::Config {
                    bucket: bucket.to_string(),
                    description: Some("sandmesh workspace file contents".into()),
                    storage: stream::StorageType::File,
                    num_replicas: replicas,
                    ..Default::default()
                })
                .await
            {
                Ok(store) => store,
                // Another instance created it between our look-up and create.
                Err(e) => js
                    .get_object_store(bucket)
                    .await
                    .map_err(|_| StoreError::storage("creating the object store", e))?,
            },
        };
        let stream = js
            .get_stream(format!("OBJ_{bucket}"))
            .await
            .map_err(|e| StoreError::storage("opening the object store stream", e))?;
        Ok(Self {
            indexes: Arc::default(),
            store,
            chunks: ObjectChunks::open(js, bucket)
                .await
                .map_err(|e| StoreError::Internal(e.to_string()))?,
            stream,
            bucket: bucket.to_string(),
        })
    }

    /// Stores an object read from `data`; returns its size.
    pub async fn put(&self, name: &str, data: &mut (impl AsyncRead + Unpin)) -> Result<u64> {
        let meta = ObjectMetadata {
            name: name.to_string(),
            chunk_size: Some(OBJECT_CHUNK_SIZE),
            ..Default::default()
        };
        let info = self
            .store
            .put(meta, data)
            .await
            .map_err(|e| StoreError::storage(&format!("storing {name}"), e))?;
        Ok(info.size as u64)
    }

    pub async fn put_bytes(&self, name: &str, data: &[u8]) -> Result<()> {
        let mut reader = data;
        self.put(name, &mut reader).await.map(|_| ())
    }

    pub async fn info(&self, name: &str) -> Result<Option<ObjectInfo>> {
        match self.store.info(name).await {
            Ok(info) if !info.deleted => Ok(Some(info)),
            Ok(_) => Ok(None),
            Err(e) if e.kind() == object_store::InfoErrorKind::NotFound => Ok(None),
            Err(e) => Err(StoreError::storage(&format!("looking up {name}"), e)),
        }
    }

    /// The object's size and a reader over its bytes (its digest is checked at the end).
    pub async fn open_reader(&self, name: &str) -> Result<(u64, ObjectReader)> {
        let info = self
            .info(name)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("object {name} does not exist")))?;
        Ok((info.size as u64, self.chunks.reader(&info)))
    }

    pub async fn read_all(&self, name: &str) -> Result<Vec<u8>> {
        let (size, mut reader) = self.open_reader(name).await?;
        let mut out = Vec::with_capacity(size.min(1 << 24) as usize);
        reader
            .read_to_end(&mut out)
            .await
            .map_err(|e| StoreError::storage(&format!("reading {name}"), e))?;
        Ok(out)
    }

    /// `length` bytes from `offset`, reading only the chunks the range covers. A client
    /// reads a large file as consecutive ranges, so the object's chunk index is built once
    /// (per instance) and kept: reading the whole file by ranges costs one pass, not one
    /// pass per range.
    pub async fn read_range(&self, name: &str, offset: u64, length: u64) -> Result<Vec<u8>> {
        let info = self
            .info(name)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("object {name} does not exist")))?;
        let cached = self
            .indexes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&info.nuid)
            .cloned();
        let index = match cached {
            Some(index) => index,
            None => {
                let index = Arc::new(
                    self.chunks
                        .index(&info)
                        .await
                        .map_err(|e| StoreError::storage(&format!("indexing {name}"), e))?,
                );
                let mut indexes = self.indexes.lock().unwrap_or_else(|p| p.into_inner());
                // Bounded: an index is a few bytes per chunk, and a full cache just starts over.
                if indexes.len() >= MAX_CACHED_INDEXES {
                    indexes.clear();
                }
                indexes.insert(info.nuid.clone(), index.clone());
                index
            }
        };
        self.chunks
            .read_range(&index, offset, length)
            .await
            .map_err(|e| StoreError::storage(&format!("reading {name}"), e))
    }

    /// Streams an object and returns its true size and SHA-256 (hex): a client's claim in the
    /// object's metadata is not trusted for quota.
    pub async fn measure(&self, name: &str) -> Result<(u64, String)> {
        let (_, mut reader) = self.open_reader(name).await?;
        let mut hasher = Sha256::new();
        let mut size = 0u64;
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            let n = reader
                .read(&mut buf)
                .await
                .map_err(|e| StoreError::storage(&format!("reading {name}"), e))?;
            if n == 0 {
                break;
            }
            size += n as u64;
            hasher.update(&buf[..n]);
        }
        Ok((size, hex::encode(hasher.finalize())))
    }

    /// Takes over an object a client handed over: renamed (no copy) so that the client can no
    /// longer replace it under its old name and the sweep of stale uploads leaves it alone.
    pub async fn adopt(&self, from: &str, to: &str) -> Result<()> {
        if self.info(from).await?.is_none() {
            return Err(StoreError::NotFound(format!(
                "object {from} does not exist (already used?)"
            )));
        }
        let update = object_store::UpdateMetadata {
            name: to.to_string(),
            ..Default::default()
        };
        match self.store.update_metadata(from, update).await {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == object_store::UpdateMetadataErrorKind::NotFound => Err(
                StoreError::NotFound(format!("object {from} does not exist (already used?)")),
            ),
            Err(e) => Err(StoreError::storage(&format!("taking over {from}"), e)),
        }
    }

    /// Removes an object and its metadata for good. Removing what is gone is not an error.
    pub async fn remove(&self, name: &str) -> Result<()> {
        match self.store.delete(name).await {
            Ok(()) => {}
            Err(e) if e.kind() == object_store::DeleteErrorKind::NotFound => {}
            Err(e) => return Err(StoreError::storage(&format!("deleting {name}"), e)),
        }
        let meta_subject = format!("$O.{}.M.{}", self.bucket, URL_SAFE.encode(name));
        self.stream
            .purge()
            .filter(meta_subject)
            .await
            .map_err(|e| StoreError::storage(&format!("purging {name}"), e))?;
        Ok(())
    }

    /// Removes many objects, a few at a time; logs (does not fail on) individual errors, as
    /// an object left behind costs space, not correctness.
    pub async fn remove_all(&self, names: Vec<String>) {
        futures::stream::iter(names)
            .for_each_concurrent(16, |name| async move {
                if let Err(e) = self.remove(&name).await {
                    tracing::warn!(object = %name, error = %e, "object not removed");
                }
            })
            .await;
    }

    /// Staged objects (`upload/`, `snapshot/`) older than `age`: left by clients that never
    /// fetched or used them.
    pub async fn stale_staged(&self, age: Duration) -> Result<Vec<String>> {
        let cutoff = time_cutoff(age);
        let mut list = self
            .store
            .list()
            .await
            .map_err(|e| StoreError::storage("listing objects", e))?;
        let mut stale = Vec::new();
        while let Some(info) = list.next().await {
            let info = info.map_err(|e| StoreError::storage("listing objects", e))?;
            let old = info.modified.is_some_and(|m| m.unix_timestamp() < cutoff);
            if is_staged_name(&info.name) && old {
                stale.push(info.name);
            }
        }
        Ok(stale)
    }

    /// Every object name (tests and diagnostics).
    pub async fn names(&self) -> Result<Vec<String>> {
        let mut list = self
            .store
            .list()
            .await
            .map_err(|e| StoreError::storage("listing objects", e))?;
        let mut names = Vec::new();
        while let Some(info) = list.next().await {
            names.push(
                info.map_err(|e| StoreError::storage("listing objects", e))?
                    .name,
            );
        }
        Ok(names)
    }
}

fn time_cutoff(age: Duration) -> i64 {
    (messages::now_ms() / 1000) as i64 - age.as_secs() as i64
}
