//! `SessionContainer`: one per session on this node. It owns the session's container, runs
//! the session's executions one at a time in arrival order (files in `/workspace` and `/tmp`
//! persist between them; processes never do — the supervisor kills them at the end of each
//! run), and removes the container on close or after an idle timeout.
//!
//! A new session takes a warm container from the pool when one is ready, so its first run
//! pays no cold start.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use messages::exec::ExecResult;
use messages::ErrorBody;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::docker::{Container, ContainerKind, ContainerLimits};
use crate::execution::{Health, Job, Runner};
use crate::executor::ExecutorMsg;
use crate::node::{Handoff, NodeState};
use crate::warm_pool::WarmPoolMsg;

type Reply = RpcReplyPort<Result<ExecResult, ErrorBody>>;

pub enum SessionMsg {
    Run(Box<Job>, Reply),
    /// The session's container is ready, or could not be had.
    Acquired(Result<Container, String>),
    /// The running execution finished and gives the container back (with the run itself
    /// when it must be retried in another container).
    Done(Container, Health, Option<(Box<Job>, Reply)>),
    IdleCheck,
}

pub struct SessionContainer;

pub struct SessionArgs {
    pub session_id: String,
    pub runner: Runner,
    pub pool: ActorRef<WarmPoolMsg>,
    pub executor: ActorRef<ExecutorMsg>,
    pub node: Arc<NodeState>,
    pub idle: Duration,
    pub limits: ContainerLimits,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Acquiring,
    Idle,
    Busy,
}

pub struct SessionState {
    args: SessionArgs,
    phase: Phase,
    /// The container while idle; while busy the running task holds it.
    container: Option<Container>,
    /// The container's name in every phase, so a close can remove it even mid-run.
    container_name: Option<String>,
    queue: VecDeque<(Box<Job>, Reply)>,
    last_used: Instant,
    /// Containers acquired by a background task, until this actor has them.
    handoff: Handoff,
}

impl SessionState {
    /// Gets the session a container: a warm one from the pool, or a cold start (always
    /// cold after a dead container, which may have died with the pool's others).
    fn acquire(&mut self, myself: &ActorRef<SessionMsg>, use_pool: bool) {
        self.phase = Phase::Acquiring;
        let pool = self.args.pool.clone();
        let sandboxes = self.args.runner.sandboxes.clone();
        let node = self.args.node.clone();
        let session = self.args.session_id.clone();
        let limits = self.args.limits;
        let myself = myself.clone();
        let handoff = self.handoff.clone();
        self.args.node.tasks.spawn(async move {
            let warm = if use_pool {
                pool.call(WarmPoolMsg::Take, Some(Duration::from_secs(5)))
                    .await
                    .ok()
                    .and_then(|r| r.success_or(()).ok())
                    .flatten()
            } else {
                None
            };
            let acquired = match warm {
                Some(c) => Ok(c),
                None => {
                    let name = sandboxes.new_name();
                    node.own(&name);
                    let started = sandboxes
                        .start(&name, ContainerKind::Session, Some(&session), limits)
                        .await;
                    if started.is_err() {
                        node.disown(&name);
                    }
                    started.map_err(|e| e.to_string())
                }
            };
            if let Ok(c) = &acquired {
                if !handoff.offer(&c.name) {
                    // Closed while starting.
                    sandboxes.remove(&c.name).await;
                    node.disown(&c.name);
                    return;
                }
            }
            let _ = myself.cast(SessionMsg::Acquired(acquired));
        });
    }

    fn pump(&mut self, myself: &ActorRef<SessionMsg>) {
        if self.phase != Phase::Idle {
            return;
        }
        let Some((job, reply)) = self.queue.pop_front() else {
            return;
        };
        let Some(mut container) = self.container.take() else {
            self.queue.push_front((job, reply));
            return;
        };
        self.phase = Phase::Busy;
        let runner = self.args.runner.clone();
        let executor = self.args.executor.clone();
        let node = self.args.node.clone();
        let myself = myself.clone();
        self.args.node.tasks.spawn(async move {
            let (result, health) = runner.execute(&mut container, &job).await;
            // The container was dead before the run began (killed from outside): the run
            // goes back to the head of the queue, once, for the next container.
            let retry = if health == Health::Unusable && !job.retried {
                let mut job = job;
                job.retried = true;
                Some((job, reply))
            } else {
                let _ = reply.send(Ok(result));
                let _ = executor.cast(ExecutorMsg::Finished);
                None
            };
            if let Err(ractor::MessagingErr::SendErr(SessionMsg::Done(c, _, retry))) =
                myself.cast(SessionMsg::Done(container, health, retry))
            {
                if let Some((_, reply)) = retry {
                    let _ = reply.send(Err(ErrorBody::unavailable("the session was closed")));
                    let _ = executor.cast(ExecutorMsg::Finished);
                }
                runner.sandboxes.remove(&c.name).await;
                node.disown(&c.name);
            }
        });
    }

    fn reject_queued(&mut self, error: ErrorBody) {
        for (_, reply) in self.queue.drain(..) {
            let _ = reply.send(Err(error.clone()));
            let _ = self.args.executor.cast(ExecutorMsg::Finished);
        }
    }

    fn remove_container(&mut self) {
        let Some(name) = self.container_name.take() else {
            return;
        };
        self.container = None;
        let sandboxes = self.args.runner.sandboxes.clone();
        let node = self.args.node.clone();
        self.args.node.tasks.spawn(async move {
            sandboxes.remove(&name).await;
            node.disown(&name);
        });
    }
}

impl Actor for SessionContainer {
    type Msg = SessionMsg;
    type State = SessionState;
    type Arguments = SessionArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: SessionArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        args.node.sessions.fetch_add(1, Ordering::Relaxed);
        let check = (args.idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(30));
        myself.send_interval(check, || SessionMsg::IdleCheck);
        let mut state = SessionState {
            args,
            phase: Phase::Acquiring,
            container: None,
            container_name: None,
            queue: VecDeque::new(),
            last_used: Instant::now(),
            handoff: Handoff::default(),
        };
        state.acquire(&myself, true);
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SessionMsg::Run(job, reply) => {
                state.queue.push_back((job, reply));
                state.pump(&myself);
            }
            SessionMsg::Acquired(Ok(container)) => {
                state.handoff.received(&container.name);
                state.container_name = Some(container.name.clone());
                state.container = Some(container);
                state.phase = Phase::Idle;
                state.last_used = Instant::now();
                state.pump(&myself);
            }
            SessionMsg::Acquired(Err(e)) => {
                tracing::warn!(session = %state.args.session_id, error = %e, "no container for the session");
                state.reject_queued(ErrorBody::unavailable(format!(
                    "could not start the session's container: {e}"
                )));
                myself.stop(Some("no container".into()));
            }
            SessionMsg::Done(container, health, retry) => {
                state.last_used = Instant::now();
                if let Some(run) = retry {
                    state.queue.push_front(run);
                }
                if health == Health::Reusable {
                    state.container = Some(container);
                    state.phase = Phase::Idle;
                } else {
                    // Killed (backstop) or dead: the session continues in a fresh container.
                    state.remove_container();
                    state.acquire(&myself, health != Health::Unusable);
                }
                state.pump(&myself);
            }
            SessionMsg::IdleCheck => {
                if state.phase == Phase::Idle
                    && state.queue.is_empty()
                    && state.last_used.elapsed() >= state.args.idle
                {
                    tracing::debug!(session = %state.args.session_id, "session idle: closing");
                    myself.stop(Some("idle".into()));
                }
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.reject_queued(ErrorBody::unavailable("the session was closed"));
        let mut names = state.handoff.close();
        names.extend(state.container_name.take());
        for name in names {
            state.args.runner.sandboxes.remove(&name).await;
            state.args.node.disown(&name);
        }
        state.args.node.sessions.fetch_sub(1, Ordering::Relaxed);
        Ok(())
    }
}
