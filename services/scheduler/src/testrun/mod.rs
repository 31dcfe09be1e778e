//! `TestRuns`: the `test` endpoint — test-driven execution. A test run *is* an
//! execution: it goes through [`Intake::run`] like `exec`, so risk assessment (of the code and
//! the tests, not the runner), confirmation (with the same awaiting-confirmation notice), tenancy,
//! quotas, limits and audit apply unchanged, and hostile tests get the same limits as any code.
//!
//! The run's parent process writes the JUnit report into a workspace, sealed with a key only it
//! and this scheduler hold ([`seal`]), and the report is read back through the workspace
//! service and opened with the key — never parsed from stdout, where the tests' own prints
//! could forge it, nor trusted unsealed, since the tests can rewrite the workspace and choose
//! their exit code. So a run needs a session: the caller's (which must exist; another tenant's is 404), or an
//! internal one opened for the run and closed after it. A replay of an execution id answers
//! the stored result and reads the same report again.

pub mod junit;
pub mod report;
pub mod runner;
pub mod seal;

use kit::RequestContext;
use messages::exec::ExecResult;
use messages::session::SessionRef;
use messages::subjects::WorkspaceOp;
use messages::testrun::{TestReport, TestRequest, MAX_REPORT_BYTES};
use messages::validate::Ceilings;
use messages::workspace::{WsFile, WsRead};
use messages::{ErrorBody, ErrorKind, ServiceName};
use sandmesh_client::MeshClient;

use crate::error::{JunitError, SchedulerError};
use crate::intake::Intake;
use crate::session_api::SessionApi;
use report::Sealed;
use seal::{RunKey, Sealer};

#[derive(Clone)]
pub struct TestRuns {
    intake: Intake,
    sessions: SessionApi,
    /// For `workspace.read` of the report.
    mesh: MeshClient,
    /// For the test-particular checks and the run's timeout; the execution is checked again
    /// as any is.
    ceilings: Ceilings,
    /// Each run's report key.
    sealer: Sealer,
}

impl TestRuns {
    pub fn new(intake: Intake, sessions: SessionApi, mesh: MeshClient, ceilings: Ceilings) -> Self {
        Self {
            intake,
            sessions,
            mesh,
            ceilings,
            sealer: Sealer::new(),
        }
    }

    /// `test`: runs the tests against the code and answers per-test results.
    pub async fn test(
        &self,
        ctx: RequestContext,
        req: TestRequest,
    ) -> Result<TestReport, SchedulerError> {
        req.validate(&self.ceilings)?;
        let execution_id = match &req.execution_id {
            Some(id) => id.clone(),
            None => messages::new_id(),
        };
        let (session, template) = match &req.session_id {
            Some(named) => {
                // The caller's own session, which must exist (scoped: another tenant's is 404).
                let record = self
                    .sessions
                    .get(
                        ctx.clone(),
                        SessionRef {
                            session_id: named.clone(),
                        },
                    )
                    .await?;
                // Its template when it has one, unless the run names its own.
                let template = match (&req.template, record.template) {
                    (Some(t), _) => Some(t.clone()),
                    (None, Some(_)) => None,
                    (None, None) => Some(req.default_template().to_string()),
                };
                (Session::Callers(named.clone()), template)
            }
            None => {
                let template = req
                    .template
                    .clone()
                    .unwrap_or_else(|| req.default_template().to_string());
                (
                    Session::Internal(internal_session(&execution_id)),
                    Some(template),
                )
            }
        };
        // Keyed by the id as scoped by the caller's tenant: another tenant's run of the same id
        // gets another key.
        let key = self
            .sealer
            .key(&ctx.caller.scope("execution_id", &execution_id)?);
        let mut plan = runner::plan(req, execution_id, template, &self.ceilings, &key);
        plan.request.session_id = Some(session.id().to_string());
        let ran = self
            .intake
            .run(ctx.clone(), plan.request, Some(plan.reviewed))
            .await;
        let read = match &ran {
            // A report that cannot be read or opened is part of the answer, beside what ran.
            Ok(result) if report::ran(result) => Some(
                self.read_report(&ctx, session.id(), &plan.report, &key)
                    .await,
            ),
            _ => None,
        };
        if let Session::Internal(id) = &session {
            self.close_internal(&ctx, id).await;
        }
        let mut result: ExecResult = ran?;
        if matches!(session, Session::Internal(_)) {
            result.session_id = None;
        }
        Ok(report::compose(result, read))
    }

    /// The JUnit report at `path` in the session's workspace, opened with the run's key.
    async fn read_report(
        &self,
        ctx: &RequestContext,
        session: &str,
        path: &str,
        key: &RunKey,
    ) -> Result<Sealed, ErrorBody> {
        let file = self.fetch_report(ctx, session, path).await?;
        let body = key
            .open(&file)
            .map_err(|e| ErrorBody::bad_request(e.to_string()))?;
        Sealed::try_from(junit::parse(body)?)
    }

    /// The bytes of the file at `path` in the session's workspace, within the report's bound.
    async fn fetch_report(
        &self,
        ctx: &RequestContext,
        session: &str,
        path: &str,
    ) -> Result<Vec<u8>, SchedulerError> {
        let read = WsRead {
            session_id: ctx.caller.scope("session_id", session)?,
            path: path.to_string(),
            offset: None,
            length: Some(MAX_REPORT_BYTES),
            encoding: None,
        };
        // The plain request, not `WorkspaceClient::read`: a report larger than the bound is
        // refused, not fetched whole.
        let subject = self.mesh.subjects().workspace(WorkspaceOp::Read);
        let file: WsFile = match self.mesh.request(subject, &read).await {
            Ok(file) => file,
            Err(e) if e.kind() == ErrorKind::NotFound => return Err(SchedulerError::NoTestReport),
            Err(e) => return Err(SchedulerError::calling(ServiceName::WorkspaceStore)(e)),
        };
        if file.size > MAX_REPORT_BYTES || file.object.is_some() {
            return Err(JunitError::TooLarge { size: file.size }.into());
        }
        messages::decode_content(&file.content, file.encoding)
            .map_err(|reason| SchedulerError::ReportContent { reason })
    }

    /// Closes the internal session (its container and AIO instance go with it); a failure is
    /// only logged: the session's idle and TTL cleanup reclaim it.
    async fn close_internal(&self, ctx: &RequestContext, id: &str) {
        let close = SessionRef {
            session_id: id.to_string(),
        };
        match self.sessions.close(ctx.clone(), close).await {
            Ok(_) => {}
            // Never opened: the run stopped before it (refused, or rejected).
            Err(SchedulerError::NoSession { .. }) => {}
            Err(e) => tracing::warn!(session_id = id, error = %e, "test session not closed"),
        }
    }
}

/// The internal session of a run, named after its execution id: a replay of the id (answered
/// with the stored result, nothing runs again) reads the same report, which the closed
/// session's workspace keeps until its cleanup. An id too long to prefix gets a fresh session.
fn internal_session(execution_id: &str) -> String {
    let id = format!("test-{execution_id}");
    if id.len() <= messages::validate::MAX_ID_LEN {
        id
    } else {
        format!("test-{}", messages::new_id())
    }
}

/// Where a test run runs.
enum Session {
    /// The caller's session (as it named it).
    Callers(String),
    /// Opened for this run, closed after it.
    Internal(String),
}

impl Session {
    fn id(&self) -> &str {
        match self {
            Session::Callers(id) | Session::Internal(id) => id,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runs_internal_session_follows_its_id_when_it_fits() {
        assert_eq!(internal_session("01J"), "test-01J");
        let long = "x".repeat(messages::validate::MAX_ID_LEN);
        let fresh = internal_session(&long);
        assert!(fresh.starts_with("test-") && fresh.len() <= messages::validate::MAX_ID_LEN);
    }
}
