//! Human-in-the-loop confirmation of risky work.

use serde::{Deserialize, Serialize};

use crate::risk::RiskAssessment;
use crate::tenancy::{unscoped, Tenant};

/// `sandbox.v1.confirm.request`. With `wait` (the default) the reply comes when the decision
/// does (or at the timeout); without it the reply is the pending record at once (id,
/// `expires_at`), to be followed with the `confirm.decided.<tenant>.<id>` event — published for every
/// final state, the timeout included, whether or not anyone waits — or with `get` (events are
/// core NATS: a caller that was disconnected asks). Asking again for the same `execution_id`
/// returns the same confirmation, as it stands.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfirmRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(default)]
    pub risk: RiskAssessment,
    #[serde(default)]
    pub summary: String,
    #[serde(default)]
    pub code_excerpt: String,
    /// The files sent with the code, which it may run: a person approves them with it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<ConfirmFile>,
    /// What `code_excerpt` holds; set by the service that asks.
    #[serde(default, skip_serializing_if = "ConfirmKind::is_code")]
    pub kind: ConfirmKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default = "default_true")]
    pub wait: bool,
    /// The tenant the work belongs to (set by the service that asks; ids above are scoped by
    /// it). Only operators whose scope covers it, and that tenant's agents, see the record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<Tenant>,
}

/// A file sent with code to run, as a person deciding on it sees it: where it is placed, its
/// size and the SHA-256 of its bytes (what was approved can be told from what was not), and,
/// for text, its beginning. Findings in it name it by `path` (`Finding::path`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfirmFile {
    pub path: String,
    /// Size in bytes, as written into the workspace.
    pub bytes: u64,
    /// SHA-256 of those bytes, lower-case hex.
    pub sha256: String,
    /// The beginning of the file when it is text (cut like `code_excerpt`); empty for binary.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub excerpt: String,
}

/// What a confirmation asks about, so that a person sees it rendered as what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConfirmKind {
    /// Code to run: `code_excerpt` is (an excerpt of) the code.
    #[default]
    Code,
    /// A browser action: `code_excerpt` is the action's parameters as a JSON object.
    BrowserAction,
}

impl ConfirmKind {
    /// Code is the default and is left out on the wire (records from before the field read
    /// as code).
    pub fn is_code(&self) -> bool {
        *self == ConfirmKind::Code
    }
}

fn default_true() -> bool {
    true
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConfirmState {
    #[default]
    Pending,
    Approved,
    Denied,
    Timeout,
}

impl ConfirmState {
    pub const fn is_final(self) -> bool {
        !matches!(self, ConfirmState::Pending)
    }
}

/// How far an approval reaches: this request only, or the same rules for the rest of the
/// session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConfirmScope {
    #[default]
    Once,
    Session,
}

/// A confirmation as stored and as returned by every `confirm.*` call.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Confirmation {
    pub id: String,
    pub state: ConfirmState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(default)]
    pub risk: RiskAssessment,
    #[serde(default)]
    pub summary: String,
    #[serde(default)]
    pub code_excerpt: String,
    /// The files sent with the code, as the person deciding saw them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<ConfirmFile>,
    #[serde(default, skip_serializing_if = "ConfirmKind::is_code")]
    pub kind: ConfirmKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
    /// Unix milliseconds.
    pub created_at: u64,
    /// Unix milliseconds after which a pending request times out.
    pub expires_at: u64,
    /// Who decided (a person, or `policy:<name>` for automatic decisions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default)]
    pub scope: ConfirmScope,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<Tenant>,
    /// The NATS account `by` was authenticated in (`OPERATORS` for a person's decision made
    /// with operator credentials); `None` for policy decisions and trusted internal callers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by_account: Option<String>,
}

/// `sandbox.v1.confirm.decide`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfirmDecide {
    pub id: String,
    pub approve: bool,
    pub by: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default)]
    pub scope: ConfirmScope,
    /// Filled in by the confirmation service from the authenticated caller; a value sent by a
    /// client is ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by_account: Option<String>,
}

/// `sandbox.v1.confirm.get`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfirmGet {
    pub id: String,
}

/// `sandbox.v1.confirm.list`: pending ones by default, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfirmList {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<ConfirmState>,
    /// At most this many (default 100, at most 1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ConfirmListReply {
    pub confirmations: Vec<Confirmation>,
}

/// Confirmations as people and agents read them: the execution and session ids each record's
/// agent chose (stored scoped by its tenant, `acme-s1`), beside `tenant`. Only services read the
/// stored form.
pub trait Unscope {
    fn named(self) -> Self;
}

impl Unscope for Confirmation {
    fn named(mut self) -> Self {
        let tenant = self.tenant.clone();
        self.execution_id = self.execution_id.map(|id| unscoped(tenant.as_ref(), &id));
        self.session_id = self.session_id.map(|id| unscoped(tenant.as_ref(), &id));
        self
    }
}

impl Unscope for ConfirmListReply {
    fn named(mut self) -> Self {
        self.confirmations = self.confirmations.into_iter().map(Unscope::named).collect();
        self
    }
}
