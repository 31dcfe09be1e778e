//! `Registry`: this instance's view of the confirmations bucket and everything that waits on it.
//!
//! It owns the requests waiting for a decision, the expiry timer of every pending confirmation,
//! and a replica of the pending ones, fed by the KV watch (`watch.rs`). It never awaits NATS
//! itself: each request runs its `Workflow` step in a task that replies directly or sends the
//! outcome back here. Because every instance watches the same bucket, a decision written by
//! any instance releases the waiters held by this one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kit::{CancellationToken, RequestContext};
use messages::confirm::{
    ConfirmDecide, ConfirmGet, ConfirmList, ConfirmListReply, ConfirmRequest, ConfirmScope,
    ConfirmState, Confirmation,
};
use messages::ErrorBody;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::listing;
use crate::watch::{self, Observation};
use crate::workflow::Workflow;

pub type Reply<T> = RpcReplyPort<Result<T, ErrorBody>>;

/// A waiter is answered at the latest this long after its confirmation expires, even if no
/// instance could record the timeout (NATS unreachable): then with an error to retry on.
const WAITER_GRACE: Duration = Duration::from_secs(5);
/// How long `list` waits for the replica to catch up with the bucket before answering anyway.
const LIST_BARRIER: Duration = Duration::from_secs(2);
/// Retry interval for an expiry that could not be written.
const EXPIRE_RETRY: Duration = Duration::from_secs(1);

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
    FailWaiters(String, ErrorBody),
    /// Pending `list`, answered once the replica has applied the given revision.
    ListPending(ConfirmList, u64, Reply<ConfirmListReply>),
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

pub struct Registry;

pub struct RegistryArgs {
    pub workflow: Workflow,
    pub gauges: Arc<Gauges>,
}

pub struct RegistryState {
    workflow: Workflow,
    gauges: Arc<Gauges>,
    /// Requests with `wait` whose confirmation is pending, by id; answered when it is final.
    waiters: HashMap<String, Vec<Reply<Confirmation>>>,
    /// Every pending confirmation in the bucket (watch replica): expiry timers run from it and
    /// the pending `list` reads it, so neither scans the bucket.
    pending: HashMap<String, Confirmation>,
    /// The highest bucket revision applied to `pending`; `list` waits for it to reach the
    /// bucket's revision so a caller always sees its own earlier writes.
    applied: u64,
    parked_lists: Vec<(ConfirmList, u64, Instant, Reply<ConfirmListReply>)>,
    /// Set by `Drain`: new waits are refused so shutdown is not held up by them.
    draining: bool,
    watch_stop: CancellationToken,
}

impl RegistryState {
    fn update_gauges(&self) {
        let waiters = self.waiters.values().map(Vec::len).sum::<usize>();
        self.gauges
            .pending
            .store(self.pending.len() as u64, Ordering::Relaxed);
        self.gauges.waiters.store(waiters as u64, Ordering::Relaxed);
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
}

fn stopping() -> ErrorBody {
    ErrorBody::unavailable(
        "this confirmation instance is stopping; retry the request (same execution_id) or get \
         the confirmation by id — its state is kept",
    )
}

fn until(at_ms: u64) -> Duration {
    Duration::from_millis(at_ms.saturating_sub(messages::now_ms()))
}

impl Actor for Registry {
    type Msg = RegistryMsg;
    type State = RegistryState;
    type Arguments = RegistryArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: RegistryArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let watch_stop = CancellationToken::new();
        watch::spawn(
            args.workflow.store.kv().clone(),
            myself.clone(),
            watch_stop.clone(),
        );
        Ok(RegistryState {
            workflow: args.workflow,
            gauges: args.gauges,
            waiters: HashMap::new(),
            pending: HashMap::new(),
            applied: 0,
            parked_lists: Vec::new(),
            draining: false,
            watch_stop,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let workflow = state.workflow.clone();
        match msg {
            RegistryMsg::Request(ctx, req, port) => {
                let wait = req.wait;
                tokio::spawn(async move {
                    let opened = match workflow.open(req, ctx.trace_id).await {
                        Ok(o) => o,
                        Err(e) => return drop(port.send(Err(e))),
                    };
                    let record = opened.record;
                    if !wait || record.state.is_final() {
                        return drop(port.send(Ok(record)));
                    }
                    let _ = myself.cast(RegistryMsg::Wait(
                        record.id.clone(),
                        record.expires_at,
                        port,
                    ));
                    // A decision written before the Wait was queued is not in the watch's
                    // future: read once more after registering.
                    if let Ok(now) = workflow.get(&record.id).await {
                        if now.state.is_final() {
                            let _ = myself.cast(RegistryMsg::Settled(now));
                        }
                    }
                });
            }
            RegistryMsg::Wait(id, expires_at, port) => {
                if state.draining {
                    let _ = port.send(Err(stopping()));
                    return Ok(());
                }
                state.waiters.entry(id.clone()).or_default().push(port);
                myself.send_after(until(expires_at) + WAITER_GRACE, move || {
                    RegistryMsg::WaiterDeadline(id)
                });
                state.update_gauges();
            }
            RegistryMsg::Decide(ctx, decide, port) => {
                tokio::spawn(async move {
                    let outcome = workflow.decide(decide, ctx.trace_id).await;
                    if let Ok(record) = &outcome {
                        if record.scope == ConfirmScope::Session
                            && record.state == ConfirmState::Approved
                        {
                            if let Some(session) = &record.session_id {
                                let _ = myself.cast(RegistryMsg::SessionGranted(session.clone()));
                            }
                        }
                        let _ = myself.cast(RegistryMsg::Settled(record.clone()));
                    }
                    let _ = port.send(outcome);
                });
            }
            RegistryMsg::Get(_, get, port) => {
                tokio::spawn(async move { port.send(workflow.get(&get.id).await) });
            }
            RegistryMsg::List(_, list, port) => {
                if let Err(e) = listing::check(&list) {
                    let _ = port.send(Err(e));
                    return Ok(());
                }
                tokio::spawn(async move {
                    if !listing::wants_pending(&list) {
                        return drop(port.send(listing::scan(&workflow.store, &list).await));
                    }
                    // Pending ones come from the replica, once it has caught up with the bucket.
                    match workflow.store.last_revision().await {
                        Ok(revision) => {
                            let _ = myself.cast(RegistryMsg::ListPending(list, revision, port));
                        }
                        Err(e) => drop(port.send(Err(e.into()))),
                    }
                });
            }
            RegistryMsg::ListPending(list, revision, port) => {
                if state.applied >= revision {
                    let _ = port.send(Ok(listing::from_replica(&state.pending, &list)));
                } else {
                    state
                        .parked_lists
                        .push((list, revision, Instant::now() + LIST_BARRIER, port));
                    myself.send_after(LIST_BARRIER, || RegistryMsg::ListDeadline);
                }
            }
            RegistryMsg::ListDeadline => {
                let now = Instant::now();
                let (due, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut state.parked_lists)
                    .into_iter()
                    .partition(|(_, _, deadline, _)| *deadline <= now);
                state.parked_lists = keep;
                for (list, revision, _, port) in due {
                    tracing::warn!(
                        revision,
                        applied = state.applied,
                        "list answered from a lagging replica"
                    );
                    let _ = port.send(Ok(listing::from_replica(&state.pending, &list)));
                }
            }
            RegistryMsg::Observed(observation) => {
                state.applied = state.applied.max(observation.revision);
                if let Some(record) = observation.record {
                    if record.state.is_final() {
                        state.settle(&record);
                    } else {
                        let id = record.id.clone();
                        if !state.pending.contains_key(&id) {
                            myself.send_after(until(record.expires_at), move || {
                                RegistryMsg::Expire(id)
                            });
                        }
                        state.pending.insert(record.id.clone(), record);
                        state.update_gauges();
                    }
                }
                let applied = state.applied;
                let (ready, parked): (Vec<_>, Vec<_>) = std::mem::take(&mut state.parked_lists)
                    .into_iter()
                    .partition(|(_, revision, _, _)| *revision <= applied);
                state.parked_lists = parked;
                for (list, _, _, port) in ready {
                    let _ = port.send(Ok(listing::from_replica(&state.pending, &list)));
                }
            }
            RegistryMsg::Settled(record) => state.settle(&record),
            RegistryMsg::Expire(id) => {
                if !state.pending.contains_key(&id) {
                    return Ok(());
                }
                // Every instance does this; compare-and-set lets exactly one write the timeout.
                tokio::spawn(async move {
                    match workflow.expire(&id, None).await {
                        Ok(record) if record.state.is_final() => {
                            let _ = myself.cast(RegistryMsg::Settled(record));
                        }
                        Ok(record) => {
                            myself.send_after(until(record.expires_at), move || {
                                RegistryMsg::Expire(id)
                            });
                        }
                        Err(e) if e.code == 404 => {}
                        Err(e) => {
                            tracing::warn!(%id, error = %e, "could not record a timeout; retrying");
                            myself.send_after(EXPIRE_RETRY, move || RegistryMsg::Expire(id));
                        }
                    }
                });
            }
            RegistryMsg::WaiterDeadline(id) => {
                if !state.waiters.contains_key(&id) {
                    return Ok(());
                }
                tokio::spawn(async move {
                    let msg = match workflow.expire(&id, None).await {
                        Ok(record) if record.state.is_final() => RegistryMsg::Settled(record),
                        Ok(_) => RegistryMsg::FailWaiters(
                            id,
                            ErrorBody::timeout("no decision observed in time; get it by id"),
                        ),
                        Err(e) => RegistryMsg::FailWaiters(id, e),
                    };
                    let _ = myself.cast(msg);
                });
            }
            RegistryMsg::FailWaiters(id, error) => {
                for port in state.waiters.remove(&id).unwrap_or_default() {
                    let _ = port.send(Err(error.clone()));
                }
                state.update_gauges();
            }
            RegistryMsg::SessionGranted(session) => {
                let ids: Vec<String> = state
                    .pending
                    .values()
                    .filter(|c| c.session_id.as_deref() == Some(session.as_str()))
                    .map(|c| c.id.clone())
                    .collect();
                tokio::spawn(async move {
                    for id in ids {
                        match workflow.settle_by_grant(&id).await {
                            Ok(Some(record)) => drop(myself.cast(RegistryMsg::Settled(record))),
                            Ok(None) => {}
                            Err(e) => tracing::warn!(%id, error = %e, "session grant not applied"),
                        }
                    }
                });
            }
            RegistryMsg::Drain(done) => {
                state.draining = true;
                for (_, ports) in state.waiters.drain() {
                    for port in ports {
                        let _ = port.send(Err(stopping()));
                    }
                }
                state.update_gauges();
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
        state.watch_stop.cancel();
        for (_, ports) in state.waiters.drain() {
            for port in ports {
                let _ = port.send(Err(stopping()));
            }
        }
        Ok(())
    }
}
