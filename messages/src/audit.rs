//! Audit events on `sandbox.v1.audit.<tenant>.<event>`, stored in the `SANDBOX_AUDIT` stream.

use serde::{Deserialize, Serialize};

use crate::exec::{ExecStatus, Language, Tier, TierChoice, Timing};
use crate::risk::RiskLevel;
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

impl AuditEvent {
    /// Its details as the type its kind writes, when it has one: `None` for a kind not typed
    /// yet, and for a shape no type reads (an event stored by an older version, or another
    /// service's event of the same kind). Readers then fall back to `details` as stored: an
    /// odd event never fails a listing.
    pub fn typed_details(&self) -> Option<AuditDetails> {
        let d = self.details.clone();
        let typed = match self.kind {
            AuditKind::RequestReceived => {
                AuditDetails::ExecutionReceived(serde_json::from_value(d).ok()?)
            }
            AuditKind::RiskAssessed => {
                AuditDetails::ExecutionAssessed(serde_json::from_value(d).ok()?)
            }
            AuditKind::Finished => AuditDetails::ExecutionFinished(serde_json::from_value(d).ok()?),
            _ => return None,
        };
        Some(typed)
    }
}

/// The details of an execution's events, one type per kind (the scheduler writes them, the
/// console reads them). Stored as the event's `details` object, field for field.
#[derive(Debug, Clone, PartialEq)]
pub enum AuditDetails {
    ExecutionReceived(ExecutionReceived),
    ExecutionAssessed(ExecutionAssessed),
    ExecutionFinished(ExecutionFinished),
}

impl AuditDetails {
    /// The kind of event these details belong to.
    pub const fn kind(&self) -> AuditKind {
        match self {
            AuditDetails::ExecutionReceived(_) => AuditKind::RequestReceived,
            AuditDetails::ExecutionAssessed(_) => AuditKind::RiskAssessed,
            AuditDetails::ExecutionFinished(_) => AuditKind::Finished,
        }
    }

    /// The event's `details` object.
    pub fn to_value(&self) -> serde_json::Value {
        let value = match self {
            AuditDetails::ExecutionReceived(d) => serde_json::to_value(d),
            AuditDetails::ExecutionAssessed(d) => serde_json::to_value(d),
            AuditDetails::ExecutionFinished(d) => serde_json::to_value(d),
        };
        // Plain structs of strings, numbers and enums: nothing in them fails to serialize.
        value.unwrap_or_default()
    }
}

/// `request_received` of an execution: what was asked, before any check of its code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecutionReceived {
    pub language: Language,
    pub code_bytes: u64,
    /// The tier the client asked for.
    pub tier: TierChoice,
    /// The timeout it runs with (the request's, clamped).
    pub timeout_ms: u64,
}

/// `risk_assessed` of an execution: the assessor's verdict and the tier decided from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecutionAssessed {
    pub level: RiskLevel,
    pub suggested_tier: Tier,
    pub tier: Tier,
    pub requires_confirmation: bool,
    pub reason: String,
    /// The rules that matched.
    pub findings: Vec<String>,
}

/// `finished` of an execution: how it ended and where.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecutionFinished {
    pub status: ExecStatus,
    pub exit_code: Option<i64>,
    pub tier: Tier,
    pub node: Option<String>,
    pub timing: Timing,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn event(kind: AuditKind, details: serde_json::Value) -> AuditEvent {
        AuditEvent {
            id: "01JD0000000000000000000002".into(),
            kind,
            time: 1_764_000_000_000,
            source: "scheduler.a1".into(),
            execution_id: Some("01JD0000000000000000000000".into()),
            session_id: None,
            trace_id: None,
            actor: None,
            tenant: None,
            account: None,
            user: None,
            details,
        }
    }

    /// The literals the scheduler wrote before these types: the typed values store the same
    /// objects, so events in a stream from before and after read alike.
    #[test]
    fn typed_details_store_the_objects_the_literals_stored() {
        let timing = Timing {
            total_ms: 42,
            ..Default::default()
        };
        let cases = [
            (
                AuditDetails::ExecutionReceived(ExecutionReceived {
                    language: Language::Python,
                    code_bytes: 11,
                    tier: TierChoice::Auto,
                    timeout_ms: 5000,
                }),
                json!({"language": "python", "code_bytes": 11, "tier": "auto",
                       "timeout_ms": 5000}),
            ),
            (
                AuditDetails::ExecutionAssessed(ExecutionAssessed {
                    level: RiskLevel::High,
                    suggested_tier: Tier::Session,
                    tier: Tier::Session,
                    requires_confirmation: true,
                    reason: "imports subprocess".into(),
                    findings: vec!["py.subprocess".into()],
                }),
                json!({"level": "high", "suggested_tier": "session", "tier": "session",
                       "requires_confirmation": true, "reason": "imports subprocess",
                       "findings": ["py.subprocess"]}),
            ),
            (
                AuditDetails::ExecutionFinished(ExecutionFinished {
                    status: ExecStatus::Ok,
                    exit_code: Some(0),
                    tier: Tier::Ephemeral,
                    node: None,
                    timing,
                }),
                json!({"status": "ok", "exit_code": 0, "tier": "ephemeral", "node": null,
                       "timing": timing}),
            ),
        ];
        for (typed, literal) in cases {
            assert_eq!(typed.to_value(), literal);
            let e = event(typed.kind(), literal);
            assert_eq!(e.typed_details(), Some(typed));
        }
    }

    #[test]
    fn an_event_of_an_unknown_shape_still_decodes_and_reads_untyped() {
        // A browser action's `finished`, an older `request_received` without its size, a kind
        // not typed yet, and details that are not even an object.
        for (kind, details) in [
            (AuditKind::Finished, json!({"action": "click", "ok": true})),
            (AuditKind::RequestReceived, json!({"language": "python"})),
            (AuditKind::Placed, json!({"node": "a", "tier": "session"})),
            (AuditKind::RiskAssessed, json!("high")),
        ] {
            let stored = serde_json::to_vec(&event(kind, details.clone())).unwrap();
            let e: AuditEvent = serde_json::from_slice(&stored).unwrap();
            assert_eq!((e.kind, &e.details), (kind, &details));
            assert_eq!(e.typed_details(), None, "{kind:?} {details}");
        }
    }
}
