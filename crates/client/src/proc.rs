//! A session's background processes (`sandbox.v1.proc.*`): start, list, read output from any
//! seq still kept, write input, signal, wait, resize a terminal, and follow the live output.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Stream, StreamExt};
use messages::proc::{
    ProcEvent, ProcInfo, ProcInput, ProcInputAck, ProcList, ProcOutput, ProcOutputRequest, ProcRef,
    ProcResize, ProcSignal, ProcSignalKind, ProcStart, ProcStarted, ProcWait, MAX_WAIT_MS,
};
use messages::subjects::ProcOp;

use crate::{decode_reply, MeshClient, Result};

/// How long past a `wait`'s own bound its request may take to come back.
const WAIT_SLACK: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub struct ProcClient {
    mesh: MeshClient,
}

impl ProcClient {
    pub fn new(mesh: MeshClient) -> Self {
        Self { mesh }
    }

    fn subject(&self, op: ProcOp) -> String {
        self.mesh.subjects().proc(op)
    }

    /// Starts a process. A start that needs a person's approval answers once decided, so
    /// `timeout` should cover the confirmation's (the default timeout is used when `None`).
    pub async fn start(&self, req: &ProcStart, timeout: Option<Duration>) -> Result<ProcStarted> {
        let timeout = timeout.unwrap_or(self.mesh.timeout());
        self.mesh
            .request_timeout(self.subject(ProcOp::Start), req, timeout)
            .await
    }

    /// Every process of the session, oldest first.
    pub async fn list(&self, session_id: &str) -> Result<Vec<ProcInfo>> {
        let req = ProcRef {
            session_id: session_id.to_string(),
            proc_id: String::new(),
        };
        let reply: ProcList = self.mesh.request(self.subject(ProcOp::List), &req).await?;
        Ok(reply.procs)
    }

    /// The kept output of a process from `from_seq` on (one page: continue from
    /// `next_seq`).
    pub async fn output(&self, req: &ProcOutputRequest) -> Result<ProcOutput> {
        self.mesh.request(self.subject(ProcOp::Output), req).await
    }

    /// Writes to the process's stdin (or terminal).
    pub async fn input(&self, req: &ProcInput) -> Result<ProcInputAck> {
        self.mesh.request(self.subject(ProcOp::Input), req).await
    }

    pub async fn signal(
        &self,
        session_id: &str,
        proc_id: &str,
        signal: ProcSignalKind,
    ) -> Result<ProcInfo> {
        let req = ProcSignal {
            session_id: session_id.to_string(),
            proc_id: proc_id.to_string(),
            signal,
        };
        self.mesh.request(self.subject(ProcOp::Signal), &req).await
    }

    /// The process once it ended, or as it is after `timeout` (at most
    /// [`MAX_WAIT_MS`]) if it still runs.
    pub async fn wait(
        &self,
        session_id: &str,
        proc_id: &str,
        timeout: Duration,
    ) -> Result<ProcInfo> {
        let ms = (timeout.as_millis() as u64).min(MAX_WAIT_MS);
        let req = ProcWait {
            session_id: session_id.to_string(),
            proc_id: proc_id.to_string(),
            timeout_ms: Some(ms),
        };
        let budget = Duration::from_millis(ms) + WAIT_SLACK;
        self.mesh
            .request_timeout(self.subject(ProcOp::Wait), &req, budget)
            .await
    }

    /// A terminal's new size.
    pub async fn resize(
        &self,
        session_id: &str,
        proc_id: &str,
        cols: u16,
        rows: u16,
    ) -> Result<ProcInfo> {
        let req = ProcResize {
            session_id: session_id.to_string(),
            proc_id: proc_id.to_string(),
            cols,
            rows,
        };
        self.mesh.request(self.subject(ProcOp::Resize), &req).await
    }

    /// The live events of a process (its output chunks as they come, then its end). Only
    /// what is published after the subscription arrives: read what came before with
    /// [`Self::output`] (the chunks' seqs join the two without a gap or a repeat).
    pub async fn events(&self, proc_id: &str) -> Result<ProcEvents> {
        let subject = self.mesh.subjects().output_any(proc_id);
        let messages = self.mesh.subscribe_live(subject.clone()).await?;
        Ok(ProcEvents {
            subject,
            messages,
            done: false,
        })
    }
}

/// A process's live events, ending after [`ProcEvent::Ended`].
#[derive(Debug)]
pub struct ProcEvents {
    subject: String,
    messages: async_nats::Subscriber,
    done: bool,
}

impl Stream for ProcEvents {
    type Item = Result<ProcEvent>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        match self.messages.poll_next_unpin(cx) {
            Poll::Ready(Some(msg)) => {
                let event: Result<ProcEvent> =
                    decode_reply(&self.subject, msg.headers.as_ref(), &msg.payload);
                self.done = matches!(event, Ok(ProcEvent::Ended(_)) | Err(_));
                Poll::Ready(Some(event))
            }
            other => other.map(|_| None),
        }
    }
}
