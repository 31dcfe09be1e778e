//! `Claims`: no two schedulers run the same execution id at once. A claim is a KV create,
//! renewed while its holder runs the execution and expiring by TTL when the holder dies; a
//! released claim leaves a delete marker the next claimant overwrites at its revision.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, kv, stream};
use async_nats::HeaderMap;
use messages::Subjects;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::error::{ensure_bucket, StoreError};

/// What a claim key holds: who runs the execution, since when.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ClaimValue {
    owner: String,
    at: u64,
}

#[derive(Clone)]
pub struct Claims {
    js: jetstream::Context,
    kv: kv::Store,
    bucket: String,
    owner: String,
    ttl: Duration,
    /// Releases handed off by [`Claim::release_later`]; the scheduler's stop awaits them.
    releases: TaskTracker,
}

/// The outcome of trying to claim an execution id.
pub enum ClaimOutcome {
    Claimed(Box<Claim>),
    /// Another scheduler (named) holds it.
    HeldBy(String),
}

impl Claims {
    pub async fn open(
        js: &jetstream::Context,
        subjects: &Subjects,
        owner: &str,
        ttl: Duration,
        replicas: usize,
    ) -> Result<Self, StoreError> {
        // Not one of the shared assets: the scheduler ensures it itself.
        let bucket = subjects.exec_claims_bucket();
        let config = kv::Config {
            bucket: bucket.clone(),
            history: 1,
            // Per-key TTLs need limit markers (nats-server ≥ 2.11).
            limit_markers: Some(Duration::from_secs(60)),
            max_age: Duration::from_secs(24 * 3600),
            storage: stream::StorageType::File,
            ..Default::default()
        };
        let kv = ensure_bucket(js, config, replicas).await?;
        Ok(Self {
            js: js.clone(),
            kv,
            bucket,
            owner: owner.to_string(),
            ttl,
            releases: TaskTracker::new(),
        })
    }

    /// Waits, at most `limit`, for the releases handed off by [`Claim::release_later`]; no
    /// new ones are taken after this. A release not finished leaves its claim to expire.
    pub async fn finish_releases(&self, limit: Duration) {
        self.releases.close();
        if tokio::time::timeout(limit, self.releases.wait())
            .await
            .is_err()
        {
            tracing::warn!("claim releases still pending; those claims will expire");
        }
    }

    /// Claims `execution_id` for this scheduler until the claim is released or dropped.
    pub async fn claim(&self, execution_id: &str) -> Result<ClaimOutcome, StoreError> {
        let value: bytes::Bytes = serde_json::to_vec(&ClaimValue {
            owner: self.owner.clone(),
            at: messages::now_ms(),
        })
        .map_err(StoreError::during("encoding a claim"))?
        .into();
        // Revision 0 means "the key must not exist"; a released claim leaves a delete marker,
        // which may be overwritten at its own revision.
        let first = self.write(execution_id, 0, value.clone()).await;
        let revision = match first {
            Ok(revision) => revision,
            Err(first_err) => match self.read(execution_id).await {
                Ok(Some(e)) if e.operation == kv::Operation::Put => {
                    let owner = serde_json::from_slice::<ClaimValue>(&e.value)
                        .map(|v| v.owner)
                        .unwrap_or_default();
                    return Ok(ClaimOutcome::HeldBy(owner));
                }
                Ok(Some(marker)) => {
                    match self
                        .write(execution_id, marker.revision, value.clone())
                        .await
                    {
                        Ok(revision) => revision,
                        // Someone else took it between our read and write.
                        Err(_) => {
                            let owner = self.holder(execution_id).await?.unwrap_or_default();
                            return Ok(ClaimOutcome::HeldBy(owner));
                        }
                    }
                }
                Ok(None) => return Err(StoreError::new("claiming an execution", first_err)),
                Err(e) => return Err(StoreError::new("claiming an execution", e)),
            },
        };
        Ok(ClaimOutcome::Claimed(Box::new(Claim::start(
            self.clone(),
            execution_id,
            revision,
            value,
        ))))
    }

    /// Who holds `execution_id` now, if anyone.
    pub async fn holder(&self, execution_id: &str) -> Result<Option<String>, StoreError> {
        match self.read(execution_id).await {
            Ok(Some(entry)) if entry.operation == kv::Operation::Put => {
                Ok(serde_json::from_slice::<ClaimValue>(&entry.value)
                    .ok()
                    .map(|v| v.owner))
            }
            Ok(_) => Ok(None),
            Err(e) => Err(StoreError::new("reading a claim", e)),
        }
    }

    /// The claim key's last entry, read through a cluster's leader elections.
    async fn read(&self, key: &str) -> Result<Option<kv::Entry>, kv::EntryError> {
        kit::retry("reading a claim", kit::RetryPolicy::JETSTREAM, || {
            self.kv.entry(key)
        })
        .await
    }

    /// Writes the claim with a fresh TTL, only if the key's last revision is `revision` (0: the
    /// key has never been written). The KV API sets no TTL when it overwrites a delete marker,
    /// so claims are written to the bucket's subject directly, like heartbeats.
    async fn write(
        &self,
        key: &str,
        revision: u64,
        value: bytes::Bytes,
    ) -> Result<u64, StoreError> {
        let mut headers = HeaderMap::new();
        headers.insert(
            async_nats::header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
            revision.to_string().as_str(),
        );
        headers.insert("Nats-TTL", format!("{}s", self.ttl.as_secs()).as_str());
        // A retry after a lost ack fails on the expected revision (it moved): the claim is
        // then read back and seen held, and comes free when its TTL ends. Never two holders.
        let subject = format!("$KV.{}.{key}", self.bucket);
        let write = || async {
            self.js
                .publish_with_headers(subject.clone(), headers.clone(), value.clone())
                .await?
                .await
        };
        let ack = kit::retry("writing a claim", kit::RetryPolicy::JETSTREAM, write)
            .await
            .map_err(StoreError::during("writing a claim"))?;
        Ok(ack.sequence)
    }
}

/// A held claim. Renewed in the background at a third of its TTL; released explicitly, or
/// left to expire when dropped (a crashed holder simply stops renewing).
pub struct Claim {
    claims: Claims,
    key: String,
    revision: Arc<AtomicU64>,
    stop: CancellationToken,
}

impl Claim {
    fn start(claims: Claims, key: &str, revision: u64, value: bytes::Bytes) -> Self {
        let revision = Arc::new(AtomicU64::new(revision));
        let stop = CancellationToken::new();
        let (c, k, rev, s) = (
            claims.clone(),
            key.to_string(),
            revision.clone(),
            stop.clone(),
        );
        tokio::spawn(async move {
            let period = c.ttl / 3;
            loop {
                tokio::select! {
                    _ = s.cancelled() => return,
                    _ = tokio::time::sleep(period) => {}
                }
                match c.write(&k, rev.load(Ordering::SeqCst), value.clone()).await {
                    Ok(r) => rev.store(r, Ordering::SeqCst),
                    Err(e) => tracing::warn!(execution_id = %k, error = %e, "claim renewal failed"),
                }
            }
        });
        Self {
            claims,
            key: key.to_string(),
            revision,
            stop,
        }
    }

    /// Gives the claim up so another attempt may take it at once. Bounded: with NATS gone a
    /// delete would wait for a reconnect, and a claim not deleted simply expires.
    pub async fn release(self) {
        self.stop.cancel();
        let revision = self.revision.load(Ordering::SeqCst);
        let client = self.claims.js.client();
        let delete = self
            .claims
            .kv
            .delete_expect_revision(&self.key, Some(revision));
        if let Some(Err(e)) = kit::shutdown::bounded(&client, "releasing a claim", delete).await {
            tracing::debug!(execution_id = %self.key, error = %e, "claim not deleted; it will expire");
        }
    }

    /// Releases the claim in the background, tracked so the scheduler's stop awaits it.
    pub fn release_later(self: Box<Self>) {
        let releases = self.claims.releases.clone();
        releases.spawn(self.release());
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// What keeps a second attempt of an execution from running while this one does.
pub enum Hold {
    /// The id is the caller's, who may send it again: a claim in the KV.
    Claimed(Box<Claim>),
    /// The scheduler made the id for this sync request just now, so no other attempt can
    /// know it and there is nothing to claim or look up (two JetStream round trips saved).
    FreshId,
}

impl Hold {
    pub async fn release(self) {
        if let Hold::Claimed(claim) = self {
            claim.release().await;
        }
    }

    /// [`Claim::release_later`], or nothing for a fresh id.
    pub fn release_later(self) {
        if let Hold::Claimed(claim) = self {
            claim.release_later();
        }
    }
}
