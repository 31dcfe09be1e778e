//! `Pool`: owns all pool state ([`PoolState`]) and the `Instance` actors, so `acquire` is one
//! message and cannot race (no TOCTOU between "is there a free one" and "take it"). It
//! carries out the state machine's effects: containers are created in spawned tasks (a cold
//! start takes seconds; the pool keeps answering meanwhile), instances are stopped to be
//! destroyed, waiting acquires are answered. The warmer and the idle reaper are its tick.
//! Instances are linked children: when one stops (destroyed, used up, unhealthy), the pool
//! hears it in `handle_supervisor_evt` and frees its capacity.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bollard::Docker;
use kit::RequestContext;
use messages::browser::{
    AioAcquire, AioExec, AioExecResult, AioLease, AioRelease, AioReleased, AioStats,
};
use messages::quota::{OverQuota, Quota};
use messages::tenancy::{scoped, tenant_of_scoped};
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio::time::Instant;

use crate::docker::{start_instance, InstanceSpec, OwnedContainer, Registry, Started};
use crate::error::PoolError;
use crate::instance::{Instance, InstanceArgs, InstanceMsg};
use crate::state::{AcquireError, Effect, InstanceId, PoolState, UseError, WaiterId};

type Reply<T> = RpcReplyPort<Result<T, PoolError>>;

/// Largest command `aio.exec` forwards (code travels inside it; files belong in the
/// workspace API).
pub const MAX_COMMAND_BYTES: usize = 512 * 1024;

pub enum PoolMsg {
    Acquire(RequestContext, AioAcquire, Reply<AioLease>),
    Release(RequestContext, AioRelease, Reply<AioReleased>),
    Exec(RequestContext, AioExec, Reply<AioExecResult>),
    Stats(
        RequestContext,
        messages::browser::AioStatsRequest,
        Reply<AioStats>,
    ),
    /// A creation task finished.
    Created(InstanceId, Result<(OwnedContainer, Started), String>),
    /// An instance finished an execution (idle time counts from here).
    Touched(InstanceId),
    /// Warmer, idle reclaim, waiter deadlines.
    Tick,
}

/// The pool's figures, readable by the heartbeat without a message.
#[derive(Debug, Default)]
pub struct Gauges {
    pub creating: AtomicU32,
    pub warm: AtomicU32,
    pub bound: AtomicU32,
    pub retiring: AtomicU32,
    pub waiting: AtomicU32,
    /// What each tenant holds here (its quota's count), for the heartbeat.
    pub tenants: Mutex<BTreeMap<String, u32>>,
}

impl Gauges {
    fn set(&self, state: &PoolState) {
        let c = state.counts();
        *self.tenants.lock().unwrap_or_else(|p| p.into_inner()) = state.held_per_tenant();
        self.creating.store(c.creating as u32, Ordering::Relaxed);
        self.warm.store(c.warm as u32, Ordering::Relaxed);
        self.bound.store(c.bound as u32, Ordering::Relaxed);
        self.retiring.store(c.retiring as u32, Ordering::Relaxed);
        self.waiting.store(c.waiting as u32, Ordering::Relaxed);
    }

    pub fn stats(&self, min: usize, max: usize) -> AioStats {
        let creating = self.creating.load(Ordering::Relaxed);
        let warm = self.warm.load(Ordering::Relaxed);
        let bound = self.bound.load(Ordering::Relaxed);
        let retiring = self.retiring.load(Ordering::Relaxed);
        AioStats {
            total: creating + warm + bound + retiring,
            warm,
            bound,
            max: max as u32,
            creating,
            retiring,
            waiting: self.waiting.load(Ordering::Relaxed),
            min: min as u32,
        }
    }
}

pub struct Pool;

pub struct PoolArgs {
    pub docker: Docker,
    pub spec: InstanceSpec,
    pub registry: Registry,
    pub state: PoolState,
    pub gauges: Arc<Gauges>,
    pub health_interval: Duration,
    pub default_exec_timeout: Duration,
    pub max_exec_timeout: Duration,
    pub max_output_chars: usize,
    /// Each tenant's `aio_instances` quota.
    pub quotas: Arc<kit::QuotaBook>,
    /// What the other pools hold per tenant: the quota counts the mesh.
    pub peers: Arc<kit::PeerCounts>,
}

/// The lease's `base_url`: the instance's API over its control socket, as an `http+unix`
/// URL (the socket's host path, percent-encoded, as the host).
fn control_url(socket: &std::path::Path) -> String {
    let path = socket.display().to_string();
    format!(
        "http+unix://{}/",
        path.replace('%', "%25").replace('/', "%2F")
    )
}

/// A live instance.
struct Live {
    actor: ActorRef<InstanceMsg>,
    name: String,
    base_url: String,
}

/// An acquire waiting for its answer.
struct Waiting {
    session: String,
    browser: bool,
    reply: Reply<AioLease>,
}

pub struct PoolStateHolder {
    args: PoolArgs,
    live: HashMap<InstanceId, Live>,
    by_actor: HashMap<ActorId, InstanceId>,
    by_name: HashMap<String, InstanceId>,
    waiting: HashMap<WaiterId, Waiting>,
    next_waiter: WaiterId,
}

/// The session id as the pool keys it: scoped by the caller's tenant (internal callers name
/// scoped ids already), validated by the protocol's one rule for ids.
fn scoped_session(ctx: &RequestContext, session_id: &str) -> Result<String, PoolError> {
    Ok(ctx.caller.scope("session_id", session_id)?)
}

impl PoolStateHolder {
    /// Whether the tenant of `session` may hold one more instance (a session that has its
    /// instance already just gets it again). The tenant is the caller's, or — for the
    /// scheduler binding a session's instance — the one the scoped id names.
    fn admit(&self, ctx: &RequestContext, session: &str) -> Result<(), OverQuota> {
        let tenant = match ctx.caller.tenant() {
            Some(t) => t.clone(),
            None => match tenant_of_scoped(session) {
                Some(t) => t,
                None => return Ok(()),
            },
        };
        if self.args.state.bound_instance(session).is_some() {
            return Ok(());
        }
        let here = self.args.state.held_by(&scoped(&tenant, "")) as u64;
        let held = here + self.args.peers.held(&tenant);
        let quotas = self.args.quotas.of(&tenant);
        quotas.admit(&tenant, Quota::AioInstances, held, 1)
    }

    /// Carries out the state machine's effects.
    fn apply(&mut self, myself: &ActorRef<PoolMsg>, effects: Vec<Effect>) {
        for effect in effects {
            match effect {
                Effect::Create(id) => self.create(myself, id),
                Effect::Destroy(id) => {
                    if let Some(live) = self.live.get(&id) {
                        live.actor.stop(Some("destroyed".into()));
                    }
                }
                Effect::Answer(w, result) => self.answer(w, result),
            }
        }
        self.args.gauges.set(&self.args.state);
    }

    fn create(&mut self, myself: &ActorRef<PoolMsg>, id: InstanceId) {
        let unique = messages::new_id().to_ascii_lowercase();
        let name = format!("sandmesh-aio-{}-{unique}", self.args.spec.owner);
        // Only the unique part: a Unix socket path has room for 107 bytes.
        let control_dir = self.args.spec.control_root.join(unique);
        let mut owned = OwnedContainer::claim(
            self.args.docker.clone(),
            self.args.registry.clone(),
            name,
            control_dir,
        );
        let docker = self.args.docker.clone();
        let spec = self.args.spec.clone();
        let pool = myself.clone();
        tokio::spawn(async move {
            let result = match start_instance(&docker, &spec, &owned).await {
                Ok(started) => Ok((owned, started)),
                Err(e) => {
                    tracing::warn!(container = %owned, error = %e, "starting an AIO instance failed");
                    owned.remove().await;
                    Err(crate::error_chain(&e))
                }
            };
            // A pool that is gone drops the message, and with it the container (its drop
            // removes it).
            pool.cast(PoolMsg::Created(id, result)).ok();
        });
    }

    fn answer(&mut self, waiter: WaiterId, result: Result<InstanceId, AcquireError>) {
        let Some(w) = self.waiting.remove(&waiter) else {
            return;
        };
        let live = match result {
            Ok(id) => match self.live.get(&id) {
                Some(live) => live,
                None => {
                    w.reply.send(Err(PoolError::NoActor)).ok();
                    return;
                }
            },
            Err(e) => {
                w.reply.send(Err(e.into())).ok();
                return;
            }
        };
        let lease = AioLease {
            session_id: w.session,
            instance_id: live.name.clone(),
            base_url: live.base_url.clone(),
            cdp_url: None,
        };
        if !w.browser {
            w.reply.send(Ok(lease)).ok();
            return;
        }
        // The browser may take seconds to start: the instance answers, the pool goes on.
        let actor = live.actor.clone();
        tokio::spawn(async move {
            let url = actor.call(InstanceMsg::BrowserUrl, None).await;
            let answer = match url {
                Ok(ractor::rpc::CallResult::Success(Ok(url))) => Ok(AioLease {
                    cdp_url: Some(url),
                    ..lease
                }),
                Ok(ractor::rpc::CallResult::Success(Err(e))) => Err(e),
                _ => Err(PoolError::BrowserStopped),
            };
            w.reply.send(answer).ok();
        });
    }

    fn instance_named(&self, name: Option<&str>) -> Result<Option<InstanceId>, PoolError> {
        match name {
            None => Ok(None),
            Some(n) => {
                self.by_name
                    .get(n)
                    .copied()
                    .map(Some)
                    .ok_or_else(|| PoolError::UnknownInstance {
                        name: n.to_string(),
                    })
            }
        }
    }
}

fn not_bound(session: &str) -> PoolError {
    PoolError::NotBound {
        session: session.to_string(),
    }
}

fn wrong_instance(session: &str, named: Option<&str>) -> PoolError {
    PoolError::WrongInstance {
        session: session.to_string(),
        named: named.map(str::to_string),
    }
}

impl Actor for Pool {
    type Msg = PoolMsg;
    type State = PoolStateHolder;
    type Arguments = PoolArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<PoolMsg>,
        args: PoolArgs,
    ) -> Result<PoolStateHolder, ActorProcessingErr> {
        myself.send_interval(args.health_interval, || PoolMsg::Tick);
        Ok(PoolStateHolder {
            args,
            live: HashMap::new(),
            by_actor: HashMap::new(),
            by_name: HashMap::new(),
            waiting: HashMap::new(),
            next_waiter: 0,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<PoolMsg>,
        state: &mut PoolStateHolder,
    ) -> Result<(), ActorProcessingErr> {
        // The warmer's first round at once, not after one tick.
        let fx = state.args.state.tick(Instant::now());
        state.apply(&myself, fx);
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<PoolMsg>,
        msg: PoolMsg,
        state: &mut PoolStateHolder,
    ) -> Result<(), ActorProcessingErr> {
        let now = Instant::now();
        match msg {
            PoolMsg::Acquire(ctx, req, reply) => {
                let session = match scoped_session(&ctx, &req.session_id) {
                    Ok(s) => s,
                    Err(e) => {
                        reply.send(Err(e)).ok();
                        return Ok(());
                    }
                };
                if let Err(e) = state.admit(&ctx, &session) {
                    reply.send(Err(e.into())).ok();
                    return Ok(());
                }
                state.next_waiter += 1;
                let waiter = state.next_waiter;
                state.waiting.insert(
                    waiter,
                    Waiting {
                        // The lease names the session as the caller did.
                        session: req.session_id,
                        browser: req.browser,
                        reply,
                    },
                );
                let fx = state.args.state.acquire(waiter, &session, now);
                state.apply(&myself, fx);
            }
            PoolMsg::Release(ctx, req, reply) => {
                let session = match scoped_session(&ctx, &req.session_id) {
                    Ok(s) => s,
                    Err(e) => {
                        reply.send(Err(e)).ok();
                        return Ok(());
                    }
                };
                let named = match state.instance_named(req.instance_id.as_deref()) {
                    Ok(n) => n,
                    Err(e) => {
                        reply.send(Err(e)).ok();
                        return Ok(());
                    }
                };
                let bound = state.args.state.bound_instance(&session);
                match (bound, named) {
                    (None, _) => {
                        reply.send(Err(not_bound(&req.session_id))).ok();
                    }
                    (Some(b), Some(n)) if b != n => {
                        let e = wrong_instance(&req.session_id, req.instance_id.as_deref());
                        reply.send(Err(e)).ok();
                    }
                    (Some(b), _) => {
                        let name = state
                            .live
                            .get(&b)
                            .map(|l| l.name.clone())
                            .unwrap_or_default();
                        let (_, fx) = state.args.state.release(&session, now);
                        state.apply(&myself, fx);
                        reply
                            .send(Ok(AioReleased {
                                session_id: req.session_id,
                                instance_id: name,
                            }))
                            .ok();
                    }
                }
            }
            PoolMsg::Exec(ctx, req, reply) => {
                // Only the scheduler, after risk assessment and confirmation; the subject is
                // not exported, so this holds also if a permission were ever widened.
                if ctx.caller != messages::tenancy::Caller::Internal {
                    reply.send(Err(PoolError::NotThroughScheduler)).ok();
                    return Ok(());
                }
                if let Err(e) = scoped_session(&ctx, &req.session_id) {
                    reply.send(Err(e)).ok();
                    return Ok(());
                }
                if req.command.is_empty() {
                    reply.send(Err(PoolError::EmptyCommand)).ok();
                    return Ok(());
                }
                if req.command.len() > MAX_COMMAND_BYTES {
                    let e = PoolError::CommandTooLarge {
                        len: req.command.len(),
                        max: MAX_COMMAND_BYTES,
                    };
                    reply.send(Err(e)).ok();
                    return Ok(());
                }
                let timeout = match req.timeout_ms.map(Duration::from_millis) {
                    None => state.args.default_exec_timeout,
                    Some(t) if t.is_zero() || t > state.args.max_exec_timeout => {
                        let e = PoolError::BadTimeout {
                            max_ms: state.args.max_exec_timeout.as_millis(),
                        };
                        reply.send(Err(e)).ok();
                        return Ok(());
                    }
                    Some(t) => t,
                };
                let named = match state.instance_named(req.instance_id.as_deref()) {
                    Ok(n) => n,
                    Err(e) => {
                        reply.send(Err(e)).ok();
                        return Ok(());
                    }
                };
                match state.args.state.use_instance(&req.session_id, named, now) {
                    Err(UseError::NotBound) => {
                        reply.send(Err(not_bound(&req.session_id))).ok();
                    }
                    Err(UseError::WrongInstance { .. }) => {
                        let e = wrong_instance(&req.session_id, req.instance_id.as_deref());
                        reply.send(Err(e)).ok();
                    }
                    Ok((id, retire_after)) => match state.live.get(&id) {
                        Some(live) => {
                            let msg = InstanceMsg::Exec {
                                session_id: req.session_id,
                                command: req.command,
                                timeout,
                                max_output_chars: state.args.max_output_chars,
                                retire_after,
                                reply,
                            };
                            if let Err(e) = live.actor.cast(msg) {
                                tracing::warn!(error = %e, "AIO instance gone before its execution");
                            }
                        }
                        None => {
                            reply.send(Err(PoolError::NoActor)).ok();
                        }
                    },
                }
                state.args.gauges.set(&state.args.state);
            }
            PoolMsg::Stats(_, _, reply) => {
                let limits = state.args.state.limits();
                let stats = state
                    .args
                    .gauges
                    .stats(limits.min_instances, limits.max_instances);
                reply.send(Ok(stats)).ok();
            }
            PoolMsg::Created(id, Ok((container, started))) => {
                let name = container.name().to_string();
                let base_url = control_url(&started.client.socket);
                let pool = myself.clone();
                let args = InstanceArgs {
                    container,
                    client: started.client,
                    touched: Box::new(move || {
                        ractor::cast!(pool, PoolMsg::Touched(id)).ok();
                    }),
                    health_interval: state.args.health_interval,
                };
                match Actor::spawn_linked(None, Instance, args, myself.get_cell()).await {
                    Ok((actor, _)) => {
                        state.by_actor.insert(actor.get_id(), id);
                        state.by_name.insert(name.clone(), id);
                        state.live.insert(
                            id,
                            Live {
                                actor,
                                name,
                                base_url,
                            },
                        );
                        let fx = state.args.state.created(id, Ok(()), now);
                        state.apply(&myself, fx);
                    }
                    Err(e) => {
                        // The args (and with them the container) were dropped: removed.
                        let fx = state.args.state.created(id, Err(e.to_string()), now);
                        state.apply(&myself, fx);
                    }
                }
            }
            PoolMsg::Created(id, Err(message)) => {
                let fx = state.args.state.created(id, Err(message), now);
                state.apply(&myself, fx);
            }
            PoolMsg::Touched(id) => state.args.state.touch(id, now),
            PoolMsg::Tick => {
                let fx = state.args.state.tick(now);
                state.apply(&myself, fx);
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<PoolMsg>,
        evt: SupervisionEvent,
        state: &mut PoolStateHolder,
    ) -> Result<(), ActorProcessingErr> {
        let (cell, why) = match &evt {
            SupervisionEvent::ActorTerminated(cell, _, reason) => (cell, reason.clone()),
            SupervisionEvent::ActorFailed(cell, e) => (cell, Some(e.to_string())),
            _ => return Ok(()),
        };
        let Some(id) = state.by_actor.remove(&cell.get_id()) else {
            return Ok(());
        };
        if let Some(live) = state.live.remove(&id) {
            state.by_name.remove(&live.name);
            tracing::info!(container = live.name, reason = ?why, "AIO instance gone");
        }
        // Whatever ended it (destroyed, used up, unhealthy, failed), its container was
        // removed by its post_stop and its capacity is free.
        let fx = state.args.state.gone(id, Instant::now());
        state.apply(&myself, fx);
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<PoolMsg>,
        state: &mut PoolStateHolder,
    ) -> Result<(), ActorProcessingErr> {
        let fx = state.args.state.stop();
        for effect in fx {
            if let Effect::Answer(w, result) = effect {
                state.answer(w, result);
            }
        }
        // Every instance removes its container as it stops.
        for (_, live) in state.live.drain() {
            live.actor
                .stop_and_wait(
                    Some("aio-pool stopping".into()),
                    Some(Duration::from_secs(20)),
                )
                .await
                .ok();
        }
        Ok(())
    }
}
