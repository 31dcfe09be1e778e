//! What goes wrong inside the confirmation service, kept as a value with its cause while it
//! travels from the workflow through the registry; the wire's [`ErrorBody`] is made from it
//! once, at the endpoint (`kit::actor_handler`).

use std::sync::Arc;

use messages::confirm::Confirmation;
use messages::validate::ValidationError;
use messages::{ErrorBody, ErrorKind};
use ractor::RpcReplyPort;
use serde_json::json;

use crate::store::StoreError;

/// Where a registry call's answer goes.
pub type Reply<T> = RpcReplyPort<Result<T, ConfirmError>>;

#[derive(Debug, thiserror::Error)]
pub enum ConfirmError {
    /// A request that breaks a bound (a field, the timeout, a list filter).
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// Unknown — or not the caller's to see: the same answer, so ids cannot be probed.
    #[error("no confirmation {id}")]
    NotFound { id: String },
    /// Only the first decision counts; this one stands.
    #[error(
        "confirmation {} was already decided ({:?} by {})",
        .0.id, .0.state, .0.by.as_deref().unwrap_or("?")
    )]
    AlreadyDecided(Box<Confirmation>),
    /// A session-scoped approval of a confirmation that belongs to no session.
    #[error("scope session: confirmation {id} belongs to no session")]
    NoSession { id: String },
    /// The caller may not do this (who asks and decides is the server's word).
    #[error("{0}")]
    Denied(&'static str),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Created by a concurrent request for the same execution, then gone when read.
    #[error("confirmation {id} vanished while created")]
    Vanished { id: String },
    #[error(
        "the approval of {id} is stored, but the session grant could not be written (too much \
         contention); approve the next request again"
    )]
    GrantContention { id: String },
    #[error(
        "this confirmation instance is stopping; retry the request (same execution_id) or get \
         the confirmation by id — its state is kept"
    )]
    Stopping,
    #[error("no decision observed in time; get it by id")]
    Undecided,
    /// One failure answered to every request waiting on the same confirmation.
    #[error(transparent)]
    Shared(Arc<ConfirmError>),
}

impl ConfirmError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            ConfirmError::Invalid(ValidationError::TooLarge { .. }) => ErrorKind::TooLarge,
            ConfirmError::Invalid(_) | ConfirmError::NoSession { .. } => ErrorKind::BadRequest,
            ConfirmError::NotFound { .. } => ErrorKind::NotFound,
            ConfirmError::AlreadyDecided(_) => ErrorKind::Conflict,
            ConfirmError::Denied(_) => ErrorKind::Denied,
            ConfirmError::Store(StoreError::Corrupt { .. }) => ErrorKind::Internal,
            ConfirmError::Store(StoreError::Unavailable { .. })
            | ConfirmError::Vanished { .. }
            | ConfirmError::GrantContention { .. }
            | ConfirmError::Stopping => ErrorKind::Unavailable,
            ConfirmError::Undecided => ErrorKind::Timeout,
            ConfirmError::Shared(e) => e.kind(),
        }
    }

    /// The reply: its kind, the whole cause chain in the message (callers on the other side of
    /// NATS cannot walk `source()`), and what the caller needs in `details`.
    fn body(&self) -> ErrorBody {
        match self {
            ConfirmError::Invalid(e) => e.clone().into(),
            ConfirmError::AlreadyDecided(record) => ErrorBody::new(self.kind(), self.to_string())
                .with_details(json!({ "confirmation": record })),
            ConfirmError::Shared(e) => e.body(),
            _ => ErrorBody::new(self.kind(), kit::error_chain(self)),
        }
    }
}

impl From<ConfirmError> for ErrorBody {
    fn from(e: ConfirmError) -> Self {
        e.body()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reply_keeps_the_kind_and_the_cause() {
        let outage = ConfirmError::Store(StoreError::Unavailable {
            op: "read",
            source: Box::new(std::io::Error::other("no route to the server")),
        });
        let shared = ConfirmError::Shared(Arc::new(outage));
        assert_eq!(shared.kind(), ErrorKind::Unavailable);
        let body = ErrorBody::from(shared);
        assert_eq!(body.kind, ErrorKind::Unavailable);
        assert!(
            body.message.ends_with("no route to the server"),
            "{}",
            body.message
        );
    }

    #[test]
    fn a_second_decision_is_answered_with_the_first() {
        let first = Confirmation {
            id: "c1".into(),
            by: Some("alice".into()),
            ..Default::default()
        };
        let body = ErrorBody::from(ConfirmError::AlreadyDecided(Box::new(first)));
        assert_eq!(body.kind, ErrorKind::Conflict);
        assert_eq!(body.details.unwrap()["confirmation"]["by"], "alice");
    }
}
