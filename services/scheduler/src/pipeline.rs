//! `Pipeline`: one execution from request to stored result (assess → confirm → select →
//! execute), as stages over an [`Execution`]: validate, claim + assess, tier, confirm
//! (or park), place, run, store. Sync and async intake share it, and so does the
//! [`crate::resumer::Resumer`], which continues a parked execution at the place stage.
//!
//! Waiting for a person never holds capacity: an execution that needs approval
//! is recorded in the [`ParkedStore`], its claim released, and [`Outcome::Parked`] returned so
//! the intake releases its admission permit.

use std::time::{Duration, Instant};

use kit::{AuditScope, Auditor};
use messages::audit::{
    AuditDetails, ExecutionAssessed, ExecutionFinished, ExecutionParked, ExecutionReceived,
    ExecutionRejected, ExecutionResumed,
};
use messages::exec::{validate_exec, Decision, ExecRequest, ExecResult, ExecStatus, Tier, Timing};
use messages::risk::{AssessRequest, RiskAssessment};
use messages::validate::Ceilings;
use messages::{ErrorBody, ErrorKind, ServiceName};
use sandmesh_client::{RiskClient, TemplateClient};
use serde_json::json;
use tokio_util::task::TaskTracker;

use crate::claims::{ClaimOutcome, Claims, Hold};
use crate::confirm::{self, Confirmations};
use crate::dispatch::Dispatcher;
use crate::error::SchedulerError;
use crate::execution::{mint_id, Execution, Origin, Outcome};
use crate::parking::{Parked, ParkedState, ParkedStore};
use crate::results::ResultStore;
use crate::tier::decide_tier;

/// The settings the stages decide by.
#[derive(Debug, Clone)]
pub struct Policy {
    pub security_mode: messages::risk::SecurityMode,
    pub ceilings: Ceilings,
    pub assess_timeout: Duration,
    /// Added to an execution's own timeout; past it the executor counts as lost.
    pub exec_grace: Duration,
    /// The egress a deployment permits at all (`SANDMESH_NETWORK_ALLOW`).
    pub network_ceiling: messages::network::NetworkPolicy,
    /// The longest a session may ask to live (`SANDMESH_SESSION_MAX_TTL_MS`).
    pub session_lifetime: messages::session::SessionLifetime,
}

/// Built as a struct literal in [`crate::run`]: every part is a handle of its own.
#[derive(Clone)]
pub struct Pipeline {
    pub policy: Policy,
    /// Its timeout is [`Policy::assess_timeout`].
    pub risk: RiskClient,
    /// Templates an execution names are read before it is validated.
    pub templates: TemplateClient,
    pub results: ResultStore,
    pub claims: Claims,
    pub confirmations: Confirmations,
    pub parked: ParkedStore,
    pub dispatcher: Dispatcher,
    pub auditor: Auditor,
    /// Stores finishing after their sync caller was answered; the scheduler's stop waits.
    pub stores: TaskTracker,
}

/// What the confirm stage decided.
enum Confirmed {
    /// Run it (approved, or no confirmation needed).
    Go,
    /// A terminal result: denied or timed out. (Both boxed: results and executions carry
    /// network policies and reports, and most executions take neither branch.)
    Stop(Box<ExecResult>),
    /// Waiting for a person; parked.
    Park(Box<Parked>),
}

impl Pipeline {
    fn audit(&self, exec: &Execution, details: impl Into<AuditDetails>) {
        self.auditor.emit(&exec.scope(), details);
    }

    /// Runs `req` through the whole pipeline. An absent `execution_id` (only a sync request
    /// can lack one: async jobs carry theirs) is assigned here, and then needs no claim.
    pub async fn execute(&self, mut req: ExecRequest, origin: Origin) -> Outcome {
        let fresh_id = req.execution_id.is_none();
        req.execution_id
            .get_or_insert_with(|| mint_id(&origin.caller));
        // A session's executions get what it opened with (env, timeout, template) where they
        // leave it out, before anything is checked; a run naming another template than the
        // session's is refused here. The record is read once, for the dispatch too.
        let session = match &req.session_id {
            Some(id) => match self.dispatcher.session(id).await {
                Ok(record) => record,
                Err(e) => return Outcome::Retry(e.into()),
            },
            None => None,
        };
        let refused = session.as_ref().and_then(|record| {
            record.apply_defaults(&mut req);
            record.admits_template(req.template.as_deref()).err()
        });
        let template = match refused {
            Some(conflict) => Err(conflict),
            None => match crate::templates::resolve(&self.templates, &mut req).await {
                Ok(template) => Ok(template),
                Err(e) if e.kind() == ErrorKind::BadRequest => Err(e.into()),
                Err(e) => return Outcome::Retry(e),
            },
        };
        let admitted = template.and_then(|template| {
            let limits = validate_exec(&req, &self.policy.ceilings)?;
            crate::network::admit_request(&mut req, &self.policy.network_ceiling)?;
            Ok((limits, template))
        });
        let (limits, template) = match admitted {
            Ok(admitted) => admitted,
            Err(body) => {
                let scope = AuditScope {
                    execution_id: req.execution_id.clone(),
                    session_id: req.session_id.clone(),
                    trace_id: origin.trace_id.clone(),
                    actor: req.requested_by.clone(),
                    ..Default::default()
                }
                .by(&origin.caller);
                let why = ExecutionRejected::Validate {
                    reason: body.message.clone(),
                };
                self.auditor.emit(&scope, why);
                return Outcome::Invalid(body);
            }
        };
        let mut exec = Execution::new(req, limits, &origin);
        if let Some(template) = template {
            exec.template = Some(template.run);
            exec.filesystem = template.filesystem;
        }
        exec.session = session;
        // The assessment has no side effects, so it runs while the claim is taken; it is
        // wasted only when an earlier attempt holds the claim or already has a result.
        let assessing = async {
            let started = Instant::now();
            (self.assess(&exec).await, started.elapsed())
        };
        let holding = async {
            if fresh_id {
                Ok(Hold::FreshId)
            } else {
                self.claim_fresh(&exec.id).await
            }
        };
        let (claimed, (risk, assess_took)) = tokio::join!(holding, assessing);
        let claim = match claimed {
            Ok(claim) => claim,
            Err(outcome) => return outcome,
        };
        let received = ExecutionReceived {
            language: exec.request.language,
            code_bytes: exec.request.code.len() as u64,
            tier: exec.request.tier,
            timeout_ms: exec.limits.timeout_ms,
        };
        self.audit(&exec, received);
        exec.timing.assess_ms = Timing::ms(assess_took);
        let risk = match risk {
            Ok(risk) => risk,
            Err(e) if matches!(e.kind(), ErrorKind::BadRequest | ErrorKind::TooLarge) => {
                let r = exec.refused(ExecStatus::Rejected, Tier::Reject, e.into());
                return self.store(&exec, r, claim).await;
            }
            Err(e) => {
                claim.release_later();
                return Outcome::Retry(e);
            }
        };
        if let Some(rejected) = self.decide_tier(&mut exec, risk) {
            return self.store(&exec, rejected, claim).await;
        }
        match self.confirm_stage(&mut exec).await {
            Ok(Confirmed::Go) => {}
            Ok(Confirmed::Stop(result)) => return self.store(&exec, *result, claim).await,
            Ok(Confirmed::Park(parked)) => {
                // Released before the decision is looked at again, so whoever resumes it (an
                // event, or the look below) can claim it.
                claim.release().await;
                return self.after_parking(*parked).await;
            }
            Err(e) => {
                claim.release_later();
                return Outcome::Retry(e);
            }
        }
        self.run_and_store(exec, claim).await
    }

    /// Continues a parked execution with the decision: runs it when approved, and stores its
    /// result (denied, timed out, or what ran) once. `Busy` when another instance resumes it.
    pub async fn resume(
        &self,
        parked: Parked,
        decision: messages::exec::ConfirmationOutcome,
    ) -> Outcome {
        let mut exec = parked.execution;
        let claim = match self.claim_fresh(&exec.id).await {
            Ok(claim) => claim,
            Err(outcome) => {
                if matches!(outcome, Outcome::Done(_)) {
                    // Stored by an earlier resume that stopped before forgetting the entry.
                    if let Err(e) = self.parked.remove(&exec.id).await {
                        tracing::warn!(execution_id = %exec.id, error = %e, "parked entry kept");
                    }
                }
                return outcome;
            }
        };
        exec.timing.confirm_ms += messages::now_ms().saturating_sub(parked.parked_at);
        exec.confirmation = decision;
        let resumed = ExecutionResumed {
            confirmation_id: parked.confirmation_id,
            decision: exec.confirmation.decision,
        };
        self.audit(&exec, resumed);
        if exec.confirmation.decision != Decision::Approved {
            let denied = self.denied(&exec);
            return self.store(&exec, denied, claim).await;
        }
        self.run_and_store(exec, claim).await
    }

    /// Stores a terminal result for a parked execution that cannot be resumed.
    pub async fn fail_parked(&self, parked: Parked, error: ErrorBody) -> Outcome {
        let exec = parked.execution;
        let claim = match self.claim_fresh(&exec.id).await {
            Ok(claim) => claim,
            Err(outcome) => return outcome,
        };
        let r = exec.refused(ExecStatus::Internal, exec.tier, error);
        self.store(&exec, r, claim).await
    }

    /// Takes the claim on `id` when no result is stored for it yet; otherwise the outcome to
    /// answer with. Claim first, then look: a holder stores before it releases, so a result
    /// stored by an earlier attempt is always seen (two round trips, not three).
    async fn claim_fresh(&self, id: &str) -> Result<Hold, Outcome> {
        let claim = match self.claims.claim(id).await {
            Ok(ClaimOutcome::Claimed(claim)) => claim,
            Ok(ClaimOutcome::HeldBy(owner)) => {
                // The holder may have stored its result already and not yet released.
                return Err(match self.results.get(id).await {
                    Ok(Some(stored)) => Outcome::Done(stored),
                    Ok(None) => Outcome::Busy(owner),
                    Err(e) => Outcome::Retry(e.into()),
                });
            }
            Err(e) => return Err(Outcome::Retry(e.into())),
        };
        match self.results.get(id).await {
            Ok(None) => Ok(Hold::Claimed(claim)),
            Ok(Some(stored)) => {
                claim.release_later();
                Err(Outcome::Done(stored))
            }
            Err(e) => {
                claim.release_later();
                Err(Outcome::Retry(e.into()))
            }
        }
    }

    /// Records the risk and decides the tier; a result when the risk policy rejects the code.
    fn decide_tier(&self, exec: &mut Execution, risk: RiskAssessment) -> Option<ExecResult> {
        let required = risk.required_tier(self.policy.security_mode);
        exec.tier = decide_tier(
            required,
            exec.request.tier,
            exec.request.session_id.is_some(),
        );
        exec.risk = risk;
        let risk = &exec.risk;
        let assessed = ExecutionAssessed {
            level: risk.level,
            suggested_tier: risk.suggested_tier,
            tier: exec.tier,
            requires_confirmation: risk.requires_confirmation,
            reason: risk.reason.clone(),
            findings: risk.findings.iter().map(|f| f.rule.clone()).collect(),
        };
        self.audit(exec, assessed);
        if exec.tier != Tier::Reject {
            return None;
        }
        let why = ExecutionRejected::Risk {
            level: risk.level,
            reason: risk.reason.clone(),
        };
        self.audit(exec, why);
        let error = ErrorBody::denied(format!("rejected by the risk policy: {}", risk.reason))
            .with_details(json!({ "findings": risk.findings }));
        Some(exec.refused(ExecStatus::Rejected, Tier::Reject, error))
    }

    /// Asks for a confirmation when the risk requires one. A decision made at once (a policy,
    /// a session grant) is applied here; a pending one parks the execution.
    async fn confirm_stage(&self, exec: &mut Execution) -> Result<Confirmed, SchedulerError> {
        if !exec.risk.requires_confirmation {
            return Ok(Confirmed::Go);
        }
        let started = Instant::now();
        let confirmation = self.confirmations.request(exec).await?;
        exec.timing.confirm_ms = Timing::ms(started.elapsed());
        if let Some(decision) = confirm::outcome(&confirmation) {
            exec.confirmation = decision;
            return Ok(if exec.confirmation.decision == Decision::Approved {
                Confirmed::Go
            } else {
                Confirmed::Stop(Box::new(self.denied(exec)))
            });
        }
        // Whoever resumes it reads the session as it is then.
        exec.session = None;
        let parked = Parked {
            state: ParkedState::AwaitingConfirmation,
            confirmation_id: confirmation.id,
            expires_at: confirmation.expires_at,
            parked_at: messages::now_ms(),
            execution: exec.clone(),
        };
        self.parked.put(&parked).await?;
        let parked_details = ExecutionParked {
            confirmation_id: parked.confirmation_id.clone(),
            expires_at: parked.expires_at,
        };
        self.audit(exec, parked_details);
        Ok(Confirmed::Park(Box::new(parked)))
    }

    /// A decision that came between the request and the parking found no parked entry to
    /// resume; look once more now that the entry exists.
    async fn after_parking(&self, parked: Parked) -> Outcome {
        let notice = parked.notice();
        match self.confirmations.get(&parked.confirmation_id).await {
            Ok(c) => match confirm::outcome(&c) {
                Some(decision) => match self.resume(parked, decision).await {
                    // Another instance resumes it: the caller waits for that result.
                    Outcome::Busy(_) => Outcome::Parked(notice),
                    done => done,
                },
                None => Outcome::Parked(notice),
            },
            Err(e) => {
                // The event (or the expiry sweep) resumes it.
                tracing::debug!(execution_id = %notice.execution_id, error = %e, "confirmation not re-read");
                Outcome::Parked(notice)
            }
        }
    }

    fn denied(&self, exec: &Execution) -> ExecResult {
        let c = &exec.confirmation;
        let error = ErrorBody::denied(format!(
            "confirmation {}: {}",
            match c.decision {
                Decision::Timeout => "timed out",
                _ => "denied",
            },
            c.reason.as_deref().unwrap_or("no reason given")
        ));
        exec.refused(ExecStatus::Denied, exec.tier, error)
    }

    /// Place, run, store.
    async fn run_and_store(&self, exec: Execution, claim: Hold) -> Outcome {
        match self.dispatcher.dispatch(&exec).await {
            Ok(result) => {
                let result = exec.finish(result);
                self.store(&exec, result, claim).await
            }
            Err(e) => {
                claim.release_later();
                Outcome::Retry(e)
            }
        }
    }

    /// Audits the end, stores the result, forgets a parked entry, releases the claim.
    ///
    /// For a sync caller ([`Execution::sync_reply`]) the result is sent to the stream ahead of
    /// the reply, and the rest happens after it: the caller holds the result, and the fsync
    /// behind the store's acknowledgement (about a millisecond with `sync_interval: always`) is
    /// not on its path. The claim is held until the result is stored, so a second attempt of
    /// the same id still finds it running or stored.
    async fn store(&self, exec: &Execution, result: ExecResult, claim: Hold) -> Outcome {
        let finished = ExecutionFinished {
            status: result.status,
            exit_code: result.exit_code,
            tier: result.tier,
            node: result.node.clone(),
            timing: result.timing,
        };
        self.audit(exec, finished);
        let sending = self.results.send(&result).await;
        let parked = exec.risk.requires_confirmation.then(|| self.parked.clone());
        let id = exec.id.clone();
        let finish = async move {
            let stored = match sending {
                Ok(sending) => sending.stored().await,
                Err(e) => Err(e),
            };
            match (&stored, parked) {
                (Ok(()), Some(parked)) => {
                    if let Err(e) = parked.remove(&id).await {
                        tracing::warn!(execution_id = %id, error = %e, "parked entry kept; a resume will find the result");
                    }
                }
                (Ok(()), None) => {}
                (Err(e), _) => tracing::error!(execution_id = %id, error = %e, "result not stored"),
            }
            // The caller need not wait for the release; a claim whose release is lost expires
            // by its TTL.
            claim.release_later();
            stored
        };
        if exec.sync_reply {
            self.stores.spawn(finish);
            return Outcome::Done(result);
        }
        match finish.await {
            Ok(()) => Outcome::Done(result),
            Err(e) => Outcome::Unstored(result, e),
        }
    }

    /// The code is assessed with the files sent with it. The assessor is told whether the code
    /// runs under a network policy (its own, or its session's): then fetching is bounded by the
    /// policy, not a risk by itself.
    async fn assess(&self, exec: &Execution) -> Result<RiskAssessment, SchedulerError> {
        let session_network = exec.session.as_ref().is_some_and(|s| s.network.is_some());
        let network = exec.request.network.is_some() || session_network;
        let ask = AssessRequest {
            content: exec.reviewed_code().to_string(),
            content_type: exec.reviewed_language().into(),
            params: network.then(|| json!({ messages::risk::NETWORK_POLICY_PARAM: true })),
            mode: Some(self.policy.security_mode),
            files: exec.reviewed_files(),
        };
        self.risk
            .assess(&ask)
            .await
            .map_err(SchedulerError::calling(ServiceName::RiskAssessor))
    }
}
