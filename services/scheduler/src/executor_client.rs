//! `ExecutorClient`: one call to a docker executor (`executor.docker.<node>.run`, or the
//! `executor.docker.run` queue group) and the classification of its reply into a [`Call`];
//! [`settle`] turns that into the result with the scheduler's fields overlaid.

use std::time::{Duration, Instant};

use kit::{AuditScope, Auditor, CallError, Caller};
use messages::audit::AuditKind;
use messages::exec::{ExecResult, ExecStatus};
use messages::executor::{Backend, ExecutorRun};
use messages::subjects::ExecutorOp;
use messages::{ErrorBody, ErrorKind, Subjects};
use serde_json::json;

use crate::execution::terminal;

/// The first pause before retrying an executor that answered 429 (doubling up to the max).
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// The reply of one executor call, classified.
pub enum Call {
    Done(Box<ExecResult>),
    /// Nobody listens on that subject: nothing ran; another node may take it.
    NoResponders,
    /// The executor took the work and never answered: it is presumed dead.
    Lost(String),
    /// A failure before anything ran; the whole request may be retried later.
    Transient(ErrorBody),
    /// The executor refused or failed the work; final.
    Failed(ExecStatus, ErrorBody),
}

#[derive(Clone)]
pub struct ExecutorClient {
    caller: Caller,
    subjects: Subjects,
    auditor: Auditor,
}

impl ExecutorClient {
    pub fn new(caller: Caller, subjects: Subjects, auditor: Auditor) -> Self {
        Self {
            caller,
            subjects,
            auditor,
        }
    }

    /// Runs `run` on `node` of `backend` (that backend's queue group when `None`), giving it
    /// `deadline`.
    pub async fn run(
        &self,
        backend: Backend,
        node: Option<&str>,
        run: &ExecutorRun,
        deadline: Duration,
        scope: &AuditScope,
    ) -> Call {
        let subject = match node {
            Some(node) => self
                .subjects
                .executor_node_on(backend, node, ExecutorOp::Run),
            None => self.subjects.executor_run_on(backend),
        };
        self.auditor.emit(
            AuditKind::Started,
            scope,
            json!({"node": node, "tier": run.tier.as_str(), "backend": backend.as_str()}),
        );
        let started = Instant::now();
        // Each attempt gets the whole execution budget, since an executor that takes the work
        // needs all of it. (Giving the last attempt only what was left of the wait made a run
        // that started late look lost.)
        let give_up = started + deadline;
        let mut backoff = FIRST_BACKOFF;
        let reply = loop {
            let reply = self
                .caller
                .call_timeout::<_, ExecResult>(subject.clone(), run, deadline)
                .await;
            // A full executor refused before running anything (another scheduler filled it
            // since its last heartbeat): back off rather than fail work already admitted.
            let full =
                matches!(&reply, Err(CallError::Service(e)) if e.kind == ErrorKind::Overloaded);
            if !full || Instant::now() + backoff >= give_up {
                break reply;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        };
        classify(reply, started)
    }

    /// Asks `node` to close `session_id`'s container. A node that is gone closed it already.
    pub async fn close_session(&self, node: &str, session_id: &str) -> Result<(), CallError> {
        let close = messages::executor::ExecutorClose {
            session_id: session_id.to_string(),
        };
        let subject = self.subjects.executor_node(node, ExecutorOp::Close);
        match self
            .caller
            .call::<_, serde::de::IgnoredAny>(subject, &close)
            .await
        {
            Ok(_) | Err(CallError::NoResponders(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

fn classify(reply: Result<ExecResult, CallError>, started: Instant) -> Call {
    match reply {
        Ok(mut result) => {
            if result.timing.exec_ms == 0 {
                result.timing.exec_ms = messages::exec::Timing::ms(started.elapsed());
            }
            Call::Done(Box::new(result))
        }
        Err(CallError::NoResponders(_)) => Call::NoResponders,
        Err(CallError::TimedOut { timeout, .. }) => {
            Call::Lost(format!("the executor did not answer within {timeout:?}"))
        }
        Err(CallError::Transport { message, .. }) => Call::Transient(ErrorBody::unavailable(
            format!("executor call failed: {message}"),
        )),
        Err(CallError::Service(body)) => match body.kind {
            ErrorKind::Overloaded | ErrorKind::Unavailable => Call::Transient(body),
            ErrorKind::BadRequest | ErrorKind::TooLarge | ErrorKind::Denied => {
                Call::Failed(ExecStatus::Rejected, body)
            }
            _ => Call::Failed(ExecStatus::Internal, body),
        },
        Err(e @ CallError::Decode { .. }) => {
            Call::Failed(ExecStatus::Internal, ErrorBody::internal(e.to_string()))
        }
    }
}

/// Turns a classified call into the result (the scheduler's fields overlaid) or a transient
/// error.
pub fn settle(
    call: Call,
    node: Option<String>,
    run: &ExecutorRun,
) -> Result<ExecResult, ErrorBody> {
    let mut result = match call {
        Call::Done(r) => *r,
        Call::Transient(e) => return Err(e),
        Call::NoResponders => return Err(ErrorBody::unavailable("no docker executor is running")),
        Call::Lost(why) => terminal(
            &run.execution_id,
            &run.request,
            ExecStatus::ExecutorLost,
            ErrorBody::new(ErrorKind::Unavailable, why),
        ),
        Call::Failed(status, e) => terminal(&run.execution_id, &run.request, status, e),
    };
    result.execution_id = run.execution_id.clone();
    result.session_id = run.request.session_id.clone();
    result.tier = run.tier;
    if result.node.is_none() {
        result.node = node;
    }
    Ok(result)
}
