//! The details of each kind of audit event: one type per shape a service writes, holding the
//! fields it writes. Every type refuses fields it does not know, so a shape no type reads
//! (stored by an older or newer version) stays [`Untyped`] and is kept as it was.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::AuditKind;
use crate::browser::BrowserAction;
use crate::confirm::{ConfirmScope, ConfirmState};
use crate::exec::{Decision, ExecStatus, Language, Tier, TierChoice, Timing};
use crate::executor::Backend;
use crate::risk::RiskLevel;
use crate::session::CloseReason;

/// The enum of details, its kind per variant, and the decoding that tries a kind's shapes in
/// order, from one list (so a new shape is one line here and its type below).
macro_rules! audit_details {
    ($( $(#[$doc:meta])* $variant:ident => $kind:ident, )*) => {
        /// What an audit event tells; the variant decides the event's kind.
        #[derive(Debug, Clone, PartialEq)]
        pub enum AuditDetails {
            $( $(#[$doc])* $variant($variant), )*
            /// Details no type reads: a shape stored by another version, kept as stored so a
            /// listing still shows it. Emitters never write it.
            Untyped(Untyped),
        }

        impl AuditDetails {
            /// The kind of event these details belong to.
            pub const fn kind(&self) -> AuditKind {
                match self {
                    $( AuditDetails::$variant(_) => AuditKind::$kind, )*
                    AuditDetails::Untyped(u) => u.kind,
                }
            }

            /// The event's `details` object.
            pub fn to_value(&self) -> Value {
                let value = match self {
                    $( AuditDetails::$variant(d) => serde_json::to_value(d), )*
                    AuditDetails::Untyped(u) => return u.details.clone(),
                };
                // Structs of strings, numbers, enums and JSON values: nothing in them fails
                // to serialize.
                value.unwrap_or_default()
            }

            /// `details` of a `kind` event as the first of the kind's types that reads them,
            /// or [`Untyped`] when none does: decoding an event never fails on its details.
            pub fn decode(kind: AuditKind, details: Value) -> Self {
                $(
                    if kind == AuditKind::$kind {
                        if let Ok(d) = $variant::deserialize(&details) {
                            return AuditDetails::$variant(d);
                        }
                    }
                )*
                AuditDetails::Untyped(Untyped { kind, details })
            }
        }

        $(
            impl From<$variant> for AuditDetails {
                fn from(d: $variant) -> Self {
                    AuditDetails::$variant(d)
                }
            }
        )*
    };
}

audit_details! {
    /// The scheduler received an execution.
    ExecutionReceived => RequestReceived,
    /// The scheduler assessed an execution's code.
    ExecutionAssessed => RiskAssessed,
    /// The browser router assessed an action.
    BrowserAssessed => RiskAssessed,
    /// The scheduler refused an execution.
    ExecutionRejected => Rejected,
    /// The confirmation service asked a person.
    ConfirmationRequested => ConfirmationRequested,
    /// A confirmation was decided (by a person, a policy, a grant or its expiry).
    ConfirmationDecided => ConfirmationDecided,
    /// An execution waits for its confirmation.
    ExecutionParked => Parked,
    /// A parked execution continues.
    ExecutionResumed => Resumed,
    /// The scheduler chose where an execution runs.
    ExecutionPlaced => Placed,
    /// The scheduler sent an execution to its executor.
    ExecutionStarted => Started,
    /// An execution ended.
    ExecutionFinished => Finished,
    /// A browser action ended.
    BrowserActed => Finished,
    SessionOpened => SessionOpened,
    SessionClosed => SessionClosed,
    SessionLost => SessionLost,
    FileWritten => FileWritten,
    FileDeleted => FileDeleted,
    WorkspaceRestored => WorkspaceRestored,
    WorkspaceCleaned => WorkspaceCleaned,
    /// An egress proxy's decision (docker executor and browser router).
    EgressEvent => Egress,
    /// The scheduler started a session's background process.
    ProcessStarted => ProcStarted,
    /// The scheduler sent a background process a signal.
    ProcessSignaled => ProcSignaled,
    /// A background process ended (from the executor holding it).
    ProcessEnded => ProcEnded,
}

/// Details of a shape no type reads, as they were stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Untyped {
    kind: AuditKind,
    details: Value,
}

impl Untyped {
    pub fn kind(&self) -> AuditKind {
        self.kind
    }

    pub fn details(&self) -> &Value {
        &self.details
    }
}

// === an execution, from the scheduler ===

/// `request_received` of an execution: what was asked, before any check of its code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
#[serde(deny_unknown_fields)]
pub struct ExecutionAssessed {
    pub level: RiskLevel,
    pub suggested_tier: Tier,
    pub tier: Tier,
    pub requires_confirmation: bool,
    pub reason: String,
    /// The rules that matched.
    pub findings: Vec<String>,
}

/// `rejected`: the stage that refused an execution, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "stage", rename_all = "snake_case", deny_unknown_fields)]
pub enum ExecutionRejected {
    /// Its request failed a check (limits, template, network policy, session).
    Validate { reason: String },
    /// The risk policy refused its code.
    Risk { level: RiskLevel, reason: String },
}

/// `parked`: the execution waits for confirmation `confirmation_id` until `expires_at`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutionParked {
    pub confirmation_id: String,
    /// Unix milliseconds.
    pub expires_at: u64,
}

/// `resumed`: a parked execution continues with the decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutionResumed {
    pub confirmation_id: String,
    pub decision: Decision,
}

/// `placed`: where an execution goes and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutionPlaced {
    pub tier: Tier,
    /// `None`: the executors' queue group takes it.
    pub node: Option<String>,
    pub reason: String,
    /// The scheduler's placement strategy (`round_robin`, `least_loaded`, `resource_aware`).
    pub strategy: String,
    pub session_restored: bool,
}

/// `started`: the run was sent to its executor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutionStarted {
    /// `None`: sent to the backend's queue group.
    pub node: Option<String>,
    pub tier: Tier,
    pub backend: Backend,
}

/// `finished` of an execution: how it ended and where.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutionFinished {
    pub status: ExecStatus,
    pub exit_code: Option<i64>,
    pub tier: Tier,
    pub node: Option<String>,
    pub timing: Timing,
}

// === confirmations ===

/// `confirmation_requested`: a person is asked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfirmationRequested {
    pub id: String,
    pub level: RiskLevel,
    pub summary: String,
    /// Unix milliseconds.
    pub expires_at: u64,
}

/// `confirmation_decided`: the decision, by whom, and how long it waited.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfirmationDecided {
    pub id: String,
    pub state: ConfirmState,
    pub by: Option<String>,
    pub reason: Option<String>,
    pub scope: ConfirmScope,
    pub waited_ms: u64,
}

// === a session's background processes ===

/// `proc_started`: what was started (the program's name and the command's size: the command
/// line may hold secrets, as code may).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessStarted {
    pub proc_id: String,
    pub program: String,
    pub command_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    pub pty: bool,
    pub node: String,
    pub pid: u32,
}

/// `proc_signaled`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessSignaled {
    pub proc_id: String,
    pub signal: crate::proc::ProcSignalKind,
}

/// `proc_ended`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessEnded {
    pub proc_id: String,
    pub state: crate::proc::ProcState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
}

// === sessions ===

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionOpened {
    pub tier: Tier,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionClosed {
    /// `None`: it was never placed.
    pub node: Option<String>,
    pub executions: u64,
    pub reason: CloseReason,
}

/// `session_lost`: the node holding the session's sandbox is gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionLost {
    pub node: String,
    /// `None`: a run of the session found the node gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<LostCause>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LostCause {
    /// The node's heartbeat expired and the node does not answer.
    #[serde(rename = "heartbeat expired")]
    HeartbeatExpired,
}

// === workspaces, from the workspace store ===

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileWritten {
    pub path: String,
    pub size: u64,
    pub sha256: String,
    pub append: bool,
}

/// `file_deleted`: a file, or a directory with the files in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileDeleted {
    pub path: String,
    pub files: u64,
    pub bytes: u64,
}

/// `workspace_restored`: what an archive changed (counts of files).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceRestored {
    pub created: u64,
    pub modified: u64,
    pub deleted: u64,
    pub replace: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceCleaned {
    pub reason: CleanReason,
    pub files: u64,
    pub bytes: u64,
}

/// Why a workspace was removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CleanReason {
    /// Its session asked (`workspace.cleanup`).
    Request,
    /// Its time to live ran out.
    Ttl,
}

// === egress ===

/// One decision of an egress proxy: a destination allowed or refused, and the rule that
/// decided.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressEvent {
    pub host: String,
    pub port: u16,
    /// The address dialed (allowed) or refused after resolution, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<IpAddr>,
    pub allowed: bool,
    pub rule: String,
}

// === browser actions, from the browser router ===

/// `risk_assessed` of a browser action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BrowserAssessed {
    pub action: BrowserAction,
    /// The action's parameters as the assessor saw them.
    pub params: Value,
    pub level: RiskLevel,
    pub reason: String,
    /// Whether a person is asked before it runs.
    pub confirmation: bool,
}

/// `finished` of a browser action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "ActedWire", try_from = "ActedWire")]
pub struct BrowserActed {
    pub action: BrowserAction,
    pub outcome: BrowserOutcome,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BrowserOutcome {
    /// Done; the page's URL after it, and whether the browser had to be started afresh.
    Done {
        url: Option<String>,
        state_lost: bool,
    },
    /// Refused or failed with this wire error.
    Failed { code: u16, error: String },
}

/// A browser action's end as stored: `ok` beside the fields of its outcome.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum ActedWire {
    Done(DoneWire),
    Failed(FailedWire),
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct DoneWire {
    action: BrowserAction,
    ok: bool,
    url: Option<String>,
    state_lost: bool,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FailedWire {
    action: BrowserAction,
    ok: bool,
    code: u16,
    error: String,
}

impl From<BrowserActed> for ActedWire {
    fn from(a: BrowserActed) -> Self {
        let action = a.action;
        match a.outcome {
            BrowserOutcome::Done { url, state_lost } => ActedWire::Done(DoneWire {
                action,
                ok: true,
                url,
                state_lost,
            }),
            BrowserOutcome::Failed { code, error } => ActedWire::Failed(FailedWire {
                action,
                ok: false,
                code,
                error,
            }),
        }
    }
}

impl TryFrom<ActedWire> for BrowserActed {
    type Error = &'static str;

    fn try_from(wire: ActedWire) -> Result<Self, Self::Error> {
        let (action, outcome) = match wire {
            ActedWire::Done(d) if d.ok => (
                d.action,
                BrowserOutcome::Done {
                    url: d.url,
                    state_lost: d.state_lost,
                },
            ),
            ActedWire::Failed(f) if !f.ok => (
                f.action,
                BrowserOutcome::Failed {
                    code: f.code,
                    error: f.error,
                },
            ),
            _ => return Err("`ok` disagrees with the outcome's fields"),
        };
        Ok(Self { action, outcome })
    }
}
