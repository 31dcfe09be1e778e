//! The activity view's data: the audit trail (`SANDBOX_AUDIT`), read with the console's own
//! service identity — operators may follow audit events live but not read the services'
//! JetStream — and filtered to the operator's scope before anything is shown.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use messages::audit::{AuditEvent, AuditKind};
use sandmesh_auth::Scope;
use sandmesh_client::audit::AuditQuery;
use sandmesh_client::{ClientError, MeshClient};

/// Recent executions shown at most.
pub const RECENT: usize = 100;
/// How far back the trail is read (recent executions and a session's tail).
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

    /// Finished executions in `scope`, newest first, each with what its earlier events said
    /// (language and size from `request_received`, risk level from `risk_assessed`).
    pub async fn recent(&self, scope: &Scope) -> Result<Vec<AuditEvent>, ClientError> {
        let query = AuditQuery {
            kind: None,
            last: SESSION_WINDOW,
            follow: false,
        };
        let events = self.read(&query, scope, |_| true, usize::MAX).await?;
        let mut facts: HashMap<String, serde_json::Map<String, serde_json::Value>> = HashMap::new();
        for e in &events {
            let (Some(id), Some(details)) = (&e.execution_id, e.details.as_object()) else {
                continue;
            };
            let keys: &[&str] = match e.kind {
                AuditKind::RequestReceived => &["language", "code_bytes"],
                AuditKind::RiskAssessed => &["level"],
                _ => continue,
            };
            let known = facts.entry(id.clone()).or_default();
            for key in keys {
                if let Some(v) = details.get(*key) {
                    known.insert(key.to_string(), v.clone());
                }
            }
        }
        let finished = events
            .into_iter()
            .filter(|e| e.kind == AuditKind::Finished)
            .take(RECENT)
            .map(|mut e| {
                let known = e.execution_id.as_ref().and_then(|id| facts.get(id));
                if let (Some(known), Some(details)) = (known, e.details.as_object_mut()) {
                    for (k, v) in known {
                        details.entry(k.clone()).or_insert_with(|| v.clone());
                    }
                }
                e
            })
            .collect();
        Ok(finished)
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
        // `keep` newest: older ones fall off the front as newer ones arrive.
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
