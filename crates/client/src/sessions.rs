//! Sessions: a workspace and, in tier `session`, a container kept between executions.

use messages::session::{
    SessionList, SessionListReply, SessionOpen, SessionRecord, SessionRef, SessionTtl,
};
use messages::subjects::SessionOp;

use crate::{MeshClient, Result};

#[derive(Debug, Clone)]
pub struct SessionClient {
    mesh: MeshClient,
}

impl SessionClient {
    pub fn new(mesh: MeshClient) -> Self {
        Self { mesh }
    }

    /// Opens a session (idempotent when `session_id` is given).
    pub async fn open(&self, req: &SessionOpen) -> Result<SessionRecord> {
        self.mesh
            .request(self.mesh.subjects().sessions(SessionOp::Open), req)
            .await
    }

    pub async fn get(&self, session_id: &str) -> Result<SessionRecord> {
        self.mesh
            .request(
                self.mesh.subjects().sessions(SessionOp::Get),
                &session_ref(session_id),
            )
            .await
    }

    /// Every session, or those placed on one executor node.
    pub async fn list(&self, node: Option<&str>) -> Result<Vec<SessionRecord>> {
        let req = SessionList {
            node: node.map(str::to_string),
        };
        let reply: SessionListReply = self
            .mesh
            .request(self.mesh.subjects().sessions(SessionOp::List), &req)
            .await?;
        Ok(reply.sessions)
    }

    /// Moves the session's end: it closes itself `ttl_ms` from now.
    pub async fn set_ttl(&self, session_id: &str, ttl_ms: u64) -> Result<SessionRecord> {
        let req = SessionTtl {
            session_id: session_id.to_string(),
            ttl_ms,
        };
        self.mesh
            .request(self.mesh.subjects().sessions(SessionOp::SetTtl), &req)
            .await
    }

    /// Closes a session: its container goes; the record says `closed`.
    pub async fn close(&self, session_id: &str) -> Result<SessionRecord> {
        self.mesh
            .request(
                self.mesh.subjects().sessions(SessionOp::Close),
                &session_ref(session_id),
            )
            .await
    }
}

fn session_ref(session_id: &str) -> SessionRef {
    SessionRef {
        session_id: session_id.to_string(),
    }
}
