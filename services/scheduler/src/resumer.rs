//! `Resumer`: brings parked executions back. Every scheduler instance subscribes to
//! `confirm.decided.*`; on a decision for a parked execution it resumes it through the
//! [`Pipeline`] — the execution claim makes sure only one instance runs it. A sweep looks at
//! every parked execution once at start (a decision may have come while no scheduler ran) and
//! then, every `SANDMESH_SCHED_PARKED_SWEEP_MS`, at those past their expiry: a confirmation
//! that is still pending (or cannot be read) by then counts as timed out, so the execution is
//! denied — nothing parked waits forever.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use messages::confirm::Confirmation;
use messages::exec::ConfirmationOutcome;
use messages::tenancy::scoped;
use messages::{ErrorBody, ErrorKind, Subjects};
use sandmesh_client::{ClientError, MeshClient};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::confirm;
use crate::error::SchedulerError;
use crate::execution::Outcome;
use crate::parking::Parked;
use crate::pipeline::Pipeline;

/// After its expiry, how long a confirmation may stay pending (the confirmation service's own
/// expiry normally decides it first) before the scheduler counts it as timed out.
const EXPIRY_GRACE: Duration = Duration::from_secs(5);
/// Attempts at resuming one execution whose dependencies fail transiently.
const ATTEMPTS: u32 = 5;

#[derive(Clone)]
pub struct Resumer {
    /// Its parked store and confirmations are the sweep's too.
    pipeline: Pipeline,
    /// A resumed execution takes a permit like any other while it runs.
    queue: Arc<Semaphore>,
    /// For the decisions.
    client: async_nats::Client,
    subjects: Subjects,
    sweep: Duration,
    tasks: TaskTracker,
    /// Execution ids this instance is resuming now (an event and a sweep may both see one).
    resuming: Arc<Mutex<HashSet<String>>>,
}

impl Resumer {
    pub fn new(
        pipeline: Pipeline,
        queue: Arc<Semaphore>,
        mesh: &MeshClient,
        sweep: Duration,
        tasks: TaskTracker,
    ) -> Self {
        Self {
            pipeline,
            queue,
            client: mesh.nats().clone(),
            subjects: mesh.subjects().clone(),
            sweep,
            tasks,
            resuming: Arc::default(),
        }
    }

    /// Subscribes to decisions (live before this returns), then serves them and the sweep
    /// until `stop`.
    pub async fn start(
        self,
        stop: CancellationToken,
    ) -> Result<tokio::task::JoinHandle<()>, async_nats::SubscribeError> {
        let mut decided = self
            .client
            .subscribe(self.subjects.confirm_decided_all())
            .await?;
        let _ = self.client.flush().await;
        Ok(tokio::spawn(async move {
            let mut tick = tokio::time::interval(self.sweep);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // The first tick is at once: every parked execution is looked at after a start.
            let mut everything = true;
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    m = decided.next() => match m {
                        // Off the read loop, so a burst of decisions never makes NATS drop
                        // events for a slow subscriber.
                        Some(m) => {
                            let (me, stop) = (self.clone(), stop.clone());
                            self.tasks.spawn(async move { me.on_decided(&m.payload, &stop).await });
                        }
                        None => break,
                    },
                    _ = tick.tick() => {
                        // A sweep reads KV and asks the confirmation service: with NATS gone it
                        // may hang, so it races `stop` (it spawns resumes, never half-does one).
                        tokio::select! {
                            _ = stop.cancelled() => break,
                            _ = self.sweep(everything, &stop) => {}
                        }
                        everything = false;
                    }
                }
            }
        }))
    }

    async fn on_decided(&self, payload: &[u8], stop: &CancellationToken) {
        let Ok(c) = serde_json::from_slice::<Confirmation>(payload) else {
            return;
        };
        let (Some(named), Some(decision)) = (&c.execution_id, confirm::outcome(&c)) else {
            return;
        };
        // Events name the execution as its agent did; parked executions are stored scoped.
        let execution_id = &match &c.tenant {
            Some(tenant) => scoped(tenant, named),
            None => named.clone(),
        };
        match self.pipeline.parked.get(execution_id).await {
            Ok(Some(parked)) if parked.confirmation_id == c.id => {
                self.spawn_resume(parked, decision, stop)
            }
            Ok(_) => {}
            // The expiry sweep finds it.
            Err(e) => tracing::warn!(execution_id, error = %e, "parked execution not read"),
        }
    }

    /// Looks at every parked execution (`everything`) or at those past their expiry.
    async fn sweep(&self, everything: bool, stop: &CancellationToken) {
        let all = match self.pipeline.parked.all().await {
            Ok(all) => all,
            Err(e) => return tracing::warn!(error = %e, "parked executions not listed"),
        };
        let now = messages::now_ms();
        for parked in all {
            if everything || now >= parked.expires_at {
                if let Some(decision) = self.decision(&parked, now).await {
                    self.spawn_resume(parked, decision, stop);
                }
            }
        }
    }

    /// The decision of a parked execution, if there is one now.
    async fn decision(&self, parked: &Parked, now: u64) -> Option<ConfirmationOutcome> {
        let overdue = now >= parked.expires_at + EXPIRY_GRACE.as_millis() as u64;
        match self
            .pipeline
            .confirmations
            .get(&parked.confirmation_id)
            .await
        {
            Ok(c) => confirm::outcome(&c)
                .or_else(|| overdue.then(|| confirm::expired("no decision before it expired"))),
            Err(ClientError::Service { body, .. }) if body.kind == ErrorKind::NotFound => {
                Some(confirm::expired("the confirmation no longer exists"))
            }
            Err(e) => {
                tracing::debug!(id = %parked.confirmation_id, error = %e, "confirmation not read");
                overdue.then(|| confirm::expired("the confirmation service did not answer"))
            }
        }
    }

    fn spawn_resume(
        &self,
        parked: Parked,
        decision: ConfirmationOutcome,
        stop: &CancellationToken,
    ) {
        let id = parked.execution.id.clone();
        if !self
            .resuming
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.clone())
        {
            return;
        }
        let (me, stop) = (self.clone(), stop.clone());
        self.tasks.spawn(async move {
            me.resume(parked, decision, &stop).await;
            me.resuming
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id);
        });
    }

    async fn resume(
        &self,
        parked: Parked,
        decision: ConfirmationOutcome,
        stop: &CancellationToken,
    ) {
        let id = parked.execution.id.clone();
        let _permit = tokio::select! {
            _ = stop.cancelled() => return,
            p = self.queue.clone().acquire_owned() => p,
        };
        let mut last = None;
        for attempt in 1..=ATTEMPTS {
            let failed: SchedulerError =
                match self.pipeline.resume(parked.clone(), decision.clone()).await {
                    Outcome::Retry(e) => e,
                    Outcome::Unstored(_, e) => e.into(),
                    Outcome::Busy(owner) => {
                        return tracing::debug!(execution_id = %id, owner, "resumed elsewhere")
                    }
                    _ => return,
                };
            tracing::info!(execution_id = %id, attempt, error = %failed, "resume will be retried");
            last = Some(failed);
            let pause = Duration::from_secs(u64::from(attempt));
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(pause) => {}
            }
        }
        let last = last.map(|e| e.to_string()).unwrap_or_default();
        let error = ErrorBody::internal(format!(
            "gave up resuming after {ATTEMPTS} attempts: {last}"
        ));
        self.pipeline.fail_parked(parked, error).await;
    }
}
