//! The scheduler's errors, kept as values with their causes while they travel up the pipeline
//! ([`SchedulerError`]); the wire's [`ErrorBody`] is made from one once, at the endpoint.

use async_nats::jetstream::{self, kv};
use messages::{ErrorBody, ErrorKind, ServiceName};
use sandmesh_client::ClientError;

use crate::placer::RegistryGone;

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

/// Why the scheduler could not serve a request (an execution, a session, a test run).
#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    /// Refused by a rule (malformed, beyond a ceiling, unknown id, queue full): the answer is
    /// decided where the rule lives.
    #[error("{0}")]
    Refused(ErrorBody),
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
}

impl SchedulerError {
    /// A closure for `map_err` on a call to `service`.
    pub fn calling(service: ServiceName) -> impl Fn(ClientError) -> Self + Copy {
        move |source| SchedulerError::Dependency { service, source }
    }

    /// The kind the caller is answered with.
    pub fn kind(&self) -> ErrorKind {
        match self {
            SchedulerError::Refused(body) => body.kind,
            SchedulerError::Store(_) | SchedulerError::Registry(_) => ErrorKind::Unavailable,
            SchedulerError::Dependency { source, .. } => source.kind(),
        }
    }
}

impl From<ErrorBody> for SchedulerError {
    fn from(body: ErrorBody) -> Self {
        SchedulerError::Refused(body)
    }
}

impl From<SchedulerError> for ErrorBody {
    /// A dependency's own refusal is passed on as it said it; a dependency that did not answer
    /// is named, so the client knows which part of the mesh is missing.
    fn from(e: SchedulerError) -> Self {
        match e {
            SchedulerError::Refused(body) => body,
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
