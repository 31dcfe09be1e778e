//! The scheduler's errors: JetStream operations that failed (what was being done, and why), and
//! failed calls to other services, named; and opening its own KV buckets.

use async_nats::jetstream::{self, kv};
use kit::CallError;
use messages::ErrorBody;

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

/// A failed call to another service, named so the client knows which part is missing.
pub fn dependency_error(service: &str, e: CallError) -> ErrorBody {
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

#[cfg(test)]
mod tests {
    use super::*;
    use messages::ErrorKind;

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
