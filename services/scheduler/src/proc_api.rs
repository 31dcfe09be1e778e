//! `ProcApi`: the `proc.{start,list,output,input,signal,wait,resize}` endpoints — a session's
//! background processes, held by the executor node holding the session's container.
//!
//! Identity and scoping as everywhere: the caller's tenant scopes the session id, so another
//! tenant's session (and every process in it) answers 404. A start goes through the same two
//! gates as an execution: its command is assessed as shell code (the risk policy may refuse
//! it), and when the assessment asks for a person the start waits for the decision — through
//! the confirmation service's waiting request, as the browser-router's actions do — holding
//! no executor capacity meanwhile. A session without a container yet gets one the way its
//! first execution would (a no-op shell execution of the caller, placed like any other).
//! Every start and signal is an audit event; the executor holding the process audits its end.

use std::time::Duration;

use kit::{AuditScope, Auditor, RequestContext};
use messages::audit::{ExecutionAssessed, ExecutionRejected, ProcessSignaled, ProcessStarted};
use messages::confirm::{ConfirmKind, ConfirmRequest, ConfirmState};
use messages::exec::{ExecRequest, ExecStatus, Language, Tier, Timing};
use messages::executor::Backend;
use messages::proc::{
    validate_ids, ProcCall, ProcInfo, ProcInput, ProcInputAck, ProcList, ProcOutput,
    ProcOutputRequest, ProcRef, ProcReply, ProcResize, ProcSignal, ProcStart, ProcStarted,
    ProcWait, MAX_WAIT_MS,
};
use messages::risk::{AssessRequest, ContentType, RiskAssessment};
use messages::session::{SessionRecord, SessionState};
use messages::validate::validate_id;
use messages::{ErrorBody, ErrorKind, ServiceName, Subjects};
use sandmesh_client::{ConfirmClient, ExecutorClient, RiskClient};

use crate::error::{SchedulerError, SessionEnd};
use crate::intake::Intake;
use crate::pipeline::Policy;
use crate::sessions::SessionTable;

/// What an executor call may take besides a `wait`'s own bound.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Clone)]
pub struct ProcApi {
    pub sessions: SessionTable,
    pub executors: ExecutorClient,
    pub risk: RiskClient,
    pub confirm: ConfirmClient,
    /// How long a person has to decide on a start.
    pub confirm_timeout: Duration,
    /// Places a session without a container, as its first execution would.
    pub intake: Intake,
    pub auditor: Auditor,
    pub policy: Policy,
    pub subjects: Subjects,
}

fn scope(ctx: &RequestContext, session_id: &str, proc_id: &str) -> AuditScope {
    AuditScope {
        execution_id: Some(proc_id.to_string()),
        session_id: Some(session_id.to_string()),
        trace_id: ctx.trace_id.clone(),
        ..Default::default()
    }
    .by(&ctx.caller)
}

impl ProcApi {
    /// The caller's session (scoped id and record); 404 for an unknown (or another tenant's)
    /// session, 409 for a closed one.
    async fn session(
        &self,
        ctx: &RequestContext,
        named: &str,
    ) -> Result<(String, SessionRecord), SchedulerError> {
        let id = ctx.caller.scope("session_id", named)?;
        let record = self
            .sessions
            .get(&id)
            .await?
            .ok_or_else(|| SchedulerError::NoSession {
                id: named.to_string(),
            })?;
        if record.state == SessionState::Closed {
            return Err(SchedulerError::SessionEnded {
                id: named.to_string(),
                why: SessionEnd::Closed,
            });
        }
        Ok((id, record))
    }

    /// Sends `call` to the node holding the session; a session never placed has no process.
    async fn forward(
        &self,
        record: &SessionRecord,
        call: &ProcCall,
        timeout: Duration,
    ) -> Result<Option<ProcReply>, SchedulerError> {
        let (SessionState::Active, Some(node)) = (record.state, record.node.as_deref()) else {
            return Ok(None);
        };
        self.executors
            .proc(Backend::Docker, node, call, timeout)
            .await
            .map(Some)
            .map_err(SchedulerError::calling(ServiceName::DockerExecutor))
    }

    /// Forwards a call about one process: 404 when the session holds none by that id.
    async fn about(
        &self,
        ctx: &RequestContext,
        session_id: &str,
        proc_id: &str,
        make: impl FnOnce(String) -> ProcCall,
        timeout: Duration,
    ) -> Result<ProcReply, SchedulerError> {
        validate_ids(session_id, proc_id)?;
        let (id, record) = self.session(ctx, session_id).await?;
        self.forward(&record, &make(id), timeout)
            .await?
            .ok_or_else(|| {
                SchedulerError::Refused(ErrorBody::not_found(format!(
                    "no process {proc_id} in session {session_id}"
                )))
            })
    }

    pub async fn start(
        &self,
        ctx: RequestContext,
        mut start: ProcStart,
    ) -> Result<ProcStarted, SchedulerError> {
        start.validate(&self.policy.ceilings)?;
        let named = start.session_id.clone();
        let (id, record) = self.session(&ctx, &named).await?;
        if record.tier != Tier::Session {
            return Err(SchedulerError::Refused(ErrorBody::bad_request(format!(
                "background processes live in a session's own container: open the session \
                 with tier session (it has tier {})",
                record.tier.as_str()
            ))));
        }
        let proc_id = messages::new_id();
        let audit = scope(&ctx, &id, &proc_id);
        self.gate(&ctx, &start, &record, &proc_id, &audit).await?;
        start.session_id = id.clone();
        let call = ProcCall::Start {
            proc_id: proc_id.clone(),
            tenant: ctx.caller.tenant().cloned(),
            output_subject: self.subjects.output(ctx.caller.tenant(), &proc_id),
            start: start.clone(),
        };
        // Twice at most: a session without a container (never placed, or closed by its node
        // as idle) is placed by a no-op execution, then the start is sent again.
        let mut record = record;
        for attempt in 0..2 {
            let answer = self.forward(&record, &call, CALL_TIMEOUT).await;
            let needs_place = match &answer {
                Ok(None) => true,
                Err(e) => attempt == 0 && e.kind() == ErrorKind::NotFound,
                Ok(Some(_)) => false,
            };
            if !needs_place {
                let ProcReply::Started(started) = answer?.expect("answered") else {
                    return Err(unexpected());
                };
                let program = start.command.argv().first().cloned().unwrap_or_default();
                let details = ProcessStarted {
                    proc_id: proc_id.clone(),
                    program,
                    command_bytes: start.command.shell_text().len() as u64,
                    tag: start.tag.clone(),
                    pty: start.pty.is_some(),
                    node: record.node.clone().unwrap_or_default(),
                    pid: started.pid,
                };
                self.auditor.emit(&audit, details);
                return Ok(started);
            }
            record = self.place(&ctx, &named, &id).await?;
        }
        Err(SchedulerError::Refused(ErrorBody::unavailable(format!(
            "session {named} has no container to start the process in; retry"
        ))))
    }

    /// Places the session (its container started on a node) by a no-op shell execution of
    /// the caller, and reads its record again.
    async fn place(
        &self,
        ctx: &RequestContext,
        named: &str,
        id: &str,
    ) -> Result<SessionRecord, SchedulerError> {
        let noop = ExecRequest {
            session_id: Some(named.to_string()),
            language: Language::Shell,
            code: ":".into(),
            ..Default::default()
        };
        let result = self.intake.exec(ctx.clone(), noop).await?;
        if result.status != ExecStatus::Ok {
            let why = result
                .error
                .map(|e| e.message)
                .unwrap_or_else(|| format!("{:?}", result.status));
            return Err(SchedulerError::Refused(ErrorBody::unavailable(format!(
                "could not place session {named}: {why}"
            ))));
        }
        self.sessions
            .get(id)
            .await?
            .ok_or_else(|| SchedulerError::SessionVanished { id: named.into() })
    }

    /// The start's two gates: its command assessed as shell code (refused by the risk
    /// policy: 403), then a person's decision when the assessment asks for one (denied or
    /// undecided: 403).
    async fn gate(
        &self,
        ctx: &RequestContext,
        start: &ProcStart,
        record: &SessionRecord,
        proc_id: &str,
        audit: &AuditScope,
    ) -> Result<(), SchedulerError> {
        let command = start.command.shell_text();
        let mut ask = AssessRequest::new(command.clone(), ContentType::from(Language::Shell));
        ask.mode = Some(self.policy.security_mode);
        if record.network.is_some() {
            ask.params = Some(serde_json::json!({ messages::risk::NETWORK_POLICY_PARAM: true }));
        }
        let risk: RiskAssessment = self
            .risk
            .assess(&ask)
            .await
            .map_err(SchedulerError::calling(ServiceName::RiskAssessor))?;
        let tier = risk.required_tier(self.policy.security_mode);
        self.auditor.emit(
            audit,
            ExecutionAssessed {
                level: risk.level,
                suggested_tier: risk.suggested_tier,
                tier,
                requires_confirmation: risk.requires_confirmation,
                reason: risk.reason.clone(),
                findings: risk.findings.iter().map(|f| f.rule.clone()).collect(),
            },
        );
        if tier == Tier::Reject {
            let why = ExecutionRejected::Risk {
                level: risk.level,
                reason: risk.reason.clone(),
            };
            self.auditor.emit(audit, why);
            return Err(SchedulerError::Refused(
                ErrorBody::denied(format!("rejected by the risk policy: {}", risk.reason))
                    .with_details(serde_json::json!({ "findings": risk.findings })),
            ));
        }
        if !risk.requires_confirmation {
            return Ok(());
        }
        let ask = ConfirmRequest {
            tenant: ctx.caller.tenant().cloned(),
            execution_id: Some(ctx.caller.scope("proc_id", proc_id)?),
            session_id: audit.session_id.clone(),
            summary: format!(
                "background process ({} bytes), risk {}: {}",
                command.len(),
                risk.level.as_str(),
                risk.reason
            ),
            code_excerpt: crate::confirm::excerpt(&command, crate::confirm::EXCERPT_BYTES),
            risk,
            files: Vec::new(),
            kind: ConfirmKind::Code,
            requested_by: start.requested_by.clone(),
            timeout_ms: Some(Timing::ms(self.confirm_timeout)),
            wait: true,
        };
        let decided = self
            .confirm
            .request(&ask)
            .await
            .map_err(SchedulerError::calling(ServiceName::Confirmation))?;
        match decided.state {
            ConfirmState::Approved => Ok(()),
            state => Err(SchedulerError::Refused(ErrorBody::denied(format!(
                "the process was not approved ({})",
                match state {
                    ConfirmState::Denied => "denied",
                    ConfirmState::Timeout => "no decision in time",
                    _ => "still pending",
                }
            )))),
        }
    }

    pub async fn list(
        &self,
        ctx: RequestContext,
        req: ProcRef,
    ) -> Result<ProcList, SchedulerError> {
        validate_id("session_id", &req.session_id)?;
        let (id, record) = self.session(&ctx, &req.session_id).await?;
        let call = ProcCall::List { session_id: id };
        match self.forward(&record, &call, CALL_TIMEOUT).await {
            Ok(Some(ProcReply::List(list))) => Ok(list),
            Ok(Some(_)) => Err(unexpected()),
            // Never placed, or its container closed (idle): it holds no process.
            Ok(None) => Ok(ProcList::default()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(ProcList::default()),
            Err(e) => Err(e),
        }
    }

    pub async fn output(
        &self,
        ctx: RequestContext,
        mut req: ProcOutputRequest,
    ) -> Result<ProcOutput, SchedulerError> {
        let (session, proc_id) = (req.session_id.clone(), req.proc_id.clone());
        let make = |id| {
            req.session_id = id;
            ProcCall::Output(req)
        };
        match self
            .about(&ctx, &session, &proc_id, make, CALL_TIMEOUT)
            .await?
        {
            ProcReply::Output(output) => Ok(output),
            _ => Err(unexpected()),
        }
    }

    pub async fn input(
        &self,
        ctx: RequestContext,
        mut req: ProcInput,
    ) -> Result<ProcInputAck, SchedulerError> {
        req.bytes()?;
        let (session, proc_id) = (req.session_id.clone(), req.proc_id.clone());
        let make = |id| {
            req.session_id = id;
            ProcCall::Input(req)
        };
        match self
            .about(&ctx, &session, &proc_id, make, CALL_TIMEOUT)
            .await?
        {
            ProcReply::Input(ack) => Ok(ack),
            _ => Err(unexpected()),
        }
    }

    pub async fn signal(
        &self,
        ctx: RequestContext,
        mut req: ProcSignal,
    ) -> Result<ProcInfo, SchedulerError> {
        let (session, proc_id, signal) = (req.session_id.clone(), req.proc_id.clone(), req.signal);
        let make = |id| {
            req.session_id = id;
            ProcCall::Signal(req)
        };
        let ProcReply::Info(info) = self
            .about(&ctx, &session, &proc_id, make, CALL_TIMEOUT)
            .await?
        else {
            return Err(unexpected());
        };
        let id = ctx.caller.scope("session_id", &session)?;
        let details = ProcessSignaled {
            proc_id: proc_id.clone(),
            signal,
        };
        self.auditor.emit(&scope(&ctx, &id, &proc_id), details);
        Ok(info)
    }

    pub async fn wait(
        &self,
        ctx: RequestContext,
        mut req: ProcWait,
    ) -> Result<ProcInfo, SchedulerError> {
        let ms = req.timeout_ms.unwrap_or(MAX_WAIT_MS).min(MAX_WAIT_MS);
        req.timeout_ms = Some(ms);
        let (session, proc_id) = (req.session_id.clone(), req.proc_id.clone());
        let make = |id| {
            req.session_id = id;
            ProcCall::Wait(req)
        };
        let budget = Duration::from_millis(ms) + CALL_TIMEOUT;
        match self.about(&ctx, &session, &proc_id, make, budget).await? {
            ProcReply::Info(info) => Ok(info),
            _ => Err(unexpected()),
        }
    }

    pub async fn resize(
        &self,
        ctx: RequestContext,
        mut req: ProcResize,
    ) -> Result<ProcInfo, SchedulerError> {
        let size = messages::proc::PtySize {
            cols: req.cols,
            rows: req.rows,
        };
        size.validate()?;
        let (session, proc_id) = (req.session_id.clone(), req.proc_id.clone());
        let make = |id| {
            req.session_id = id;
            ProcCall::Resize(req)
        };
        match self
            .about(&ctx, &session, &proc_id, make, CALL_TIMEOUT)
            .await?
        {
            ProcReply::Info(info) => Ok(info),
            _ => Err(unexpected()),
        }
    }
}

/// An executor answered an operation with another operation's shape.
fn unexpected() -> SchedulerError {
    SchedulerError::Refused(ErrorBody::internal(
        "the executor answered with another operation's reply",
    ))
}
