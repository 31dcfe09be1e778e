//! The KV watch feeding the `Registry`: every change to the confirmations bucket, in revision
//! order, from the current value of every key at start. When the watch breaks (NATS restart,
//! consumer lost) it is re-created from the next revision, so nothing written meanwhile is
//! missed and nothing is replayed twice.

use std::time::Duration;

use async_nats::jetstream::kv::{self, Operation};
use futures::StreamExt;
use kit::CancellationToken;
use messages::confirm::Confirmation;
use tokio::task::JoinHandle;

use crate::store;

/// Pause before re-creating a broken watch (the server may still be restarting).
const RETRY_AFTER: Duration = Duration::from_millis(500);

/// One change seen in the bucket.
#[derive(Debug, Clone)]
pub struct Observation {
    pub revision: u64,
    /// The confirmation written at this revision; `None` for the other keys (execution index,
    /// session grants), which only advance the revision.
    pub record: Option<Confirmation>,
}

/// Where observations go (the registry's mailbox): `false` once nobody takes them any more.
pub type Observer = Box<dyn Fn(Observation) -> bool + Send + Sync>;

pub fn spawn(kv: kv::Store, observe: Observer, stop: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut next: Option<u64> = None;
        loop {
            let watch = match next {
                None => kv.watch_with_history(">").await,
                Some(revision) => kv.watch_all_from_revision(revision).await,
            };
            let mut watch = match watch {
                Ok(w) => w,
                Err(e) => {
                    tracing::warn!(error = %e, "confirmations watch could not start; retrying");
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(RETRY_AFTER) => continue,
                    }
                }
            };
            loop {
                let entry = tokio::select! {
                    _ = stop.cancelled() => return,
                    e = watch.next() => e,
                };
                let entry = match entry {
                    Some(Ok(entry)) => entry,
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "confirmations watch broke; re-creating it");
                        break;
                    }
                    None => break,
                };
                next = Some(entry.revision + 1);
                let record = match (store::is_record_key(&entry.key), entry.operation) {
                    (true, Operation::Put) => {
                        match store::decode_record(&entry.key, &entry.value) {
                            Ok(r) => Some(r),
                            Err(e) => {
                                tracing::error!(error = %e, "skipping a corrupt confirmation");
                                None
                            }
                        }
                    }
                    _ => None,
                };
                let observation = Observation {
                    revision: entry.revision,
                    record,
                };
                if !observe(observation) {
                    return;
                }
            }
        }
    })
}
