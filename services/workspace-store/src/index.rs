//! The workspace index in KV `<prefix>_workspace_index`: one key per node, one meta key per
//! session (see `keys`). Every change is compare-and-set on the key's revision, so instances
//! share nothing but JetStream and still never lose an update.

use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};
use async_nats::jetstream::kv::{self, CreateErrorKind, UpdateErrorKind};
use async_nats::jetstream::{self, stream};
use bytes::Bytes;
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use crate::error::{Result, StoreError};
use crate::keys::{self, RelPath};

/// Messages fetched per round trip while scanning.
const SCAN_BATCH: usize = 20_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeKind {
    File,
    Dir,
}

/// One file or directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    pub kind: NodeKind,
    #[serde(default)]
    pub size: u64,
    /// SHA-256 of the content, hex; lets restore skip files that did not change.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sha256: String,
    /// Object-store name of the content.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub object: String,
    /// Permission bits only (`& 0o777`): set-id and sticky bits are never stored.
    pub mode: u32,
    /// Unix milliseconds.
    pub modified: u64,
}

impl Node {
    pub fn dir(modified: u64) -> Self {
        Self {
            kind: NodeKind::Dir,
            size: 0,
            sha256: String::new(),
            object: String::new(),
            mode: 0o755,
            modified,
        }
    }

    pub fn is_dir(&self) -> bool {
        self.kind == NodeKind::Dir
    }
}

/// A session's totals, kept in one key so the quota is one compare-and-set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionMeta {
    pub bytes: u64,
    pub files: u64,
    pub created: u64,
    pub last_modified: u64,
    /// Set by the sweeper before it removes the session, so a writer arriving meanwhile is
    /// told to retry instead of writing into a workspace about to vanish.
    #[serde(default)]
    pub removing: bool,
}

/// A node with the revision it was read at.
#[derive(Debug, Clone)]
pub struct Versioned<T> {
    pub value: T,
    pub revision: u64,
}

#[derive(Clone)]
pub struct Index {
    kv: kv::Store,
    /// The bucket's stream, for scans (filtered consumers) and subtree purges.
    stream: stream::Stream,
    bucket: String,
}

fn decode<T: serde::de::DeserializeOwned>(key: &str, value: &[u8]) -> Result<T> {
    serde_json::from_slice(value)
        .map_err(|e| StoreError::Internal(format!("index entry {key} is corrupt: {e}")))
}

fn encode<T: Serialize>(value: &T) -> Bytes {
    Bytes::from(serde_json::to_vec(value).expect("index values serialise"))
}

/// Compare-and-set retries of a revision bump (each retry means another change landed).
const MAX_BUMP_ATTEMPTS: usize = 1000;

/// A revision bump: the revision a change followed and the one it made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Revisions {
    pub previous: Option<u64>,
    pub revision: u64,
}

/// The outcome of a compare-and-set.
pub enum Cas {
    Done(u64),
    /// The key changed (or appeared) since the revision we expected.
    Stale,
}

impl Index {
    pub async fn open(js: &jetstream::Context, bucket: &str, replicas: usize) -> Result<Self> {
        let kv = match js.get_key_value(bucket).await {
            Ok(kv) => kv,
            Err(_) => match js
                .create_key_value(kv::Config {
                    bucket: bucket.to_string(),
                    description: "sandmesh workspace index".into(),
                    history: 1,
                    storage: stream::StorageType::File,
                    // Enables per-key TTLs (the sweep lock).
                    limit_markers: Some(Duration::from_secs(60)),
                    num_replicas: replicas,
                    ..Default::default()
                })
                .await
            {
                Ok(kv) => kv,
                Err(e) => js
                    .get_key_value(bucket)
                    .await
                    .map_err(|_| StoreError::storage("creating the index bucket", e))?,
            },
        };
        let stream = js
            .get_stream(format!("KV_{bucket}"))
            .await
            .map_err(|e| StoreError::storage("opening the index stream", e))?;
        Ok(Self {
            kv,
            stream,
            bucket: bucket.to_string(),
        })
    }

    async fn entry<T: serde::de::DeserializeOwned>(
        &self,
        key: &str,
    ) -> Result<Option<Versioned<T>>> {
        let read = || self.kv.entry(key);
        let entry = kit::retry("reading the index", kit::RetryPolicy::JETSTREAM, read)
            .await
            .map_err(|e| StoreError::storage("reading the index", e))?;
        match entry {
            Some(e) if e.operation == kv::Operation::Put => Ok(Some(Versioned {
                value: decode(key, &e.value)?,
                revision: e.revision,
            })),
            _ => Ok(None),
        }
    }

    pub async fn node(&self, session: &str, path: &RelPath) -> Result<Option<Versioned<Node>>> {
        self.entry(&keys::node_key(session, path)).await
    }

    pub async fn meta(&self, session: &str) -> Result<Option<Versioned<SessionMeta>>> {
        self.entry(&keys::meta_key(session)).await
    }

    /// Writes `value` if the key is still at `expected` (`None`: absent or deleted).
    async fn cas<T: Serialize>(&self, key: &str, value: &T, expected: Option<u64>) -> Result<Cas> {
        let bytes = encode(value);
        // Through a cluster's elections; a write repeated after a lost ack finds the key moved
        // (`Stale`), and the caller reads it again, as after any concurrent change.
        let policy = kit::RetryPolicy::JETSTREAM;
        match expected {
            None => match kit::retry("writing the index", policy, || {
                self.kv.create(key, bytes.clone())
            })
            .await
            {
                Ok(rev) => Ok(Cas::Done(rev)),
                Err(e) if e.kind() == CreateErrorKind::AlreadyExists => Ok(Cas::Stale),
                Err(e) => Err(StoreError::storage("writing the index", e)),
            },
            Some(rev) => match kit::retry("writing the index", policy, || {
                self.kv.update(key, bytes.clone(), rev)
            })
            .await
            {
                Ok(rev) => Ok(Cas::Done(rev)),
                Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => Ok(Cas::Stale),
                Err(e) => Err(StoreError::storage("writing the index", e)),
            },
        }
    }

    pub async fn put_node(
        &self,
        session: &str,
        path: &RelPath,
        node: &Node,
        expected: Option<u64>,
    ) -> Result<Cas> {
        self.cas(&keys::node_key(session, path), node, expected)
            .await
    }

    pub async fn put_meta(
        &self,
        session: &str,
        meta: &SessionMeta,
        expected: Option<u64>,
    ) -> Result<Cas> {
        self.cas(&keys::meta_key(session), meta, expected).await
    }

    /// The session's workspace revision: the entry revision of its revision key
    /// (`messages::workspace::revision_key`); `None` before its first change or after removal.
    pub async fn revision(&self, session: &str) -> Result<Option<u64>> {
        let key = messages::workspace::revision_key(session);
        let entry = self
            .kv
            .entry(&key)
            .await
            .map_err(|e| StoreError::storage("reading the workspace revision", e))?;
        Ok(entry
            .filter(|e| e.operation == kv::Operation::Put)
            .map(|e| e.revision))
    }

    /// Records one change of the session's workspace, after it landed: returns the revision
    /// before and the new one. Compare-and-set, so `previous` is exactly the revision this
    /// change follows (no other change in between).
    pub async fn bump_revision(&self, session: &str) -> Result<Revisions> {
        let key = messages::workspace::revision_key(session);
        for _ in 0..MAX_BUMP_ATTEMPTS {
            let previous = self.revision(session).await?;
            if let Cas::Done(revision) = self.cas(&key, &(), previous).await? {
                return Ok(Revisions { previous, revision });
            }
        }
        Err(StoreError::Raced(format!(
            "the revision of workspace {session}"
        )))
    }

    /// Deletes a node if it is still at `revision`.
    pub async fn delete_node(&self, session: &str, path: &RelPath, revision: u64) -> Result<Cas> {
        match self
            .kv
            .delete_expect_revision(keys::node_key(session, path), Some(revision))
            .await
        {
            Ok(()) => Ok(Cas::Done(revision)),
            Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => Ok(Cas::Stale),
            Err(e) => Err(StoreError::storage("deleting from the index", e)),
        }
    }

    /// The nodes below `dir` (direct children, or the whole subtree), with their paths.
    pub async fn list(
        &self,
        session: &str,
        dir: &RelPath,
        recursive: bool,
    ) -> Result<Vec<(RelPath, Versioned<Node>)>> {
        let entries = self
            .scan(&keys::children_filter(session, dir, recursive))
            .await?;
        let mut out = Vec::with_capacity(entries.len());
        for (key, value, revision) in entries {
            let Some(path) = keys::path_of_key(session, &key) else {
                continue;
            };
            out.push((
                path,
                Versioned {
                    value: decode(&key, &value)?,
                    revision,
                },
            ));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// Is there any node directly below `dir`?
    pub async fn has_children(&self, session: &str, dir: &RelPath) -> Result<bool> {
        Ok(!self
            .scan(&keys::children_filter(session, dir, false))
            .await?
            .is_empty())
    }

    /// Every session with its meta.
    pub async fn sessions(&self) -> Result<Vec<(String, Versioned<SessionMeta>)>> {
        let mut out = Vec::new();
        for (key, value, revision) in self.scan(&keys::all_meta_filter()).await? {
            if let Some(session) = keys::session_of_meta_key(&key) {
                out.push((
                    session.to_string(),
                    Versioned {
                        value: decode(&key, &value)?,
                        revision,
                    },
                ));
            }
        }
        Ok(out)
    }

    /// Removes every key under `filter` for good (no delete markers left behind).
    pub async fn purge(&self, filter: &str) -> Result<()> {
        self.stream
            .purge()
            .filter(format!("$KV.{}.{filter}", self.bucket))
            .await
            .map_err(|e| StoreError::storage("purging the index", e))?;
        Ok(())
    }

    /// Tries to take the sweep lock for `ttl`; false when another instance holds it.
    pub async fn try_lock(&self, key: &str, holder: &str, ttl: Duration) -> Result<bool> {
        match self
            .kv
            .create_with_ttl(key, Bytes::from(holder.to_string()), ttl)
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == CreateErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(StoreError::storage("taking the sweep lock", e)),
        }
    }

    pub async fn unlock(&self, key: &str) -> Result<()> {
        self.kv
            .purge(key)
            .await
            .map_err(|e| StoreError::storage("releasing the sweep lock", e))
    }

    /// The latest live value of every key matching `filter`: an ephemeral pull consumer that
    /// delivers the last message per subject. The server walks only the subjects matching
    /// the filter, so one session's scan costs that session's keys.
    async fn scan(&self, filter: &str) -> Result<Vec<(String, Bytes, u64)>> {
        let prefix = format!("$KV.{}.", self.bucket);
        let err = |e: &dyn std::fmt::Display| StoreError::storage("scanning the index", e);
        let consumer = self
            .stream
            .create_consumer(pull::Config {
                filter_subject: format!("{prefix}{filter}"),
                deliver_policy: DeliverPolicy::LastPerSubject,
                ack_policy: AckPolicy::None,
                inactive_threshold: Duration::from_secs(30),
                memory_storage: true,
                ..Default::default()
            })
            .await
            .map_err(|e| err(&e))?;
        let mut pending = consumer.cached_info().num_pending;
        let mut out = Vec::with_capacity(pending.min(1 << 20) as usize);
        while pending > 0 {
            let mut batch = consumer
                .fetch()
                .max_messages(SCAN_BATCH)
                .messages()
                .await
                .map_err(|e| err(&e))?;
            let mut got = 0;
            while let Some(message) = batch.next().await {
                let message = message.map_err(|e| err(&e))?;
                got += 1;
                let info = message.info().map_err(|e| err(&e))?;
                pending = info.pending;
                let revision = info.stream_sequence;
                let deleted = message
                    .headers
                    .as_ref()
                    .and_then(|h| h.get("KV-Operation"))
                    .is_some_and(|op| op.as_str() == "DEL" || op.as_str() == "PURGE");
                if deleted {
                    continue;
                }
                let Some(key) = message.subject.strip_prefix(&prefix) else {
                    continue;
                };
                out.push((key.to_string(), message.payload.clone(), revision));
            }
            if got == 0 {
                // What was pending when the consumer was made can be purged before delivery;
                // the server's own count says whether anything is really left.
                let mut consumer = consumer.clone();
                pending = consumer.info().await.map_err(|e| err(&e))?.num_pending;
            }
        }
        let name = consumer.cached_info().name.clone();
        let stream = self.stream.clone();
        tokio::spawn(async move {
            let _ = stream.delete_consumer(&name).await;
        });
        Ok(out)
    }
}
