//! `ResultStore`: one result per execution id in `SANDBOX_RESULTS` (subject `results.<id>`,
//! read back by direct get). A result is written once: the execution id is its `Nats-Msg-Id`.
//! It is also where `sandbox_executions_total` is counted: once per result actually stored, so
//! a redelivered job's second store (a duplicate) is not counted again.

use std::sync::Arc;

use async_nats::jetstream::{self, stream};
use async_nats::HeaderMap;
use kit::metrics::Metrics;
use kit::RetryPolicy;
use messages::codec;
use messages::exec::ExecResult;
use messages::{Encoding, Subjects};

use crate::error::StoreError;

#[derive(Clone)]
pub struct ResultStore {
    js: jetstream::Context,
    stream: stream::Stream,
    subjects: Subjects,
    metrics: Arc<Metrics>,
}

impl ResultStore {
    pub async fn open(
        js: &jetstream::Context,
        subjects: &Subjects,
        replicas: usize,
        metrics: Arc<Metrics>,
    ) -> Result<Self, StoreError> {
        let stream = kit::bootstrap::results_stream(js, subjects, replicas)
            .await
            .map_err(StoreError::during("opening the results stream"))?;
        Ok(Self {
            js: js.clone(),
            stream,
            subjects: subjects.clone(),
            metrics,
        })
    }

    /// The stored result of `execution_id`, if any.
    pub async fn get(&self, execution_id: &str) -> Result<Option<ExecResult>, StoreError> {
        use jetstream::stream::DirectGetErrorKind;
        let subject = self.subjects.result(execution_id);
        let read = kit::retry("reading a result", RetryPolicy::JETSTREAM, || {
            self.stream.direct_get_last_for_subject(subject.clone())
        });
        match read.await {
            Ok(message) => {
                let content_type = message
                    .headers
                    .get(codec::CONTENT_TYPE)
                    .map(|v| v.as_str().to_string());
                let encoding = Encoding::from_content_type(content_type.as_deref())
                    .map_err(StoreError::during("decoding a stored result"))?;
                encoding
                    .decode(&message.payload)
                    .map(Some)
                    .map_err(StoreError::during("decoding a stored result"))
            }
            Err(e) if e.kind() == DirectGetErrorKind::NotFound => Ok(None),
            Err(e) => Err(StoreError::new("reading a result", e)),
        }
    }

    /// Stores `result` under its execution id. Deduplicated on `Nats-Msg-Id` = execution id,
    /// so a second store of the same id (a redelivered job) leaves the first one in place.
    /// Retried through reconnects and leader elections (the id makes a repeat harmless): a
    /// result that was computed should not be lost to a blip.
    pub async fn put(&self, result: &ExecResult) -> Result<(), StoreError> {
        let payload = bytes::Bytes::from(
            Encoding::Json
                .encode(result)
                .map_err(StoreError::during("encoding a result"))?,
        );
        let subject = self.subjects.result(&result.execution_id);
        let store = || async {
            let mut headers = HeaderMap::new();
            headers.insert(codec::CONTENT_TYPE, codec::JSON);
            headers.insert(
                async_nats::header::NATS_MESSAGE_ID,
                result.execution_id.as_str(),
            );
            self.js
                .publish_with_headers(subject.clone(), headers, payload.clone())
                .await?
                .await
        };
        let ack = kit::retry("storing a result", RetryPolicy::JETSTREAM, store)
            .await
            .map_err(StoreError::during("storing a result"))?;
        if !ack.duplicate {
            self.count(result);
        }
        Ok(())
    }

    fn count(&self, result: &ExecResult) {
        let t = &result.timing;
        // Waiting for a person is not the system's time; it would drown the buckets.
        let ms = t.total_ms.saturating_sub(t.confirm_ms);
        self.metrics.execution_finished(
            result.status.as_str(),
            result.tier.as_str(),
            ms as f64 / 1000.0,
        );
    }
}
