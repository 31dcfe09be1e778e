//! Async intake: a durable pull consumer on `SANDBOX_JOBS`. Jobs are fetched only while the
//! queue has room (so they wait in the stream, not in memory), in small batches; a running job
//! sends `Progress` so it is not redelivered, and is acked only after its result is stored.
//!
//! Nothing accepted is lost: a job that cannot run now (no executor can take it, one
//! restarting) is nak'ed with an exponential backoff and comes back, until its queue deadline
//! (publication + `SANDMESH_SCHED_JOB_QUEUE_TTL_MS`, minutes by default); a job whose scheduler
//! died comes back after `ack_wait` and finds its stored result (or the expired claim) instead
//! of running twice; past its deadline it gets a stored terminal `unavailable` result naming
//! the last reason. The consumer's own `max_deliver` is unlimited, so the server never drops a
//! job on its own. A job that waits for a person is acked once it is parked (durably, in KV):
//! the resumed execution stores its result.

use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{pull, AckPolicy, Consumer};
use async_nats::jetstream::{AckKind, Message};
use futures::StreamExt;
use messages::codec;
use messages::exec::{ExecRequest, ExecStatus};
use messages::tenancy::{validate_scoped_id, Caller};
use messages::validate::validate_id;
use messages::{Encoding, ErrorBody, Subjects};
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::error::SchedulerError;
use crate::execution::{mint_id, scope_request, terminal, Origin, Outcome};
use crate::fairness::{Admission, TenantSlot};
use crate::pipeline::Pipeline;

/// The durable consumer shared by every scheduler instance.
pub const CONSUMER: &str = "scheduler";

/// How jobs are pulled and retried.
#[derive(Debug, Clone, Copy)]
pub struct JobSettings {
    /// How long after its publication a job may still be retried.
    pub queue_ttl: Duration,
    /// How long a delivered job may go without an ack or progress before redelivery.
    pub ack_wait: Duration,
    /// Jobs pulled per fetch (never more than free queue slots).
    pub batch: usize,
    /// A job whose id another scheduler holds checks back after a third of this.
    pub claim_ttl: Duration,
}

/// The async intake: jobs from `SANDBOX_JOBS` through the [`Pipeline`].
#[derive(Clone)]
pub struct Jobs {
    /// Its result store is where a job that can never run is answered.
    pipeline: Pipeline,
    /// A job's tenant is in its subject (`jobs.<tenant>.exec`, guaranteed by the server).
    subjects: Subjects,
    /// Shared with sync intake: a job runs only with a permit, and a tenant over its share
    /// waits while others' jobs go on.
    admission: Admission,
    settings: JobSettings,
}

#[derive(Debug, thiserror::Error)]
pub enum JobsError {
    #[error("the jobs stream")]
    Stream(#[source] kit::KitError),
    #[error("creating the jobs consumer")]
    Consumer(#[source] async_nats::jetstream::stream::ConsumerError),
}

impl Jobs {
    pub fn new(
        pipeline: Pipeline,
        subjects: Subjects,
        admission: Admission,
        settings: JobSettings,
    ) -> Self {
        Self {
            pipeline,
            subjects,
            admission,
            settings,
        }
    }

    pub async fn consumer(
        &self,
        js: &async_nats::jetstream::Context,
        subjects: &Subjects,
        replicas: usize,
    ) -> Result<Consumer<pull::Config>, JobsError> {
        let stream = kit::bootstrap::jobs_stream(js, subjects, replicas)
            .await
            .map_err(JobsError::Stream)?;
        stream
            .get_or_create_consumer(
                CONSUMER,
                pull::Config {
                    durable_name: Some(CONSUMER.into()),
                    // Every tenant's `jobs.<tenant>.exec` and the services' own `jobs.exec`.
                    filter_subject: subjects.jobs_all(),
                    ack_policy: AckPolicy::Explicit,
                    ack_wait: self.settings.ack_wait,
                    max_deliver: -1,
                    max_ack_pending: 10_000,
                    ..Default::default()
                },
            )
            .await
            .map_err(JobsError::Consumer)
    }
}

/// Pulls jobs and runs each on `running` until `stop`; the caller waits for those (bounded).
pub async fn run(
    jobs: Jobs,
    consumer: Consumer<pull::Config>,
    stop: CancellationToken,
    running: TaskTracker,
) {
    let batch = jobs.settings.batch;
    while !stop.is_cancelled() {
        // Wait for room without holding it, so sync requests keep every free slot meanwhile.
        tokio::select! {
            _ = stop.cancelled() => break,
            permit = jobs.admission.queue.clone().acquire_owned() => drop(permit),
        }
        let room = jobs.admission.queue.available_permits().clamp(1, batch);
        // Every NATS wait races `stop`: with the server gone, a fetch or a batch may never end.
        let fetch = consumer
            .batch()
            .max_messages(room)
            .expires(Duration::from_secs(1))
            .messages();
        let fetched = tokio::select! {
            _ = stop.cancelled() => break,
            f = fetch => f,
        };
        let mut messages = match fetched {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "fetching jobs failed; retrying");
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                }
            }
        };
        loop {
            // Jobs of the batch not taken yet come back after `ack_wait`.
            let next = tokio::select! {
                _ = stop.cancelled() => break,
                next = messages.next() => next,
            };
            let Some(message) = next else { break };
            let message = match message {
                Ok(m) => m,
                Err(e) => {
                    tracing::debug!(error = %e, "job batch ended");
                    break;
                }
            };
            // A tenant at its share of the queue: back to the stream for a moment, so the
            // jobs of other tenants behind these are taken meanwhile (its queue time keeps
            // counting). Checked before a slot of the queue is taken: a job only being turned
            // away must not hold one, or a flood of one tenant's jobs, fetched and turned away
            // over and over, keeps the queue full for everyone's sync requests.
            let tenant = jobs
                .subjects
                .tenant_of_job(message.subject.as_str())
                .ok()
                .flatten();
            let tenant_slot = match jobs.admission.tenants.take(tenant.as_ref()) {
                Ok(slot) => slot,
                Err(_) => {
                    nak(
                        &message,
                        Duration::from_millis(messages::quota::RETRY_AFTER_MS),
                    )
                    .await;
                    continue;
                }
            };
            match jobs.admission.queue.clone().try_acquire_owned() {
                Ok(permit) => {
                    running.spawn(handle(jobs.clone(), message, permit, tenant_slot));
                }
                // A sync request took the slot since we looked: let the job come back later.
                Err(_) => {
                    let _ = message
                        .ack_with(AckKind::Nak(Some(Duration::from_millis(500))))
                        .await;
                }
            }
        }
    }
}

/// Keeps a job from being redelivered while it runs.
fn keep_alive(message: &Message, every: Duration) -> CancellationToken {
    let done = CancellationToken::new();
    let (token, message) = (done.clone(), message.clone());
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = token.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
            if let Err(e) = message.ack_with(AckKind::Progress).await {
                tracing::debug!(error = %e, "progress ack failed");
            }
        }
    });
    done
}

/// Runs one job holding a slot of the queue and one of its tenant's share.
async fn handle(
    jobs: Jobs,
    message: Message,
    permit: OwnedSemaphorePermit,
    tenant_slot: Option<TenantSlot>,
) {
    let msg_id = message
        .headers
        .as_ref()
        .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
        .map(|v| v.as_str().to_string())
        .filter(|id| validate_id("Nats-Msg-Id", id).is_ok());
    let span = tracing::info_span!("job", msg_id = msg_id.as_deref().unwrap_or(""));
    kit::telemetry::set_parent_from(&span, message.headers.as_ref());
    handle_job(jobs, message, msg_id).instrument(span).await;
    drop((permit, tenant_slot));
}

async fn handle_job(jobs: Jobs, message: Message, msg_id: Option<String>) {
    let received = Instant::now();
    let (delivered, queued_ms) = match message.info() {
        Ok(info) => {
            let published = info.published.unix_timestamp_nanos() / 1_000_000;
            let queued = (messages::now_ms() as i128 - published).max(0) as u64;
            (info.delivered, queued)
        }
        Err(_) => (1, 0),
    };
    let settings = jobs.settings;
    let queue_ttl_ms = settings.queue_ttl.as_millis() as u64;
    let left = Duration::from_millis(queue_ttl_ms.saturating_sub(queued_ms));
    let header = |name: &str| {
        message
            .headers
            .as_ref()
            .and_then(|h| h.get(name))
            .map(|v| v.as_str().to_string())
    };
    let alive = keep_alive(&message, settings.ack_wait / 3);

    let decoded = Encoding::from_content_type(header(codec::CONTENT_TYPE).as_deref())
        .map_err(ErrorBody::from)
        .and_then(|e| {
            e.decode::<ExecRequest>(&message.payload)
                .map_err(ErrorBody::from)
        });
    let caller = match jobs.subjects.tenant_of_job(message.subject.as_str()) {
        Ok(None) => Caller::Internal,
        Ok(Some(tenant)) => Caller::Agent {
            tenant,
            user: String::new(),
        },
        Err(e) => {
            alive.cancel();
            tracing::warn!(error = %e, "job on an unexpected subject dropped");
            let _ = message.ack_with(AckKind::Term).await;
            return;
        }
    };
    // The id as stored: scoped by the job's tenant.
    let stored_id = msg_id.and_then(|id| caller.scope("execution_id", &id).ok());
    let scoped = decoded.and_then(|r| scope_request(&caller, r).map_err(ErrorBody::from));
    let mut req = match scoped {
        Ok(req) => req,
        Err(error) => {
            alive.cancel();
            return refuse(&jobs, &message, stored_id, None, error).await;
        }
    };
    if req.execution_id.is_none() {
        req.execution_id = stored_id;
    }
    let id = req.execution_id.clone().unwrap_or_else(|| mint_id(&caller));
    req.execution_id = Some(id.clone());

    // Past its deadline (also for a job whose schedulers kept dying under it): given up.
    if left.is_zero() && delivered > 1 {
        alive.cancel();
        let error = ErrorBody::unavailable(format!(
            "no executor ran it within the job's queue time ({} s, {} deliveries)",
            settings.queue_ttl.as_secs(),
            delivered - 1
        ));
        let failed = terminal(&id, &req, ExecStatus::Unavailable, error);
        return store_and_ack(&jobs, &message, failed).await;
    }
    let origin = Origin {
        received,
        queued_ms,
        trace_id: kit::telemetry::current_trace_id(),
        caller,
        // Acked only once the result is stored, so a job outlives a scheduler that dies mid-run.
        sync_reply: false,
        reviewed: None,
    };
    let outcome = jobs.pipeline.execute(req.clone(), origin).await;
    alive.cancel();
    let error: SchedulerError = match outcome {
        // Parked: durable in KV, so the job is done; the resumed execution stores the result.
        Outcome::Done(_) | Outcome::Parked(_) => return ack(&message).await,
        Outcome::Invalid(error) => {
            return refuse(&jobs, &message, Some(id), Some(&req), error).await
        }
        Outcome::Busy(owner) => {
            tracing::debug!(execution_id = %id, owner, "job runs elsewhere; checking back later");
            return nak(&message, settings.claim_ttl / 3).await;
        }
        Outcome::Retry(error) => error,
        Outcome::Unstored(_, error) => error.into(),
    };
    // What is left of the queue time after this try.
    let left = left.saturating_sub(received.elapsed());
    if left.is_zero() {
        let error = ErrorBody::unavailable(format!(
            "no executor ran it within the job's queue time ({} s, {delivered} \
             deliveries); the last try: {}",
            settings.queue_ttl.as_secs(),
            ErrorBody::from(error).message
        ));
        let failed = terminal(&id, &req, ExecStatus::Unavailable, error);
        store_and_ack(&jobs, &message, failed).await;
    } else {
        let delay = backoff(delivered).min(left);
        tracing::info!(execution_id = %id, delivered, ?delay, error = %error, "job will be retried");
        nak(&message, delay).await;
    }
}

/// The wait before a job's next try: 250 ms doubling with each delivery, at most 10 s (an
/// executor restarting takes tens of seconds; a few tries a minute find it soon after).
fn backoff(delivered: i64) -> Duration {
    let exponent = delivered.clamp(1, 7) as u32 - 1;
    Duration::from_millis(250 * 2u64.pow(exponent)).min(Duration::from_secs(10))
}

/// A job that can never run: stored as `rejected` when it has a usable id, else terminated
/// (nobody could look its result up) with the reason logged.
async fn refuse(
    jobs: &Jobs,
    message: &Message,
    id: Option<String>,
    req: Option<&ExecRequest>,
    error: ErrorBody,
) {
    let id = id.filter(|id| validate_scoped_id("execution_id", id).is_ok());
    match id {
        Some(id) => {
            let blank = ExecRequest::default();
            let failed = terminal(&id, req.unwrap_or(&blank), ExecStatus::Rejected, error);
            store_and_ack(jobs, message, failed).await;
        }
        None => {
            tracing::warn!(error = %error, "job without a usable execution id dropped as unreadable");
            let _ = message.ack_with(AckKind::Term).await;
        }
    }
}

async fn store_and_ack(jobs: &Jobs, message: &Message, result: messages::exec::ExecResult) {
    match jobs.pipeline.results.put(&result).await {
        Ok(()) => ack(message).await,
        Err(e) => {
            tracing::error!(execution_id = %result.execution_id, error = %e, "result not stored; job will come back");
            nak(message, Duration::from_secs(2)).await;
        }
    }
}

async fn ack(message: &Message) {
    // Double ack: the server confirms, so an ack lost on the way cannot cause a redelivery
    // we did not expect (which would still be harmless: the result is stored). Retried
    // through a reconnect or a consumer leader election, briefly.
    let acked = kit::retry("acking a job", kit::RetryPolicy::ACK, || async {
        message.double_ack().await.map_err(kit::retry::Boxed)
    });
    if let Err(e) = acked.await {
        tracing::warn!(error = %e, "job ack not confirmed; a redelivery will find the result");
    }
}

async fn nak(message: &Message, delay: Duration) {
    let nak = kit::retry("nak'ing a job", kit::RetryPolicy::ACK, || async {
        let nak = AckKind::Nak(Some(delay));
        message.ack_with(nak).await.map_err(kit::retry::Boxed)
    });
    if let Err(e) = nak.await {
        tracing::warn!(error = %e, "job nak failed; it comes back after ack_wait");
    }
}
