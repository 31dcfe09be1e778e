//! `SessionApi`: the `sessions.{open,get,list,close,ttl}` endpoints, and marking the sessions of a
//! node whose heartbeat vanished as lost.

use kit::{AuditScope, Auditor, RequestContext};
use messages::audit::{LostCause, SessionClosed, SessionLost};
use messages::executor::Backend;
use messages::session::{
    CloseReason, SessionList, SessionListReply, SessionOpen, SessionRecord, SessionRef,
    SessionState, SessionTtl,
};
use tokio::sync::mpsc;

use crate::affinity::SessionAffinity;
use crate::aio::AioRunner;
use crate::error::{SchedulerError, SessionEnd};
use crate::executor_runner::ExecutorRunner;
use crate::pipeline::Policy;
use crate::sessions::{Change, SessionTable};

#[derive(Clone)]
pub struct SessionApi {
    affinity: SessionAffinity,
    executor: ExecutorRunner,
    /// A closed session's AIO instance is released with it.
    aio: AioRunner,
    auditor: Auditor,
    /// What a session may ask for: env and timeout within the ceilings, egress within the
    /// deployment's (`SANDMESH_NETWORK_ALLOW`), a lifetime within `SANDMESH_SESSION_MAX_TTL_MS`.
    policy: Policy,
}

fn scope(ctx: &RequestContext, id: &str, actor: Option<String>) -> AuditScope {
    AuditScope {
        session_id: Some(id.to_string()),
        trace_id: ctx.trace_id.clone(),
        actor,
        ..Default::default()
    }
    .by(&ctx.caller)
}

impl SessionApi {
    pub fn new(
        affinity: SessionAffinity,
        executor: ExecutorRunner,
        aio: AioRunner,
        auditor: Auditor,
        policy: Policy,
    ) -> Self {
        Self {
            affinity,
            executor,
            aio,
            auditor,
            policy,
        }
    }

    pub(crate) fn table(&self) -> &SessionTable {
        self.affinity.sessions()
    }

    /// `sessions.open`: creates the session and its workspace (idempotent by id: an open
    /// session of that id is answered as it is).
    pub async fn open(
        &self,
        ctx: RequestContext,
        mut open: SessionOpen,
    ) -> Result<SessionRecord, SchedulerError> {
        let named = open.session_id.clone().unwrap_or_else(messages::new_id);
        let id = ctx.caller.scope("session_id", &named)?;
        let tenant = ctx.caller.tenant();
        open.admit(&self.policy.ceilings, self.policy.session_lifetime)?;
        if let Some(wanted) = &open.network {
            open.network = Some(crate::network::admit(wanted, &self.policy.network_ceiling)?);
        }
        if let Some(existing) = self.table().get(&id).await? {
            if existing.state == SessionState::Closed {
                return Err(SchedulerError::SessionEnded {
                    id: named,
                    why: SessionEnd::Closed,
                });
            }
            return Ok(existing.unscoped(tenant));
        }
        let scope = scope(&ctx, &id, open.requested_by.clone());
        let record = self.affinity.open_session(&id, &open, &scope).await?;
        Ok(record.unscoped(tenant))
    }

    pub async fn get(
        &self,
        ctx: RequestContext,
        req: SessionRef,
    ) -> Result<SessionRecord, SchedulerError> {
        let id = ctx.caller.scope("session_id", &req.session_id)?;
        let record = self.record(&id, &req.session_id).await?;
        Ok(record.unscoped(ctx.caller.tenant()))
    }

    /// The session stored under `id` (scoped), or 404 naming it as the caller did.
    async fn record(&self, id: &str, named: &str) -> Result<SessionRecord, SchedulerError> {
        self.table()
            .get(id)
            .await?
            .ok_or_else(|| SchedulerError::NoSession {
                id: named.to_string(),
            })
    }

    pub async fn list(
        &self,
        ctx: RequestContext,
        req: SessionList,
    ) -> Result<SessionListReply, SchedulerError> {
        let tenant = ctx.caller.tenant();
        let sessions = self
            .table()
            .list(req.node.as_deref(), tenant)
            .await?
            .into_iter()
            .map(|r| r.unscoped(tenant))
            .collect();
        Ok(SessionListReply { sessions })
    }

    /// `sessions.ttl`: the session now ends `ttl_ms` from now (the reaper reads the stored
    /// end at each sweep). A closed session stays closed.
    pub async fn set_ttl(
        &self,
        ctx: RequestContext,
        req: SessionTtl,
    ) -> Result<SessionRecord, SchedulerError> {
        req.admit(self.policy.session_lifetime)?;
        let id = ctx.caller.scope("session_id", &req.session_id)?;
        let expires_at = messages::now_ms().saturating_add(req.ttl_ms);
        let mut closed = false;
        let stored = self
            .table()
            .update(&id, |r| {
                closed = r.state == SessionState::Closed;
                if closed {
                    return Change::Keep;
                }
                r.expires_at = Some(expires_at);
                Change::Write
            })
            .await?
            .ok_or_else(|| SchedulerError::NoSession {
                id: req.session_id.clone(),
            })?;
        if closed {
            return Err(SchedulerError::SessionEnded {
                id: req.session_id,
                why: SessionEnd::Closed,
            });
        }
        Ok(stored.unscoped(ctx.caller.tenant()))
    }

    /// `sessions.close`. Closing a closed session answers the record again.
    pub async fn close(
        &self,
        ctx: RequestContext,
        req: SessionRef,
    ) -> Result<SessionRecord, SchedulerError> {
        let tenant = ctx.caller.tenant();
        let id = ctx.caller.scope("session_id", &req.session_id)?;
        self.record(&id, &req.session_id).await?;
        let scope = scope(&ctx, &id, None);
        let closed = self
            .close_stored(&id, CloseReason::Requested, &scope)
            .await?
            .ok_or_else(|| SchedulerError::NoSession {
                id: req.session_id.clone(),
            })?;
        Ok(closed.unscoped(tenant))
    }

    /// Closes the session stored under `id` for `reason`: marks it closed first (so no new
    /// execution is placed in it; once, however many schedulers close it at the same time),
    /// then removes its container on its node and its AIO instance. Its browser follows the
    /// `session_closed` event, which the browser-router hears. Returns the record as stored
    /// (`None`: no such session).
    pub async fn close_stored(
        &self,
        id: &str,
        reason: CloseReason,
        scope: &AuditScope,
    ) -> Result<Option<SessionRecord>, SchedulerError> {
        let now = messages::now_ms();
        let mut was = None;
        let closed = self
            .table()
            .update(id, |r| {
                if r.state == SessionState::Closed {
                    was = None;
                    return Change::Keep;
                }
                was = Some((r.state, r.node.clone()));
                r.state = SessionState::Closed;
                r.container = None;
                r.closed_at = Some(now);
                r.close_reason = Some(reason);
                Change::Write
            })
            .await?;
        let (Some(closed), Some((state, node))) = (closed.clone(), was) else {
            return Ok(closed);
        };
        if let (SessionState::Active, Some(node)) = (state, &node) {
            if let Err(e) = self.executor.close_session(node, id).await {
                tracing::warn!(session_id = %id, node, error = %e, "executor close failed; its idle close removes the container");
            }
        }
        self.aio.release(id).await;
        let details = SessionClosed {
            node,
            executions: closed.executions,
            reason,
        };
        self.auditor.emit(scope, details);
        Ok(Some(closed))
    }

    /// Whether the session is in use by a background process still running: then it is
    /// marked used now (so the idle clock starts again) and does not lapse as idle.
    pub async fn held_by_processes(&self, record: &SessionRecord) -> bool {
        let (SessionState::Active, Some(node)) = (record.state, record.node.as_deref()) else {
            return false;
        };
        if !self.executor.runs_processes(node, &record.session_id).await {
            return false;
        }
        let now = messages::now_ms();
        let touched = self
            .table()
            .update(&record.session_id, |r| {
                r.last_used_at = r.last_used_at.max(now);
                Change::Write
            })
            .await;
        if let Err(e) = touched {
            tracing::warn!(session_id = %record.session_id, error = %e, "could not mark the session used");
        }
        true
    }

    /// Marks the sessions of every node whose heartbeat vanished as lost, until `lost` closes.
    /// A node that still answers keeps them: its beats were lost (a NATS failover longer than
    /// the heartbeat's TTL), not its sandboxes, and it beats again once JetStream is back.
    pub async fn mark_lost_sessions(self, mut lost: mpsc::UnboundedReceiver<String>) {
        while let Some(node) = lost.recv().await {
            if self.executor.answers(Backend::Docker, &node).await {
                tracing::warn!(
                    node,
                    "heartbeat gone but the node answers: its sessions kept"
                );
                continue;
            }
            match self.table().mark_node_lost(&node).await {
                Ok(records) => {
                    for record in records {
                        let scope = AuditScope {
                            session_id: Some(record.session_id),
                            tenant: record.tenant,
                            ..Default::default()
                        };
                        let lost = SessionLost {
                            node: node.clone(),
                            cause: Some(LostCause::HeartbeatExpired),
                        };
                        self.auditor.emit(&scope, lost);
                    }
                }
                Err(e) => {
                    tracing::warn!(node, error = %e, "could not mark the node's sessions lost")
                }
            }
        }
    }
}
