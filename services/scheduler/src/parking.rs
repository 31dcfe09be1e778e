//! `ParkedStore`: executions waiting for a person, one key per execution id in the scheduler's
//! KV bucket `Subjects::parked_executions_bucket()`. An entry is the whole
//! [`Execution`] as decided so far, so any scheduler instance — also one started after a
//! restart — can resume it when the decision comes. It is removed once the result is stored.

use async_nats::jetstream::{self, kv, stream};
use futures::TryStreamExt;
use messages::exec::AwaitingConfirmation;
use messages::Subjects;
use serde::{Deserialize, Serialize};

use crate::error::{ensure_bucket, StoreError};
use crate::execution::Execution;

/// What a parked execution waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParkedState {
    AwaitingConfirmation,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Parked {
    pub state: ParkedState,
    pub confirmation_id: String,
    /// Unix milliseconds: past it, the confirmation counts as timed out (denied).
    pub expires_at: u64,
    /// Unix milliseconds, for the `confirm_ms` of the result.
    pub parked_at: u64,
    pub execution: Execution,
}

impl Parked {
    pub fn notice(&self) -> AwaitingConfirmation {
        AwaitingConfirmation {
            execution_id: self.execution.id.clone(),
            confirmation_id: self.confirmation_id.clone(),
            expires_at: self.expires_at,
        }
    }
}

#[derive(Clone)]
pub struct ParkedStore {
    kv: kv::Store,
}

impl ParkedStore {
    pub async fn open(
        js: &jetstream::Context,
        subjects: &Subjects,
        replicas: usize,
    ) -> Result<Self, StoreError> {
        let config = kv::Config {
            bucket: subjects.parked_executions_bucket(),
            history: 1,
            storage: stream::StorageType::File,
            ..Default::default()
        };
        let kv = ensure_bucket(js, config, replicas).await?;
        Ok(Self { kv })
    }

    /// Records `parked` durably (a repeat of the same execution overwrites its own entry).
    pub async fn put(&self, parked: &Parked) -> Result<(), StoreError> {
        let value = serde_json::to_vec(parked).map_err(StoreError::during("encoding"))?;
        let value = bytes::Bytes::from(value);
        let put = || self.kv.put(&parked.execution.id, value.clone());
        kit::retry("parking an execution", kit::RetryPolicy::JETSTREAM, put)
            .await
            .map_err(StoreError::during("parking an execution"))?;
        Ok(())
    }

    pub async fn get(&self, execution_id: &str) -> Result<Option<Parked>, StoreError> {
        let read = || self.kv.get(execution_id);
        match kit::retry(
            "reading a parked execution",
            kit::RetryPolicy::JETSTREAM,
            read,
        )
        .await
        {
            Ok(Some(value)) => serde_json::from_slice(&value)
                .map(Some)
                .map_err(StoreError::during("decoding a parked execution")),
            Ok(None) => Ok(None),
            Err(e) => Err(StoreError::new("reading a parked execution", e)),
        }
    }

    /// Forgets a parked execution whose result is stored.
    pub async fn remove(&self, execution_id: &str) -> Result<(), StoreError> {
        let delete = || self.kv.delete(execution_id);
        kit::retry(
            "removing a parked execution",
            kit::RetryPolicy::JETSTREAM,
            delete,
        )
        .await
        .map_err(StoreError::during("removing a parked execution"))
    }

    /// Every execution parked now.
    pub async fn all(&self) -> Result<Vec<Parked>, StoreError> {
        let keys: Vec<String> = match self.kv.keys().await {
            Ok(keys) => keys
                .try_collect()
                .await
                .map_err(StoreError::during("listing parked executions"))?,
            Err(e) => return Err(StoreError::new("listing parked executions", e)),
        };
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            if let Some(parked) = self.get(&key).await? {
                out.push(parked);
            }
        }
        Ok(out)
    }
}
