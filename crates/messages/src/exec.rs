//! Executions: the request a client sends, the result it gets back, and the output chunks
//! streamed while it runs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use crate::code::{ContentEncoding, FileSpec, Language, Limits, Tier, TierChoice};
use crate::error::ErrorBody;
use crate::network::{NetworkPolicy, NetworkReport};
use crate::risk::RiskAssessment;
use crate::template::TemplateRan;
use crate::tenancy::{unscoped, Tenant};
use crate::validate::{
    check_size, clamp_timeout, clamp_u64, validate_env, validate_relative_path, Ceilings,
    ValidationError,
};

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// The idempotency key; a ULID is assigned when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    pub language: Language,
    pub code: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default)]
    pub tier: TierChoice,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<FileSpec>,
    #[serde(default)]
    pub stream_output: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
    /// Egress for this one execution (no session: a session's policy is set when it opens).
    /// Absent: no network at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkPolicy>,
    /// The template to run in (`crate::template`): its image, and its defaults for what the
    /// request leaves out. Absent: the session's template, else the sandbox image as is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// Run the code as a cell of the session's long-lived interpreter (Python or JavaScript,
    /// as `language` says; not shell), so variables survive between executions and rich outputs
    /// come back typed (`docs/architecture.md#kernels`).
    /// Needs a session. Absent: a fresh interpreter per execution.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub kernel: bool,
}

/// Where a kernel cell's rich output came from.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputKind {
    /// The value of the cell's last expression.
    #[default]
    Result,
    /// A `display(...)` call or a captured figure.
    Display,
}

/// One typed output of a kernel cell (`text/plain`, `text/html`, `image/png`,
/// `application/json`): inline `content` (base64 for binary types, as `encoding` says), or,
/// when large, the workspace `path` (under `artifacts/`) of the file holding it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RichOutput {
    pub kind: OutputKind,
    pub mime_type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default)]
    pub encoding: ContentEncoding,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// A file a run created or changed that its session's workspace did not take, and why: a name
/// no workspace path may have (a newline, a backslash, an encoded `..`, ...), or a file past
/// the total size one run carries back.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RefusedFile {
    /// The name as the run made it, relative to the workspace: it may hold control characters,
    /// so show it escaped.
    pub path: String,
    pub reason: String,
}

/// The exception a kernel cell raised.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CellError {
    /// The exception's type, e.g. `ZeroDivisionError`.
    pub name: String,
    pub value: String,
    /// The formatted traceback, one entry per line group (as Jupyter's).
    #[serde(default)]
    pub traceback: Vec<String>,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecStatus {
    /// Exit code 0.
    Ok,
    /// Non-zero exit.
    Error,
    Timeout,
    Oom,
    OutputLimit,
    Killed,
    Rejected,
    Denied,
    ExecutorLost,
    /// Accepted, but nothing could run it before its queue deadline (no executor took it):
    /// the error says why. Never run, so safe to submit again.
    Unavailable,
    #[default]
    Internal,
}

impl ExecStatus {
    pub const fn as_str(self) -> &'static str {
        match self {
            ExecStatus::Ok => "ok",
            ExecStatus::Error => "error",
            ExecStatus::Timeout => "timeout",
            ExecStatus::Oom => "oom",
            ExecStatus::OutputLimit => "output_limit",
            ExecStatus::Killed => "killed",
            ExecStatus::Rejected => "rejected",
            ExecStatus::Denied => "denied",
            ExecStatus::ExecutorLost => "executor_lost",
            ExecStatus::Unavailable => "unavailable",
            ExecStatus::Internal => "internal",
        }
    }
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    #[default]
    NotRequired,
    Approved,
    Denied,
    Timeout,
}

/// Why the execution was (or was not) allowed to run.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ConfirmationOutcome {
    pub decision: Decision,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    pub peak_memory_bytes: u64,
    pub cpu_ms: u64,
}

/// Milliseconds spent in each phase.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Timing {
    #[serde(default)]
    pub queued_ms: u64,
    #[serde(default)]
    pub assess_ms: u64,
    #[serde(default)]
    pub confirm_ms: u64,
    #[serde(default)]
    pub exec_ms: u64,
    #[serde(default)]
    pub total_ms: u64,
}

impl Timing {
    /// `d` in whole milliseconds, rounded to the nearest: truncating would make every phase
    /// read half a millisecond short on average, and a difference of phases (the mesh's own
    /// overhead: the total less the executor's time) half a millisecond long.
    pub fn ms(d: std::time::Duration) -> u64 {
        ((d.as_micros() + 500) / 1000).min(u128::from(u64::MAX)) as u64
    }
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ExecResult {
    pub execution_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    pub status: ExecStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
    #[serde(default)]
    pub stdout: String,
    #[serde(default)]
    pub stderr: String,
    #[serde(default)]
    pub stdout_truncated: bool,
    #[serde(default)]
    pub stderr_truncated: bool,
    pub tier: Tier,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(default)]
    pub risk: RiskAssessment,
    #[serde(default)]
    pub confirmation: ConfirmationOutcome,
    #[serde(default)]
    pub files_created: Vec<String>,
    #[serde(default)]
    pub files_modified: Vec<String>,
    /// Files the run created or changed that were not saved, each with why. Every other
    /// change was saved.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files_refused: Vec<RefusedFile>,
    /// Changes past the most one run carries back (`error` names the limit): neither saved nor
    /// listed. The changes kept are those nearest the workspace's root.
    #[serde(default, skip_serializing_if = "crate::network::is_zero")]
    pub files_omitted: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    #[serde(default)]
    pub timing: Timing,
    /// Set when the session's process state was lost (its node died and the session was
    /// re-placed with its workspace restored).
    #[serde(default)]
    pub session_restored: bool,
    /// The hosts the run contacted and those its egress proxy refused (runs with a network
    /// policy only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkReport>,
    /// The template and image it ran in (runs that named a template only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<TemplateRan>,
    /// A kernel cell's typed outputs, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outputs: Vec<RichOutput>,
    /// The exception a kernel cell raised (the status is then `error`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cell_error: Option<CellError>,
    /// A kernel cell ran in a kernel started anew (the previous one died: killed, out of
    /// memory, or its container replaced): the variables of earlier cells are gone.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub state_lost: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}

impl ExecResult {
    /// The result as `tenant`'s agents know it: ids without the tenant's scope prefix.
    pub fn unscoped(mut self, tenant: Option<&Tenant>) -> Self {
        self.execution_id = unscoped(tenant, &self.execution_id);
        self.session_id = self.session_id.map(|s| unscoped(tenant, &s));
        self
    }
}

impl AwaitingConfirmation {
    /// The notice as `tenant`'s agents know it.
    pub fn unscoped(mut self, tenant: Option<&Tenant>) -> Self {
        self.execution_id = unscoped(tenant, &self.execution_id);
        self
    }
}

impl ResultLookup {
    /// The look-up as `tenant`'s agents know it.
    pub fn unscoped(self, tenant: Option<&Tenant>) -> Self {
        match self {
            ResultLookup::Done { result } => ResultLookup::Done {
                result: Box::new(result.unscoped(tenant)),
            },
            ResultLookup::Pending {
                execution_id,
                awaiting_confirmation,
            } => ResultLookup::Pending {
                execution_id: unscoped(tenant, &execution_id),
                awaiting_confirmation: awaiting_confirmation.map(|a| a.unscoped(tenant)),
            },
        }
    }
}

/// The longest a `exec.result` look-up may wait for its result to be stored.
pub const MAX_RESULT_WAIT_MS: u64 = 30_000;

/// `sandbox.v1.exec.result` request. With `wait_ms`, a result not stored yet is waited for up
/// to that long (at most [`MAX_RESULT_WAIT_MS`]) before the reply says `pending`: a long poll
/// that needs no subscription to the results stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResultGet {
    pub execution_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
}

/// `sandbox.v1.exec.result` reply: the result once stored, or `pending` while it runs.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum ResultLookup {
    Done {
        result: Box<ExecResult>,
    },
    Pending {
        execution_id: String,
        /// Set while the execution is parked waiting for a person's decision.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        awaiting_confirmation: Option<AwaitingConfirmation>,
    },
}

/// Request header of a sync `exec` asking for status notices as extra messages on the reply
/// subject before the final reply (any value). Opt-in, because a plain request-reply client
/// would take the first message on its reply inbox as the reply. They go to the reply subject,
/// not to a subject the caller names, because a tenant's inboxes are in its own account: only
/// replies cross back.
pub const NOTIFY_HEADER: &str = "Sandmesh-Notify";
/// Header of a status notice saying what it is.
pub const STATUS_HEADER: &str = "Sandmesh-Status";
/// [`STATUS_HEADER`] value: the execution is parked until a person decides; the body is an
/// [`AwaitingConfirmation`] (JSON).
pub const STATUS_AWAITING_CONFIRMATION: &str = "awaiting-confirmation";

/// An execution waits for a person: decide it with `confirm.decide` (CLI:
/// `sandmesh confirm approve <confirmation_id>`) before `expires_at`, or it is denied.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct AwaitingConfirmation {
    pub execution_id: String,
    pub confirmation_id: String,
    /// Unix milliseconds.
    pub expires_at: u64,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputStream {
    Stdout,
    Stderr,
}

/// One piece of live output on `sandbox.v1.output.<execution_id>`. `seq` starts at 0 and has no
/// gaps, so a consumer can detect loss; the chunk with `eof` is the last.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputChunk {
    pub seq: u64,
    pub stream: OutputStream,
    pub data: String,
    #[serde(default)]
    pub eof: bool,
}

/// Limits with every value decided: what the executor enforces.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EffectiveLimits {
    pub timeout_ms: u64,
    pub memory_mb: u64,
    pub cpus: f64,
    pub pids: u64,
    pub max_output_bytes: u64,
}

impl EffectiveLimits {
    pub fn as_limits(&self) -> Limits {
        Limits {
            memory_mb: Some(self.memory_mb),
            cpus: Some(self.cpus),
            pids: Some(self.pids),
            max_output_bytes: Some(self.max_output_bytes),
        }
    }
}

/// A kernel cell runs in its session's container, in a Python or JavaScript kernel, with no
/// stdin.
fn validate_kernel(req: &ExecRequest) -> Result<(), ValidationError> {
    if req.session_id.is_none() {
        return Err(ValidationError::invalid(
            "kernel",
            "a kernel lives in a session: set session_id",
        ));
    }
    if req.language == Language::Shell {
        return Err(ValidationError::invalid(
            "kernel",
            "no shell kernel; kernels run python and javascript",
        ));
    }
    if req.tier == TierChoice::Aio {
        return Err(ValidationError::invalid(
            "kernel",
            "kernels run in the session's container, not in tier aio",
        ));
    }
    if req.stdin.is_some() {
        return Err(ValidationError::invalid(
            "stdin",
            "a kernel cell has no stdin",
        ));
    }
    Ok(())
}

/// Checks an exec request against the ceilings and decides its limits (values above a ceiling
/// are clamped to it; zero, negative or non-finite values are refused).
pub fn validate_exec(req: &ExecRequest, c: &Ceilings) -> Result<EffectiveLimits, ValidationError> {
    if let Some(id) = &req.execution_id {
        crate::tenancy::validate_scoped_id("execution_id", id)?;
    }
    if let Some(id) = &req.session_id {
        crate::tenancy::validate_scoped_id("session_id", id)?;
    }
    if req.kernel {
        validate_kernel(req)?;
    }
    check_size("code", req.code.len(), c.max_code_bytes)?;
    if req.code.contains('\0') {
        return Err(ValidationError::invalid(
            "code",
            "NUL bytes are not allowed in code",
        ));
    }
    if let Some(stdin) = &req.stdin {
        check_size("stdin", stdin.len(), c.max_stdin_bytes)?;
    }
    validate_env(&req.env, c)?;
    if req.files.len() > c.max_files {
        return Err(ValidationError::invalid(
            "files",
            format!("at most {} files", c.max_files),
        ));
    }
    let mut total = 0usize;
    for (i, f) in req.files.iter().enumerate() {
        let field = format!("files[{i}].path");
        validate_relative_path(&field, &f.path)?;
        let bytes = f
            .bytes()
            .map_err(|e| ValidationError::invalid(format!("files[{i}].content"), e))?;
        total += bytes.len();
    }
    check_size("files", total, c.max_files_bytes)?;
    let limits = req.limits.unwrap_or_default();
    let cpus = match limits.cpus {
        None => c.default_cpus.min(c.max_cpus),
        Some(v) if v.is_finite() && v > 0.0 => v.min(c.max_cpus),
        Some(_) => {
            return Err(ValidationError::invalid(
                "limits.cpus",
                "must be a positive number",
            ))
        }
    };
    Ok(EffectiveLimits {
        timeout_ms: clamp_timeout(req.timeout_ms, c.default_timeout_ms, c)?,
        memory_mb: clamp_u64(
            "limits.memory_mb",
            limits.memory_mb,
            c.default_memory_mb,
            c.max_memory_mb,
        )?
        .max(16),
        cpus,
        pids: clamp_u64("limits.pids", limits.pids, c.default_pids, c.max_pids)?.max(8),
        max_output_bytes: clamp_u64(
            "limits.max_output_bytes",
            limits.max_output_bytes,
            c.default_output_bytes,
            c.max_output_bytes,
        )?,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::Timing;

    #[test]
    fn phase_times_round_to_the_nearest_millisecond() {
        let us = Duration::from_micros;
        assert_eq!(Timing::ms(us(0)), 0);
        assert_eq!(Timing::ms(us(499)), 0);
        assert_eq!(Timing::ms(us(500)), 1);
        assert_eq!(Timing::ms(us(1_499)), 1);
        assert_eq!(Timing::ms(Duration::from_secs(2)), 2_000);
        assert_eq!(Timing::ms(Duration::MAX), u64::MAX);
    }
}
