//! `ResultStore`: one result per execution id in `SANDBOX_RESULTS` (subject `results.<id>`,
//! read back by direct get). A result is written once: the execution id is its `Nats-Msg-Id`.
//! It is also where `sandbox_executions_total` is counted: once per result actually stored, so
//! a redelivered job's second store (a duplicate) is not counted again.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, stream};
use async_nats::HeaderMap;
use kit::metrics::Metrics;
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
        metrics: Arc<Metrics>,
    ) -> Result<Self, StoreError> {
        let stream = kit::bootstrap::results_stream(js, subjects)
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
        match self
            .stream
            .direct_get_last_for_subject(self.subjects.result(execution_id))
            .await
        {
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
    /// Retries a few times: a result that was computed should not be lost to a blip.
    pub async fn put(&self, result: &ExecResult) -> Result<(), StoreError> {
        let payload = Encoding::Json
            .encode(result)
            .map_err(StoreError::during("encoding a result"))?;
        let mut last = None;
        for attempt in 0..4u32 {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
            }
            let mut headers = HeaderMap::new();
            headers.insert(codec::CONTENT_TYPE, codec::JSON);
            headers.insert(
                async_nats::header::NATS_MESSAGE_ID,
                result.execution_id.as_str(),
            );
            let publish = self
                .js
                .publish_with_headers(
                    self.subjects.result(&result.execution_id),
                    headers,
                    payload.clone().into(),
                )
                .await;
            match publish {
                Ok(ack) => match ack.await {
                    Ok(ack) => {
                        if !ack.duplicate {
                            self.count(result);
                        }
                        return Ok(());
                    }
                    Err(e) => last = Some(StoreError::new("storing a result", e)),
                },
                Err(e) => last = Some(StoreError::new("storing a result", e)),
            }
        }
        Err(last.unwrap_or_else(|| StoreError::new("storing a result", "no attempt made")))
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
