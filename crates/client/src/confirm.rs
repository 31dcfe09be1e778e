//! Human-in-the-loop confirmations: ask, decide, look up, list, and watch the events.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures::{Stream, StreamExt};
use messages::confirm::{
    ConfirmDecide, ConfirmGet, ConfirmList, ConfirmListReply, ConfirmRequest, Confirmation,
};
use messages::subjects::ConfirmOp;

use crate::{decode_reply, MeshClient, Result};

#[derive(Debug, Clone)]
pub struct ConfirmClient {
    mesh: MeshClient,
}

impl ConfirmClient {
    pub fn new(mesh: MeshClient) -> Self {
        Self { mesh }
    }

    /// Asks for a decision. With `req.wait` the reply is the decision (or the timeout), so
    /// the call may last as long as `req.timeout_ms`; without it, the pending record.
    pub async fn request(&self, req: &ConfirmRequest) -> Result<Confirmation> {
        let subject = self.mesh.subjects().confirm(ConfirmOp::Request);
        let timeout = match (req.wait, req.timeout_ms) {
            (true, Some(ms)) => self.mesh.timeout() + std::time::Duration::from_millis(ms),
            (true, None) => crate::exec::EXEC_TIMEOUT,
            (false, _) => self.mesh.timeout(),
        };
        self.mesh.request_timeout(subject, req, timeout).await
    }

    /// Approves or denies; a second decision is refused (`Conflict`) and the first stands.
    pub async fn decide(&self, req: &ConfirmDecide) -> Result<Confirmation> {
        self.mesh
            .request(self.mesh.subjects().confirm(ConfirmOp::Decide), req)
            .await
    }

    pub async fn get(&self, id: &str) -> Result<Confirmation> {
        let req = ConfirmGet { id: id.to_string() };
        self.mesh
            .request(self.mesh.subjects().confirm(ConfirmOp::Get), &req)
            .await
    }

    /// Pending ones by default, newest first.
    pub async fn list(&self, filter: &ConfirmList) -> Result<Vec<Confirmation>> {
        let reply: ConfirmListReply = self
            .mesh
            .request(self.mesh.subjects().confirm(ConfirmOp::List), filter)
            .await?;
        Ok(reply.confirmations)
    }

    /// Every confirmation event from now on (`confirm.pending.*` and `confirm.decided.*`):
    /// the record as it is after the change. Live when this returns, so listing afterwards
    /// misses nothing.
    pub async fn watch(&self) -> Result<ConfirmEvents> {
        let subject = self.mesh.subjects().confirm_events_all();
        let messages = self.mesh.subscribe_live(subject.clone()).await?;
        Ok(ConfirmEvents { subject, messages })
    }
}

/// Confirmation events as they happen.
#[derive(Debug)]
pub struct ConfirmEvents {
    subject: String,
    messages: async_nats::Subscriber,
}

impl Stream for ConfirmEvents {
    type Item = Result<Confirmation>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.messages
            .poll_next_unpin(cx)
            .map(|m| m.map(|msg| decode_reply(&self.subject, msg.headers.as_ref(), &msg.payload)))
    }
}
