//! Audit events on `sandbox.v1.audit.<tenant>.<event>`, stored in the `SANDBOX_AUDIT` stream.

use serde::{Deserialize, Serialize};

use crate::tenancy::Tenant;

/// The event name is the last subject token, so consumers can filter by subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditKind {
    RequestReceived,
    RiskAssessed,
    ConfirmationRequested,
    ConfirmationDecided,
    Placed,
    Started,
    Finished,
    Rejected,
    FileWritten,
    FileDeleted,
    WorkspaceRestored,
    WorkspaceCleaned,
    SessionOpened,
    SessionClosed,
    SessionLost,
    /// An execution waits for a person; its state is parked and its capacity released.
    Parked,
    /// A parked execution continues after the decision (or its expiry).
    Resumed,
    /// An egress proxy allowed or refused a connection (host, port, address, rule).
    Egress,
}

impl AuditKind {
    pub const fn as_str(self) -> &'static str {
        match self {
            AuditKind::RequestReceived => "request_received",
            AuditKind::RiskAssessed => "risk_assessed",
            AuditKind::ConfirmationRequested => "confirmation_requested",
            AuditKind::ConfirmationDecided => "confirmation_decided",
            AuditKind::Placed => "placed",
            AuditKind::Started => "started",
            AuditKind::Finished => "finished",
            AuditKind::Rejected => "rejected",
            AuditKind::FileWritten => "file_written",
            AuditKind::FileDeleted => "file_deleted",
            AuditKind::WorkspaceRestored => "workspace_restored",
            AuditKind::WorkspaceCleaned => "workspace_cleaned",
            AuditKind::SessionOpened => "session_opened",
            AuditKind::SessionClosed => "session_closed",
            AuditKind::SessionLost => "session_lost",
            AuditKind::Parked => "parked",
            AuditKind::Resumed => "resumed",
            AuditKind::Egress => "egress",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditEvent {
    /// ULID of the event.
    pub id: String,
    pub kind: AuditKind,
    /// Unix milliseconds.
    pub time: u64,
    /// The service instance that emitted it, `<service>.<instance_id>`.
    pub source: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// Who asked (`requested_by` of the request), when known: a label the caller wrote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
    /// The tenant the event belongs to (also the subject token), `None` for internal work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<Tenant>,
    /// The NATS account that made the request, as the server authenticated it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// The NATS user that made the request, as the server authenticated it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Event-specific facts (level, tier, node, status, path, ...).
    #[serde(default)]
    pub details: serde_json::Value,
}
