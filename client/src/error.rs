//! One error type for every client call. Callers branch on [`ClientError::kind`] (the service
//! error codes plus the two ways a call fails before any service answers); the cause is kept.

use std::time::Duration;

use messages::ErrorBody;

type Cause = Box<dyn std::error::Error + Send + Sync>;

/// What went wrong, stable enough to branch on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// 400: the request was refused as malformed or out of bounds.
    BadRequest,
    /// 403
    Denied,
    /// 404: also "no such id" (results, sessions, confirmations, files).
    NotFound,
    /// 409
    Conflict,
    /// 413
    TooLarge,
    /// 429: the service sheds load; retry later.
    Overloaded,
    /// 503, or no instance of the service answers at all.
    Unavailable,
    /// 504, or no answer within the caller's timeout.
    Timeout,
    /// 500, or a reply this client does not understand.
    Internal,
    /// The NATS connection or JetStream failed underneath the call.
    Transport,
}

impl ErrorKind {
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorKind::BadRequest => "bad_request",
            ErrorKind::Denied => "denied",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Conflict => "conflict",
            ErrorKind::TooLarge => "too_large",
            ErrorKind::Overloaded => "overloaded",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Internal => "internal",
            ErrorKind::Transport => "transport",
        }
    }

    fn of_service(kind: messages::ErrorKind) -> Self {
        use messages::ErrorKind as K;
        match kind {
            K::BadRequest => ErrorKind::BadRequest,
            K::Denied => ErrorKind::Denied,
            K::NotFound => ErrorKind::NotFound,
            K::Conflict => ErrorKind::Conflict,
            K::TooLarge => ErrorKind::TooLarge,
            K::Overloaded => ErrorKind::Overloaded,
            K::Unavailable => ErrorKind::Unavailable,
            K::Timeout => ErrorKind::Timeout,
            K::Internal => ErrorKind::Internal,
        }
    }

    /// The wire kind a service reports onwards when a call it made failed this way.
    pub fn to_service(self) -> messages::ErrorKind {
        use messages::ErrorKind as K;
        match self {
            ErrorKind::BadRequest => K::BadRequest,
            ErrorKind::Denied => K::Denied,
            ErrorKind::NotFound => K::NotFound,
            ErrorKind::Conflict => K::Conflict,
            ErrorKind::TooLarge => K::TooLarge,
            ErrorKind::Overloaded => K::Overloaded,
            ErrorKind::Unavailable | ErrorKind::Transport => K::Unavailable,
            ErrorKind::Timeout => K::Timeout,
            ErrorKind::Internal => K::Internal,
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

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
            ClientError::Service { body, .. } => ErrorKind::of_service(body.kind),
            ClientError::NoResponders { .. } => ErrorKind::Unavailable,
            ClientError::TimedOut { .. } => ErrorKind::Timeout,
            ClientError::Transport { .. } => ErrorKind::Transport,
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
            other => ErrorBody::new(other.kind().to_service(), other.to_string()),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_service_code_has_its_kind() {
        use messages::ErrorKind as K;
        for (wire, kind) in [
            (K::BadRequest, ErrorKind::BadRequest),
            (K::Denied, ErrorKind::Denied),
            (K::NotFound, ErrorKind::NotFound),
            (K::Conflict, ErrorKind::Conflict),
            (K::TooLarge, ErrorKind::TooLarge),
            (K::Overloaded, ErrorKind::Overloaded),
            (K::Unavailable, ErrorKind::Unavailable),
            (K::Timeout, ErrorKind::Timeout),
            (K::Internal, ErrorKind::Internal),
        ] {
            let e = ClientError::Service {
                subject: "s".into(),
                body: ErrorBody::new(wire, "m"),
            };
            assert_eq!(e.kind(), kind);
            assert_eq!(e.kind().to_service(), wire);
            assert_eq!(e.into_body().kind, wire);
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
        assert_eq!(io.kind(), ErrorKind::Transport);
        assert!(
            std::error::Error::source(&io).is_some(),
            "the cause is kept"
        );
        assert_eq!(io.into_body().kind, messages::ErrorKind::Unavailable);
    }
}
