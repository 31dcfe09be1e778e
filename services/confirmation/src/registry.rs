//! `Registry`: this instance's view of the confirmations bucket and everything that waits on it.
//!
//! It owns the requests waiting for a decision, the expiry timer of every pending confirmation,
//! and a replica of the pending ones, fed by the watch (`Workflow::watch`). It never awaits
//! NATS itself: each request runs its `Workflow` step in a tracked task that replies directly
//! or sends the outcome back here as a message. Because every instance watches the same
//! bucket, a decision written by any instance releases the waiters held by this one, and every
//! instance arms the expiry of every pending confirmation (compare-and-set lets one write it).
//!
//! Its state is rebuilt from the bucket when it starts (the watch replays the current value of
//! every key), so the `Root` can restart it after a crash; only the waiters it held are lost,
//! and they are told to retry.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kit::RequestContext;
use messages::confirm::{
    ConfirmDecide, ConfirmGet, ConfirmList, ConfirmListReply, ConfirmRequest, ConfirmScope,
    ConfirmState, Confirmation,
};
use messages::tenancy::{Caller, OPERATORS_ACCOUNT};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;

use crate::audience::Audience;
use crate::error::{ConfirmError, Reply};
use crate::listing::{self, ParkedLists, Query};
use crate::watch::Observation;
use crate::workflow::Workflow;

/// A waiter is answered at the latest this long after its confirmation expires, even if no
/// instance could record the timeout (NATS unreachable): then with an error to retry on.
pub const WAITER_GRACE: Duration = Duration::from_secs(5);
/// Retry interval for an expiry that could not be written.
pub const EXPIRE_RETRY: Duration = Duration::from_secs(1);
/// How long a stopping registry waits for its tasks (each is a few bounded NATS calls).
const TASKS_GRACE: Duration = Duration::from_secs(5);

pub enum RegistryMsg {
    Request(RequestContext, ConfirmRequest, Reply<Confirmation>),
    Decide(RequestContext, ConfirmDecide, Reply<Confirmation>),
    Get(RequestContext, ConfirmGet, Reply<Confirmation>),
    List(RequestContext, ConfirmList, Reply<ConfirmListReply>),
    /// Answer this port when confirmation `id` (expiring at the given time) is decided.
    Wait(String, u64, Reply<Confirmation>),
    /// A change in the bucket, from the watch.
    Observed(Observation),
    /// A final confirmation learnt by one of our own tasks (before the watch shows it).
    Settled(Confirmation),
    /// A pending confirmation's time is up.
    Expire(String),
    /// The waiters of `id` outlived the expiry plus grace.
    WaiterDeadline(String),
    FailWaiters(String, ConfirmError),
    /// Pending `list`, answered once the replica has applied the given revision.
    ListPending(Query, u64, Reply<ConfirmListReply>),
    ListDeadline,
    /// A session-scoped approval was written: settle the session's covered pending ones.
    SessionGranted(String),
    /// Shutdown: answer every waiter with a retryable error, accept no new ones.
    Drain(RpcReplyPort<()>),
}

/// Gauges for the heartbeat.
#[derive(Debug, Default)]
pub struct Gauges {
    pub pending: AtomicU64,
    pub waiters: AtomicU64,
}

pub struct Registry<W>(PhantomData<fn() -> W>);

impl<W> Default for Registry<W> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

pub struct RegistryArgs<W> {
    pub workflow: W,
    pub gauges: Arc<Gauges>,
}

pub struct RegistryState<W> {
    workflow: W,
    gauges: Arc<Gauges>,
    /// Requests with `wait` whose confirmation is pending, by id; answered when it is final.
    waiters: HashMap<String, Vec<Reply<Confirmation>>>,
    /// Every pending confirmation in the bucket (watch replica): expiry timers run from it and
    /// the pending `list` reads it, so neither scans the bucket.
    pending: HashMap<String, Confirmation>,
    /// The highest bucket revision applied to `pending`.
    applied: u64,
    /// Pending `list`s waiting for `applied` to reach the bucket's revision, so a caller always
    /// sees its own earlier writes.
    parked_lists: ParkedLists,
    /// Set by `Drain`: new waits are refused so shutdown is not held up by them.
    draining: bool,
    /// The workflow steps in flight; closed and awaited when the registry stops.
    tasks: TaskTracker,
    /// Stops the watch when the state is dropped, also when the actor is killed (no
    /// `post_stop` then): a restarted registry starts its own watch.
    _watch: DropGuard,
}

/// Time left until `at_ms` on the workflow's clock.
fn until(workflow: &impl Workflow, at_ms: u64) -> Duration {
    Duration::from_millis(at_ms.saturating_sub(workflow.now_ms()))
}

impl<W: Workflow> Actor for Registry<W> {
    type Msg = RegistryMsg;
    type State = RegistryState<W>;
    type Arguments = RegistryArgs<W>;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: RegistryArgs<W>,
    ) -> Result<Self::State, ActorProcessingErr> {
        let watch = CancellationToken::new();
        let registry = myself.clone();
        let observe = move |o| registry.cast(RegistryMsg::Observed(o)).is_ok();
        args.workflow.watch(Box::new(observe), watch.clone());
        let state = RegistryState {
            workflow: args.workflow,
            gauges: args.gauges,
            waiters: HashMap::new(),
            pending: HashMap::new(),
            applied: 0,
            parked_lists: ParkedLists::default(),
            draining: false,
            tasks: TaskTracker::new(),
            _watch: watch.drop_guard(),
        };
        // A restarted registry must not report its predecessor's numbers.
        state.update_gauges();
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            RegistryMsg::Request(ctx, req, port) => state.request(myself, ctx, req, port),
            RegistryMsg::Wait(id, expires_at, port) => state.wait(myself, id, expires_at, port),
            RegistryMsg::Decide(ctx, decide, port) => state.decide(myself, ctx, decide, port),
            RegistryMsg::Get(ctx, get, port) => state.get(ctx, get, port),
            RegistryMsg::List(ctx, list, port) => state.list(myself, ctx, list, port),
            RegistryMsg::ListPending(list, revision, port) => {
                state.list_pending(myself, list, revision, port)
            }
            RegistryMsg::ListDeadline => state.list_deadline(),
            RegistryMsg::Observed(observation) => state.observed(myself, observation),
            RegistryMsg::Settled(record) => state.settle(&record),
            RegistryMsg::Expire(id) => state.expire(myself, id),
            RegistryMsg::WaiterDeadline(id) => state.waiter_deadline(myself, id),
            RegistryMsg::FailWaiters(id, error) => state.fail_waiters(&id, error),
            RegistryMsg::SessionGranted(session) => state.session_granted(myself, &session),
            RegistryMsg::Drain(done) => {
                state.drain();
                let _ = done.send(());
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.drain();
        state.tasks.close();
        if tokio::time::timeout(TASKS_GRACE, state.tasks.wait())
            .await
            .is_err()
        {
            // What they were writing is redone from the bucket by any instance.
            tracing::warn!(
                tasks = state.tasks.len(),
                "registry stopped with tasks running"
            );
        }
        Ok(())
    }
}

// === impl RegistryState: one method per message ===

impl<W: Workflow> RegistryState<W> {
    fn update_gauges(&self) {
        let waiters = self.waiters.values().map(Vec::len).sum::<usize>();
        self.gauges
            .pending
            .store(self.pending.len() as u64, Ordering::Relaxed);
        self.gauges.waiters.store(waiters as u64, Ordering::Relaxed);
    }

    fn request(
        &self,
        myself: ActorRef<RegistryMsg>,
        ctx: RequestContext,
        req: ConfirmRequest,
        port: Reply<Confirmation>,
    ) {
        if ctx.caller != Caller::Internal {
            // Services ask on behalf of the work they run; a tenant's own request could name any
            // tenant or execution.
            let _ = port.send(Err(ConfirmError::Denied(
                "confirmations are requested by the services that run the work",
            )));
            return;
        }
        let workflow = self.workflow.clone();
        self.tasks.spawn(async move {
            let wait = req.wait;
            let record = match workflow.open(req, ctx.trace_id).await {
                Ok(record) => record,
                Err(e) => return drop(port.send(Err(e))),
            };
            if !wait || record.state.is_final() {
                return drop(port.send(Ok(record)));
            }
            let id = record.id.clone();
            let _ = myself.cast(RegistryMsg::Wait(id.clone(), record.expires_at, port));
            // A decision written before the Wait was queued is not in the watch's future:
            // read once more after registering.
            if let Ok(now) = workflow.get(&id).await {
                if now.state.is_final() {
                    let _ = myself.cast(RegistryMsg::Settled(now));
                }
            }
        });
    }

    fn wait(
        &mut self,
        myself: ActorRef<RegistryMsg>,
        id: String,
        expires_at: u64,
        port: Reply<Confirmation>,
    ) {
        if self.draining {
            let _ = port.send(Err(ConfirmError::Stopping));
            return;
        }
        self.waiters.entry(id.clone()).or_default().push(port);
        myself.send_after(
            until(&self.workflow, expires_at) + WAITER_GRACE,
            move || RegistryMsg::WaiterDeadline(id),
        );
        self.update_gauges();
    }

    fn decide(
        &self,
        myself: ActorRef<RegistryMsg>,
        ctx: RequestContext,
        mut decide: ConfirmDecide,
        port: Reply<Confirmation>,
    ) {
        match &ctx.caller {
            Caller::Agent { .. } => {
                // The server refuses agents this subject; this is the second lock.
                let _ = port.send(Err(ConfirmError::Denied(
                    "agents cannot decide confirmations; an operator must",
                )));
                return;
            }
            // The decision is recorded as the authenticated operator, whatever `by` says.
            Caller::Operator { user } => {
                decide.by = user.clone();
                decide.by_account = Some(OPERATORS_ACCOUNT.to_string());
            }
            Caller::Internal => decide.by_account = None,
        }
        let audience = self.workflow.audience(&ctx.caller);
        let workflow = self.workflow.clone();
        self.tasks.spawn(async move {
            if let Err(e) = visible(&workflow, &audience, &decide.id).await {
                return drop(port.send(Err(e)));
            }
            let outcome = workflow.decide(decide, ctx.trace_id).await;
            if let Ok(record) = &outcome {
                if record.scope == ConfirmScope::Session && record.state == ConfirmState::Approved {
                    if let Some(session) = &record.session_id {
                        let _ = myself.cast(RegistryMsg::SessionGranted(session.clone()));
                    }
                }
                let _ = myself.cast(RegistryMsg::Settled(record.clone()));
            }
            let _ = port.send(outcome);
        });
    }

    fn get(&self, ctx: RequestContext, get: ConfirmGet, port: Reply<Confirmation>) {
        let audience = self.workflow.audience(&ctx.caller);
        let workflow = self.workflow.clone();
        self.tasks
            .spawn(async move { port.send(visible(&workflow, &audience, &get.id).await) });
    }

    fn list(
        &self,
        myself: ActorRef<RegistryMsg>,
        ctx: RequestContext,
        list: ConfirmList,
        port: Reply<ConfirmListReply>,
    ) {
        if let Err(e) = listing::check(&list) {
            let _ = port.send(Err(e.into()));
            return;
        }
        let query = Query {
            list,
            audience: self.workflow.audience(&ctx.caller),
        };
        let workflow = self.workflow.clone();
        self.tasks.spawn(async move {
            if !listing::wants_pending(&query.list) {
                return drop(port.send(workflow.scan(&query).await));
            }
            // Pending ones come from the replica, once it has caught up with the bucket.
            match workflow.last_revision().await {
                Ok(revision) => {
                    let _ = myself.cast(RegistryMsg::ListPending(query, revision, port));
                }
                Err(e) => drop(port.send(Err(e))),
            }
        });
    }

    fn list_pending(
        &mut self,
        myself: ActorRef<RegistryMsg>,
        query: Query,
        revision: u64,
        port: Reply<ConfirmListReply>,
    ) {
        if self.applied >= revision {
            let _ = port.send(Ok(listing::from_replica(&self.pending, &query)));
            return;
        }
        self.parked_lists.park(query, revision, port);
        myself.send_after(listing::BARRIER, || RegistryMsg::ListDeadline);
    }

    fn list_deadline(&mut self) {
        self.parked_lists.release_due(self.applied, &self.pending);
    }

    fn observed(&mut self, myself: ActorRef<RegistryMsg>, observation: Observation) {
        self.applied = self.applied.max(observation.revision);
        if let Some(record) = observation.record {
            if record.state.is_final() {
                self.settle(&record);
            } else {
                let id = record.id.clone();
                if !self.pending.contains_key(&id) {
                    myself.send_after(until(&self.workflow, record.expires_at), move || {
                        RegistryMsg::Expire(id)
                    });
                }
                self.pending.insert(record.id.clone(), record);
                self.update_gauges();
            }
        }
        self.parked_lists
            .release_applied(self.applied, &self.pending);
    }

    fn settle(&mut self, record: &Confirmation) {
        if !record.state.is_final() {
            return;
        }
        self.pending.remove(&record.id);
        for port in self.waiters.remove(&record.id).unwrap_or_default() {
            let _ = port.send(Ok(record.clone()));
        }
        self.update_gauges();
    }

    fn expire(&self, myself: ActorRef<RegistryMsg>, id: String) {
        if !self.pending.contains_key(&id) {
            return;
        }
        let workflow = self.workflow.clone();
        // Every instance does this; compare-and-set lets exactly one write the timeout.
        self.tasks.spawn(async move {
            match workflow.expire(&id).await {
                Ok(record) if record.state.is_final() => {
                    let _ = myself.cast(RegistryMsg::Settled(record));
                }
                Ok(record) => {
                    // Not yet due by the workflow's clock: try again when it is.
                    myself.send_after(until(&workflow, record.expires_at), move || {
                        RegistryMsg::Expire(id)
                    });
                }
                // Gone from the bucket: nothing left to expire.
                Err(ConfirmError::NotFound { .. }) => {}
                Err(e) => {
                    tracing::warn!(%id, error = %e, "could not record a timeout; retrying");
                    myself.send_after(EXPIRE_RETRY, move || RegistryMsg::Expire(id));
                }
            }
        });
    }

    fn waiter_deadline(&self, myself: ActorRef<RegistryMsg>, id: String) {
        if !self.waiters.contains_key(&id) {
            return;
        }
        let workflow = self.workflow.clone();
        self.tasks.spawn(async move {
            let msg = match workflow.expire(&id).await {
                Ok(record) if record.state.is_final() => RegistryMsg::Settled(record),
                Ok(_) => RegistryMsg::FailWaiters(id, ConfirmError::Undecided),
                Err(e) => RegistryMsg::FailWaiters(id, e),
            };
            let _ = myself.cast(msg);
        });
    }

    fn fail_waiters(&mut self, id: &str, error: ConfirmError) {
        let error = Arc::new(error);
        for port in self.waiters.remove(id).unwrap_or_default() {
            let _ = port.send(Err(ConfirmError::Shared(error.clone())));
        }
        self.update_gauges();
    }

    fn session_granted(&self, myself: ActorRef<RegistryMsg>, session: &str) {
        let ids: Vec<String> = self
            .pending
            .values()
            .filter(|c| c.session_id.as_deref() == Some(session))
            .map(|c| c.id.clone())
            .collect();
        let workflow = self.workflow.clone();
        self.tasks.spawn(async move {
            for id in ids {
                match workflow.settle_by_grant(&id).await {
                    Ok(Some(record)) => drop(myself.cast(RegistryMsg::Settled(record))),
                    Ok(None) => {}
                    Err(e) => tracing::warn!(%id, error = %e, "session grant not applied"),
                }
            }
        });
    }

    fn drain(&mut self) {
        self.draining = true;
        for (_, ports) in self.waiters.drain() {
            for port in ports {
                let _ = port.send(Err(ConfirmError::Stopping));
            }
        }
        self.update_gauges();
    }
}

#[cfg(test)]
mod tests;

/// The confirmation, if `audience` may see it; else the same 404 as for an unknown id.
async fn visible<W: Workflow>(
    workflow: &W,
    audience: &Audience,
    id: &str,
) -> Result<Confirmation, ConfirmError> {
    let record = workflow.get(id).await?;
    if audience.sees(&record) {
        Ok(record)
    } else {
        Err(ConfirmError::NotFound { id: id.to_string() })
    }
}
