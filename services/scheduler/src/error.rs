//! The scheduler's error for JetStream operations: what was being done, and why it failed.

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
