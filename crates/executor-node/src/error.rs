//! [`ExecutorError`]: why a node did not run an execution or answer a call, kept as a value
//! with its cause while it travels from admission, a backend or a run to the endpoint, where
//! the wire's [`ErrorBody`] is made from it once (`kit::actor_handler`). A run's answer is
//! kept in this form too ([`crate::ResultStore`]), to be given again.
//!
//! A backend's own reasons (a run kind it does not take, a process call that failed) are its
//! own types, each a [`BackendError`] that says its kind.

use std::sync::Arc;

use messages::executor::Backend;
use messages::validate::ValidationError;
use messages::{ErrorBody, ErrorKind};

use crate::template_images::ImageError;

/// A backend's own error, carried by [`ExecutorError::Backend`] to its caller.
pub trait BackendError: std::error::Error + Send + Sync + 'static {
    /// The kind the caller is answered with.
    fn kind(&self) -> ErrorKind;

    /// Its wire form: its kind and message, unless the error's own wire form says more (the
    /// details of a malformed field).
    fn body(&self) -> ErrorBody {
        ErrorBody::new(self.kind(), self.to_string())
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum ExecutorError {
    /// A drain began: no new work is taken.
    #[error("this executor is draining")]
    Draining,
    /// A malformed field (an id, a status query, a backend's policy check) or a request past
    /// the node's ceilings.
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// Every run slot is held (by the tenants asking, as the sharing rule counts them).
    #[error(
        "this executor runs {capacity} executions at once, shared among the tenants asking; \
         retry later"
    )]
    Full { capacity: usize },
    #[error(
        "the {} backend keeps no background processes: use a session on a docker node",
        .backend.as_str()
    )]
    NoProcesses { backend: Backend },
    /// The execution ran here, but its answer was dropped to bound the node's memory.
    #[error("execution {execution_id} already ran on this node; its result is no longer kept")]
    Forgotten { execution_id: String },
    /// The run was dropped unanswered (a task that panicked, an actor that stopped): nothing
    /// is kept, so a retry runs it.
    #[error("the execution ended without an answer")]
    Unanswered,
    #[error(transparent)]
    Image(#[from] ImageError),
    /// The backend's own reason (shared: a run's answer goes to every caller attached to it).
    #[error(transparent)]
    Backend(Arc<dyn BackendError>),
}

impl<E: BackendError> From<E> for ExecutorError {
    fn from(e: E) -> Self {
        ExecutorError::Backend(Arc::new(e))
    }
}

impl ExecutorError {
    /// The kind the caller is answered with.
    pub fn kind(&self) -> ErrorKind {
        use ExecutorError as E;
        match self {
            E::Invalid(ValidationError::Invalid { .. }) => ErrorKind::BadRequest,
            E::Invalid(ValidationError::TooLarge { .. }) => ErrorKind::TooLarge,
            E::Draining | E::Unanswered => ErrorKind::Unavailable,
            E::Full { .. } => ErrorKind::Overloaded,
            E::NoProcesses { .. } => ErrorKind::NotImplemented,
            E::Forgotten { .. } => ErrorKind::Conflict,
            E::Image(e) => e.kind(),
            E::Backend(e) => e.kind(),
        }
    }
}

impl From<ExecutorError> for ErrorBody {
    /// Its kind and its message; a malformed field keeps the details its own wire form has.
    fn from(e: ExecutorError) -> Self {
        match e {
            ExecutorError::Invalid(e) => e.into(),
            ExecutorError::Backend(e) => e.body(),
            e => ErrorBody::new(e.kind(), e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend's error whose wire form has details.
    #[derive(Debug, thiserror::Error)]
    #[error("no such thing here")]
    struct Missing;

    impl BackendError for Missing {
        fn kind(&self) -> ErrorKind {
            ErrorKind::NotFound
        }

        fn body(&self) -> ErrorBody {
            ErrorBody::new(self.kind(), self.to_string())
                .with_details(serde_json::json!({"thing": 1}))
        }
    }

    /// The body `e` is answered with, checked against its kind and message.
    fn answered(e: ExecutorError) -> ErrorBody {
        let (kind, message) = (e.kind(), e.to_string());
        let body = ErrorBody::from(e);
        assert_eq!((body.kind, body.code), (kind, kind.code()), "{message}");
        assert_eq!(body.message, message);
        body
    }

    #[tokio::test]
    async fn every_refusal_is_answered_with_its_kind_and_its_message() {
        let task = tokio::spawn(std::future::pending::<()>());
        task.abort();
        let cancelled = task.await.unwrap_err();
        let build = containers::image::ImageError::Failed {
            command: "docker build".into(),
            message: "no space left".into(),
        };
        for (e, kind) in [
            (ExecutorError::Draining, ErrorKind::Unavailable),
            (
                ValidationError::invalid("execution_id", "bad").into(),
                ErrorKind::BadRequest,
            ),
            (
                ValidationError::TooLarge {
                    field: "code".into(),
                    size: 2,
                    limit: 1,
                }
                .into(),
                ErrorKind::TooLarge,
            ),
            (ExecutorError::Full { capacity: 4 }, ErrorKind::Overloaded),
            (
                ExecutorError::NoProcesses {
                    backend: Backend::Bwrap,
                },
                ErrorKind::NotImplemented,
            ),
            (
                ExecutorError::Forgotten {
                    execution_id: "e1".into(),
                },
                ErrorKind::Conflict,
            ),
            (ExecutorError::Unanswered, ErrorKind::Unavailable),
            (
                ImageError::Build {
                    template: "data".into(),
                    source: Arc::new(build),
                }
                .into(),
                ErrorKind::Unavailable,
            ),
            (
                ImageError::Task(Arc::new(cancelled)).into(),
                ErrorKind::Internal,
            ),
            (Missing.into(), ErrorKind::NotFound),
        ] {
            assert_eq!(answered(e).kind, kind);
        }
    }

    #[test]
    fn a_field_and_a_backend_error_keep_their_details() {
        let bad = ValidationError::invalid("session_id", "bad");
        let body = answered(bad.clone().into());
        assert_eq!(body, ErrorBody::from(bad));
        assert!(body.details.is_some());
        let body = answered(Missing.into());
        assert_eq!(body.details, Some(serde_json::json!({"thing": 1})));
    }
}
