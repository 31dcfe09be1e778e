//! `ExecutorNode<B>`: the node's root actor, the same for every backend. It admits runs
//! (validation, the node's ceilings, the backend's run kinds, capacity → 429, draining → 503),
//! hands each admitted run to the backend — once per execution id: a repeated request attaches
//! to the run or gets its kept answer ([`ResultStore`]), and `status` says which — drains,
//! closes sessions, and supervises its children: the `Janitor` is restarted when it fails; any
//! other child is the backend's, and its failure fails the node (so `run()` ends instead of a
//! heartbeat for a node that cannot run anything).

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kit::RequestContext;
use messages::exec::{validate_exec, ExecResult};
use messages::executor::{
    ExecutorClose, ExecutorDrain, ExecutorRun, ExecutorRunStatus, ExecutorStatusQuery,
};
use messages::proc::{ProcCall, ProcReply};
use messages::workspace::Ack;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};

use crate::config::NodeConfig;
use crate::error::ExecutorError;
use crate::job::{output_budget, Admitted, Job};
use crate::node::NodeState;
use crate::results::{ResultStore, Seen};
use crate::slot::RunSlot;
use crate::Backend;
use kit::janitor::{Janitor, JanitorArgs, JanitorMsg};

type Reply<T> = RpcReplyPort<Result<T, ExecutorError>>;

// `Run` is large, but it is the message this actor exists for and the kit's `actor_handler`
// builds it by value; boxing would only add an allocation per request.
#[allow(clippy::large_enum_variant)]
pub enum NodeMsg {
    Run(RequestContext, ExecutorRun, Reply<ExecResult>),
    Close(RequestContext, ExecutorClose, Reply<Ack>),
    Proc(RequestContext, ProcCall, Reply<ProcReply>),
    Drain(RequestContext, ExecutorDrain, Reply<Ack>),
    Status(
        RequestContext,
        ExecutorStatusQuery,
        Reply<ExecutorRunStatus>,
    ),
}

pub struct ExecutorNode<B>(PhantomData<fn() -> B>);

impl<B> Default for ExecutorNode<B> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

pub struct NodeArgs<B: Backend> {
    pub backend: B,
    pub config: Arc<NodeConfig>,
    pub node: Arc<NodeState>,
    /// Executions running at once; beyond it callers get 429.
    pub capacity: usize,
    /// The most output a result can carry over the node's NATS connection.
    pub client: async_nats::Client,
    pub janitor: JanitorArgs<B::Sweeper>,
    /// The runs' answers, kept for callers whose reply was lost.
    pub results: Arc<ResultStore>,
}

pub struct NodeActorState<B: Backend> {
    backend: B,
    config: Arc<NodeConfig>,
    node: Arc<NodeState>,
    capacity: usize,
    /// Output beyond this is cut: a result must fit in one NATS message.
    output_budget: u64,
    janitor: ActorRef<JanitorMsg>,
    janitor_args: JanitorArgs<B::Sweeper>,
    /// Set by a drain: no new work is taken.
    draining: bool,
    results: Arc<ResultStore>,
}

impl<B: Backend> NodeActorState<B> {
    /// Checks a run against this node's rules, decides its limits and takes its run slot.
    fn admit(&self, run: &ExecutorRun) -> Result<(Job, RunSlot), ExecutorError> {
        if self.draining {
            return Err(ExecutorError::Draining);
        }
        run.validate_ids()?;
        let mut limits = validate_exec(run.request(), &self.config.ceilings)?;
        // The result travels in one NATS message: output beyond what fits is cut (and the
        // status says so) rather than making the reply undeliverable.
        limits.max_output_bytes = limits.max_output_bytes.min(self.output_budget);
        self.backend.accepts(run)?;
        let capacity = self.capacity;
        let slot = RunSlot::acquire(&self.node, capacity, run.tenant.as_ref())
            .ok_or(ExecutorError::Full { capacity })?;
        let job = Job {
            run: run.clone(),
            limits,
            accepted: Instant::now(),
            retried: false,
        };
        Ok((job, slot))
    }
}

impl<B: Backend> Actor for ExecutorNode<B> {
    type Msg = NodeMsg;
    type State = NodeActorState<B>;
    type Arguments = NodeArgs<B>;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: NodeArgs<B>,
    ) -> Result<Self::State, ActorProcessingErr> {
        let NodeArgs {
            mut backend,
            config,
            node,
            capacity,
            client,
            janitor: janitor_args,
            results,
        } = args;
        backend.start(myself.get_cell()).await?;
        let (janitor, _) = Actor::spawn_linked(
            None,
            Janitor::default(),
            janitor_args.clone(),
            myself.get_cell(),
        )
        .await?;
        Ok(NodeActorState {
            backend,
            config,
            node,
            capacity,
            output_budget: output_budget(&client),
            janitor,
            janitor_args,
            draining: false,
            results,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            NodeMsg::Run(_ctx, run, reply) => {
                // Handled one at a time here, so a run is recorded before the next request
                // for it is looked up: never two runs of one id.
                let reply = match state.results.seen(&run, reply) {
                    Ok(Seen::Attached) => return Ok(()),
                    Ok(Seen::Answered(reply, answer)) => {
                        let _ = reply.send(*answer);
                        return Ok(());
                    }
                    Err(reply) => reply,
                };
                match state.admit(&run) {
                    Ok((job, slot)) => {
                        state.results.started(&run);
                        let admitted = Admitted::new(job, reply, slot, state.results.clone());
                        state.backend.execute(admitted)?
                    }
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
            }
            NodeMsg::Status(_ctx, query, reply) => {
                let status = query
                    .validate()
                    .map(|()| state.results.status(&query))
                    .map_err(ExecutorError::from);
                let _ = reply.send(status);
            }
            NodeMsg::Close(_ctx, close, reply) => {
                let closed = state.backend.close(close.session_id);
                tokio::spawn(async move {
                    let ok = closed.await;
                    let _ = reply.send(Ok(Ack { ok }));
                });
            }
            NodeMsg::Proc(_ctx, call, reply) => {
                // Not while draining: a drain ends in closing every session.
                if state.draining && matches!(call, ProcCall::Start { .. }) {
                    let _ = reply.send(Err(ExecutorError::Draining));
                    return Ok(());
                }
                let answer = state.backend.proc(call);
                tokio::spawn(async move {
                    let _ = reply.send(answer.await);
                });
            }
            NodeMsg::Drain(_ctx, _drain, reply) => {
                state.draining = true;
                let node = state.node.clone();
                let grace = state.config.drain_grace();
                let close_all = state.backend.close_all();
                tokio::spawn(async move {
                    node.wait_idle(tokio::time::Instant::now() + grace).await;
                    close_all.await;
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
        // Never the default for the janitor (which would stop the node): it is replaced.
        // A backend's child failing fails the node.
        match event {
            SupervisionEvent::ActorFailed(cell, e) if cell.get_id() == state.janitor.get_id() => {
                tracing::error!(error = %e, "janitor failed; restarting it");
                let (janitor, _) = Actor::spawn_linked(
                    None,
                    Janitor::default(),
                    state.janitor_args.clone(),
                    myself.get_cell(),
                )
                .await?;
                state.janitor = janitor;
            }
            SupervisionEvent::ActorFailed(_, e) => {
                return Err(format!("the backend's actor failed: {e}").into());
            }
            // Children stop only when the node does (post_stop, where no event is handled).
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                return Err(
                    format!("a child actor {:?} stopped: {reason:?}", cell.get_id()).into(),
                );
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
        // Every sandbox of the backend goes first; the janitor last.
        state.backend.stop().await;
        let _ = state
            .janitor
            .stop_and_wait(None, Some(Duration::from_secs(30)))
            .await;
        Ok(())
    }
}
