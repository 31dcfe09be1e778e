//! Publishing audit events into the `SANDBOX_AUDIT` stream, on `audit.<tenant>.<kind>` so each
//! tenant can follow its own. Audit must not stall the work it
//! describes: events are published asynchronously and a failure is logged, not returned.

use async_nats::jetstream;
use messages::audit::{AuditDetails, AuditEvent};
use messages::tenancy::{Caller, Tenant};
use messages::{Encoding, Subjects};

/// Why an audit event was not stored.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("encoding the audit event: {0}")]
    Encode(#[source] messages::CodecError),
    #[error("storing the audit event in JetStream: {0}")]
    Publish(#[source] jetstream::context::PublishError),
}

#[derive(Clone)]
pub struct Auditor {
    js: jetstream::Context,
    subjects: Subjects,
    source: String,
}

/// The ids, tenant and caller an event is about.
#[derive(Debug, Clone, Default)]
pub struct AuditScope {
    pub execution_id: Option<String>,
    pub session_id: Option<String>,
    pub trace_id: Option<String>,
    pub actor: Option<String>,
    pub tenant: Option<Tenant>,
    /// The authenticated account and user of the request (`None`: internal work).
    pub account: Option<String>,
    pub user: Option<String>,
}

impl AuditScope {
    /// The tenant, account and user of `caller`.
    pub fn by(mut self, caller: &Caller) -> Self {
        if let Some(t) = caller.tenant() {
            self.tenant = Some(t.clone());
        }
        self.account = Some(caller.account().to_string());
        self.user = caller.user().map(str::to_string);
        self
    }
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

    pub fn event(&self, scope: &AuditScope, details: impl Into<AuditDetails>) -> AuditEvent {
        AuditEvent {
            id: messages::new_id(),
            time: messages::now_ms(),
            source: self.source.clone(),
            execution_id: scope.execution_id.clone(),
            session_id: scope.session_id.clone(),
            trace_id: scope
                .trace_id
                .clone()
                .or_else(crate::telemetry::current_trace_id),
            actor: scope.actor.clone(),
            tenant: scope.tenant.clone(),
            account: scope.account.clone(),
            user: scope.user.clone(),
            details: details.into(),
        }
    }

    /// Publishes and waits for the stream's ack (for callers that must know it is stored).
    pub async fn record(&self, event: &AuditEvent) -> Result<(), AuditError> {
        let subject = self
            .subjects
            .audit(event.tenant.as_ref(), event.kind().as_str());
        let payload = Encoding::Json.encode(event).map_err(AuditError::Encode)?;
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(messages::codec::CONTENT_TYPE, messages::codec::JSON);
        headers.insert(async_nats::header::NATS_MESSAGE_ID, event.id.as_str());
        self.js
            .publish_with_headers(subject, headers, payload.into())
            .await
            .map_err(AuditError::Publish)?
            .await
            .map_err(AuditError::Publish)?;
        Ok(())
    }

    /// Fire and forget: records in the background, logging a failure. The event's kind is
    /// its details'.
    pub fn emit(&self, scope: &AuditScope, details: impl Into<AuditDetails>) {
        let event = self.event(scope, details);
        let this = self.clone();
        tokio::spawn(async move {
            if let Err(e) = this.record(&event).await {
                tracing::warn!(error = %e, kind = event.kind().as_str(), "audit event not stored");
            }
        });
    }
}
