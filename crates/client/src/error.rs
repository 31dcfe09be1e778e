//! One error type for every client call. Callers branch on [`ClientError::kind`], the wire's
//! [`ErrorKind`]: a service's refusal keeps its own kind; a call no service answered is
//! `Unavailable` (nothing listens, or the connection failed) or `Timeout`; a reply this client
//! does not understand is `Internal`. The variant says which happened, and the cause is kept.

use std::time::Duration;

use messages::ErrorBody;

type Cause = Box<dyn std::error::Error + Send + Sync>;

/// What went wrong, stable enough to branch on: the wire's kinds, one vocabulary for a
/// service's own refusals and for the ways a call fails before any service answers.
pub use messages::ErrorKind;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The service answered with an error (the micro error headers and a typed body).
    #[error("{subject}: {body}")]
    Service { subject: String, body: ErrorBody },
    #[error("no service answers on {subject}")]
    NoResponders { subject: String },
    #[error("no answer on {subject} within {timeout:?}")]
    TimedOut { subject: String, timeout: Duration },
    /// NATS, JetStream or the object store failed.
    #[error("{what}")]
    Transport {
        what: String,
        #[source]
        source: Cause,
    },
    /// A request that could not be encoded or a reply that could not be decoded.
    #[error("{what}")]
    Codec {
        what: String,
        #[source]
        source: Cause,
    },
    /// A reply that decodes but breaks the protocol (e.g. a snapshot with neither bytes nor
    /// object).
    #[error("{subject}: {problem}")]
    Protocol { subject: String, problem: String },
}

impl ClientError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            ClientError::Service { body, .. } => body.kind,
            ClientError::NoResponders { .. } | ClientError::Transport { .. } => {
                ErrorKind::Unavailable
            }
            ClientError::TimedOut { .. } => ErrorKind::Timeout,
            ClientError::Codec { .. } | ClientError::Protocol { .. } => ErrorKind::Internal,
        }
    }

    /// The service's error body, when a service refused.
    pub fn service_error(&self) -> Option<&ErrorBody> {
        match self {
            ClientError::Service { body, .. } => Some(body),
            _ => None,
        }
    }

    /// The error as a service passes it on to its own caller: a refusal unchanged, anything
    /// else as a body of the matching kind.
    pub fn into_body(self) -> ErrorBody {
        match self {
            ClientError::Service { body, .. } => body,
            other => ErrorBody::new(other.kind(), other.to_string()),
        }
    }

    pub(crate) fn transport(
        what: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        ClientError::Transport {
            what: what.into(),
            source: Box::new(source),
        }
    }

    pub(crate) fn codec(
        what: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        ClientError::Codec {
            what: what.into(),
            source: Box::new(source),
        }
    }
}

pub type Result<T, E = ClientError> = std::result::Result<T, E>;

/// Why streamed content did not reach the workspace.
#[derive(Debug, thiserror::Error)]
pub enum StreamError<E> {
    /// The content's own stream failed (the caller's error: a body that stalled, a cap).
    #[error("reading the content failed")]
    Content(#[source] E),
    #[error(transparent)]
    Mesh(#[from] ClientError),
}

impl StreamError<std::convert::Infallible> {
    pub(crate) fn into_mesh(self) -> ClientError {
        match self {
            StreamError::Content(never) => match never {},
            StreamError::Mesh(e) => e,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_service_code_has_its_kind() {
        for code in [400, 403, 404, 409, 413, 429, 500, 503, 504] {
            let wire = ErrorKind::from_code(code);
            let e = ClientError::Service {
                subject: "s".into(),
                body: ErrorBody::new(wire, "m"),
            };
            assert_eq!(e.kind(), wire);
            assert_eq!(e.into_body().code, code);
        }
    }

    #[test]
    fn failures_before_a_service_answers_have_their_own_kinds() {
        let none = ClientError::NoResponders {
            subject: "s".into(),
        };
        assert_eq!(none.kind(), ErrorKind::Unavailable);
        let late = ClientError::TimedOut {
            subject: "s".into(),
            timeout: Duration::from_secs(1),
        };
        assert_eq!(late.kind(), ErrorKind::Timeout);
        let io = ClientError::transport("publish", std::io::Error::other("closed"));
        assert_eq!(io.kind(), ErrorKind::Unavailable);
        assert!(matches!(io, ClientError::Transport { .. }));
        assert!(
            std::error::Error::source(&io).is_some(),
            "the cause is kept"
        );
        assert_eq!(io.into_body().kind, ErrorKind::Unavailable);
    }
}
