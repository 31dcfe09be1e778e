//! `Executor`: the node's supervisor actor. It admits runs (validation, the node's ceilings,
//! tier `ephemeral` without a session only, capacity → 429, draining → 503), starts each on
//! the node's task tracker in a sandbox of its own, and owns the `Janitor` as a linked child
//! that it restarts when it fails.

use std::sync::Arc;
use std::time::{Duration, Instant};

use docker_executor::execution::{output_budget, Admitted, Job};
use docker_executor::lease::RunSlot;
use docker_executor::node::NodeState;
use kit::RequestContext;
use messages::exec::{ExecResult, Tier};
use messages::executor::{ExecutorDrain, ExecutorRun, RunKind};
use messages::validate::validate_exec;
use messages::workspace::Ack;
use messages::ErrorBody;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};

use crate::execution::Runner;
use crate::janitor::{Janitor, JanitorArgs, JanitorMsg};

type Reply<T> = RpcReplyPort<Result<T, ErrorBody>>;

// `Run` is large, but it is the message this actor exists for and the kit's `actor_handler`
// builds it by value.
#[allow(clippy::large_enum_variant)]
pub enum ExecutorMsg {
    Run(RequestContext, ExecutorRun, Reply<ExecResult>),
    Drain(RequestContext, ExecutorDrain, Reply<Ack>),
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
    janitor: ActorRef<JanitorMsg>,
    janitor_args: JanitorArgs,
    /// Set by a drain: no new work is taken.
    draining: bool,
}

impl ExecutorState {
    /// Checks a run against this node's rules, decides its limits and takes its run slot.
    fn admit(&self, run: &ExecutorRun) -> Result<(Job, RunSlot), ErrorBody> {
        if self.draining {
            return Err(ErrorBody::unavailable("this executor is draining"));
        }
        run.validate_ids().map_err(ErrorBody::from)?;
        let config = &self.runner.config;
        let mut limits =
            validate_exec(&run.request, &config.exec.ceilings).map_err(ErrorBody::from)?;
        limits.max_output_bytes = limits
            .max_output_bytes
            .min(output_budget(&self.runner.client));
        // A sandbox is single-use and keeps no workspace: sessions live in Docker containers.
        if run.tier != Tier::Ephemeral
            || run.kind == RunKind::Session
            || run.request.session_id.is_some()
        {
            return Err(ErrorBody::bad_request(format!(
                "the bwrap executor runs tier ephemeral without a session, not tier {} ({:?})",
                run.tier.as_str(),
                run.kind
            )));
        }
        let capacity = config.capacity;
        let slot = RunSlot::acquire(&self.node, capacity).ok_or_else(|| {
            ErrorBody::overloaded(format!(
                "this executor runs {capacity} sandboxes at once; retry later"
            ))
        })?;
        let job = Job {
            run: run.clone(),
            limits,
            accepted: Instant::now(),
            retried: false,
        };
        Ok((job, slot))
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
        let (janitor, _) =
            Actor::spawn_linked(None, Janitor, args.janitor.clone(), myself.get_cell()).await?;
        Ok(ExecutorState {
            runner: args.runner,
            node: args.node,
            janitor,
            janitor_args: args.janitor,
            draining: false,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ExecutorMsg::Run(_ctx, run, reply) => {
                let (job, slot) = match state.admit(&run) {
                    Ok(admitted) => admitted,
                    Err(e) => {
                        let _ = reply.send(Err(e));
                        return Ok(());
                    }
                };
                let run = Admitted::new(job, reply, slot);
                let runner = state.runner.clone();
                let node = state.node.clone();
                state.node.tasks.spawn(async move {
                    let result = runner.execute(&node, &run.job).await;
                    run.answer(Ok(result));
                });
            }
            ExecutorMsg::Drain(_ctx, _drain, reply) => {
                state.draining = true;
                let node = state.node.clone();
                let grace = state.runner.config.exec.kill_grace
                    + Duration::from_millis(state.runner.config.exec.ceilings.max_timeout_ms);
                tokio::spawn(async move {
                    node.wait_idle(tokio::time::Instant::now() + grace).await;
                    let _ = reply.send(Ok(Ack { ok: true }));
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
        // Never the default (which stops the parent): a failed janitor is replaced.
        if let SupervisionEvent::ActorFailed(cell, e) = event {
            if cell.get_id() == state.janitor.get_id() {
                tracing::error!(error = %e, "janitor failed; restarting it");
                let (janitor, _) = Actor::spawn_linked(
                    None,
                    Janitor,
                    state.janitor_args.clone(),
                    myself.get_cell(),
                )
                .await?;
                state.janitor = janitor;
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let _ = state
            .janitor
            .stop_and_wait(None, Some(Duration::from_secs(30)))
            .await;
        Ok(())
    }
}
