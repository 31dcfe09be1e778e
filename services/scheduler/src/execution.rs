//! `Execution`: one request as it goes through the [`crate::pipeline::Pipeline`] — what was
//! decided so far (limits, risk, tier, confirmation) and how long each stage took. It is
//! serializable, because an execution waiting for a person is parked in KV as exactly this.

use std::time::Instant;

use kit::AuditScope;
use messages::exec::{
    AwaitingConfirmation, ConfirmationOutcome, EffectiveLimits, ExecRequest, ExecResult,
    ExecStatus, FileSpec, Language, Tier, Timing,
};
use messages::filesystem::FilesystemPolicy;
use messages::risk::RiskAssessment;
use messages::session::SessionRecord;
use messages::template::RunTemplate;
use messages::tenancy::{scoped, Caller, Tenant};
use messages::validate::ValidationError;
use messages::ErrorBody;
use serde::{Deserialize, Serialize};

use crate::error::{SchedulerError, StoreError};

/// Where a request came from and how long it waited before the scheduler took it.
#[derive(Debug, Clone)]
pub struct Origin {
    pub received: Instant,
    pub queued_ms: u64,
    pub trace_id: Option<String>,
    /// Who asked; its request's ids are already scoped by its tenant ([`scope_request`]).
    pub caller: Caller,
    /// A sync caller, answered with the result itself ([`Execution::sync_reply`]).
    pub sync_reply: bool,
    /// What the risk-assessor and a person review instead of the request's code
    /// ([`Execution::reviewed`]).
    pub reviewed: Option<Reviewed>,
}

/// Code reviewed in place of a request's own, in its own language: a test run executes a
/// small shell launcher, but what is assessed and approved is its Python or JavaScript.
#[derive(Debug, Clone, PartialEq)]
pub struct Reviewed {
    pub language: Language,
    pub code: String,
}

/// The request with the ids its caller named scoped by the caller's tenant,
/// so nothing it names can reach another tenant's executions or sessions.
pub fn scope_request(
    caller: &Caller,
    mut req: ExecRequest,
) -> Result<ExecRequest, ValidationError> {
    if let Some(id) = &req.execution_id {
        req.execution_id = Some(caller.scope("execution_id", id)?);
    }
    if let Some(id) = &req.session_id {
        req.session_id = Some(caller.scope("session_id", id)?);
    }
    Ok(req)
}

/// A new execution id for `caller`'s request that named none.
pub fn mint_id(caller: &Caller) -> String {
    let id = messages::new_id();
    match caller.tenant() {
        Some(t) => scoped(t, &id),
        None => id,
    }
}

/// How an execution attempt ended.
#[derive(Debug)]
pub enum Outcome {
    /// A terminal result, stored (or found stored).
    Done(ExecResult),
    /// A terminal result that could not be stored.
    Unstored(ExecResult, StoreError),
    /// The request is malformed or beyond a ceiling; nothing ran.
    Invalid(ErrorBody),
    /// Another scheduler (named) runs this id right now.
    Busy(String),
    /// A dependency failed before anything ran; the same request may be retried.
    Retry(SchedulerError),
    /// It waits for a person: parked durably, holding no capacity; it resumes on the decision.
    Parked(AwaitingConfirmation),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Execution {
    pub id: String,
    /// The client's request, `execution_id` filled in.
    pub request: ExecRequest,
    pub limits: EffectiveLimits,
    /// Unix milliseconds when this scheduler took the request (the monotonic clock does not
    /// survive a restart; a parked execution's total time must).
    pub received_at: u64,
    pub trace_id: Option<String>,
    pub timing: Timing,
    #[serde(default)]
    pub risk: RiskAssessment,
    #[serde(default)]
    pub tier: Tier,
    #[serde(default)]
    pub confirmation: ConfirmationOutcome,
    /// The tenant it runs for (its ids are scoped by it); `None` for internal callers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<Tenant>,
    /// The authenticated account and user that asked, for the audit trail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The template it runs in, as read when it was admitted (a parked execution runs in
    /// the template it was approved with).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<RunTemplate>,
    /// Its template's filesystem policy, as read when it was admitted (its session's is
    /// added at dispatch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filesystem: Option<FilesystemPolicy>,
    /// The session's record as read when the request was assessed, for the dispatch right
    /// after it; never stored (a parked execution reads the session again when it resumes).
    #[serde(skip)]
    pub session: Option<SessionRecord>,
    /// Its caller waits for the result in a sync reply, so the reply need not wait for the
    /// stored copy's acknowledgement. Never stored: a resumed execution's result reaches a
    /// waiting sync caller through the stream itself.
    #[serde(skip)]
    pub sync_reply: bool,
    /// What the risk-assessor and a person review when it is not the request's code: a test
    /// run's code and tests, not the runner that drives them (`crate::testrun`). Never stored:
    /// both happen before an execution is parked, and the request already holds the files
    /// (a second copy could push a parked entry past the server's payload limit).
    #[serde(skip)]
    pub reviewed: Option<Reviewed>,
}

impl Execution {
    pub fn new(request: ExecRequest, limits: EffectiveLimits, origin: &Origin) -> Self {
        let waited = Timing::ms(origin.received.elapsed());
        Self {
            id: request.execution_id.clone().unwrap_or_default(),
            request,
            limits,
            received_at: messages::now_ms().saturating_sub(waited),
            trace_id: origin.trace_id.clone(),
            timing: Timing {
                queued_ms: origin.queued_ms,
                ..Default::default()
            },
            risk: RiskAssessment::default(),
            tier: Tier::Ephemeral,
            confirmation: ConfirmationOutcome::default(),
            tenant: origin.caller.tenant().cloned(),
            account: Some(origin.caller.account().to_string()),
            user: origin
                .caller
                .user()
                .filter(|u| !u.is_empty())
                .map(str::to_string),
            template: None,
            filesystem: None,
            session: None,
            sync_reply: origin.sync_reply,
            reviewed: origin.reviewed.clone(),
        }
    }

    /// The code that is assessed and shown to a person for approval.
    pub fn reviewed_code(&self) -> &str {
        self.reviewed
            .as_ref()
            .map_or(&self.request.code, |r| &r.code)
    }

    /// The language of [`Self::reviewed_code`].
    pub fn reviewed_language(&self) -> Language {
        self.reviewed
            .as_ref()
            .map_or(self.request.language, |r| r.language)
    }

    /// The files assessed and shown with the code: every file of the request, which the code
    /// may run or import, except in a test run the test runner's own files (the mesh writes
    /// them under its directory, where a test request's files may not go).
    pub fn reviewed_files(&self) -> Vec<FileSpec> {
        let runner = format!("{}/", messages::testrun::RUNNER_DIR);
        let own = |f: &FileSpec| self.reviewed.is_some() && f.path.starts_with(&runner);
        self.request
            .files
            .iter()
            .filter(|f| !own(f))
            .cloned()
            .collect()
    }

    pub fn scope(&self) -> AuditScope {
        AuditScope {
            account: self.account.clone(),
            tenant: self.tenant.clone(),
            user: self.user.clone(),
            execution_id: Some(self.id.clone()),
            session_id: self.request.session_id.clone(),
            trace_id: self.trace_id.clone(),
            actor: self.request.requested_by.clone(),
        }
    }

    /// A result that never reached an executor, with what was decided so far.
    pub fn refused(&self, status: ExecStatus, tier: Tier, error: ErrorBody) -> ExecResult {
        let mut r = terminal(&self.id, &self.request, status, error);
        r.tier = tier;
        self.finish(r)
    }

    /// Overlays the scheduler's view (risk, confirmation, timings) on a result.
    pub fn finish(&self, mut r: ExecResult) -> ExecResult {
        r.risk = self.risk.clone();
        r.confirmation = self.confirmation.clone();
        let since = messages::now_ms().saturating_sub(self.received_at);
        r.timing = Timing {
            exec_ms: r.timing.exec_ms,
            total_ms: since + self.timing.queued_ms,
            ..self.timing
        };
        r
    }
}

/// A result for an execution that never reached an executor.
pub fn terminal(id: &str, req: &ExecRequest, status: ExecStatus, error: ErrorBody) -> ExecResult {
    ExecResult {
        execution_id: id.to_string(),
        session_id: req.session_id.clone(),
        status,
        tier: Tier::Reject,
        error: Some(error),
        ..Default::default()
    }
}
