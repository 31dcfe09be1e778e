//! One execution from request to stored result (seed 000 §5.2: assess → confirm → select →
//! execute): validate, look for a stored result, claim the id, ask the risk-assessor, decide
//! the tier, ask for confirmation when required, place and run it ([`crate::dispatch`]), store
//! the result, and audit every step. Sync and async intake share this path.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kit::{AuditScope, Auditor, CallError, Caller};
use messages::audit::AuditKind;
use messages::confirm::{ConfirmRequest, ConfirmState, Confirmation};
use messages::exec::{
    ConfirmationOutcome, Decision, ExecRequest, ExecResult, ExecStatus, Tier, Timing,
};
use messages::risk::{AssessRequest, RiskAssessment};
use messages::subjects::ConfirmOp;
use messages::validate::{validate_exec, EffectiveLimits};
use messages::{ErrorBody, ErrorKind, Subjects};
use ractor::ActorRef;
use serde_json::json;
use tokio::sync::Semaphore;

use crate::config::SchedulerConfig;
use crate::registry::RegistryMsg;
use crate::results::{Claim, ClaimOutcome, Claims, ResultStore};
use crate::sessions::SessionTable;
use crate::tier::decide_tier;

/// Everything the pipeline talks to. Cheap to clone.
#[derive(Clone)]
pub struct Scheduler(pub(crate) Arc<Parts>);

pub(crate) struct Parts {
    pub config: SchedulerConfig,
    pub js: async_nats::jetstream::Context,
    pub subjects: Subjects,
    pub caller: Caller,
    pub registry: ActorRef<RegistryMsg>,
    pub sessions: SessionTable,
    pub results: ResultStore,
    pub claims: Claims,
    pub auditor: Auditor,
    /// The bounded queue: one permit per execution in flight, shared by sync and async.
    pub admission: Arc<Semaphore>,
}

/// Where a request came from and how long it waited.
#[derive(Debug, Clone)]
pub struct Origin {
    pub received: Instant,
    pub queued_ms: u64,
    pub trace_id: Option<String>,
}

/// How an execution attempt ended.
#[derive(Debug)]
pub enum Outcome {
    /// A terminal result, stored (or found stored).
    Done(ExecResult),
    /// A terminal result that could not be stored.
    Unstored(ExecResult, ErrorBody),
    /// The request is malformed or beyond a ceiling; nothing ran.
    Invalid(ErrorBody),
    /// Another scheduler (named) runs this id right now.
    Busy(String),
    /// A dependency failed before anything ran; the same request may be retried.
    Retry(ErrorBody),
}

/// A result for an execution that never reached an executor.
pub(crate) fn terminal(
    id: &str,
    req: &ExecRequest,
    status: ExecStatus,
    error: ErrorBody,
) -> ExecResult {
    ExecResult {
        execution_id: id.to_string(),
        session_id: req.session_id.clone(),
        status,
        tier: Tier::Reject,
        error: Some(error),
        ..Default::default()
    }
}

fn ms(d: Duration) -> u64 {
    d.as_millis().min(u128::from(u64::MAX)) as u64
}

impl Scheduler {
    pub fn config(&self) -> &SchedulerConfig {
        &self.0.config
    }

    pub fn results(&self) -> &ResultStore {
        &self.0.results
    }

    pub fn claims(&self) -> &Claims {
        &self.0.claims
    }

    pub fn admission(&self) -> &Arc<Semaphore> {
        &self.0.admission
    }

    pub(crate) fn audit(&self, kind: AuditKind, scope: &AuditScope, details: serde_json::Value) {
        self.0.auditor.emit(kind, scope, details);
    }

    /// Runs `req` through the whole pipeline. An absent `execution_id` is assigned here.
    pub async fn execute(&self, mut req: ExecRequest, origin: Origin) -> Outcome {
        let id = req
            .execution_id
            .get_or_insert_with(messages::new_id)
            .clone();
        let scope = AuditScope {
            execution_id: Some(id.clone()),
            session_id: req.session_id.clone(),
            trace_id: origin.trace_id.clone(),
            actor: req.requested_by.clone(),
        };
        let limits = match validate_exec(&req, &self.0.config.ceilings) {
            Ok(limits) => limits,
            Err(e) => {
                let body = ErrorBody::from(e);
                self.audit(
                    AuditKind::Rejected,
                    &scope,
                    json!({"stage": "validate", "reason": body.message}),
                );
                return Outcome::Invalid(body);
            }
        };
        // The assessment has no side effects, so it runs while the claim is taken; it is
        // wasted only when an earlier attempt holds the claim or already has a result.
        let assessing = async {
            let started = Instant::now();
            (self.assess(&req).await, started.elapsed())
        };
        let (claimed, assessed) = tokio::join!(self.claim_fresh(&id), assessing);
        let claim = match claimed {
            Ok(claim) => claim,
            Err(outcome) => return outcome,
        };
        self.audit(
            AuditKind::RequestReceived,
            &scope,
            json!({
                "language": req.language.as_str(),
                "code_bytes": req.code.len(),
                "tier": req.tier,
                "timeout_ms": limits.timeout_ms,
            }),
        );
        let outcome = match self.run(&id, &req, limits, &scope, &origin, assessed).await {
            Ok(result) => {
                self.audit(
                    AuditKind::Finished,
                    &scope,
                    json!({
                        "status": result.status.as_str(),
                        "exit_code": result.exit_code,
                        "tier": result.tier.as_str(),
                        "node": result.node,
                        "timing": result.timing,
                    }),
                );
                match self.0.results.put(&result).await {
                    Ok(()) => Outcome::Done(result),
                    Err(e) => {
                        tracing::error!(execution_id = %id, error = %e, "result not stored");
                        Outcome::Unstored(result, e.into())
                    }
                }
            }
            Err(body) => Outcome::Retry(body),
        };
        // The result is stored (or the attempt failed): the caller need not wait for the
        // release, and a claim whose release is lost expires by its TTL.
        tokio::spawn(claim.release());
        outcome
    }

    /// Takes the claim on `id` when no result is stored for it yet; otherwise the outcome to
    /// answer with. Claim first, then look: a holder stores before it releases, so a result
    /// stored by an earlier attempt is always seen (two round trips, not three).
    async fn claim_fresh(&self, id: &str) -> Result<Box<Claim>, Outcome> {
        let claim = match self.0.claims.claim(id).await {
            Ok(ClaimOutcome::Claimed(claim)) => claim,
            Ok(ClaimOutcome::HeldBy(owner)) => {
                // The holder may have stored its result already and not yet released.
                return Err(match self.0.results.get(id).await {
                    Ok(Some(stored)) => Outcome::Done(stored),
                    Ok(None) => Outcome::Busy(owner),
                    Err(e) => Outcome::Retry(e.into()),
                });
            }
            Err(e) => return Err(Outcome::Retry(e.into())),
        };
        match self.0.results.get(id).await {
            Ok(None) => Ok(claim),
            Ok(Some(stored)) => {
                tokio::spawn(claim.release());
                Err(Outcome::Done(stored))
            }
            Err(e) => {
                tokio::spawn(claim.release());
                Err(Outcome::Retry(e.into()))
            }
        }
    }

    /// Assess → tier → confirm → dispatch. `Err` is a transient failure before anything ran.
    async fn run(
        &self,
        id: &str,
        req: &ExecRequest,
        limits: EffectiveLimits,
        scope: &AuditScope,
        origin: &Origin,
        assessed: (Result<RiskAssessment, ErrorBody>, Duration),
    ) -> Result<ExecResult, ErrorBody> {
        let mut timing = Timing {
            queued_ms: origin.queued_ms,
            ..Default::default()
        };
        let finish = |mut r: ExecResult, timing: Timing| {
            r.timing = Timing {
                exec_ms: r.timing.exec_ms,
                total_ms: ms(origin.received.elapsed()) + origin.queued_ms,
                ..timing
            };
            r
        };

        let (risk, assess_took) = assessed;
        let risk = match risk {
            Ok(risk) => risk,
            Err(e) if matches!(e.kind, ErrorKind::BadRequest | ErrorKind::TooLarge) => {
                let r = terminal(id, req, ExecStatus::Rejected, e);
                return Ok(finish(r, timing));
            }
            Err(e) => return Err(e),
        };
        timing.assess_ms = ms(assess_took);
        let tier = decide_tier(
            risk.required_tier(self.0.config.security_mode),
            req.tier,
            req.session_id.is_some(),
        );
        self.audit(
            AuditKind::RiskAssessed,
            scope,
            json!({
                "level": risk.level.as_str(),
                "suggested_tier": risk.suggested_tier.as_str(),
                "tier": tier.as_str(),
                "requires_confirmation": risk.requires_confirmation,
                "reason": risk.reason,
                "findings": risk.findings.iter().map(|f| &f.rule).collect::<Vec<_>>(),
            }),
        );
        let with_risk = |mut r: ExecResult, confirmation: ConfirmationOutcome| {
            r.risk = risk.clone();
            r.confirmation = confirmation;
            r
        };

        if tier == Tier::Reject {
            self.audit(
                AuditKind::Rejected,
                scope,
                json!({"stage": "risk", "level": risk.level.as_str(), "reason": risk.reason}),
            );
            let error = ErrorBody::denied(format!("rejected by the risk policy: {}", risk.reason))
                .with_details(json!({ "findings": risk.findings }));
            let r = terminal(id, req, ExecStatus::Rejected, error);
            return Ok(finish(with_risk(r, ConfirmationOutcome::default()), timing));
        }

        let mut confirmation = ConfirmationOutcome::default();
        if risk.requires_confirmation {
            let started = Instant::now();
            confirmation = self.confirm(id, req, &risk, scope).await?;
            timing.confirm_ms = ms(started.elapsed());
            if confirmation.decision != Decision::Approved {
                let error = ErrorBody::denied(format!(
                    "confirmation {}: {}",
                    match confirmation.decision {
                        Decision::Timeout => "timed out",
                        _ => "denied",
                    },
                    confirmation.reason.as_deref().unwrap_or("no reason given")
                ));
                let mut r = terminal(id, req, ExecStatus::Denied, error);
                r.tier = tier;
                return Ok(finish(with_risk(r, confirmation), timing));
            }
        }

        if tier == Tier::Aio {
            // The aio-pool runs shell commands for browser work; it does not take exec
            // requests yet, so this tier cannot be served here and saying so beats a fallback
            // to a weaker tier.
            let error = ErrorBody::unavailable(
                "tier aio is required, but executions in AIO sandboxes are not served by this \
                 scheduler; use the browser API, or permissive mode for a docker tier",
            );
            let mut r = terminal(id, req, ExecStatus::Internal, error);
            r.tier = tier;
            return Ok(finish(with_risk(r, confirmation), timing));
        }

        let result = self.dispatch(id, req, limits, tier, scope).await?;
        Ok(finish(with_risk(result, confirmation), timing))
    }

    async fn assess(&self, req: &ExecRequest) -> Result<RiskAssessment, ErrorBody> {
        let ask = AssessRequest {
            content: req.code.clone(),
            content_type: req.language.into(),
            params: None,
            mode: Some(self.0.config.security_mode),
        };
        self.0
            .caller
            .call_timeout(
                self.0.subjects.risk_assess(),
                &ask,
                self.0.config.assess_timeout,
            )
            .await
            .map_err(|e| dependency_error("risk-assessor", e))
    }

    async fn confirm(
        &self,
        id: &str,
        req: &ExecRequest,
        risk: &RiskAssessment,
        scope: &AuditScope,
    ) -> Result<ConfirmationOutcome, ErrorBody> {
        let wait = self.0.config.confirm_timeout;
        let ask = ConfirmRequest {
            execution_id: Some(id.to_string()),
            session_id: req.session_id.clone(),
            risk: risk.clone(),
            summary: format!(
                "{} code ({} bytes), risk {}: {}",
                req.language.as_str(),
                req.code.len(),
                risk.level.as_str(),
                risk.reason
            ),
            code_excerpt: excerpt(&req.code, 2048),
            requested_by: req.requested_by.clone(),
            timeout_ms: Some(ms(wait)),
            wait: true,
        };
        self.audit(
            AuditKind::ConfirmationRequested,
            scope,
            json!({"level": risk.level.as_str(), "timeout_ms": ms(wait)}),
        );
        // The confirmation service answers at its own timeout; ours only guards against it
        // vanishing mid-wait. A 503 (its instance stopped while we waited, or none is up yet)
        // is retried with the same execution id, which finds the same pending confirmation.
        let deadline = tokio::time::Instant::now() + wait + Duration::from_secs(10);
        let reply: Result<Confirmation, CallError> = loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let subject = self.0.subjects.confirm(ConfirmOp::Request);
            let reply = self.0.caller.call_timeout(subject, &ask, left).await;
            let retry = matches!(&reply, Err(e) if e.kind() == messages::ErrorKind::Unavailable);
            if !retry || tokio::time::Instant::now() + CONFIRM_RETRY >= deadline {
                break reply;
            }
            tokio::time::sleep(CONFIRM_RETRY).await;
        };
        let outcome = match reply {
            Ok(c) => ConfirmationOutcome {
                decision: match c.state {
                    ConfirmState::Approved => Decision::Approved,
                    ConfirmState::Denied => Decision::Denied,
                    ConfirmState::Timeout | ConfirmState::Pending => Decision::Timeout,
                },
                by: c.by,
                reason: c.reason,
            },
            Err(CallError::TimedOut { timeout, .. }) => ConfirmationOutcome {
                decision: Decision::Timeout,
                by: None,
                reason: Some(format!("no decision within {timeout:?}")),
            },
            Err(e) => return Err(dependency_error("confirmation", e)),
        };
        self.audit(
            AuditKind::ConfirmationDecided,
            scope,
            json!({"decision": outcome.decision, "by": outcome.by, "reason": outcome.reason}),
        );
        Ok(outcome)
    }
}

/// Pause between attempts to reach a confirmation service that is restarting.
const CONFIRM_RETRY: Duration = Duration::from_millis(250);

/// A failed call to another service, named so the client knows which part is missing.
pub(crate) fn dependency_error(service: &str, e: CallError) -> ErrorBody {
    match e {
        CallError::Service(body) => body,
        CallError::NoResponders(subject) => ErrorBody::unavailable(format!(
            "the {service} service is not running (no responders on {subject})"
        )),
        other => {
            let kind = other.kind();
            ErrorBody::new(kind, format!("{service}: {other}"))
        }
    }
}

/// At most `max` bytes of `code`, cut at a character boundary.
fn excerpt(code: &str, max: usize) -> String {
    if code.len() <= max {
        return code.to_string();
    }
    let mut end = max;
    while !code.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &code[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excerpts_cut_at_character_boundaries() {
        assert_eq!(excerpt("abc", 10), "abc");
        assert_eq!(excerpt("ééé", 3), "é…");
    }

    #[test]
    fn missing_services_are_named() {
        let e = dependency_error(
            "risk-assessor",
            CallError::NoResponders("sandbox.v1.risk.assess".into()),
        );
        assert_eq!(e.kind, ErrorKind::Unavailable);
        assert!(e.message.contains("risk-assessor"));
    }
}
