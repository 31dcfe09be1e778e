//! Placement and the executor call. Work without a session goes to the node the strategy picks
//! (or to the `executor.docker.run` queue group while no node is known); work of a session goes
//! to the node holding its container ([`crate::affinity`]).

use std::time::{Duration, Instant};

use kit::{AuditScope, CallError};
use messages::audit::AuditKind;
use messages::exec::{ExecRequest, ExecResult, ExecStatus, Tier};
use messages::executor::ExecutorClose;
use messages::executor::{ExecutorRun, RunKind};
use messages::subjects::{ExecutorOp, WorkspaceOp};
use messages::validate::EffectiveLimits;
use messages::workspace::WsCleanup;
use messages::{ErrorBody, ErrorKind};
use serde_json::json;

use crate::pipeline::{terminal, Scheduler};
use crate::placement::{Decision, Requirements};
use crate::registry::RegistryMsg;

/// Tries per execution when the chosen node turns out to be gone (no responders).
pub(crate) const PLACEMENT_ATTEMPTS: usize = 3;
/// How often a request waiting for a free executor slot looks again.
const SLOT_POLL: Duration = Duration::from_millis(20);
/// The longest pause between retries of an executor that answered 429.
const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// The reply of one executor call, classified.
pub(crate) enum Call {
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

impl Scheduler {
    pub(crate) async fn dispatch(
        &self,
        id: &str,
        req: &ExecRequest,
        limits: EffectiveLimits,
        tier: Tier,
        scope: &AuditScope,
    ) -> Result<ExecResult, ErrorBody> {
        let mut request = req.clone();
        request.execution_id = Some(id.to_string());
        request.timeout_ms = Some(limits.timeout_ms);
        request.limits = Some(limits.as_limits());
        let mut run = ExecutorRun {
            execution_id: id.to_string(),
            tier,
            request,
            session_restored: false,
            kind: match (tier, req.session_id.is_some()) {
                (_, true) => RunKind::Session,
                (Tier::Session, false) => RunKind::Isolated,
                _ => RunKind::Pooled,
            },
        };
        let needs = Requirements {
            cpus: limits.cpus,
            memory_mb: limits.memory_mb,
        };
        let deadline = Duration::from_millis(limits.timeout_ms) + self.0.config.exec_grace;
        match req.session_id.clone() {
            None if tier == Tier::Session => {
                self.dispatch_dedicated(&mut run, needs, deadline, scope)
                    .await
            }
            None => {
                self.dispatch_anywhere(&mut run, needs, deadline, scope)
                    .await
            }
            Some(session_id) => {
                self.dispatch_session(&session_id, &mut run, needs, deadline, scope)
                    .await
            }
        }
    }

    async fn dispatch_anywhere(
        &self,
        run: &mut ExecutorRun,
        needs: Requirements,
        deadline: Duration,
        scope: &AuditScope,
    ) -> Result<ExecResult, ErrorBody> {
        let mut exclude = Vec::new();
        for _ in 0..PLACEMENT_ATTEMPTS {
            let decision = self.pick_waiting(needs, &exclude, deadline).await;
            let node = decision.as_ref().map(|d| d.node.clone());
            self.audit_placed(scope, run, decision.as_ref());
            let call = self
                .call_executor(node.as_deref(), run, deadline, scope)
                .await;
            // The pick counted this work on the node; it has ended either way.
            self.release(node.as_deref());
            match call {
                Call::NoResponders => match node {
                    Some(node) => exclude.push(node),
                    None => break,
                },
                other => return self.settle(other, node, run),
            }
        }
        Err(ErrorBody::unavailable(
            "no docker executor is running (no responders on the executor subjects)",
        ))
    }

    /// Session isolation for work without a session (strict mode, code not SAFE): a container
    /// of its own under a one-off session, closed — with its workspace — right after.
    async fn dispatch_dedicated(
        &self,
        run: &mut ExecutorRun,
        needs: Requirements,
        deadline: Duration,
        scope: &AuditScope,
    ) -> Result<ExecResult, ErrorBody> {
        let once = format!("once-{}", messages::new_id().to_ascii_lowercase());
        run.request.session_id = Some(once.clone());
        let outcome = self.dispatch_anywhere(run, needs, deadline, scope).await;
        run.request.session_id = None;
        let node = outcome.as_ref().ok().and_then(|r| r.node.clone());
        self.discard_session(once, node);
        outcome.map(|mut r| {
            r.session_id = None;
            r.files_created.clear();
            r.files_modified.clear();
            r
        })
    }

    /// Closes a one-off session's container and removes its workspace, in the background.
    fn discard_session(&self, session_id: String, node: Option<String>) {
        let me = self.clone();
        tokio::spawn(async move {
            let s = &me.0.subjects;
            if let Some(node) = node {
                let close = ExecutorClose {
                    session_id: session_id.clone(),
                };
                let subject = s.executor_node(&node, ExecutorOp::Close);
                if let Err(e) =
                    me.0.caller
                        .call::<_, serde::de::IgnoredAny>(subject, &close)
                        .await
                {
                    tracing::debug!(session_id, node, error = %e, "one-off session not closed; the executor's idle close will");
                }
            }
            let cleanup = WsCleanup {
                session_id: Some(session_id.clone()),
                older_than_hours: None,
            };
            let subject = s.workspace(WorkspaceOp::Cleanup);
            if let Err(e) =
                me.0.caller
                    .call::<_, serde::de::IgnoredAny>(subject, &cleanup)
                    .await
            {
                tracing::debug!(session_id, error = %e, "one-off workspace not removed; the TTL sweep will");
            }
        });
    }

    /// Like [`Self::pick`], but while executors are known and all of them are full, waits
    /// (up to `limit`) for a slot instead of sending work they would refuse with 429. `None`
    /// means no executor is known (the queue group is the fallback) or the wait ran out.
    pub(crate) async fn pick_waiting(
        &self,
        needs: Requirements,
        exclude: &[String],
        limit: Duration,
    ) -> Option<Decision> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(decision) = self.pick(needs, exclude).await {
                return Some(decision);
            }
            let known = ractor::call!(self.0.registry, RegistryMsg::Nodes).unwrap_or_default();
            if known.iter().all(|n| exclude.contains(&n.id)) || Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(SLOT_POLL).await;
        }
    }

    pub(crate) async fn pick(&self, needs: Requirements, exclude: &[String]) -> Option<Decision> {
        let exclude = exclude.to_vec();
        ractor::call!(self.0.registry, |reply| RegistryMsg::Pick {
            req: needs,
            exclude,
            reply
        })
        .unwrap_or(None)
    }

    /// The work counted on `node` (by a pick or `Dispatched`) ended.
    pub(crate) fn release(&self, node: Option<&str>) {
        if let Some(node) = node {
            let _ = self
                .0
                .registry
                .cast(RegistryMsg::Finished { node: node.into() });
        }
    }

    pub(crate) async fn is_alive(&self, node: &str) -> bool {
        let node = node.to_string();
        ractor::call!(self.0.registry, |reply| RegistryMsg::IsAlive {
            node,
            reply
        })
        .unwrap_or(false)
    }

    pub(crate) fn audit_placed(&self, scope: &AuditScope, run: &ExecutorRun, d: Option<&Decision>) {
        self.audit(
            AuditKind::Placed,
            scope,
            json!({
                "tier": run.tier.as_str(),
                "node": d.map(|d| &d.node),
                "reason": d.map(|d| d.reason.as_str()).unwrap_or("executor queue group"),
                "strategy": self.0.config.placement.as_str(),
                "session_restored": run.session_restored,
            }),
        );
    }

    pub(crate) async fn call_executor(
        &self,
        node: Option<&str>,
        run: &ExecutorRun,
        deadline: Duration,
        scope: &AuditScope,
    ) -> Call {
        let subjects = &self.0.subjects;
        let subject = match node {
            Some(node) => subjects.executor_node(node, ExecutorOp::Run),
            None => subjects.executor_run(),
        };
        self.audit(
            AuditKind::Started,
            scope,
            json!({"node": node, "tier": run.tier.as_str()}),
        );
        let started = Instant::now();
        // Waiting for a slot is bounded by `deadline`; each attempt gets the whole execution
        // budget, since an executor that takes the work needs all of it. (Giving the last
        // attempt only what was left of the wait made a run that started late look lost.)
        let give_up = started + deadline;
        let mut backoff = SLOT_POLL;
        let reply = loop {
            let reply = self
                .0
                .caller
                .call_timeout::<_, ExecResult>(subject.clone(), run, deadline)
                .await;
            // A full executor refused before running anything: wait for a slot rather than
            // fail work the scheduler already admitted.
            let full =
                matches!(&reply, Err(CallError::Service(e)) if e.kind == ErrorKind::Overloaded);
            if !full || Instant::now() + backoff >= give_up {
                break reply;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        };
        match reply {
            Ok(mut result) => {
                if result.timing.exec_ms == 0 {
                    result.timing.exec_ms = started.elapsed().as_millis() as u64;
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

    /// Turns a classified call into the result (the scheduler's fields overlaid) or a
    /// transient error.
    pub(crate) fn settle(
        &self,
        call: Call,
        node: Option<String>,
        run: &ExecutorRun,
    ) -> Result<ExecResult, ErrorBody> {
        let mut result = match call {
            Call::Done(r) => *r,
            Call::Transient(e) => return Err(e),
            Call::NoResponders => {
                return Err(ErrorBody::unavailable("no docker executor is running"))
            }
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
}
