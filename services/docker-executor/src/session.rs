//! `SessionContainer`: one per session on this node. It owns the session's container, runs
//! the session's executions one at a time in arrival order (files in `/workspace` and `/tmp`
//! persist between them; a run's processes never do — the supervisor kills them at the end of
//! each run — only the session's background processes, started by name), and removes the
//! container on close or after an idle timeout.
//!
//! A new session takes a warm container from the pool when one is ready, so its first run
//! pays no cold start. The container remembers the workspace revision it holds
//! (`lease::Held`), so a run after one that changed nothing makes no workspace request.
//!
//! Background processes (`crate::procs`) live in the session's container and die with it; a
//! running one keeps the session from its idle close. What they write reaches the
//! workspace store with the session's next run (its baseline is what the last run left), or,
//! asked by the store before an agent's read (`ProcCall::Sync`) while a process runs or after
//! one ran since the last run, with a run of nothing queued behind the session's runs.
//!
//! Kernel cells run in the container's kernel, which its resident supervisor keeps between
//! runs and restarts (saying so) when it died. A kernel that goes with a replaced container
//! is noticed here: the session's next cell says `state_lost`.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use messages::filesystem::FilesystemPolicy;
use messages::network::NetworkPolicy;
use messages::proc::{ProcCall, ProcReply};
use messages::ErrorKind;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use executor_node::{Admitted, BackendError, ExecutorError, NodeState};

use crate::docker::{ContainerKind, ContainerLimits};
use crate::execution::{Health, Runner};
use crate::gauges::ContainerGauges;
use crate::lease::{ContainerLease, StartError};
use crate::procs::{ProcHost, Procs};
use crate::warm_pool::WarmPoolMsg;

/// Why a session's run was not run (its answer; a run that ran says how in its result).
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The node holds as many sessions as it may (`Containers` keeps the count).
    #[error("this executor holds {held} sessions; retry on another")]
    Full { held: usize },
    /// Its actor had just stopped (idle) and the new one could not take the run either.
    #[error("the session is restarting; retry")]
    Restarting,
    #[error("the session was closed")]
    Closed,
    #[error("could not start the session's container: {0}")]
    NoContainer(#[source] StartError),
}

impl BackendError for SessionError {
    fn kind(&self) -> ErrorKind {
        match self {
            SessionError::Full { .. } => ErrorKind::Overloaded,
            SessionError::Restarting | SessionError::Closed | SessionError::NoContainer(_) => {
                ErrorKind::Unavailable
            }
        }
    }
}

/// Containers travel in messages as leases: one the stopped actor never reads is dropped with
/// its message, and that removes it.
pub enum SessionMsg {
    Run(Box<Admitted>),
    /// The session's container is ready, or could not be had.
    Acquired(Result<ContainerLease, StartError>),
    /// The running execution finished and gives the container back (with the run itself
    /// when it must be retried in another container).
    Done(ContainerLease, Health, Option<Box<Admitted>>),
    IdleCheck,
    /// An operation on the session's background processes.
    Proc(ProcCall, ProcReplyPort),
    /// A process start whose workspace sync is done: it starts now.
    StartSynced(ProcCall, ProcReplyPort),
}

pub struct SessionContainer;

pub struct SessionArgs {
    pub session_id: String,
    pub runner: Runner,
    pub pool: ActorRef<WarmPoolMsg>,
    pub node: Arc<NodeState>,
    /// Where the session counts itself for the heartbeat.
    pub gauges: Arc<ContainerGauges>,
    pub idle: Duration,
    pub limits: ContainerLimits,
    /// The session's egress policy: its container gets a proxy of its own (and is never a
    /// warm one, which has none).
    pub network: Option<NetworkPolicy>,
    /// The session's filesystem policy: its container is made with its mounts (and is never a
    /// warm one, made without).
    pub filesystem: Option<FilesystemPolicy>,
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
    container: Option<ContainerLease>,
    /// The name of the container a run holds, so a close can kill that run.
    running_in: Option<String>,
    queue: VecDeque<Box<Admitted>>,
    last_used: Instant,
    /// The current container has run a kernel cell (so its kernel holds state).
    kernel_started: bool,
    /// A container with a kernel was replaced: the next kernel cell's state is lost.
    kernel_lost: bool,
    /// The session's background processes; they live in `host`'s container.
    procs: Procs,
    /// The current container, for the processes (set while the session has one).
    host: Option<ProcHost>,
    /// Syncs asked for since the current run began: the next run (or a run of nothing, when
    /// none is queued) carries what the processes wrote, and answers them.
    syncs: Vec<SyncReply>,
    /// Syncs the current run answers when it ends.
    syncs_riding: Vec<SyncReply>,
    /// A process started since the current run (or the last one) began: what it wrote may
    /// not be in the store yet, even once it ended.
    procs_since_run: bool,
}

/// Where a call on the session's processes is answered (a sync's too).
type ProcReplyPort = RpcReplyPort<Result<ProcReply, ExecutorError>>;
type SyncReply = ProcReplyPort;

fn answer_syncs(syncs: Vec<SyncReply>, ran: bool) {
    for reply in syncs {
        let _ = reply.send(Ok(ProcReply::Synced { ran }));
    }
}

impl SessionState {
    /// What a background process needs of `container`.
    fn host_of(&self, container: &ContainerLease) -> ProcHost {
        let runner = &self.args.runner;
        ProcHost {
            docker: runner.sandboxes.docker.clone(),
            container: container.name.clone(),
            nofile: runner.config.node.nofile,
            fsize_bytes: runner.config.node.fsize_mb << 20,
            egress: container.egress.as_ref().map(|e| e.process_doors()),
            nats: runner.client.clone(),
            auditor: runner.auditor.clone(),
        }
    }

    /// Gets the session a container: a warm one from the pool, or a cold start (always
    /// cold after a dead container, which may have died with the pool's others).
    fn acquire(&mut self, myself: &ActorRef<SessionMsg>, use_pool: bool) {
        self.phase = Phase::Acquiring;
        let pool = self.args.pool.clone();
        let runner = self.args.runner.clone();
        let node = self.args.node.clone();
        let session = self.args.session_id.clone();
        let limits = self.args.limits;
        let network = self.args.network.clone();
        let filesystem = self.args.filesystem.clone();
        let myself = myself.clone();
        self.args.node.tasks.spawn(async move {
            let warm = if use_pool && network.is_none() && filesystem.is_none() {
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
                    let kind = ContainerKind::Session;
                    let (network, filesystem) = (network.as_ref(), filesystem.as_ref());
                    runner
                        .start_container(&node, kind, Some(&session), limits, network, filesystem)
                        .await
                }
            };
            let _ = myself.cast(SessionMsg::Acquired(acquired));
        });
    }

    fn pump(&mut self, myself: &ActorRef<SessionMsg>) {
        if self.phase != Phase::Idle || self.container.is_none() {
            return;
        }
        let Some(run) = self.queue.pop_front() else {
            if !self.syncs.is_empty() {
                self.sync(myself);
            }
            return;
        };
        let Some(mut container) = self.take_for_a_run() else {
            return;
        };
        let kernel = run.job.run.request().kernel;
        self.kernel_started |= kernel;
        let kernel_lost = kernel && std::mem::take(&mut self.kernel_lost);
        let runner = self.args.runner.clone();
        let myself = myself.clone();
        self.args.node.tasks.spawn(async move {
            let (mut result, health) = runner.execute(&mut container, &run.job).await;
            result.state_lost |= kernel_lost;
            // The container was dead before the run began (killed from outside): the run
            // goes back to the head of the queue, once, for the next container.
            let retry = if health == Health::Unusable && !run.job.retried {
                let mut run = run;
                run.job.retried = true;
                Some(run)
            } else {
                run.answer(Ok(result));
                None
            };
            if let Err(ractor::MessagingErr::SendErr(SessionMsg::Done(_, _, Some(run)))) =
                myself.cast(SessionMsg::Done(container, health, retry))
            {
                run.answer(Err(SessionError::Closed.into()));
            }
        });
    }

    /// The container, for the next run: the session is busy until the run is done, and the
    /// run's changes carry what the processes wrote so far, so it answers the syncs waiting.
    fn take_for_a_run(&mut self) -> Option<ContainerLease> {
        let container = self.container.take()?;
        self.phase = Phase::Busy;
        self.running_in = Some(container.name.clone());
        self.syncs_riding = std::mem::take(&mut self.syncs);
        self.procs_since_run = false;
        Some(container)
    }

    /// A run of nothing for the syncs waiting: its changes are what the processes wrote.
    fn sync(&mut self, myself: &ActorRef<SessionMsg>) {
        let job = match self.args.runner.sync_job(&self.args.session_id) {
            Ok(job) => job,
            Err(e) => {
                let e = ExecutorError::from(e);
                for reply in self.syncs.drain(..) {
                    let _ = reply.send(Err(e.clone()));
                }
                return;
            }
        };
        let Some(mut container) = self.take_for_a_run() else {
            return;
        };
        let runner = self.args.runner.clone();
        let myself = myself.clone();
        self.args.node.tasks.spawn(async move {
            let (result, health) = runner.execute(&mut container, &job).await;
            if result.status != messages::exec::ExecStatus::Ok {
                tracing::warn!(session = ?job.run.session_id(), status = ?result.status, "a workspace sync run failed");
            }
            let _ = myself.cast(SessionMsg::Done(container, health, None));
        });
    }

    /// Off the actor: a start waits for its program, a wait for its end.
    fn call_procs(&self, call: ProcCall, reply: ProcReplyPort) {
        let (procs, host) = (self.procs.clone(), self.host.clone());
        self.args.node.tasks.spawn(async move {
            let _ = reply.send(procs.call(call, host).await.map_err(Into::into));
        });
    }

    fn reject_queued(&mut self, error: ExecutorError) {
        for run in self.queue.drain(..) {
            run.answer(Err(error.clone()));
        }
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
        args.gauges.sessions.fetch_add(1, Ordering::Relaxed);
        let check = (args.idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(30));
        myself.send_interval(check, || SessionMsg::IdleCheck);
        let mut state = SessionState {
            args,
            phase: Phase::Acquiring,
            container: None,
            running_in: None,
            queue: VecDeque::new(),
            last_used: Instant::now(),
            kernel_started: false,
            kernel_lost: false,
            procs: Procs::default(),
            host: None,
            syncs: Vec::new(),
            syncs_riding: Vec::new(),
            procs_since_run: false,
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
            SessionMsg::Run(run) => {
                state.queue.push_back(run);
                state.pump(&myself);
            }
            SessionMsg::Acquired(Ok(container)) => {
                // Tunnels to the session's ports go through this container from now on.
                let doors = state.args.runner.sandboxes.ports.doors();
                doors.register(&state.args.session_id, &container.ports);
                state.host = Some(state.host_of(&container));
                state.container = Some(container);
                state.phase = Phase::Idle;
                state.last_used = Instant::now();
                state.pump(&myself);
            }
            SessionMsg::Acquired(Err(e)) => {
                tracing::warn!(session = %state.args.session_id, error = %e, "no container for the session");
                state.reject_queued(SessionError::NoContainer(e).into());
                myself.stop(Some("no container".into()));
            }
            SessionMsg::Done(container, health, retry) => {
                state.last_used = Instant::now();
                state.running_in = None;
                let carried = health == Health::Reusable;
                answer_syncs(std::mem::take(&mut state.syncs_riding), carried);
                if let Some(run) = retry {
                    state.queue.push_front(run);
                }
                if health == Health::Reusable {
                    state.container = Some(container);
                    state.phase = Phase::Idle;
                } else {
                    // Killed (backstop) or dead: the session continues in a fresh container
                    // (the old one goes with its lease, and its kernel with it).
                    // Its background processes go with it (each proc host's stream ends, and
                    // the process is recorded killed).
                    drop(container);
                    state.host = None;
                    state.kernel_lost |= std::mem::take(&mut state.kernel_started);
                    state.acquire(&myself, health != Health::Unusable);
                }
                state.pump(&myself);
            }
            SessionMsg::Proc(ProcCall::Sync { .. }, reply) => {
                // A process that wrote and ended since the last run counts too: only a run
                // carries what was written to the store.
                if state.procs.any_running() || state.procs_since_run {
                    state.syncs.push(reply);
                    state.pump(&myself);
                } else {
                    // Only processes write between runs: the store holds the workspace.
                    answer_syncs(vec![reply], false);
                }
            }
            SessionMsg::Proc(call @ ProcCall::Start { .. }, reply) => {
                // A process sees the workspace as the store holds it (an agent's upload
                // included), as a run does: a run of nothing, queued behind the session's
                // runs, brings it in first. A sync that failed is logged; the start goes on.
                let (synced, done) = ractor::concurrency::oneshot();
                state.syncs.push(synced.into());
                state.pump(&myself);
                let myself = myself.clone();
                state.args.node.tasks.spawn(async move {
                    let _ = done.await;
                    if let Err(ractor::MessagingErr::SendErr(SessionMsg::StartSynced(_, reply))) =
                        myself.cast(SessionMsg::StartSynced(call, reply))
                    {
                        let _ = reply.send(Err(SessionError::Closed.into()));
                    }
                });
            }
            SessionMsg::StartSynced(call, reply) => {
                state.last_used = Instant::now();
                state.procs_since_run = true;
                state.call_procs(call, reply);
            }
            SessionMsg::Proc(call, reply) => state.call_procs(call, reply),
            SessionMsg::IdleCheck => {
                // A running process, or an open tunnel to one of its ports, is activity: the
                // session lives on (up to its TTL, which the scheduler enforces).
                let tunnels = state
                    .container
                    .as_ref()
                    .map_or(0, |c| c.ports.open_tunnels());
                if state.procs.any_running() || tunnels > 0 {
                    state.last_used = Instant::now();
                }
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
        state.reject_queued(SessionError::Closed.into());
        let doors = state.args.runner.sandboxes.ports.doors();
        doors.forget(&state.args.session_id);
        // A run in progress dies with its container now; its lease, back from the run's task
        // to this stopped actor, is dropped and finishes the removal.
        if let Some(name) = state.running_in.take() {
            state.args.runner.sandboxes.remove(&name).await;
        }
        if let Some(container) = state.container.take() {
            container.remove().await;
        }
        state.args.gauges.sessions.fetch_sub(1, Ordering::Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::docker::DockerError;

    #[test]
    fn a_session_run_not_run_is_overloaded_only_when_the_node_is_full() {
        let failed = DockerError::Failed {
            op: "create",
            target: "a sandbox container".into(),
            message: "no uid free".into(),
        };
        for (e, kind) in [
            (SessionError::Full { held: 8 }, ErrorKind::Overloaded),
            (SessionError::Restarting, ErrorKind::Unavailable),
            (SessionError::Closed, ErrorKind::Unavailable),
            (
                SessionError::NoContainer(failed.into()),
                ErrorKind::Unavailable,
            ),
        ] {
            assert_eq!((e.kind(), e.body().kind), (kind, kind), "{e}");
        }
    }
}
