//! `ResultStore`: one result per execution id in `SANDBOX_RESULTS` (subject `results.<id>`,
//! read back by direct get). A result is written once: the execution id is its `Nats-Msg-Id`.
//! It is also where `sandbox_executions_total` is counted: once per result actually stored, so
//! a redelivered job's second store (a duplicate) is not counted again.

use std::sync::Arc;

use async_nats::jetstream::context::{PublishAckFuture, PublishError};
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

    /// Stores `result` under its execution id and waits for the server's acknowledgement.
    /// Deduplicated on `Nats-Msg-Id` = execution id, so a second store of the same id (a
    /// redelivered job) leaves the first one in place.
    pub async fn put(&self, result: &ExecResult) -> Result<(), StoreError> {
        self.send(result).await?.stored().await
    }

    /// Sends `result` to the stream: when this returns it is on the connection, ahead of
    /// anything published after it (a sync caller's reply), but not yet acknowledged —
    /// [`Sending::stored`] waits for that. With `sync_interval: always` the acknowledgement
    /// waits for an fsync, which a caller that holds the result itself need not wait for.
    pub async fn send(&self, result: &ExecResult) -> Result<Sending, StoreError> {
        let payload = bytes::Bytes::from(
            Encoding::Json
                .encode(result)
                .map_err(StoreError::during("encoding a result"))?,
        );
        let t = &result.timing;
        // Waiting for a person is not the system's time; it would drown the buckets.
        let seconds = t.total_ms.saturating_sub(t.confirm_ms) as f64 / 1000.0;
        let sending = Sending {
            store: self.clone(),
            subject: self.subjects.result(&result.execution_id),
            id: result.execution_id.clone(),
            payload,
            labels: (result.status.as_str(), result.tier.as_str(), seconds),
            first: None,
        };
        let first = sending.publish().await;
        Ok(Sending {
            first: Some(first),
            ..sending
        })
    }
}

/// A result on its way to the stream ([`ResultStore::send`]).
pub struct Sending {
    store: ResultStore,
    subject: String,
    id: String,
    payload: bytes::Bytes,
    /// Status, tier and duration, for `sandbox_executions_total`.
    labels: (&'static str, &'static str, f64),
    /// The first attempt's publish.
    first: Option<Result<PublishAckFuture, PublishError>>,
}

impl Sending {
    async fn publish(&self) -> Result<PublishAckFuture, PublishError> {
        let mut headers = HeaderMap::new();
        headers.insert(codec::CONTENT_TYPE, codec::JSON);
        headers.insert(async_nats::header::NATS_MESSAGE_ID, self.id.as_str());
        self.store
            .js
            .publish_with_headers(self.subject.clone(), headers, self.payload.clone())
            .await
    }

    /// Waits until the server has stored the result, sending it again through reconnects and
    /// leader elections when the first attempt was not acknowledged (the id makes a repeat
    /// harmless): a result that was computed should not be lost to a blip. It is counted in
    /// `sandbox_executions_total` once, when stored the first time.
    pub async fn stored(mut self) -> Result<(), StoreError> {
        let first = match self.first.take() {
            Some(Ok(ack)) => ack.await.ok(),
            _ => None,
        };
        let ack = match first {
            Some(ack) => ack,
            None => kit::retry("storing a result", RetryPolicy::JETSTREAM, || async {
                self.publish().await?.await
            })
            .await
            .map_err(StoreError::during("storing a result"))?,
        };
        if !ack.duplicate {
            let (status, tier, seconds) = self.labels;
            self.store.metrics.execution_finished(status, tier, seconds);
        }
        Ok(())
    }
}
