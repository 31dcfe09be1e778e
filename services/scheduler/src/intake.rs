//! `Intake`: the request-reply edge for executions — sync `exec` and `exec.result` look-ups.
//! A sync execution holds an admission permit while it runs; one that is parked for a person
//! gives its permit back and waits for its result on `results.<id>` (stored by whichever
//! scheduler instance resumes it). A caller that sent the `Sandmesh-Notify` header gets an
//! `awaiting-confirmation` notice on its reply subject at once, before the result.
//!
//! Ids a tenant's agent names are scoped by its tenant on the way in and unscoped on the way
//! out (`messages::tenancy`), so one tenant's ids never reach another's executions.

use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use futures::StreamExt;
use kit::RequestContext;
use messages::browser::{AioExec, AioExecResult};
use messages::codec;
use messages::exec::{
    AwaitingConfirmation, ExecRequest, ExecResult, ResultGet, ResultLookup, MAX_RESULT_WAIT_MS,
    NOTIFY_HEADER, STATUS_AWAITING_CONFIRMATION, STATUS_HEADER,
};
use messages::{Encoding, Subjects};
use sandmesh_client::MeshClient;
use tokio_util::sync::CancellationToken;

use crate::error::{SchedulerError, StoppedWaiting};
use crate::execution::{scope_request, Origin, Outcome, Reviewed};
use crate::fairness::Admission;
use crate::pipeline::Pipeline;

/// Beyond the confirmation's expiry and the run's own budget, how long a parked sync caller
/// waits for the result before it is told to look it up later.
const PARKED_WAIT_SLACK: Duration = Duration::from_secs(30);
/// How long an unknown id is given to appear before `exec.result` answers 404: a sync caller
/// is answered while its result's store (an fsync on the server) is still finishing, and the
/// stream can be a few fsyncs behind under load.
const STORE_GRACE: Duration = Duration::from_millis(500);

#[derive(Clone)]
pub struct Intake {
    /// Its result store, claims and parked executions are the look-ups' too.
    pipeline: Pipeline,
    /// A sync execution holds a permit of the queue, and a slot of its tenant's share.
    admission: Admission,
    /// For notices and for waiting on a parked execution's result.
    client: async_nats::Client,
    subjects: Subjects,
    /// Cancelled when the scheduler stops: parked sync callers are answered then, not held.
    stopping: CancellationToken,
}

impl Intake {
    pub fn new(
        pipeline: Pipeline,
        admission: Admission,
        mesh: &MeshClient,
        stopping: CancellationToken,
    ) -> Self {
        Self {
            pipeline,
            admission,
            client: mesh.nats().clone(),
            subjects: mesh.subjects().clone(),
            stopping,
        }
    }

    /// `exec`: runs the request now. Beyond the queue bound the caller gets 429 at once.
    pub async fn exec(
        &self,
        ctx: RequestContext,
        req: ExecRequest,
    ) -> Result<ExecResult, SchedulerError> {
        self.run(ctx, req, None).await
    }

    /// Runs the request now, the risk-assessor and a person reviewing `reviewed` instead of
    /// its code when given (a test run: the code and tests, not their runner).
    pub async fn run(
        &self,
        ctx: RequestContext,
        req: ExecRequest,
        reviewed: Option<Reviewed>,
    ) -> Result<ExecResult, SchedulerError> {
        let received = Instant::now();
        let req = scope_request(&ctx.caller, req)?;
        let tenant = ctx.caller.tenant();
        let tenant_slot = self.admission.tenants.take(tenant)?;
        let Ok(permit) = self.admission.queue.clone().try_acquire_owned() else {
            return Err(SchedulerError::QueueFull {
                size: self.admission.size,
            });
        };
        let origin = Origin {
            received,
            queued_ms: 0,
            trace_id: ctx.trace_id.clone(),
            caller: ctx.caller.clone(),
            sync_reply: true,
            reviewed,
        };
        let outcome = self.pipeline.execute(req, origin).await;
        // A parked execution holds neither: waiting for a person costs no slot.
        drop(permit);
        drop(tenant_slot);
        match outcome {
            Outcome::Done(result) => Ok(result.unscoped(tenant)),
            // The caller still gets what ran; a later look-up by id will not find it.
            Outcome::Unstored(result, _) => Ok(result.unscoped(tenant)),
            Outcome::Invalid(e) => Err(SchedulerError::Refused(e)),
            Outcome::Retry(e) => Err(e),
            Outcome::Busy(owner) => Err(SchedulerError::Running { owner }),
            Outcome::Parked(notice) => {
                self.notify(&ctx, &notice.clone().unscoped(tenant)).await;
                let result = self.wait_parked(&notice).await?;
                Ok(result.unscoped(tenant))
            }
        }
    }

    /// `aio.exec`: an agent's command in its session's AIO instance, through the same gates
    /// as `exec`: assessed as shell code, held for a person
    /// when the risk asks (with the same notice), stored and audited as an execution.
    pub async fn aio_exec(
        &self,
        ctx: RequestContext,
        req: AioExec,
    ) -> Result<AioExecResult, SchedulerError> {
        let session = req.session_id.clone();
        let result = self.exec(ctx, crate::aio::request_of(req)).await?;
        crate::aio::answer_of(session, result)
    }

    /// Sends the awaiting-confirmation notice on the request's reply subject, before the
    /// result, if the caller asked for notices.
    async fn notify(&self, ctx: &RequestContext, notice: &AwaitingConfirmation) {
        let asked = ctx
            .headers
            .as_ref()
            .is_some_and(|h| h.get(NOTIFY_HEADER).is_some());
        let Some(subject) = ctx.reply.clone().filter(|_| asked) else {
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
    async fn wait_parked(
        &self,
        notice: &AwaitingConfirmation,
    ) -> Result<ExecResult, SchedulerError> {
        let id = &notice.execution_id;
        let undecided = |cause| SchedulerError::Undecided {
            execution_id: id.clone(),
            confirmation_id: notice.confirmation_id.clone(),
            cause,
        };
        let mut stored = self
            .client
            .subscribe(self.subjects.result(id))
            .await
            .map_err(|e| undecided(StoppedWaiting::Subscribe(e)))?;
        // The subscription is live before the look below, so a result stored in between is
        // seen by one or the other.
        let _ = self.client.flush().await;
        if let Some(result) = self.pipeline.results.get(id).await? {
            return Ok(result);
        }
        let budget = self
            .pipeline
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
                _ = self.stopping.cancelled() => return Err(undecided(StoppedWaiting::Stopping)),
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(undecided(StoppedWaiting::TimedOut));
                }
                m = stored.next() => m,
            };
            let Some(message) = message else {
                return Err(undecided(StoppedWaiting::Ended));
            };
            if let Some(result) = decode_result(&message) {
                return Ok(result);
            }
        }
    }

    /// `exec.result`: the stored result, `pending` while a scheduler runs it or it waits for
    /// a person, else 404. With `wait_ms`, a result not stored yet is waited for that long.
    /// A sync caller is answered before its result's store is acknowledged
    /// ([`crate::pipeline`]), so an id not found at once gets [`STORE_GRACE`] to appear before
    /// it is called unknown.
    pub async fn lookup(
        &self,
        ctx: RequestContext,
        req: ResultGet,
    ) -> Result<ResultLookup, SchedulerError> {
        let id = ctx.caller.scope("execution_id", &req.execution_id)?;
        let wait = Duration::from_millis(req.wait_ms.unwrap_or(0).min(MAX_RESULT_WAIT_MS));
        let lookup = if wait.is_zero() {
            match self.look_up(&id, &req.execution_id).await {
                Err(SchedulerError::NoResult { .. }) => {
                    self.look_up_waiting(&id, &req.execution_id, wait).await?
                }
                other => other?,
            }
        } else {
            self.look_up_waiting(&id, &req.execution_id, wait).await?
        };
        Ok(lookup.unscoped(ctx.caller.tenant()))
    }

    /// Like [`Self::look_up`], holding a pending answer until the result is stored or `wait`
    /// passes, and an unknown id at least [`STORE_GRACE`] (it may be queued, or on its way to
    /// the store). Subscribed before the look, so a result stored in between is seen.
    async fn look_up_waiting(
        &self,
        id: &str,
        named: &str,
        wait: Duration,
    ) -> Result<ResultLookup, SchedulerError> {
        let mut stored = self
            .client
            .subscribe(self.subjects.result(id))
            .await
            .map_err(|source| SchedulerError::ResultWatch {
                id: named.to_string(),
                source,
            })?;
        let _ = self.client.flush().await;
        let first = self.look_up(id, named).await;
        let wait = match &first {
            Ok(ResultLookup::Done { .. }) => return first,
            Ok(_) => wait,
            Err(SchedulerError::NoResult { .. }) => wait.max(STORE_GRACE),
            Err(_) => return first,
        };
        tokio::select! {
            _ = self.stopping.cancelled() => first,
            // A last look: the stream may have stored it without this subscription seeing it
            // (published before the subscription was live, stored after the first look).
            _ = tokio::time::sleep(wait) => self.look_up(id, named).await,
            m = stored.next() => match m.and_then(|m| decode_result(&m)) {
                Some(result) => Ok(ResultLookup::Done { result: Box::new(result) }),
                None => self.look_up(id, named).await,
            },
        }
    }

    async fn look_up(&self, id: &str, named: &str) -> Result<ResultLookup, SchedulerError> {
        if let Some(result) = self.pipeline.results.get(id).await? {
            return Ok(ResultLookup::Done {
                result: Box::new(result),
            });
        }
        if let Some(parked) = self.pipeline.parked.get(id).await? {
            return Ok(ResultLookup::Pending {
                execution_id: id.to_string(),
                awaiting_confirmation: Some(parked.notice()),
            });
        }
        if self.pipeline.claims.holder(id).await?.is_some() {
            return Ok(ResultLookup::Pending {
                execution_id: id.to_string(),
                awaiting_confirmation: None,
            });
        }
        Err(SchedulerError::NoResult {
            id: named.to_string(),
        })
    }
}

/// A result as stored on `results.<id>`, decoded by its content type.
fn decode_result(message: &async_nats::Message) -> Option<ExecResult> {
    let content_type = message
        .headers
        .as_ref()
        .and_then(|h| h.get(codec::CONTENT_TYPE))
        .map(|v| v.as_str().to_string());
    Encoding::from_content_type(content_type.as_deref())
        .ok()
        .and_then(|e| e.decode::<ExecResult>(&message.payload).ok())
}
