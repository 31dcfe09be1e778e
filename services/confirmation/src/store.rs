//! The `sandbox_confirmations` bucket: the source of truth every instance shares.
//!
//! Keys:
//! - `c.<id>` — a [`Confirmation`] (JSON). Pending ones are only ever replaced by a final one,
//!   with compare-and-set on the revision read, so exactly one decision wins.
//! - `x.<execution_id>` — the confirmation id that execution owns (idempotency key), created
//!   with `create` so two concurrent requests for one execution agree on one id.
//! - `s.<session_id>` — the session's [`SessionGrants`] (JSON), updated with compare-and-set.

use async_nats::jetstream::kv::{self, CreateErrorKind, Operation, UpdateErrorKind};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use kit::RetryPolicy;
use messages::confirm::Confirmation;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::policy::SessionGrants;

const RECORD: &str = "c.";
const EXECUTION: &str = "x.";
const SESSION: &str = "s.";
/// Concurrent reads while scanning for `list`.
const SCAN_CONCURRENCY: usize = 32;
/// Every KV call is retried through a cluster's leader elections (`kit::retry`).
const JETSTREAM: RetryPolicy = RetryPolicy::JETSTREAM;

/// A bucket operation's error, boxed: each async-nats operation has its own error type.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// NATS or JetStream did not serve the operation; worth retrying.
    #[error("the confirmations bucket is unavailable ({op})")]
    Unavailable {
        op: &'static str,
        #[source]
        source: BoxError,
    },
    /// An entry this service did not write in this shape; retrying does not help.
    #[error("entry {key} is corrupt")]
    Corrupt {
        key: String,
        #[source]
        source: Corruption,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum Corruption {
    #[error("not the expected JSON")]
    Json(#[from] serde_json::Error),
    #[error("not UTF-8")]
    Utf8(#[from] std::string::FromUtf8Error),
    #[error("claimed but empty")]
    Empty,
}

fn unavailable<E>(op: &'static str) -> impl FnOnce(E) -> StoreError
where
    E: std::error::Error + Send + Sync + 'static,
{
    move |e| StoreError::Unavailable {
        op,
        source: Box::new(e),
    }
}

/// A value with the revision it was read at (for compare-and-set).
#[derive(Debug, Clone, PartialEq)]
pub struct Versioned<T> {
    pub value: T,
    pub revision: u64,
}

/// The outcome of a compare-and-set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cas {
    Written(u64),
    /// Someone else wrote first; re-read to see what they wrote.
    Conflict,
}

/// Does this key hold a confirmation (rather than an index or session grants)?
pub fn is_record_key(key: &str) -> bool {
    key.starts_with(RECORD)
}

pub fn decode_record(key: &str, value: &[u8]) -> Result<Confirmation, StoreError> {
    decode(key, value)
}

fn decode<T: DeserializeOwned>(key: &str, value: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(value).map_err(|e| StoreError::Corrupt {
        key: key.to_string(),
        source: e.into(),
    })
}

fn encode<T: Serialize>(value: &T) -> Bytes {
    // Our own types always serialise to JSON.
    Bytes::from(serde_json::to_vec(value).expect("confirmation types serialise to JSON"))
}

#[derive(Debug, Clone)]
pub struct ConfirmationStore {
    kv: kv::Store,
}

impl ConfirmationStore {
    pub fn new(kv: kv::Store) -> Self {
        Self { kv }
    }

    pub fn kv(&self) -> &kv::Store {
        &self.kv
    }

    async fn read<T: DeserializeOwned>(
        &self,
        key: &str,
    ) -> Result<Option<Versioned<T>>, StoreError> {
        let read = kit::retry("reading a confirmation", JETSTREAM, || self.kv.entry(key));
        match read.await.map_err(unavailable("read"))? {
            Some(e) if e.operation == Operation::Put => Ok(Some(Versioned {
                value: decode(key, &e.value)?,
                revision: e.revision,
            })),
            _ => Ok(None),
        }
    }

    pub async fn get(&self, id: &str) -> Result<Option<Versioned<Confirmation>>, StoreError> {
        self.read(&format!("{RECORD}{id}")).await
    }

    /// Stores a new confirmation; `None` when one with this id exists already.
    pub async fn create(&self, record: &Confirmation) -> Result<Option<u64>, StoreError> {
        // Repeated after a lost ack, a create finds its own record: `None`, and the caller
        // reads it back.
        let (key, value) = (format!("{RECORD}{}", record.id), encode(record));
        let create = || self.kv.create(&key, value.clone());
        match kit::retry("creating a confirmation", JETSTREAM, create).await {
            Ok(revision) => Ok(Some(revision)),
            Err(e) if e.kind() == CreateErrorKind::AlreadyExists => Ok(None),
            Err(e) => Err(unavailable("create")(e)),
        }
    }

    /// Replaces the confirmation if it is still at `revision`.
    pub async fn replace(&self, record: &Confirmation, revision: u64) -> Result<Cas, StoreError> {
        let key = format!("{RECORD}{}", record.id);
        let value = encode(record);
        let update = || self.kv.update(&key, value.clone(), revision);
        cas(
            "replace",
            kit::retry("replacing a confirmation", JETSTREAM, update).await,
        )
    }

    /// The confirmation id owned by `execution_id`: `proposed` if this call claimed it, else the
    /// id an earlier request claimed.
    pub async fn claim_execution(
        &self,
        execution_id: &str,
        proposed: &str,
    ) -> Result<String, StoreError> {
        let key = format!("{EXECUTION}{execution_id}");
        let value = Bytes::from(proposed.to_string());
        let create = || self.kv.create(&key, value.clone());
        match kit::retry("claiming an execution", JETSTREAM, create).await {
            Ok(_) => Ok(proposed.to_string()),
            Err(e) if e.kind() == CreateErrorKind::AlreadyExists => {
                let value = kit::retry("reading the execution index", JETSTREAM, || {
                    self.kv.get(&key)
                })
                .await
                .map_err(unavailable("read the execution index"))?
                .ok_or_else(|| StoreError::Corrupt {
                    key: key.clone(),
                    source: Corruption::Empty,
                })?;
                String::from_utf8(value.to_vec()).map_err(|e| StoreError::Corrupt {
                    key,
                    source: e.into(),
                })
            }
            Err(e) => Err(unavailable("claim the execution")(e)),
        }
    }

    pub async fn grants(
        &self,
        session_id: &str,
    ) -> Result<Option<Versioned<SessionGrants>>, StoreError> {
        self.read(&format!("{SESSION}{session_id}")).await
    }

    /// Writes the session's grants if nobody changed them since `revision` (`None`: new).
    pub async fn write_grants(
        &self,
        grants: &SessionGrants,
        revision: Option<u64>,
    ) -> Result<Cas, StoreError> {
        let key = format!("{SESSION}{}", grants.session_id);
        match revision {
            Some(r) => {
                let update = || self.kv.update(&key, encode(grants), r);
                cas(
                    "write grants",
                    kit::retry("writing grants", JETSTREAM, update).await,
                )
            }
            None => match kit::retry("creating grants", JETSTREAM, || {
                self.kv.create(&key, encode(grants))
            })
            .await
            {
                Ok(r) => Ok(Cas::Written(r)),
                Err(e) if e.kind() == CreateErrorKind::AlreadyExists => Ok(Cas::Conflict),
                Err(e) => Err(unavailable("create grants")(e)),
            },
        }
    }

    /// Up to `limit` confirmations that `keep` accepts, newest first (ids are ULIDs). Reads
    /// every record key, so it is for `list` with a state other than pending.
    pub async fn scan(
        &self,
        keep: impl Fn(&Confirmation) -> bool,
        limit: usize,
    ) -> Result<Vec<Confirmation>, StoreError> {
        let keys: Vec<String> = self
            .kv
            .keys()
            .await
            .map_err(unavailable("list keys"))?
            .try_collect()
            .await
            .map_err(unavailable("list keys"))?;
        let mut ids: Vec<String> = keys
            .into_iter()
            .filter_map(|k| k.strip_prefix(RECORD).map(str::to_string))
            .collect();
        ids.sort_unstable_by(|a, b| b.cmp(a));
        let mut reads = futures::stream::iter(ids)
            .map(|id| async move { self.get(&id).await })
            .buffered(SCAN_CONCURRENCY);
        let mut out = Vec::new();
        while let Some(read) = reads.next().await {
            if let Some(v) = read? {
                if keep(&v.value) {
                    out.push(v.value);
                    if out.len() >= limit {
                        break;
                    }
                }
            }
        }
        Ok(out)
    }

    /// The bucket's latest revision: a replica that has applied it is up to date.
    pub async fn last_revision(&self) -> Result<u64, StoreError> {
        let info = self
            .kv
            .stream
            .get_info()
            .await
            .map_err(unavailable("read the revision"))?;
        Ok(info.state.last_sequence)
    }
}

fn cas(op: &'static str, result: Result<u64, kv::UpdateError>) -> Result<Cas, StoreError> {
    match result {
        Ok(revision) => Ok(Cas::Written(revision)),
        Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => Ok(Cas::Conflict),
        Err(e) => Err(unavailable(op)(e)),
    }
}
