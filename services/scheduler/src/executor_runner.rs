//! `ExecutorRunner`: the scheduler's policy on top of the client's [`ExecutorClient`] — one run
//! on an executor node (`executor.<backend>.<node>.run`, or the backend's queue group), retried
//! while the node is full, and the classification of its reply into a [`Call`]; [`settle`]
//! turns that into the result with the scheduler's fields overlaid.
//!
//! Exactly once across a lost reply ([`ExecutorRunner::run_watched`]): core request-reply is
//! at-most-once, so a run whose reply never came (a NATS server died between node and
//! scheduler) or whose node's heartbeat lapsed is not called lost on a guess. The node is
//! asked what happened (`executor.<backend>.<node>.status`): *finished* → its kept answer;
//! *running* → the run is sent again, which attaches to it; *unknown* → it never reached the
//! node and nothing ran, so it is sent again and runs. Only a node that nothing answers for
//! and whose heartbeat is gone — or that keeps not saying within the run's budget — makes the
//! run `executor_lost`.

use std::time::{Duration, Instant};

use kit::{AuditScope, Auditor};
use messages::audit::ExecutionStarted;
use messages::exec::{ExecResult, ExecStatus};
use messages::executor::{Backend, ExecutorRun, ExecutorRunStatus, ExecutorStatusQuery, RunState};
use messages::proc::{ProcCall, ProcReply, ProcState};
use messages::{ErrorBody, ErrorKind};
use sandmesh_client::{ClientError, ExecutorClient};

use crate::error::SchedulerError;
use crate::execution::terminal;
use crate::placer::{Placement, Placer};

/// The first pause before retrying an executor that answered 429 (doubling up to the max).
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_millis(500);
/// How long one "what happened?" may take: the node answers it from memory.
const STATUS_TIMEOUT: Duration = Duration::from_secs(5);
/// The pause between questions a node did not answer (it may be reconnecting), doubling.
const STATUS_BACKOFF: Duration = Duration::from_millis(250);
const STATUS_MAX_BACKOFF: Duration = Duration::from_secs(2);
/// Times a run is sent again after a lost reply (each attaches, or runs what never arrived).
const RECOVERY_ROUNDS: usize = 3;

/// Why a node could not be asked what happened to a run.
#[derive(Debug, thiserror::Error)]
enum Unanswered {
    #[error("nothing answers for node {0} and its heartbeat is gone")]
    Gone(String),
    #[error("node {node} did not say what happened within the run's budget")]
    Silent {
        node: String,
        #[source]
        last: ClientError,
    },
}

/// The reply of one executor call, classified.
pub enum Call {
    Done(Box<ExecResult>),
    /// Nobody listens on that subject: nothing ran; another node may take it.
    NoResponders,
    /// The executor took the work and never answered, and could not say what happened to it
    /// (see the module's comment): it is presumed dead.
    Lost(String),
    /// A failure before anything ran; the whole request may be retried later.
    Transient(SchedulerError),
    /// The executor refused or failed the work; final.
    Failed(ExecStatus, ErrorBody),
}

#[derive(Clone)]
pub struct ExecutorRunner {
    executors: ExecutorClient,
    auditor: Auditor,
}

impl ExecutorRunner {
    pub fn new(executors: ExecutorClient, auditor: Auditor) -> Self {
        Self { executors, auditor }
    }

    /// Runs `run` on the node of `placement` of `backend` (that backend's queue group when
    /// `None`), giving it `deadline`; ended as lost when the node's heartbeat goes
    /// ([`Placer::unless_gone`]). A run that ends lost on a known node is recovered (the
    /// module's comment) before it is called lost; one on the queue group (no node was known)
    /// cannot be asked after. The placement is held until the run ended or the call was
    /// dropped, then its slot is given back.
    pub async fn run_watched(
        &self,
        placer: &Placer,
        backend: Backend,
        placement: Option<Placement>,
        run: &ExecutorRun,
        deadline: Duration,
        scope: &AuditScope,
    ) -> Call {
        let node = placement.as_ref().map(Placement::node);
        let started = ExecutionStarted {
            node: node.map(str::to_string),
            tier: run.tier(),
            backend,
        };
        self.auditor.emit(scope, started);
        let running = self.send(backend, node, run, deadline);
        let call = placer
            .unless_gone(node, running)
            .await
            .unwrap_or_else(|gone| Call::Lost(gone.to_string()));
        match (node, call) {
            (Some(node), Call::Lost(why)) => {
                let lost = LostRun {
                    client: self,
                    placer,
                    backend,
                    node,
                    run,
                    deadline,
                };
                lost.recover(why).await
            }
            (_, call) => call,
        }
    }

    /// Whether `node` of `backend` answers at all (its status subject, for an id nobody
    /// uses): a node whose heartbeat lapsed in a NATS failover is alive if it does.
    pub async fn answers(&self, backend: Backend, node: &str) -> bool {
        let probe = ExecutorStatusQuery {
            execution_id: "liveness-probe".into(),
            tenant: None,
        };
        let asked = self
            .executors
            .status(backend, node, &probe, STATUS_TIMEOUT)
            .await;
        matches!(asked, Ok(_) | Err(ClientError::Service { .. }))
    }

    /// One call of `run` (retried while the node is full), classified.
    async fn send(
        &self,
        backend: Backend,
        node: Option<&str>,
        run: &ExecutorRun,
        deadline: Duration,
    ) -> Call {
        let started = Instant::now();
        // Each attempt gets the whole execution budget, since an executor that takes the work
        // needs all of it. (Giving the last attempt only what was left of the wait made a run
        // that started late look lost.)
        let give_up = started + deadline;
        let mut backoff = FIRST_BACKOFF;
        let reply = loop {
            let reply = self.executors.run(backend, node, run, deadline).await;
            // A full executor refused before running anything (another scheduler filled it
            // since its last heartbeat): back off rather than fail work already admitted.
            let full = matches!(
                &reply,
                Err(ClientError::Service { body, .. }) if body.kind == ErrorKind::Overloaded
            );
            if !full || Instant::now() + backoff >= give_up {
                break reply;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        };
        classify(reply, started, backend)
    }

    /// Has `node` open a tunnel into a session container's port.
    pub async fn open_tunnel(
        &self,
        node: &str,
        order: &messages::ports::ExecutorTunnel,
    ) -> Result<messages::ports::TunnelOpened, ClientError> {
        self.executors.open_tunnel(node, order).await
    }

    /// Whether a background process of `session_id` still runs on `node` (a node that does
    /// not say has none: the session may lapse).
    pub async fn runs_processes(&self, node: &str, session_id: &str) -> bool {
        let call = ProcCall::List {
            session_id: session_id.to_string(),
        };
        match self
            .executors
            .proc(Backend::Docker, node, &call, STATUS_TIMEOUT)
            .await
        {
            Ok(ProcReply::List(list)) => list.procs.iter().any(|p| p.state == ProcState::Running),
            _ => false,
        }
    }

    /// Asks `node` to close `session_id`'s container. A node that is gone closed it already.
    pub async fn close_session(&self, node: &str, session_id: &str) -> Result<(), ClientError> {
        self.executors.close_session(node, session_id).await
    }
}

/// A run on a known node whose reply did not come, being recovered.
struct LostRun<'a> {
    client: &'a ExecutorRunner,
    placer: &'a Placer,
    backend: Backend,
    node: &'a str,
    run: &'a ExecutorRun,
    deadline: Duration,
}

impl LostRun<'_> {
    async fn recover(&self, mut why: String) -> Call {
        let (node, run) = (self.node, self.run);
        for _ in 0..RECOVERY_ROUNDS {
            let status = match self.status().await {
                Ok(status) => status,
                Err(not_asked) => {
                    return Call::Lost(format!("{why}; {}", kit::error_chain(&not_asked)))
                }
            };
            tracing::info!(
                execution_id = %run.execution_id, node, state = ?status.state, lost = %why,
                "asked the node what happened to a run whose reply did not come"
            );
            if let Some(call) = settled_by(status, node, &why) {
                return call;
            }
            let again = self
                .client
                .send(self.backend, Some(node), run, self.deadline);
            match self.placer.unless_gone(Some(node), again).await {
                Err(gone) => why = gone.to_string(),
                Ok(Call::Lost(w)) => why = w,
                Ok(Call::NoResponders) => why = format!("nothing answers on node {node}"),
                Ok(call) => return call,
            }
        }
        Call::Lost(why)
    }

    /// What the node says happened to the run, asked until it answers. `Err` (why not) once
    /// nothing answers for the node and its heartbeat is gone, or the run's budget ran out.
    async fn status(&self) -> Result<ExecutorRunStatus, Unanswered> {
        let node = self.node;
        let query = ExecutorStatusQuery::of(self.run);
        let give_up = Instant::now() + self.deadline;
        let mut backoff = STATUS_BACKOFF;
        loop {
            let asked = self
                .client
                .executors
                .status(self.backend, node, &query, STATUS_TIMEOUT)
                .await;
            let e = match asked {
                Ok(status) => return Ok(status),
                Err(e) => e,
            };
            // A node the registry still knows may be reconnecting: ask again. (A failed
            // look-up is no proof of death either.)
            if matches!(e, ClientError::NoResponders { .. })
                && matches!(self.placer.is_alive(node).await, Ok(false))
            {
                return Err(Unanswered::Gone(node.to_string()));
            }
            if Instant::now() + backoff >= give_up {
                return Err(Unanswered::Silent {
                    node: node.to_string(),
                    last: e,
                });
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(STATUS_MAX_BACKOFF);
        }
    }
}

/// What a node's answer to "what happened?" settles: the run's end, or `None` when the run is
/// to be sent again — it runs there now (the request attaches to it), or it never reached the
/// node and nothing ran (the request runs it, its only run).
fn settled_by(status: ExecutorRunStatus, node: &str, why: &str) -> Option<Call> {
    match status.state {
        RunState::Running | RunState::Unknown => None,
        RunState::Finished => {
            let answer = match (status.result, status.error) {
                (Some(result), _) => Ok(*result),
                (None, Some(body)) => Err(body),
                (None, None) => Err(ErrorBody::internal(
                    "the node said the run finished but gave no answer",
                )),
            };
            Some(match answer {
                Ok(result) => done(result, Instant::now()),
                Err(body) => refused(body),
            })
        }
        RunState::Forgotten => Some(Call::Lost(format!(
            "{why}; it ran on node {node}, which no longer keeps its result"
        ))),
    }
}

fn classify(reply: Result<ExecResult, ClientError>, started: Instant, backend: Backend) -> Call {
    match reply {
        Ok(result) => done(result, started),
        Err(ClientError::NoResponders { .. }) => Call::NoResponders,
        Err(ClientError::TimedOut { timeout, .. }) => {
            Call::Lost(format!("the executor did not answer within {timeout:?}"))
        }
        Err(e @ ClientError::Transport { .. }) => {
            Call::Transient(SchedulerError::calling(backend.service())(e))
        }
        Err(ClientError::Service { body, .. }) => refused(body),
        Err(e @ (ClientError::Codec { .. } | ClientError::Protocol { .. })) => Call::Failed(
            ExecStatus::Internal,
            ErrorBody::internal(kit::error_chain(&e)),
        ),
    }
}

fn done(mut result: ExecResult, started: Instant) -> Call {
    if result.timing.exec_ms == 0 {
        result.timing.exec_ms = messages::exec::Timing::ms(started.elapsed());
    }
    Call::Done(Box::new(result))
}

/// An executor's refusal: worth another try later, or final.
fn refused(body: ErrorBody) -> Call {
    match body.kind {
        ErrorKind::Overloaded | ErrorKind::Unavailable => {
            Call::Transient(SchedulerError::Refused(body))
        }
        ErrorKind::BadRequest | ErrorKind::TooLarge | ErrorKind::Denied => {
            Call::Failed(ExecStatus::Rejected, body)
        }
        _ => Call::Failed(ExecStatus::Internal, body),
    }
}

/// Turns a classified call into the result (the scheduler's fields overlaid) or a transient
/// error.
pub fn settle(
    call: Call,
    node: Option<String>,
    run: &ExecutorRun,
) -> Result<ExecResult, SchedulerError> {
    let mut result = match call {
        Call::Done(r) => *r,
        Call::Transient(e) => return Err(e),
        Call::NoResponders => {
            return Err(SchedulerError::NoExecutor {
                backend: Backend::Docker,
            })
        }
        Call::Lost(why) => terminal(
            &run.execution_id,
            run.request(),
            ExecStatus::ExecutorLost,
            ErrorBody::new(ErrorKind::Unavailable, why),
        ),
        Call::Failed(status, e) => terminal(&run.execution_id, run.request(), status, e),
    };
    result.execution_id = run.execution_id.clone();
    result.session_id = run.session_id().map(Into::into);
    result.tier = run.tier();
    if result.node.is_none() {
        result.node = node;
    }
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(state: RunState) -> ExecutorRunStatus {
        ExecutorRunStatus {
            state,
            result: None,
            error: None,
        }
    }

    #[test]
    fn a_nodes_answer_settles_a_lost_run_only_when_it_ended() {
        for again in [RunState::Running, RunState::Unknown] {
            assert!(
                settled_by(status(again), "a", "lost").is_none(),
                "{again:?}"
            );
        }
        let kept = ExecutorRunStatus {
            result: Some(Box::new(ExecResult {
                status: ExecStatus::Ok,
                stdout: "once\n".into(),
                ..Default::default()
            })),
            ..status(RunState::Finished)
        };
        let Some(Call::Done(r)) = settled_by(kept, "a", "lost") else {
            panic!("a kept result is the run's result");
        };
        assert_eq!(r.stdout, "once\n");
        let failed = ExecutorRunStatus {
            error: Some(ErrorBody::bad_request("bad limits")),
            ..status(RunState::Finished)
        };
        assert!(matches!(
            settled_by(failed, "a", "lost"),
            Some(Call::Failed(ExecStatus::Rejected, _))
        ));
        assert!(matches!(
            settled_by(status(RunState::Finished), "a", "lost"),
            Some(Call::Failed(ExecStatus::Internal, _))
        ));
        let Some(Call::Lost(why)) = settled_by(status(RunState::Forgotten), "a", "lost") else {
            panic!("a run whose result is gone is lost, not run again");
        };
        assert!(why.starts_with("lost; it ran on node a"), "{why}");
    }
}
