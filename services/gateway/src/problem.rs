//! The one error shape of the API: an RFC 9457 problem (`application/problem+json`) with the
//! client crate's error kind, so an HTTP caller branches on `kind` as a NATS caller branches on
//! [`sandmesh_client::ErrorKind`].

use std::collections::BTreeMap;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use sandmesh_client::{ClientError, ErrorKind};
use serde::{Deserialize, Serialize};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};

pub const PROBLEM_JSON: &str = "application/problem+json";

/// Kinds the gateway itself reports besides the client crate's.
pub const UNAUTHORIZED: &str = "unauthorized";
pub const RATE_LIMITED: &str = "rate_limited";

/// What a handler answers: its response, or a problem.
pub type Reply = Result<Response, Problem>;

/// The errors any call may answer with, all in the problem shape.
pub struct Errors;

impl utoipa::IntoResponses for Errors {
    fn responses() -> BTreeMap<String, RefOr<utoipa::openapi::Response>> {
        let problem = |what: &str| {
            ResponseBuilder::new()
                .description(what)
                .content(
                    PROBLEM_JSON,
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("Problem")))
                        .build(),
                )
                .build()
                .into()
        };
        [
            ("400", "malformed or out of bounds (`bad_request`)"),
            (
                "401",
                "no key, or an unknown or revoked one (`unauthorized`)",
            ),
            ("403", "refused by policy (`denied`)"),
            ("404", "no such id for this key's tenant (`not_found`)"),
            (
                "408",
                "the request body sent nothing for too long (`timeout`); nothing was kept",
            ),
            ("409", "conflicts with the current state (`conflict`)"),
            ("413", "over a size limit (`too_large`)"),
            (
                "429",
                "over the key's rate (`rate_limited`, `Retry-After`) or shed (`overloaded`)",
            ),
            (
                "502",
                "an answer the gateway does not understand (`internal`)",
            ),
            (
                "503",
                "the service is not there (`unavailable`, `transport`)",
            ),
            (
                "501",
                "this kind of sandbox cannot do it (`not_implemented`)",
            ),
            ("504", "no answer in time (`timeout`)"),
        ]
        .into_iter()
        .map(|(code, what)| (code.to_string(), problem(what)))
        .collect()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Problem {
    /// A URI naming the kind (`urn:sandmesh:error:<kind>`).
    #[serde(rename = "type")]
    pub type_: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    /// `bad_request`, `denied`, `not_found`, … (the client crate's kinds), `unauthorized` or
    /// `rate_limited`.
    pub kind: String,
    /// Seconds to wait before retrying (429 only; the `Retry-After` header says it too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<u64>,
}

impl Problem {
    pub fn new(status: StatusCode, kind: &str, detail: impl Into<String>) -> Self {
        Self {
            type_: format!("urn:sandmesh:error:{kind}"),
            title: status.canonical_reason().unwrap_or("Error").to_string(),
            status: status.as_u16(),
            detail: detail.into(),
            kind: kind.to_string(),
            retry_after: None,
        }
    }

    pub fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            ErrorKind::BadRequest.as_str(),
            detail,
        )
    }

    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, ErrorKind::NotFound.as_str(), detail)
    }

    pub fn unauthorized(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, UNAUTHORIZED, detail)
    }

    pub fn too_large(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::TooLarge.as_str(),
            detail,
        )
    }

    pub fn rate_limited(retry_after: u64) -> Self {
        let mut p = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            RATE_LIMITED,
            format!("this key's request rate is used up; retry in {retry_after} s"),
        );
        p.retry_after = Some(retry_after);
        p
    }

    /// A request body that does not decode as its type (malformed, or with a field the type
    /// does not have): 400, saying where.
    pub fn of_body(e: &messages::CodecError) -> Self {
        Self::bad_request(format!("the body: {e}"))
    }

    /// The HTTP status of a failed mesh call.
    pub fn status_of(kind: ErrorKind) -> StatusCode {
        match kind {
            ErrorKind::BadRequest => StatusCode::BAD_REQUEST,
            ErrorKind::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorKind::Denied => StatusCode::FORBIDDEN,
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::Conflict => StatusCode::CONFLICT,
            ErrorKind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::Overloaded => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::Timeout => StatusCode::GATEWAY_TIMEOUT,
            ErrorKind::Internal => StatusCode::BAD_GATEWAY,
            ErrorKind::NotImplemented => StatusCode::NOT_IMPLEMENTED,
        }
    }
}

impl From<ClientError> for Problem {
    fn from(e: ClientError) -> Self {
        let kind = e.kind();
        // A service's refusal says what was wrong; for the rest the chain says where.
        let detail = match e.service_error() {
            Some(body) => body.message.clone(),
            None => kit::error_chain(&e),
        };
        Self::new(Self::status_of(kind), kind.as_str(), detail)
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let retry_after = self.retry_after;
        let body = serde_json::to_vec(&self).expect("a problem serialises");
        let mut response = (status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(secs) = retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if status == StatusCode::UNAUTHORIZED {
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"sandmesh\""),
            );
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use messages::ErrorBody;

    #[test]
    fn mesh_errors_keep_their_kind_and_get_its_status() {
        let e = ClientError::Service {
            subject: "s".into(),
            body: ErrorBody::new(messages::ErrorKind::NotFound, "no session x"),
        };
        let p = Problem::from(e);
        assert_eq!((p.status, p.kind.as_str()), (404, "not_found"));
        assert_eq!(p.detail, "no session x");
        let none = Problem::from(ClientError::NoResponders {
            subject: "s".into(),
        });
        assert_eq!((none.status, none.kind.as_str()), (503, "unavailable"));
    }

    #[test]
    fn a_rate_limit_says_when_to_come_back() {
        let r = Problem::rate_limited(3).into_response();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "3");
        assert_eq!(r.headers()[header::CONTENT_TYPE], PROBLEM_JSON);
    }
}
