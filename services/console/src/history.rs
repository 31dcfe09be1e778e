//! The activity view's data: the audit trail (`SANDBOX_AUDIT`), read with the console's own
//! service identity — operators may follow audit events live but not read the services'
//! JetStream — and filtered to the operator's scope before anything is shown.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use messages::audit::{AuditDetails, AuditEvent, AuditKind};
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

/// One row of the activity table: an event, and what the typed details of its execution's
/// events say.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub event: AuditEvent,
    pub facts: ExecutionFacts,
}

impl Row {
    /// A row of `event` alone.
    pub fn of(event: AuditEvent) -> Self {
        Self::with(event, ExecutionFacts::default())
    }

    /// A row of `event` beside what its execution's earlier events told.
    fn with(event: AuditEvent, mut facts: ExecutionFacts) -> Self {
        facts.add(&event.details);
        Self { event, facts }
    }
}

/// What an execution's events told, each from its kind's details.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExecutionFacts {
    pub received: Option<messages::audit::ExecutionReceived>,
    pub assessed: Option<messages::audit::ExecutionAssessed>,
    pub finished: Option<messages::audit::ExecutionFinished>,
}

impl ExecutionFacts {
    /// Takes what `details` tell of the execution; other events tell it nothing.
    pub fn add(&mut self, details: &AuditDetails) {
        match details {
            AuditDetails::ExecutionReceived(d) => self.received = Some(d.clone()),
            AuditDetails::ExecutionAssessed(d) => self.assessed = Some(d.clone()),
            AuditDetails::ExecutionFinished(d) => self.finished = Some(d.clone()),
            _ => {}
        }
    }

    /// Whether any of the execution's events told something.
    pub fn is_known(&self) -> bool {
        self.received.is_some() || self.assessed.is_some() || self.finished.is_some()
    }
}

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
    pub async fn recent(&self, scope: &Scope) -> Result<Vec<Row>, ClientError> {
        let query = AuditQuery {
            kind: None,
            last: SESSION_WINDOW,
            follow: false,
        };
        let events = self.read(&query, scope, |_| true, usize::MAX).await?;
        let mut earlier: HashMap<String, ExecutionFacts> = HashMap::new();
        for e in events.iter().filter(|e| e.kind() != AuditKind::Finished) {
            if let Some(id) = &e.execution_id {
                earlier.entry(id.clone()).or_default().add(&e.details);
            }
        }
        let finished = events
            .into_iter()
            .filter(|e| e.kind() == AuditKind::Finished)
            .take(RECENT)
            .map(|event| {
                let facts = event
                    .execution_id
                    .as_ref()
                    .and_then(|id| earlier.get(id))
                    .cloned()
                    .unwrap_or_default();
                Row::with(event, facts)
            })
            .collect();
        Ok(finished)
    }

    /// The last events of one session in `scope`, newest first.
    pub async fn session(&self, scope: &Scope, session: &str) -> Result<Vec<Row>, ClientError> {
        let query = AuditQuery {
            kind: None,
            last: SESSION_WINDOW,
            follow: false,
        };
        let wanted = |e: &AuditEvent| e.session_id.as_deref() == Some(session);
        let events = self.read(&query, scope, wanted, SESSION_TAIL).await?;
        Ok(events.into_iter().map(Row::of).collect())
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
