//! `Executor`: the node's supervisor actor. It admits runs (validation, the node's ceilings,
//! capacity → 429, draining → 503), sends ephemeral runs to a warm container and session runs
//! to the session's `SessionContainer`, and owns the `WarmPool`, the `Janitor` and every
//! session actor as linked children.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kit::RequestContext;
use messages::exec::{ExecResult, ExecStatus, Tier};
use messages::executor::{ExecutorClose, ExecutorDrain, ExecutorRun};
use messages::validate::{validate_exec, validate_id, Ceilings};
use messages::workspace::Ack;
use messages::ErrorBody;
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};

use crate::docker::{Container, ContainerKind, ContainerLimits};
use crate::execution::{Health, Job, Runner};
use crate::janitor::{Janitor, JanitorArgs, JanitorMsg};
use crate::node::NodeState;
use crate::session::{SessionArgs, SessionContainer, SessionMsg};
use crate::warm_pool::{WarmPool, WarmPoolArgs, WarmPoolMsg};

type Reply<T> = RpcReplyPort<Result<T, ErrorBody>>;

// `Run` is large, but it is the message this actor exists for and the kit's `actor_handler`
// builds it by value; boxing would only add an allocation per request.
#[allow(clippy::large_enum_variant)]
pub enum ExecutorMsg {
    Run(RequestContext, ExecutorRun, Reply<ExecResult>),
    Close(RequestContext, ExecutorClose, Reply<Ack>),
    Drain(RequestContext, ExecutorDrain, Reply<Ack>),
    /// An accepted execution was answered.
    Finished,
    /// Part of a drain: close every session once nothing runs.
    CloseAll(RpcReplyPort<()>),
}

pub struct Executor;

pub struct ExecutorArgs {
    pub runner: Runner,
    pub node: Arc<NodeState>,
    pub janitor: JanitorArgs,
}

pub struct ExecutorState {
    runner: Runner,
    node: Arc<NodeState>,
    ceilings: Ceilings,
    pool: ActorRef<WarmPoolMsg>,
    janitor: ActorRef<JanitorMsg>,
    janitor_args: JanitorArgs,
    sessions: HashMap<String, ActorRef<SessionMsg>>,
    /// Set by a drain: no new work is taken.
    draining: bool,
}

fn default_limits(c: &Ceilings) -> ContainerLimits {
    ContainerLimits {
        memory_mb: c.default_memory_mb.max(16),
        cpus: c.default_cpus,
        pids: c.default_pids.max(8),
    }
}

async fn spawn_pool(
    myself: &ActorRef<ExecutorMsg>,
    runner: &Runner,
    node: &Arc<NodeState>,
) -> Result<ActorRef<WarmPoolMsg>, ActorProcessingErr> {
    let args = WarmPoolArgs {
        sandboxes: runner.sandboxes.clone(),
        node: node.clone(),
        size: runner.config.warm_pool,
        limits: default_limits(&runner.config.ceilings),
    };
    let (pool, _) = Actor::spawn_linked(None, WarmPool, args, myself.get_cell()).await?;
    Ok(pool)
}

/// A container started for one job, outside the pool.
async fn cold_start(runner: &Runner, node: &NodeState, job: &Job) -> Result<Container, ErrorBody> {
    let name = runner.sandboxes.new_name();
    node.own(&name);
    let limits = ContainerLimits::from(&job.limits);
    let started = runner
        .sandboxes
        .start(&name, ContainerKind::Warm, None, limits)
        .await;
    if started.is_err() {
        node.disown(&name);
    }
    started.map_err(|e| ErrorBody::unavailable(format!("no container: {e}")))
}

impl ExecutorState {
    /// Checks a run against this node's rules and decides its limits.
    fn admit(&self, run: &ExecutorRun) -> Result<Job, ErrorBody> {
        if self.draining {
            return Err(ErrorBody::unavailable("this executor is draining"));
        }
        validate_id("execution_id", &run.execution_id).map_err(ErrorBody::from)?;
        let mut limits = validate_exec(&run.request, &self.ceilings).map_err(ErrorBody::from)?;
        // The result travels in one NATS message: output beyond what fits is cut (and the
        // status says so) rather than making the reply undeliverable.
        limits.max_output_bytes = limits.max_output_bytes.min(self.runner.output_budget());
        match run.tier {
            Tier::Ephemeral => {}
            Tier::Session if run.request.session_id.is_some() => {}
            Tier::Session => {
                return Err(ErrorBody::bad_request("tier session needs a session_id"));
            }
            other => {
                return Err(ErrorBody::bad_request(format!(
                    "the docker executor runs tiers ephemeral and session, not {}",
                    other.as_str()
                )));
            }
        }
        let capacity = self.runner.config.capacity;
        if self.node.running.load(Ordering::Relaxed) >= capacity {
            return Err(ErrorBody::overloaded(format!(
                "this executor runs {capacity} executions at once; retry later"
            )));
        }
        Ok(Job {
            run: run.clone(),
            limits,
            accepted: Instant::now(),
            retried: false,
        })
    }

    fn run_ephemeral(&self, myself: &ActorRef<ExecutorMsg>, job: Job, reply: Reply<ExecResult>) {
        let runner = self.runner.clone();
        let pool = self.pool.clone();
        let node = self.node.clone();
        let myself = myself.clone();
        self.node.tasks.spawn(async move {
            let warm = pool
                .call(WarmPoolMsg::Take, Some(Duration::from_secs(5)))
                .await
                .ok()
                .and_then(|r| r.success_or(()).ok())
                .flatten();
            let mut container = warm;
            let mut attempts = 0;
            let (result, used) = loop {
                attempts += 1;
                let mut c = match container.take() {
                    Some(c) => c,
                    // Pool empty (a burst, or still warming up): a cold start.
                    None => match cold_start(&runner, &node, &job).await {
                        Ok(c) => c,
                        Err(error) => {
                            let failed =
                                runner.failed(&job, ExecStatus::Internal, error, job.accepted);
                            break (failed, None);
                        }
                    },
                };
                let (result, health) = runner.execute(&mut c, &job).await;
                // A warm container found dead (killed from outside) costs a cold start, not
                // the execution: it never began, so it is retried once.
                if health == Health::Unusable && attempts < 2 {
                    runner.sandboxes.remove(&c.name).await;
                    node.disown(&c.name);
                    continue;
                }
                break (result, Some(c.name));
            };
            let _ = reply.send(Ok(result));
            let _ = myself.cast(ExecutorMsg::Finished);
            let _ = pool.cast(WarmPoolMsg::Replenish);
            // Single use, whatever happened: removed after the answer, off the caller's clock.
            if let Some(name) = used {
                runner.sandboxes.remove(&name).await;
                node.disown(&name);
            }
        });
    }

    async fn run_session(
        &mut self,
        myself: &ActorRef<ExecutorMsg>,
        job: Job,
        reply: Reply<ExecResult>,
    ) -> Result<(), ActorProcessingErr> {
        let session_id = job.run.request.session_id.clone().expect("admitted");
        let mut msg = SessionMsg::Run(Box::new(job), reply);
        // Twice at most: a session actor that just stopped (idle) is replaced once.
        for _ in 0..2 {
            let actor = match self.sessions.get(&session_id) {
                Some(a) => a.clone(),
                None => {
                    if self.sessions.len() >= self.runner.config.max_sessions {
                        let SessionMsg::Run(_, reply) = msg else {
                            unreachable!()
                        };
                        let _ = reply.send(Err(ErrorBody::overloaded(format!(
                            "this executor holds {} sessions; retry on another",
                            self.sessions.len()
                        ))));
                        self.node.running.fetch_sub(1, Ordering::Relaxed);
                        return Ok(());
                    }
                    let args = SessionArgs {
                        session_id: session_id.clone(),
                        runner: self.runner.clone(),
                        pool: self.pool.clone(),
                        executor: myself.clone(),
                        node: self.node.clone(),
                        idle: self.runner.config.session_idle,
                        limits: default_limits(&self.ceilings),
                    };
                    let (actor, _) =
                        Actor::spawn_linked(None, SessionContainer, args, myself.get_cell())
                            .await?;
                    self.sessions.insert(session_id.clone(), actor.clone());
                    actor
                }
            };
            match actor.cast(msg) {
                Ok(()) => return Ok(()),
                Err(ractor::MessagingErr::SendErr(m)) => {
                    self.sessions.remove(&session_id);
                    msg = m;
                }
                Err(_) => return Ok(()),
            }
        }
        if let SessionMsg::Run(_, reply) = msg {
            let _ = reply.send(Err(ErrorBody::unavailable(
                "the session is restarting; retry",
            )));
            self.node.running.fetch_sub(1, Ordering::Relaxed);
        }
        Ok(())
    }

    fn forget(&mut self, cell: &ActorCell) {
        self.sessions.retain(|_, a| a.get_id() != cell.get_id());
    }
}

impl Actor for Executor {
    type Msg = ExecutorMsg;
    type State = ExecutorState;
    type Arguments = ExecutorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: ExecutorArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let pool = spawn_pool(&myself, &args.runner, &args.node).await?;
        let (janitor, _) =
            Actor::spawn_linked(None, Janitor, args.janitor.clone(), myself.get_cell()).await?;
        Ok(ExecutorState {
            ceilings: args.runner.config.ceilings.clone(),
            runner: args.runner,
            node: args.node,
            pool,
            janitor,
            janitor_args: args.janitor,
            sessions: HashMap::new(),
            draining: false,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ExecutorMsg::Run(_ctx, run, reply) => {
                let job = match state.admit(&run) {
                    Ok(job) => job,
                    Err(e) => {
                        let _ = reply.send(Err(e));
                        return Ok(());
                    }
                };
                state.node.running.fetch_add(1, Ordering::Relaxed);
                match job.run.tier {
                    Tier::Session => state.run_session(&myself, job, reply).await?,
                    _ => state.run_ephemeral(&myself, job, reply),
                }
            }
            ExecutorMsg::Finished => {
                state.node.running.fetch_sub(1, Ordering::Relaxed);
                state.node.finished.fetch_add(1, Ordering::Relaxed);
            }
            ExecutorMsg::Close(_ctx, close, reply) => {
                match state.sessions.remove(&close.session_id) {
                    Some(actor) => {
                        tokio::spawn(async move {
                            let _ = actor.stop_and_wait(Some("closed".into()), None).await;
                            let _ = reply.send(Ok(Ack { ok: true }));
                        });
                    }
                    None => {
                        let _ = reply.send(Ok(Ack { ok: false }));
                    }
                }
            }
            ExecutorMsg::Drain(_ctx, _drain, reply) => {
                state.draining = true;
                let node = state.node.clone();
                let grace = state.runner.config.kill_grace
                    + Duration::from_millis(state.ceilings.max_timeout_ms);
                tokio::spawn(async move {
                    let until = Instant::now() + grace;
                    while node.running.load(Ordering::Relaxed) > 0 && Instant::now() < until {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    let _ = ractor::call!(myself, ExecutorMsg::CloseAll);
                    let _ = reply.send(Ok(Ack { ok: true }));
                });
            }
            ExecutorMsg::CloseAll(reply) => {
                let sessions: Vec<_> = state.sessions.drain().map(|(_, a)| a).collect();
                tokio::spawn(async move {
                    for actor in sessions {
                        let _ = actor.stop_and_wait(Some("drained".into()), None).await;
                    }
                    let _ = reply.send(());
                });
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // Never the default (which stops the parent): a session ending is routine, and a
        // failed pool or janitor is replaced.
        match event {
            SupervisionEvent::ActorTerminated(cell, _, _) => state.forget(&cell),
            SupervisionEvent::ActorFailed(cell, e) => {
                if cell.get_id() == state.pool.get_id() {
                    tracing::error!(error = %e, "warm pool failed; restarting it");
                    state.pool = spawn_pool(&myself, &state.runner, &state.node).await?;
                } else if cell.get_id() == state.janitor.get_id() {
                    tracing::error!(error = %e, "janitor failed; restarting it");
                    let (janitor, _) = Actor::spawn_linked(
                        None,
                        Janitor,
                        state.janitor_args.clone(),
                        myself.get_cell(),
                    )
                    .await?;
                    state.janitor = janitor;
                } else {
                    tracing::warn!(error = %e, "a session actor failed");
                    state.forget(&cell);
                }
            }
            _ => {}
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // Every container of this node goes: sessions, then the pool; the janitor last.
        let wait = Some(Duration::from_secs(30));
        let sessions = state.sessions.drain().map(|(_, a)| async move {
            let _ = a.stop_and_wait(Some("shutdown".into()), wait).await;
        });
        futures::future::join_all(sessions).await;
        let _ = state.pool.stop_and_wait(None, wait).await;
        let _ = state.janitor.stop_and_wait(None, wait).await;
        Ok(())
    }
}
