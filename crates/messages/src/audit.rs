//! Audit events on `sandbox.v1.audit.<tenant>.<event>`, stored in the `SANDBOX_AUDIT` stream.
//!
//! An event's kind is its details' ([`AuditEvent::kind`]): each kind's details are a type in
//! [`details`], so the two cannot disagree. On the wire the event is the object it always was,
//! `{"id", "kind", …, "details": {…}}`, byte for byte (the golden vectors hold every shape).

mod details;

use serde::{Deserialize, Serialize};

use crate::exec::{Language, Tier, TierChoice};
use crate::risk::RiskLevel;
use crate::tenancy::Tenant;

pub use details::*;

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
    /// A session's background process started (`crate::proc`).
    ProcStarted,
    /// A signal was sent to a background process through `proc.signal`.
    ProcSignaled,
    /// A background process ended: exited, or killed.
    ProcEnded,
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
            AuditKind::ProcStarted => "proc_started",
            AuditKind::ProcSignaled => "proc_signaled",
            AuditKind::ProcEnded => "proc_ended",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(into = "StoredEvent", from = "StoredEvent")]
pub struct AuditEvent {
    /// ULID of the event.
    pub id: String,
    /// Unix milliseconds.
    pub time: u64,
    /// The service instance that emitted it, `<service>.<instance_id>`.
    pub source: String,
    pub execution_id: Option<String>,
    pub session_id: Option<String>,
    pub trace_id: Option<String>,
    /// Who asked (`requested_by` of the request), when known: a label the caller wrote.
    pub actor: Option<String>,
    /// The tenant the event belongs to (also the subject token), `None` for internal work.
    pub tenant: Option<Tenant>,
    /// The NATS account that made the request, as the server authenticated it.
    pub account: Option<String>,
    /// The NATS user that made the request, as the server authenticated it.
    pub user: Option<String>,
    /// What happened; its variant is the event's kind.
    pub details: AuditDetails,
}

impl AuditEvent {
    pub fn kind(&self) -> AuditKind {
        self.details.kind()
    }

    /// An event of `details` with fixed ids, time and caller (tenant `acme`, actor `agent-7`,
    /// session `s1`): one fixture for the golden vectors and the readers' tests.
    pub fn example(details: impl Into<AuditDetails>) -> Self {
        Self {
            id: "01JD0000000000000000000002".into(),
            time: 1_764_000_000_000,
            source: "scheduler.a1".into(),
            execution_id: Some("01JD0000000000000000000000".into()),
            session_id: Some("s1".into()),
            trace_id: None,
            actor: Some("agent-7".into()),
            tenant: Some(Tenant::new("acme").expect("a valid tenant name")),
            account: None,
            user: None,
            details: details.into(),
        }
    }
}

impl ExecutionReceived {
    /// A short Python request: one fixture for the golden vectors and this module's tests.
    pub fn example() -> Self {
        Self {
            language: Language::Python,
            code_bytes: 11,
            tier: TierChoice::Auto,
            timeout_ms: 5000,
        }
    }
}

impl ExecutionAssessed {
    /// A high-risk assessment that asks for a person: one fixture for the golden vectors and
    /// this module's tests.
    pub fn example() -> Self {
        Self {
            level: RiskLevel::High,
            suggested_tier: Tier::Session,
            tier: Tier::Session,
            requires_confirmation: true,
            reason: "imports subprocess".into(),
            findings: vec!["py.subprocess".into()],
        }
    }
}

/// The event as stored: kind and details side by side, the details an object of the kind's
/// fields. Details go through a `serde_json::Value` both ways, so their keys keep the order
/// they always had (the JSON map's) in JSON and MessagePack alike.
#[derive(Serialize, Deserialize)]
struct StoredEvent {
    id: String,
    kind: AuditKind,
    time: u64,
    source: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    execution_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    session_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    trace_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    actor: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tenant: Option<Tenant>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    account: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    user: Option<String>,
    #[serde(default)]
    details: serde_json::Value,
}

/// `Self { <the ten envelope fields moved from $from>, $extra… }`: the one list of the fields
/// [`AuditEvent`] and [`StoredEvent`] share, for both conversions. (Not a shared struct under
/// `#[serde(flatten)]`: the stored event keeps `kind` second, and flatten would change the
/// MessagePack bytes the golden vectors pin.)
macro_rules! with_envelope_of {
    ($from:ident, $($field:ident: $value:expr),+ $(,)?) => {
        Self {
            id: $from.id,
            time: $from.time,
            source: $from.source,
            execution_id: $from.execution_id,
            session_id: $from.session_id,
            trace_id: $from.trace_id,
            actor: $from.actor,
            tenant: $from.tenant,
            account: $from.account,
            user: $from.user,
            $($field: $value),+
        }
    };
}

impl From<AuditEvent> for StoredEvent {
    fn from(e: AuditEvent) -> Self {
        with_envelope_of!(e, kind: e.details.kind(), details: e.details.to_value())
    }
}

impl From<StoredEvent> for AuditEvent {
    fn from(e: StoredEvent) -> Self {
        with_envelope_of!(e, details: AuditDetails::decode(e.kind, e.details))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::exec::{ExecStatus, Timing};

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
                AuditDetails::from(ExecutionReceived::example()),
                json!({"language": "python", "code_bytes": 11, "tier": "auto",
                       "timeout_ms": 5000}),
            ),
            (
                AuditDetails::from(ExecutionAssessed::example()),
                json!({"level": "high", "suggested_tier": "session", "tier": "session",
                       "requires_confirmation": true, "reason": "imports subprocess",
                       "findings": ["py.subprocess"]}),
            ),
            (
                AuditDetails::from(ExecutionFinished {
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
            assert_eq!(AuditDetails::decode(typed.kind(), literal), typed);
        }
    }

    #[test]
    fn an_event_of_an_unknown_shape_still_decodes_and_keeps_what_it_stored() {
        // A browser action's `finished` of an older shape, an older `request_received` without
        // its size, a `placed` with a field no version wrote, details that are not an object.
        for (kind, details) in [
            (AuditKind::Finished, json!({"action": "click", "ok": true})),
            (AuditKind::RequestReceived, json!({"language": "python"})),
            (
                AuditKind::SessionOpened,
                json!({"tier": "session", "by": "x"}),
            ),
            (AuditKind::RiskAssessed, json!("high")),
        ] {
            let mut stored = serde_json::to_value(AuditEvent::example(SessionOpened {
                tier: Tier::Session,
            }))
            .unwrap();
            stored["kind"] = json!(kind);
            stored["details"] = details.clone();
            let e: AuditEvent = serde_json::from_value(stored.clone()).unwrap();
            let AuditDetails::Untyped(untyped) = &e.details else {
                panic!("{kind:?} {details} read as {:?}", e.details);
            };
            assert_eq!((untyped.kind(), untyped.details()), (kind, &details));
            assert_eq!(e.kind(), kind);
            // Stored again, it is what it was.
            assert_eq!(serde_json::to_value(&e).unwrap(), stored);
        }
    }

    #[test]
    fn an_event_without_details_decodes() {
        let e: AuditEvent = serde_json::from_value(json!({
            "id": "e", "kind": "parked", "time": 1, "source": "scheduler.a1"
        }))
        .unwrap();
        assert_eq!(e.kind(), AuditKind::Parked);
        assert!(matches!(e.details, AuditDetails::Untyped(_)), "{e:?}");
    }

    #[test]
    fn an_event_of_an_unknown_kind_is_malformed() {
        let stored = json!({"id": "e", "kind": "teleported", "time": 1, "source": "x"});
        assert!(serde_json::from_value::<AuditEvent>(stored).is_err());
    }
}
