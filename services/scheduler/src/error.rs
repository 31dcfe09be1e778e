//! The scheduler's errors, kept as values with their causes while they travel up the pipeline
//! ([`SchedulerError`]); the wire's [`ErrorBody`] is made from one once, at the endpoint.

use async_nats::jetstream::{self, kv};
use messages::exec::ExecStatus;
use messages::executor::{Backend, RunShapeError};
use messages::network::BeyondCeiling;
use messages::quota::OverQuota;
use messages::session::SessionState;
use messages::testrun::{MAX_REPORT_BYTES, MAX_TEST_CASES};
use messages::validate::ValidationError;
use messages::{ErrorBody, ErrorKind, ServiceName};
use sandmesh_client::ClientError;

type Cause = Box<dyn std::error::Error + Send + Sync>;

/// A JetStream operation (results, claims, sessions, parked executions) failed; the caller
/// decides whether to retry. The cause is kept, not flattened.
#[derive(Debug, thiserror::Error)]
#[error("{op}: {source}")]
pub struct StoreError {
    /// What was being done, e.g. "reading a result".
    pub op: &'static str,
    #[source]
    pub source: Cause,
}

impl StoreError {
    pub fn new(op: &'static str, source: impl Into<Cause>) -> Self {
        Self {
            op,
            source: source.into(),
        }
    }

    /// A closure for `map_err`.
    pub fn during<E: Into<Cause>>(op: &'static str) -> impl FnOnce(E) -> Self {
        move |e| Self::new(op, e)
    }
}

impl From<StoreError> for ErrorBody {
    fn from(e: StoreError) -> Self {
        ErrorBody::unavailable(format!("JetStream: {e}"))
    }
}

/// The registry could not be asked (it died and is being restarted): retry.
#[derive(Debug, thiserror::Error)]
pub enum RegistryGone {
    #[error("the runtime registry did not answer in time; retry")]
    TimedOut,
    #[error("the runtime registry stopped before answering; retry")]
    Stopped,
    /// The message it was not sent is dropped: only why counts.
    #[error("the runtime registry is not running; retry")]
    Unreachable(#[source] ractor::MessagingErr<()>),
}

impl From<RegistryGone> for ErrorBody {
    fn from(e: RegistryGone) -> Self {
        ErrorBody::unavailable(e.to_string())
    }
}

/// Why a test run's JUnit report was refused (`testrun::junit` reads it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JunitError {
    #[error("the test report is {size} bytes; the limit is {MAX_REPORT_BYTES}")]
    TooLarge { size: u64 },
    #[error("the test report is not UTF-8")]
    NotUtf8,
    #[error("the test report declares a DTD; JUnit reports have none")]
    Dtd,
    #[error("the test report nests deeper than {limit} elements")]
    TooDeep { limit: usize },
    #[error("the test report lists more than {MAX_TEST_CASES} test cases")]
    TooManyCases,
    #[error("the test report has no <testsuites> or <testsuite> root")]
    NotJunit,
    #[error("the test report is malformed at byte {position}: {reason}")]
    Malformed { position: u64, reason: String },
}

impl From<JunitError> for ErrorBody {
    fn from(e: JunitError) -> Self {
        match e {
            JunitError::TooLarge { .. } => ErrorBody::too_large(e.to_string()),
            other => ErrorBody::bad_request(other.to_string()),
        }
    }
}

/// Why a port cannot be exposed or reached; kinds in [`SchedulerError::kind`].
#[derive(Debug, thiserror::Error)]
pub enum PortError {
    /// A session whose runs each get a single-use sandbox has nothing that stays up to listen.
    #[error(
        "session {id} runs each execution in a single-use sandbox (tier {}): nothing stays up \
         to listen on a port; open the session with tier session",
        .tier.as_str()
    )]
    NoResidentSandbox {
        id: String,
        tier: messages::exec::Tier,
    },
    #[error("port {port} of session {id} is not exposed (ports.expose first)")]
    NotExposed { id: String, port: u16 },
    /// The token does not match the port's, or the exposure expired: the same answer for both,
    /// so a token cannot be probed.
    #[error("the token is not valid for port {port} of session {id}")]
    BadToken { id: String, port: u16 },
    #[error(
        "session {id} has {} exposed ports; unexpose one first",
        messages::ports::MAX_EXPOSED_PORTS
    )]
    TooMany { id: String },
    /// The session's container is not placed yet (nothing has run in it).
    #[error("session {id} has no container yet: run something in it first")]
    NoContainer { id: String },
    #[error("session {id} lost its node; its next execution places it again")]
    Lost { id: String },
}

impl PortError {
    pub fn kind(&self) -> messages::ErrorKind {
        use messages::ErrorKind as K;
        match self {
            PortError::NoResidentSandbox { .. } => K::NotImplemented,
            PortError::NotExposed { .. } => K::NotFound,
            PortError::BadToken { .. } => K::Unauthorized,
            PortError::TooMany { .. } | PortError::NoContainer { .. } => K::Conflict,
            PortError::Lost { .. } => K::Unavailable,
        }
    }
}

/// Why the scheduler could not serve a request (an execution, a session, a test run).
#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    /// A refusal that is a wire body already, passed on as it is: an executor's, a stored
    /// result's error, the pipeline's verdict on an invalid request (which is also the error
    /// its stored result carries).
    #[error("{0}")]
    Refused(ErrorBody),
    /// A field of the request is malformed or too large (ids, session settings, test runs).
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    #[error(transparent)]
    OverQuota(#[from] OverQuota),
    /// The network policy asks for more than the operator's ceiling permits.
    #[error(transparent)]
    BeyondCeiling(#[from] BeyondCeiling),
    /// The request names a template the templates service does not know: the client's
    /// mistake (400), not a missing resource of the call it made.
    #[error("unknown template {name:?}; `sandmesh template list` shows the templates")]
    UnknownTemplate { name: String },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Registry(#[from] RegistryGone),
    /// A call to another service failed; the message repeats the cause's whole chain (as
    /// [`StoreError`]'s does), so a log line and the reply are whole.
    #[error("the {service} service: {}", kit::error_chain(source))]
    Dependency {
        service: ServiceName,
        #[source]
        source: ClientError,
    },
    /// Every admission permit is taken.
    #[error("the scheduler queue is full ({size} executions in flight); retry later")]
    QueueFull { size: usize },
    /// Another attempt of the same execution id holds its claim.
    #[error(
        "this execution id is running now (on scheduler {owner}); read its result with \
         exec.result when it ends"
    )]
    Running { owner: String },
    #[error("no result for execution {id}: it is unknown, or still waiting in the job queue")]
    NoResult { id: String },
    /// A sync caller stopped waiting for a parked execution; it stays parked.
    #[error(
        "execution {execution_id} waits for confirmation {confirmation_id} (read its result \
         with exec.result)"
    )]
    Undecided {
        execution_id: String,
        confirmation_id: String,
        #[source]
        cause: StoppedWaiting,
    },
    /// Waiting for a stored result could not start.
    #[error("waiting for the result of {id}")]
    ResultWatch {
        id: String,
        #[source]
        source: async_nats::SubscribeError,
    },
    /// No node of `backend` answered (none runs, or each one tried was gone).
    #[error(
        "no {} executor is running (no responders on the executor subjects)",
        .backend.as_str()
    )]
    NoExecutor { backend: Backend },
    /// `id` names no session of the caller.
    #[error("no session {id}")]
    NoSession { id: String },
    /// The record went while the session was being used (removed after it closed).
    #[error("session {id} vanished")]
    SessionVanished { id: String },
    /// The session takes no more work.
    #[error("session {id} {why}")]
    SessionEnded { id: String, why: SessionEnd },
    /// Every node was tried, or none is free within the execution's deadline.
    #[error("no executor node could take session {id}; retry when one runs")]
    NoNodeForSession { id: String },
    /// The run the scheduler built does not hold together (a bug): nothing was sent.
    #[error("building the executor run")]
    RunShape(#[from] RunShapeError),
    /// A test run's runner did not write its report, or the tests took it away.
    #[error(
        "the tests left no report: the runner did not start, was killed before writing it, or \
         the tests removed it or took its place (see stdout and stderr)"
    )]
    NoTestReport,
    /// A test run's report is too large or not a JUnit report.
    #[error(transparent)]
    Report(#[from] JunitError),
    /// The workspace answered the report in a form that does not decode.
    #[error("the report's content: {reason}")]
    ReportContent { reason: String },
    /// An `aio.exec` command was stopped by the policy or a person (`status` says which).
    #[error("the command did not run ({}): {why}", .status.as_str())]
    CommandNotRun { status: ExecStatus, why: String },
    /// A preview port cannot be exposed or reached.
    #[error(transparent)]
    Port(#[from] PortError),
    /// An `aio.exec` command's execution ended without a result of the command's own.
    #[error("the command ended {}", .status.as_str())]
    CommandEnded { status: ExecStatus },
}

/// Why a session takes no more work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SessionEnd {
    #[error("is closed; open a new session")]
    Closed,
    #[error("expired (its ttl_ms ran out); open a new session")]
    Expired,
    /// Its record is in a state no run may start in (another scheduler changed it).
    #[error("is {0:?} and cannot run")]
    Unrunnable(SessionState),
}

/// Why a sync caller stopped waiting for a parked execution.
#[derive(Debug, thiserror::Error)]
pub enum StoppedWaiting {
    #[error("the scheduler is stopping")]
    Stopping,
    #[error("its decision and run did not end in time")]
    TimedOut,
    #[error("the result subscription ended")]
    Ended,
    #[error("subscribing to its result")]
    Subscribe(#[source] async_nats::SubscribeError),
}

impl SchedulerError {
    /// A closure for `map_err` on a call to `service`.
    pub fn calling(service: ServiceName) -> impl Fn(ClientError) -> Self + Copy {
        move |source| SchedulerError::Dependency { service, source }
    }

    /// The kind the caller is answered with.
    pub fn kind(&self) -> ErrorKind {
        use SchedulerError as E;
        match self {
            E::Refused(body) => body.kind,
            E::Port(e) => e.kind(),
            E::Invalid(ValidationError::Invalid { .. }) => ErrorKind::BadRequest,
            E::Invalid(ValidationError::TooLarge { .. })
            | E::Report(JunitError::TooLarge { .. }) => ErrorKind::TooLarge,
            E::UnknownTemplate { .. } | E::Report(_) => ErrorKind::BadRequest,
            E::OverQuota(_) => ErrorKind::Overloaded,
            E::BeyondCeiling(_) | E::CommandNotRun { .. } => ErrorKind::Denied,
            E::Dependency { source, .. } => source.kind(),
            E::QueueFull { .. } => ErrorKind::Overloaded,
            E::Running { .. } | E::SessionEnded { .. } => ErrorKind::Conflict,
            E::NoResult { .. }
            | E::NoSession { .. }
            | E::SessionVanished { .. }
            | E::NoTestReport => ErrorKind::NotFound,
            E::RunShape(_) | E::ReportContent { .. } | E::CommandEnded { .. } => {
                ErrorKind::Internal
            }
            E::Undecided {
                cause: StoppedWaiting::TimedOut,
                ..
            } => ErrorKind::Timeout,
            E::Store(_)
            | E::Registry(_)
            | E::Undecided { .. }
            | E::ResultWatch { .. }
            | E::NoExecutor { .. }
            | E::NoNodeForSession { .. } => ErrorKind::Unavailable,
        }
    }
}

impl From<SchedulerError> for ErrorBody {
    /// A dependency's own refusal is passed on as it said it; a dependency that did not answer
    /// is named, so the client knows which part of the mesh is missing. Every other error is
    /// answered with its kind and its message with the causes'.
    fn from(e: SchedulerError) -> Self {
        match e {
            SchedulerError::Refused(body) => body,
            SchedulerError::Invalid(e) => e.into(),
            SchedulerError::OverQuota(e) => e.into(),
            SchedulerError::BeyondCeiling(e) => e.into(),
            SchedulerError::Report(e) => e.into(),
            e @ SchedulerError::UnknownTemplate { .. } => ErrorBody::bad_request(e.to_string())
                .with_details(serde_json::json!({ "field": "template" })),
            SchedulerError::Store(e) => e.into(),
            SchedulerError::Registry(e) => e.into(),
            SchedulerError::Dependency {
                source: ClientError::Service { body, .. },
                ..
            } => body,
            SchedulerError::Dependency {
                service,
                source: ClientError::NoResponders { subject },
            } => ErrorBody::unavailable(format!(
                "the {service} service is not running (no responders on {subject})"
            )),
            e @ SchedulerError::Dependency { .. } => ErrorBody::new(e.kind(), e.to_string()),
            e => ErrorBody::new(e.kind(), kit::error_chain(&e)),
        }
    }
}

/// Opens the scheduler's own KV bucket with `replicas` copies, creating it when it does not
/// exist yet (another instance may create it in between: then it is opened).
pub async fn ensure_bucket(
    js: &jetstream::Context,
    config: kv::Config,
    replicas: usize,
) -> Result<kv::Store, StoreError> {
    kit::bootstrap::ensure_bucket(js, config, replicas)
        .await
        .map_err(StoreError::during("creating a KV bucket"))
}

#[cfg(test)]
mod tests {
    use std::error::Error;
    use std::time::Duration;

    use super::*;
    use messages::quota::Quota;
    use messages::tenancy::Tenant;

    #[test]
    fn missing_services_are_named_and_the_cause_is_kept() {
        let e = SchedulerError::calling(ServiceName::RiskAssessor)(ClientError::NoResponders {
            subject: "sandbox.v1.risk.assess".into(),
        });
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        let source = e.source().expect("the failed call is the cause");
        assert!(matches!(
            source.downcast_ref::<ClientError>(),
            Some(ClientError::NoResponders { .. })
        ));
        let body = ErrorBody::from(e);
        assert_eq!(body.kind, ErrorKind::Unavailable);
        assert!(body.message.contains("risk-assessor"), "{}", body.message);
    }

    #[test]
    fn the_schedulers_own_refusals_keep_their_wire_form() {
        let acme = Tenant::new("acme").unwrap();
        let over = OverQuota {
            tenant: acme.clone(),
            quota: Quota::Sessions,
            limit: 2,
            used: 2,
        };
        let e = SchedulerError::from(over.clone());
        assert_eq!(e.kind(), ErrorKind::Overloaded);
        assert_eq!(e.to_string(), over.to_string());
        assert_eq!(ErrorBody::from(e), ErrorBody::from(over));

        let large = SchedulerError::from(JunitError::TooLarge { size: 1 << 30 });
        assert_eq!(large.kind(), ErrorKind::TooLarge);
        assert_eq!(ErrorBody::from(large).code, 413);
        let dtd = ErrorBody::from(SchedulerError::from(JunitError::Dtd));
        assert_eq!(
            (dtd.kind, dtd.message.as_str()),
            (
                ErrorKind::BadRequest,
                "the test report declares a DTD; JUnit reports have none"
            )
        );

        let unknown = SchedulerError::UnknownTemplate { name: "x".into() };
        assert_eq!(unknown.kind(), ErrorKind::BadRequest);
        let body = ErrorBody::from(unknown);
        assert_eq!(
            body.details,
            Some(serde_json::json!({ "field": "template" }))
        );
    }

    #[test]
    fn a_dependencys_refusal_passes_on_unchanged_and_a_timeout_keeps_its_kind() {
        let refused = ErrorBody::conflict("decided already");
        let e = SchedulerError::calling(ServiceName::Confirmation)(ClientError::Service {
            subject: "s".into(),
            body: refused.clone(),
        });
        assert_eq!(ErrorBody::from(e), refused);
        let late = SchedulerError::calling(ServiceName::AioPool)(ClientError::TimedOut {
            subject: "s".into(),
            timeout: Duration::from_secs(1),
        });
        let body = ErrorBody::from(late);
        assert_eq!(body.kind, ErrorKind::Timeout);
        assert!(
            body.message.starts_with("the aio-pool service: "),
            "{}",
            body.message
        );
    }
}
