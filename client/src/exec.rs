//! Executions: sync (`exec`, one request, the result as reply), async (`submit` a JetStream
//! job with `Nats-Msg-Id` = execution id, then `result` / `wait_result`), and the live output.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Stream, StreamExt};
use messages::exec::{
    AwaitingConfirmation, ExecRequest, ExecResult, OutputChunk, ResultGet, ResultLookup,
    NOTIFY_HEADER, STATUS_AWAITING_CONFIRMATION, STATUS_HEADER,
};

use crate::{decode_reply, ClientError, ErrorKind, MeshClient, Result};

/// A sync execution may wait for a container, a person's approval and the run itself.
pub const EXEC_TIMEOUT: Duration = Duration::from_secs(600);

#[derive(Debug, Clone)]
pub struct ExecClient {
    mesh: MeshClient,
}

/// An accepted async job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitted {
    pub execution_id: String,
    /// JetStream had seen this id already (a retried submit): nothing new will run.
    pub duplicate: bool,
}

impl ExecClient {
    pub fn new(mesh: MeshClient) -> Self {
        Self { mesh }
    }

    /// Runs `req` and returns its result (waiting at most [`EXEC_TIMEOUT`]).
    pub async fn exec(&self, req: &ExecRequest) -> Result<ExecResult> {
        self.exec_timeout(req, EXEC_TIMEOUT).await
    }

    pub async fn exec_timeout(&self, req: &ExecRequest, timeout: Duration) -> Result<ExecResult> {
        let subject = self.mesh.subjects().exec();
        self.mesh.request_timeout(subject, req, timeout).await
    }

    /// Like [`Self::exec_timeout`], and when the execution is parked for a person's approval,
    /// `on_wait` hears of it at once (confirmation id and expiry) while the call goes on
    /// waiting for the result. The scheduler sends that notice only to callers that name an
    /// inbox in the `Sandmesh-Notify` header, so plain request-reply clients see one reply.
    pub async fn exec_notified(
        &self,
        req: &ExecRequest,
        timeout: Duration,
        mut on_wait: impl FnMut(AwaitingConfirmation) + Send + 'static,
    ) -> Result<ExecResult> {
        let subject = self.mesh.subjects().exec();
        let nats = self.mesh.nats();
        let inbox = nats.new_inbox();
        let mut notices = nats
            .subscribe(inbox.clone())
            .await
            .map_err(|e| ClientError::transport(format!("subscribing to {inbox}"), e))?;
        let listener = tokio::spawn(async move {
            while let Some(msg) = notices.next().await {
                let status = msg.headers.as_ref().and_then(|h| h.get(STATUS_HEADER));
                if status.map(|v| v.as_str()) != Some(STATUS_AWAITING_CONFIRMATION) {
                    continue;
                }
                if let Ok(notice) = serde_json::from_slice(&msg.payload) {
                    on_wait(notice);
                }
            }
        });
        let mut headers = self.mesh.headers();
        headers.insert(NOTIFY_HEADER, inbox.as_str());
        let reply = self
            .mesh
            .request_with_headers(subject, req, headers, timeout)
            .await;
        listener.abort();
        reply
    }

    /// Queues `req` as a job; JetStream's ack means it is accepted and will reach a result.
    /// The execution id (given, or a new one) is the job's `Nats-Msg-Id`, so a retried submit
    /// is a duplicate, not a second run.
    pub async fn submit(&self, req: &ExecRequest) -> Result<Submitted> {
        let subject = self.mesh.subjects().jobs_exec();
        let mut req = req.clone();
        let id = req
            .execution_id
            .get_or_insert_with(messages::new_id)
            .clone();
        let mut headers = self.mesh.headers();
        headers.insert(async_nats::header::NATS_MESSAGE_ID, id.as_str());
        let payload = self.mesh.encode(&subject, &req)?;
        let ack = self
            .mesh
            .jetstream()
            .publish_with_headers(subject.clone(), headers, payload.into())
            .await
            .map_err(|e| ClientError::transport(format!("publishing to {subject}"), e))?
            .await
            .map_err(|e| ClientError::transport(format!("JetStream ack on {subject}"), e))?;
        Ok(Submitted {
            execution_id: id,
            duplicate: ack.duplicate,
        })
    }

    /// The stored result, or `None` while the job is queued or runs. An id the mesh never saw
    /// is `NotFound`.
    pub async fn result(&self, execution_id: &str) -> Result<Option<ExecResult>> {
        let req = ResultGet {
            execution_id: execution_id.to_string(),
        };
        let lookup = self
            .mesh
            .request(self.mesh.subjects().results_get(), &req)
            .await?;
        Ok(match lookup {
            ResultLookup::Done { result } => Some(*result),
            ResultLookup::Pending { .. } => None,
        })
    }

    /// Waits for the result: the stored result's own message on `results.<id>`, with a look-up
    /// first (it may be stored already) and last (in case the message slipped by). A job just
    /// submitted may not be known yet, so `NotFound` counts as pending here.
    pub async fn wait_result(&self, execution_id: &str, timeout: Duration) -> Result<ExecResult> {
        let subject = self.mesh.subjects().result(execution_id);
        let deadline = tokio::time::Instant::now() + timeout;
        let mut stored = self
            .mesh
            .nats()
            .subscribe(subject.clone())
            .await
            .map_err(|e| ClientError::transport(format!("subscribing to {subject}"), e))?;
        if let Some(result) = self.lookup(execution_id).await? {
            return Ok(result);
        }
        if let Ok(Some(msg)) = tokio::time::timeout_at(deadline, stored.next()).await {
            return decode_reply(&subject, msg.headers.as_ref(), &msg.payload);
        }
        match self.lookup(execution_id).await? {
            Some(result) => Ok(result),
            None => Err(ClientError::TimedOut { subject, timeout }),
        }
    }

    async fn lookup(&self, execution_id: &str) -> Result<Option<ExecResult>> {
        match self.result(execution_id).await {
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            other => other,
        }
    }

    /// The live output of an execution, chunk by chunk, ending after the `eof` chunk. Subscribe
    /// before the execution starts (output is not stored): pass your own `execution_id`.
    pub async fn output(&self, execution_id: &str) -> Result<OutputChunks> {
        let subject = self.mesh.subjects().output(execution_id);
        let messages = self.mesh.subscribe_live(subject.clone()).await?;
        Ok(OutputChunks {
            subject,
            messages,
            done: false,
        })
    }
}

/// The chunks of one execution's output, in order (`seq` says if one was lost).
#[derive(Debug)]
pub struct OutputChunks {
    subject: String,
    messages: async_nats::Subscriber,
    done: bool,
}

impl Stream for OutputChunks {
    type Item = Result<OutputChunk>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        match self.messages.poll_next_unpin(cx) {
            Poll::Ready(Some(msg)) => {
                let chunk: Result<OutputChunk> =
                    decode_reply(&self.subject, msg.headers.as_ref(), &msg.payload);
                self.done = chunk.as_ref().map_or(true, |c| c.eof);
                Poll::Ready(Some(chunk))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}
