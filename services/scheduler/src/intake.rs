//! `Intake`: the request-reply edge for executions — sync `exec` and `exec.result` look-ups.
//! A sync execution holds an admission permit while it runs; one that is parked for a person
//! gives its permit back and waits for its result on `results.<id>` (stored by whichever
//! scheduler instance resumes it). A caller that sent the `Sandmesh-Notify` header gets an
//! `awaiting-confirmation` notice there at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use futures::StreamExt;
use kit::RequestContext;
use messages::codec;
use messages::exec::{
    AwaitingConfirmation, ExecRequest, ExecResult, ResultGet, ResultLookup, NOTIFY_HEADER,
    STATUS_AWAITING_CONFIRMATION, STATUS_HEADER,
};
use messages::validate::validate_id;
use messages::{Encoding, ErrorBody, Subjects};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::claims::Claims;
use crate::execution::{Origin, Outcome};
use crate::parking::ParkedStore;
use crate::pipeline::Pipeline;
use crate::results::ResultStore;

/// Beyond the confirmation's expiry and the run's own budget, how long a parked sync caller
/// waits for the result before it is told to look it up later.
const PARKED_WAIT_SLACK: Duration = Duration::from_secs(30);

#[derive(Clone)]
pub struct Intake {
    pipeline: Pipeline,
    /// The bounded queue: one permit per execution in flight, shared with async jobs.
    admission: Arc<Semaphore>,
    /// Its size, for the 429 message.
    max_queue: usize,
    results: ResultStore,
    claims: Claims,
    parked: ParkedStore,
    /// For notices and for waiting on a parked execution's result.
    client: async_nats::Client,
    subjects: Subjects,
    /// Cancelled when the scheduler stops: parked sync callers are answered then, not held.
    stopping: CancellationToken,
}

impl Intake {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        pipeline: Pipeline,
        (admission, max_queue): (Arc<Semaphore>, usize),
        results: ResultStore,
        claims: Claims,
        parked: ParkedStore,
        client: async_nats::Client,
        subjects: Subjects,
        stopping: CancellationToken,
    ) -> Self {
        Self {
            pipeline,
            admission,
            max_queue,
            results,
            claims,
            parked,
            client,
            subjects,
            stopping,
        }
    }

    /// `exec`: runs the request now. Beyond the queue bound the caller gets 429 at once.
    pub async fn exec(
        &self,
        ctx: RequestContext,
        req: ExecRequest,
    ) -> Result<ExecResult, ErrorBody> {
        let received = Instant::now();
        let Ok(permit) = self.admission.clone().try_acquire_owned() else {
            return Err(ErrorBody::overloaded(format!(
                "the scheduler queue is full ({} executions in flight); retry later",
                self.max_queue
            )));
        };
        let origin = Origin {
            received,
            queued_ms: 0,
            trace_id: ctx.trace_id.clone(),
        };
        let outcome = self.pipeline.execute(req, origin).await;
        drop(permit);
        match outcome {
            Outcome::Done(result) => Ok(result),
            // The caller still gets what ran; a later look-up by id will not find it.
            Outcome::Unstored(result, _) => Ok(result),
            Outcome::Invalid(e) | Outcome::Retry(e) => Err(e),
            Outcome::Busy(owner) => Err(ErrorBody::conflict(format!(
                "this execution id is running now (on scheduler {owner}); read its result \
                 with exec.result when it ends"
            ))),
            Outcome::Parked(notice) => {
                self.notify(&ctx, &notice).await;
                self.wait_parked(&notice).await
            }
        }
    }

    /// Publishes the awaiting-confirmation notice on the caller's notify subject, if it asked
    /// for one. Only inbox subjects are accepted, so the scheduler cannot be made to publish
    /// onto service subjects.
    async fn notify(&self, ctx: &RequestContext, notice: &AwaitingConfirmation) {
        let Some(subject) = ctx
            .headers
            .as_ref()
            .and_then(|h| h.get(NOTIFY_HEADER))
            .map(|v| v.as_str().to_string())
            .filter(|s| is_inbox(s))
        else {
            return;
        };
        let mut headers = HeaderMap::new();
        headers.insert(STATUS_HEADER, STATUS_AWAITING_CONFIRMATION);
        headers.insert(codec::CONTENT_TYPE, codec::JSON);
        let Ok(body) = Encoding::Json.encode(notice) else {
            return;
        };
        if let Err(e) = self
            .client
            .publish_with_headers(subject, headers, body.into())
            .await
        {
            tracing::debug!(error = %e, "awaiting-confirmation notice not sent");
        }
    }

    /// Waits for the result of a parked execution, stored by whoever resumes it.
    async fn wait_parked(&self, notice: &AwaitingConfirmation) -> Result<ExecResult, ErrorBody> {
        let id = &notice.execution_id;
        let later = || {
            format!(
                "execution {id} waits for confirmation {}; read its result with exec.result",
                notice.confirmation_id
            )
        };
        let mut stored = self
            .client
            .subscribe(self.subjects.result(id))
            .await
            .map_err(|e| ErrorBody::unavailable(format!("{}: {e}", later())))?;
        // The subscription is live before the look below, so a result stored in between is
        // seen by one or the other.
        let _ = self.client.flush().await;
        if let Some(result) = self.results.get(id).await? {
            return Ok(result);
        }
        let budget = self
            .parked
            .get(id)
            .await?
            .map(|p| {
                Duration::from_millis(p.execution.limits.timeout_ms)
                    + self.pipeline.policy.exec_grace
            })
            .unwrap_or_default();
        let left = Duration::from_millis(notice.expires_at.saturating_sub(messages::now_ms()));
        let deadline = tokio::time::Instant::now() + left + budget + PARKED_WAIT_SLACK;
        loop {
            let message = tokio::select! {
                _ = self.stopping.cancelled() => {
                    return Err(ErrorBody::unavailable(format!("the scheduler is stopping; {}", later())));
                }
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(ErrorBody::timeout(later()));
                }
                m = stored.next() => m,
            };
            let Some(message) = message else {
                return Err(ErrorBody::unavailable(later()));
            };
            let content_type = message
                .headers
                .as_ref()
                .and_then(|h| h.get(codec::CONTENT_TYPE))
                .map(|v| v.as_str().to_string());
            let decoded = Encoding::from_content_type(content_type.as_deref())
                .ok()
                .and_then(|e| e.decode::<ExecResult>(&message.payload).ok());
            if let Some(result) = decoded {
                return Ok(result);
            }
        }
    }

    /// `exec.result`: the stored result, `pending` while a scheduler runs it or it waits for
    /// a person, else 404.
    pub async fn lookup(
        &self,
        _ctx: RequestContext,
        req: ResultGet,
    ) -> Result<ResultLookup, ErrorBody> {
        validate_id("execution_id", &req.execution_id)?;
        if let Some(result) = self.results.get(&req.execution_id).await? {
            return Ok(ResultLookup::Done {
                result: Box::new(result),
            });
        }
        if let Some(parked) = self.parked.get(&req.execution_id).await? {
            return Ok(ResultLookup::Pending {
                execution_id: req.execution_id,
                awaiting_confirmation: Some(parked.notice()),
            });
        }
        if self.claims.holder(&req.execution_id).await?.is_some() {
            return Ok(ResultLookup::Pending {
                execution_id: req.execution_id,
                awaiting_confirmation: None,
            });
        }
        Err(ErrorBody::not_found(format!(
            "no result for execution {}: it is unknown, or still waiting in the job queue",
            req.execution_id
        )))
    }
}

/// A plain inbox subject (`_INBOX.` and tokens without wildcards or spaces).
fn is_inbox(subject: &str) -> bool {
    subject.starts_with("_INBOX.")
        && subject
            .split('.')
            .all(|t| !t.is_empty() && !t.contains(['*', '>', ' ', '\t', '\r', '\n']))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_go_to_inboxes_only() {
        assert!(is_inbox("_INBOX.abc.def"));
        assert!(!is_inbox("sandbox.v1.exec"));
        assert!(!is_inbox("_INBOX.*"));
        assert!(!is_inbox("_INBOX.>"));
        assert!(!is_inbox("_INBOX..x"));
    }
}
