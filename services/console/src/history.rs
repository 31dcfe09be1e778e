//! The activity view's data: the audit trail (`SANDBOX_AUDIT`), read with the console's own
//! service identity — operators may follow audit events live but not read the services'
//! JetStream — and filtered to the operator's scope before anything is shown.

use std::time::Duration;

use futures::StreamExt;
use messages::audit::{AuditEvent, AuditKind};
use sandmesh_auth::Scope;
use sandmesh_client::audit::AuditQuery;
use sandmesh_client::{ClientError, MeshClient};

/// Recent executions shown at most.
pub const RECENT: usize = 100;
/// How far back a session's tail is looked for.
pub const SESSION_WINDOW: u64 = 5000;
/// A session's events shown at most.
pub const SESSION_TAIL: usize = 500;
/// Reading the trail must not hold a page for long.
const READ_LIMIT: Duration = Duration::from_secs(5);

#[derive(Clone)]
pub struct History {
    /// The console's own connection (service user `console`).
    mesh: MeshClient,
}

impl History {
    pub fn new(mesh: MeshClient) -> Self {
        Self { mesh }
    }

    /// Finished executions in `scope`, newest first.
    pub async fn recent(&self, scope: &Scope) -> Result<Vec<AuditEvent>, ClientError> {
        let query = AuditQuery {
            kind: Some(AuditKind::Finished.as_str().to_string()),
            last: RECENT as u64 * 4,
            follow: false,
        };
        self.read(&query, scope, |_| true, RECENT).await
    }

    /// The last events of one session in `scope`, newest first.
    pub async fn session(
        &self,
        scope: &Scope,
        session: &str,
    ) -> Result<Vec<AuditEvent>, ClientError> {
        let query = AuditQuery {
            kind: None,
            last: SESSION_WINDOW,
            follow: false,
        };
        let wanted = |e: &AuditEvent| e.session_id.as_deref() == Some(session);
        self.read(&query, scope, wanted, SESSION_TAIL).await
    }

    async fn read(
        &self,
        query: &AuditQuery,
        scope: &Scope,
        wanted: impl Fn(&AuditEvent) -> bool,
        keep: usize,
    ) -> Result<Vec<AuditEvent>, ClientError> {
        let mut events = self.mesh.audit().events(query).await?;
        let mut out = std::collections::VecDeque::new();
        let deadline = tokio::time::Instant::now() + READ_LIMIT;
        while let Ok(Some(next)) = tokio::time::timeout_at(deadline, events.next()).await {
            let event = next?;
            if scope.covers(event.tenant.as_ref()) && wanted(&event) {
                out.push_back(event);
                if out.len() > keep {
                    out.pop_front();
                }
            }
        }
        Ok(out.into_iter().rev().collect())
    }
}
