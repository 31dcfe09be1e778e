//! The typed error body every service sends with the NATS micro error headers.

use serde::{Deserialize, Serialize};

/// What went wrong, as a stable machine-readable kind. Each kind maps to one status code
/// (the `Nats-Service-Error-Code` header), so clients can branch on either.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    BadRequest,
    /// A credential that is missing, malformed, forged or expired (a port's token).
    Unauthorized,
    Denied,
    NotFound,
    Conflict,
    TooLarge,
    Overloaded,
    Unavailable,
    Timeout,
    Internal,
    /// The operation exists but this backend or deployment does not offer it.
    NotImplemented,
}

impl ErrorKind {
    pub const fn code(self) -> u16 {
        match self {
            ErrorKind::BadRequest => 400,
            ErrorKind::Unauthorized => 401,
            ErrorKind::Denied => 403,
            ErrorKind::NotFound => 404,
            ErrorKind::Conflict => 409,
            ErrorKind::TooLarge => 413,
            ErrorKind::Overloaded => 429,
            ErrorKind::Internal => 500,
            ErrorKind::NotImplemented => 501,
            ErrorKind::Unavailable => 503,
            ErrorKind::Timeout => 504,
        }
    }

    /// The kind for a status code; unknown codes are internal errors.
    pub const fn from_code(code: u16) -> Self {
        match code {
            400 => ErrorKind::BadRequest,
            401 => ErrorKind::Unauthorized,
            403 => ErrorKind::Denied,
            404 => ErrorKind::NotFound,
            409 => ErrorKind::Conflict,
            413 => ErrorKind::TooLarge,
            429 => ErrorKind::Overloaded,
            501 => ErrorKind::NotImplemented,
            503 => ErrorKind::Unavailable,
            504 => ErrorKind::Timeout,
            _ => ErrorKind::Internal,
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorKind::BadRequest => "bad_request",
            ErrorKind::Unauthorized => "unauthorized",
            ErrorKind::Denied => "denied",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Conflict => "conflict",
            ErrorKind::TooLarge => "too_large",
            ErrorKind::Overloaded => "overloaded",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Internal => "internal",
            ErrorKind::NotImplemented => "not_implemented",
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `{code, kind, message, details}`: the body of every error reply.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[error("{kind} ({code}): {message}")]
pub struct ErrorBody {
    pub code: u16,
    pub kind: ErrorKind,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<serde_json::Value>,
}

impl ErrorBody {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            code: kind.code(),
            kind,
            message: message.into(),
            details: None,
        }
    }

    pub fn with_details(mut self, details: serde_json::Value) -> Self {
        self.details = Some(details);
        self
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::BadRequest, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }

    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Conflict, message)
    }

    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::TooLarge, message)
    }

    pub fn overloaded(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Overloaded, message)
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unavailable, message)
    }

    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Timeout, message)
    }

    pub fn not_implemented(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotImplemented, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }

    pub fn denied(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Denied, message)
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unauthorized, message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips_through_its_code() {
        for kind in [
            ErrorKind::BadRequest,
            ErrorKind::Denied,
            ErrorKind::NotFound,
            ErrorKind::Conflict,
            ErrorKind::TooLarge,
            ErrorKind::Overloaded,
            ErrorKind::Unavailable,
            ErrorKind::Timeout,
            ErrorKind::Internal,
            ErrorKind::Unauthorized,
            ErrorKind::NotImplemented,
        ] {
            assert_eq!(ErrorKind::from_code(kind.code()), kind);
        }
    }
}
