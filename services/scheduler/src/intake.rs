//! The request-reply edge: sync `exec`, `exec.result` look-ups and `sessions.*`. Each handler
//! turns a pipeline outcome into a reply or a typed error.

use std::time::Instant;

use kit::{AuditScope, RequestContext};
use messages::audit::AuditKind;
use messages::exec::{ExecRequest, ExecResult, ResultGet, ResultLookup};
use messages::executor::ExecutorClose;
use messages::session::{
    SessionList, SessionListReply, SessionOpen, SessionRecord, SessionRef, SessionState,
};
use messages::subjects::ExecutorOp;
use messages::validate::validate_id;
use messages::ErrorBody;
use serde_json::json;

use crate::pipeline::{Origin, Outcome, Scheduler};
use crate::sessions::Change;

impl Scheduler {
    /// `exec`: runs the request now. Beyond the queue bound the caller gets 429 at once.
    pub async fn exec_sync(
        &self,
        ctx: RequestContext,
        req: ExecRequest,
    ) -> Result<ExecResult, ErrorBody> {
        let received = Instant::now();
        let Ok(_permit) = self.admission().clone().try_acquire_owned() else {
            return Err(ErrorBody::overloaded(format!(
                "the scheduler queue is full ({} executions in flight); retry later",
                self.config().max_queue
            )));
        };
        let origin = Origin {
            received,
            queued_ms: 0,
            trace_id: ctx.trace_id,
        };
        match self.execute(req, origin).await {
            Outcome::Done(result) => Ok(result),
            // The caller still gets what ran; a later look-up by id will not find it.
            Outcome::Unstored(result, _) => Ok(result),
            Outcome::Invalid(e) | Outcome::Retry(e) => Err(e),
            Outcome::Busy(owner) => Err(ErrorBody::conflict(format!(
                "this execution id is running now (on scheduler {owner}); read its result \
                 with exec.result when it ends"
            ))),
        }
    }

    /// `exec.result`: the stored result, `pending` while a scheduler runs it, else 404.
    pub async fn lookup(&self, req: ResultGet) -> Result<ResultLookup, ErrorBody> {
        validate_id("execution_id", &req.execution_id)?;
        if let Some(result) = self.results().get(&req.execution_id).await? {
            return Ok(ResultLookup::Done {
                result: Box::new(result),
            });
        }
        if self.claims().holder(&req.execution_id).await?.is_some() {
            return Ok(ResultLookup::Pending {
                execution_id: req.execution_id,
            });
        }
        Err(ErrorBody::not_found(format!(
            "no result for execution {}: it is unknown, or still waiting in the job queue",
            req.execution_id
        )))
    }

    fn session_scope(&self, ctx: &RequestContext, id: &str, actor: Option<String>) -> AuditScope {
        AuditScope {
            execution_id: None,
            session_id: Some(id.to_string()),
            trace_id: ctx.trace_id.clone(),
            actor,
        }
    }

    /// `sessions.open`: creates the session and its workspace (idempotent by id).
    pub async fn session_open(
        &self,
        ctx: RequestContext,
        open: SessionOpen,
    ) -> Result<SessionRecord, ErrorBody> {
        let id = open.session_id.clone().unwrap_or_else(messages::new_id);
        validate_id("session_id", &id)?;
        let scope = self.session_scope(&ctx, &id, open.requested_by.clone());
        if let Some(existing) = self.0.sessions.get(&id).await? {
            if existing.state == SessionState::Closed {
                return Err(ErrorBody::conflict(format!(
                    "session {id} was closed; open a session with a new id"
                )));
            }
            return Ok(existing);
        }
        self.open_session(&id, &open, &scope).await
    }

    pub async fn session_get(&self, req: SessionRef) -> Result<SessionRecord, ErrorBody> {
        validate_id("session_id", &req.session_id)?;
        self.0
            .sessions
            .get(&req.session_id)
            .await?
            .ok_or_else(|| ErrorBody::not_found(format!("no session {}", req.session_id)))
    }

    pub async fn session_list(&self, req: SessionList) -> Result<SessionListReply, ErrorBody> {
        let sessions = self.0.sessions.list(req.node.as_deref()).await?;
        Ok(SessionListReply { sessions })
    }

    /// `sessions.close`: closes the container on its node (when it still runs), then marks
    /// the session closed. Closing a closed session answers the record again.
    pub async fn session_close(
        &self,
        ctx: RequestContext,
        req: SessionRef,
    ) -> Result<SessionRecord, ErrorBody> {
        let record = self.session_get(req.clone()).await?;
        if record.state == SessionState::Closed {
            return Ok(record);
        }
        if let (SessionState::Active, Some(node)) = (record.state, &record.node) {
            let close = ExecutorClose {
                session_id: req.session_id.clone(),
            };
            let subject = self.0.subjects.executor_node(node, ExecutorOp::Close);
            match self
                .0
                .caller
                .call::<_, serde::de::IgnoredAny>(subject, &close)
                .await
            {
                Ok(_) => {}
                // The node is gone, and its container with it.
                Err(kit::CallError::NoResponders(_)) => {}
                Err(e) => {
                    tracing::warn!(session_id = %req.session_id, node, error = %e, "executor close failed; closing anyway")
                }
            }
        }
        let closed = self
            .0
            .sessions
            .update(&req.session_id, |r| {
                if r.state == SessionState::Closed {
                    return Change::Keep;
                }
                r.state = SessionState::Closed;
                r.container = None;
                Change::Write
            })
            .await?
            .ok_or_else(|| ErrorBody::not_found(format!("no session {}", req.session_id)))?;
        let scope = self.session_scope(&ctx, &req.session_id, None);
        self.audit(
            AuditKind::SessionClosed,
            &scope,
            json!({"node": record.node, "executions": closed.executions}),
        );
        Ok(closed)
    }
}
