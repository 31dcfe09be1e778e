//! The audit trail (stream `SANDBOX_AUDIT`): the last events, optionally followed live.

use std::pin::Pin;
use std::task::{Context, Poll};

use async_nats::jetstream::consumer::{pull, DeliverPolicy};
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use messages::audit::AuditEvent;

use crate::{decode_reply, ClientError, MeshClient, Result};

#[derive(Debug, Clone)]
pub struct AuditClient {
    mesh: MeshClient,
}

/// Which events to read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditQuery {
    /// Only this kind (`finished`, `risk_assessed`, ...).
    pub kind: Option<String>,
    /// Start this many events before the end of the trail (0: only new ones).
    pub last: u64,
    /// Keep delivering new events instead of ending at the end of the trail.
    pub follow: bool,
}

impl AuditClient {
    pub fn new(mesh: MeshClient) -> Self {
        Self { mesh }
    }

    /// The events the query selects, oldest first. Without `follow` the stream ends at the
    /// last event stored when it was opened.
    pub async fn events(&self, query: &AuditQuery) -> Result<AuditEvents> {
        let subjects = self.mesh.subjects();
        let name = subjects.audit_stream();
        let failed = |e| ClientError::transport(format!("reading {name}"), e);
        let mut stream = self
            .mesh
            .jetstream()
            .get_stream(&name)
            .await
            .map_err(failed)?;
        let last_seq = stream
            .info()
            .await
            .map_err(|e| ClientError::transport(format!("reading {name}"), e))?
            .state
            .last_sequence;
        let deliver_policy = if query.last == 0 {
            DeliverPolicy::New
        } else {
            DeliverPolicy::ByStartSequence {
                start_sequence: last_seq.saturating_sub(query.last - 1).max(1),
            }
        };
        let filter_subject = match &query.kind {
            Some(kind) => subjects.audit_kind(kind),
            None => subjects.audit_all(),
        };
        let mut consumer = stream
            .create_consumer(pull::OrderedConfig {
                filter_subject,
                deliver_policy,
                ..Default::default()
            })
            .await
            .map_err(|e| ClientError::transport(format!("reading {name}"), e))?;
        // What the filter selects up to now: without `follow`, the stream ends after these.
        let backlog = consumer
            .info()
            .await
            .map_err(|e| ClientError::transport(format!("reading {name}"), e))?
            .num_pending;
        let messages = consumer
            .messages()
            .await
            .map_err(|e| ClientError::transport(format!("reading {name}"), e))?;
        let ended = !query.follow && backlog == 0;
        Ok(AuditEvents {
            subject: name,
            messages: messages.boxed(),
            follow: query.follow,
            ended,
        })
    }
}

type Delivered = std::result::Result<
    async_nats::jetstream::Message,
    async_nats::jetstream::consumer::pull::OrderedError,
>;

/// Audit events in stream order.
pub struct AuditEvents {
    subject: String,
    messages: BoxStream<'static, Delivered>,
    follow: bool,
    ended: bool,
}

impl Stream for AuditEvents {
    type Item = Result<AuditEvent>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.ended {
            return Poll::Ready(None);
        }
        let msg = match self.messages.poll_next_unpin(cx) {
            Poll::Ready(Some(Ok(msg))) => msg,
            Poll::Ready(Some(Err(e))) => {
                let what = format!("reading {}", self.subject);
                return Poll::Ready(Some(Err(ClientError::transport(what, e))));
            }
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => return Poll::Pending,
        };
        // Nothing pending for this consumer: the end of the trail as it was when read.
        if !self.follow && msg.info().map_or(true, |i| i.pending == 0) {
            self.ended = true;
        }
        Poll::Ready(Some(decode_reply(
            &self.subject,
            msg.headers.as_ref(),
            &msg.payload,
        )))
    }
}
