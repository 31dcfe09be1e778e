//! `SessionApi`: the `sessions.{open,get,list,close}` endpoints, and marking the sessions of a
//! node whose heartbeat vanished as lost (seed 003 §3.3).

use kit::{AuditScope, Auditor, RequestContext};
use messages::audit::AuditKind;
use messages::network::NetworkPolicy;
use messages::session::{
    SessionList, SessionListReply, SessionOpen, SessionRecord, SessionRef, SessionState,
};
use messages::validate::validate_id;
use messages::ErrorBody;
use serde_json::json;
use tokio::sync::mpsc;

use crate::affinity::SessionAffinity;
use crate::executor_client::ExecutorClient;
use crate::sessions::{Change, SessionTable};

#[derive(Clone)]
pub struct SessionApi {
    affinity: SessionAffinity,
    executor: ExecutorClient,
    auditor: Auditor,
    /// The egress a deployment permits at all (`SANDMESH_NETWORK_ALLOW`).
    network_ceiling: NetworkPolicy,
}

fn scope(ctx: &RequestContext, id: &str, actor: Option<String>) -> AuditScope {
    AuditScope {
        execution_id: None,
        session_id: Some(id.to_string()),
        trace_id: ctx.trace_id.clone(),
        actor,
    }
}

impl SessionApi {
    pub fn new(
        affinity: SessionAffinity,
        executor: ExecutorClient,
        auditor: Auditor,
        network_ceiling: NetworkPolicy,
    ) -> Self {
        Self {
            affinity,
            executor,
            auditor,
            network_ceiling,
        }
    }

    fn table(&self) -> &SessionTable {
        self.affinity.sessions()
    }

    /// `sessions.open`: creates the session and its workspace (idempotent by id).
    pub async fn open(
        &self,
        ctx: RequestContext,
        mut open: SessionOpen,
    ) -> Result<SessionRecord, ErrorBody> {
        let id = open.session_id.clone().unwrap_or_else(messages::new_id);
        validate_id("session_id", &id)?;
        if let Some(wanted) = &open.network {
            open.network = Some(crate::network::admit(wanted, &self.network_ceiling)?);
        }
        if let Some(existing) = self.table().get(&id).await? {
            if existing.state == SessionState::Closed {
                return Err(ErrorBody::conflict(format!(
                    "session {id} was closed; open a session with a new id"
                )));
            }
            return Ok(existing);
        }
        let scope = scope(&ctx, &id, open.requested_by.clone());
        self.affinity.open_session(&id, &open, &scope).await
    }

    pub async fn get(
        &self,
        _ctx: RequestContext,
        req: SessionRef,
    ) -> Result<SessionRecord, ErrorBody> {
        self.record(&req).await
    }

    async fn record(&self, req: &SessionRef) -> Result<SessionRecord, ErrorBody> {
        validate_id("session_id", &req.session_id)?;
        self.table()
            .get(&req.session_id)
            .await?
            .ok_or_else(|| ErrorBody::not_found(format!("no session {}", req.session_id)))
    }

    pub async fn list(
        &self,
        _ctx: RequestContext,
        req: SessionList,
    ) -> Result<SessionListReply, ErrorBody> {
        let sessions = self.table().list(req.node.as_deref()).await?;
        Ok(SessionListReply { sessions })
    }

    /// `sessions.close`: closes the container on its node (when it still runs), then marks
    /// the session closed. Closing a closed session answers the record again.
    pub async fn close(
        &self,
        ctx: RequestContext,
        req: SessionRef,
    ) -> Result<SessionRecord, ErrorBody> {
        let record = self.record(&req).await?;
        if record.state == SessionState::Closed {
            return Ok(record);
        }
        if let (SessionState::Active, Some(node)) = (record.state, &record.node) {
            if let Err(e) = self.executor.close_session(node, &req.session_id).await {
                tracing::warn!(session_id = %req.session_id, node, error = %e, "executor close failed; closing anyway");
            }
        }
        let closed = self
            .table()
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
        self.auditor.emit(
            AuditKind::SessionClosed,
            &scope(&ctx, &req.session_id, None),
            json!({"node": record.node, "executions": closed.executions}),
        );
        Ok(closed)
    }

    /// Marks the sessions of every node whose heartbeat vanished as lost, until `lost` closes.
    pub async fn mark_lost_sessions(self, mut lost: mpsc::UnboundedReceiver<String>) {
        while let Some(node) = lost.recv().await {
            match self.table().mark_node_lost(&node).await {
                Ok(ids) => {
                    for id in ids {
                        let scope = AuditScope {
                            session_id: Some(id),
                            ..Default::default()
                        };
                        self.auditor.emit(
                            AuditKind::SessionLost,
                            &scope,
                            json!({"node": node, "cause": "heartbeat expired"}),
                        );
                    }
                }
                Err(e) => {
                    tracing::warn!(node, error = %e, "could not mark the node's sessions lost")
                }
            }
        }
    }
}
