//! Publishing audit events into the `SANDBOX_AUDIT` stream. Audit must not stall the work it
//! describes: events are published asynchronously and a failure is logged, not returned.

use async_nats::jetstream;
use messages::audit::{AuditEvent, AuditKind};
use messages::{Encoding, Subjects};

#[derive(Clone)]
pub struct Auditor {
    js: jetstream::Context,
    subjects: Subjects,
    source: String,
}

/// The ids and actor an event is about.
#[derive(Debug, Clone, Default)]
pub struct AuditScope {
    pub execution_id: Option<String>,
    pub session_id: Option<String>,
    pub trace_id: Option<String>,
    pub actor: Option<String>,
}

impl Auditor {
    pub fn new(
        js: jetstream::Context,
        subjects: Subjects,
        service: &str,
        instance_id: &str,
    ) -> Self {
        Self {
            js,
            subjects,
            source: format!("{service}.{instance_id}"),
        }
    }

    pub fn event(
        &self,
        kind: AuditKind,
        scope: &AuditScope,
        details: serde_json::Value,
    ) -> AuditEvent {
        AuditEvent {
            id: messages::new_id(),
            kind,
            time: messages::now_ms(),
            source: self.source.clone(),
            execution_id: scope.execution_id.clone(),
            session_id: scope.session_id.clone(),
            trace_id: scope
                .trace_id
                .clone()
                .or_else(crate::telemetry::current_trace_id),
            actor: scope.actor.clone(),
            details,
        }
    }

    /// Publishes and waits for the stream's ack (for callers that must know it is stored).
    pub async fn record(&self, event: &AuditEvent) -> Result<(), String> {
        let subject = self.subjects.audit(event.kind.as_str());
        let payload = Encoding::Json.encode(event).map_err(|e| e.to_string())?;
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(messages::codec::CONTENT_TYPE, messages::codec::JSON);
        headers.insert(async_nats::header::NATS_MESSAGE_ID, event.id.as_str());
        self.js
            .publish_with_headers(subject, headers, payload.into())
            .await
            .map_err(|e| e.to_string())?
            .await
            .map_err(|e| e.to_string())?;
        Ok(())
    }

    /// Fire and forget: records in the background, logging a failure.
    pub fn emit(&self, kind: AuditKind, scope: &AuditScope, details: serde_json::Value) {
        let event = self.event(kind, scope, details);
        let this = self.clone();
        tokio::spawn(async move {
            if let Err(e) = this.record(&event).await {
                tracing::warn!(error = %e, kind = event.kind.as_str(), "audit event not stored");
            }
        });
    }
}
