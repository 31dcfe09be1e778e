//! Connect-RPC with the JSON codec, as envd speaks it: the wire rules the facade needs and
//! nothing else (no protobuf, no compression — the SDKs send none).
//!
//! - Unary: `Content-Type: application/json`, the body a JSON message; success 200 and a JSON
//!   message, failure an HTTP status and `{"code", "message"}`.
//! - Server streams: `Content-Type: application/connect+json`; the request and every response
//!   message are envelopes (a flag byte, a 4-byte big-endian length, the JSON); the response
//!   ends with an end-of-stream envelope (flag `0x02`) holding `{}` or `{"error": …}`. A
//!   failure before the first message is answered like a unary one (the client reads both).

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::{BufMut, Bytes, BytesMut};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::E2bError;
use crate::body::BodyError;

pub const UNARY_JSON: &str = "application/json";
pub const STREAM_JSON: &str = "application/connect+json";

/// An envelope's flag: the message is compressed (never sent by the SDKs; refused).
const FLAG_COMPRESSED: u8 = 0x01;
/// An envelope's flag: the end of the stream.
pub const FLAG_END_STREAM: u8 = 0x02;
/// The flag byte and the length.
const PREFIX: usize = 5;

/// The largest request message: a command line, a path or a selector, never file content
/// (files go over `/files`).
pub const MAX_REQUEST_BYTES: usize = 1 << 20;

/// Connect's error codes, with the HTTP status each maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Canceled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Unimplemented,
    Internal,
    Unavailable,
    Unauthenticated,
}

impl Code {
    pub const fn as_str(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    pub fn http_status(self) -> StatusCode {
        match self {
            Code::Canceled => StatusCode::REQUEST_TIMEOUT,
            Code::InvalidArgument | Code::FailedPrecondition => StatusCode::BAD_REQUEST,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists => StatusCode::CONFLICT,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Unknown | Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        }
    }

    /// The code of an HTTP status the mesh's answers carry.
    pub fn of_status(status: StatusCode) -> Self {
        match status.as_u16() {
            400 | 416 => Code::InvalidArgument,
            401 => Code::Unauthenticated,
            403 => Code::PermissionDenied,
            404 => Code::NotFound,
            408 => Code::Canceled,
            409 => Code::AlreadyExists,
            413 | 429 => Code::ResourceExhausted,
            501 => Code::Unimplemented,
            503 => Code::Unavailable,
            504 => Code::DeadlineExceeded,
            _ => Code::Internal,
        }
    }
}

#[derive(Debug, Serialize)]
struct WireError<'a> {
    code: &'static str,
    message: &'a str,
}

/// A failure answered in Connect's unary shape (also what a stream that fails before its first
/// message answers).
pub fn error_response(e: E2bError) -> Response {
    let body = serde_json::to_vec(&WireError {
        code: e.code.as_str(),
        message: &e.message,
    })
    .expect("an error serialises");
    let mut response = (e.status, body).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(UNARY_JSON));
    response
}

/// A unary success.
pub fn unary<T: Serialize>(message: &T) -> Response {
    let body = serde_json::to_vec(message).expect("a message serialises");
    let mut response = body.into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(UNARY_JSON));
    response
}

/// One envelope of a server stream.
pub fn envelope<T: Serialize>(flags: u8, message: &T) -> Bytes {
    let json = serde_json::to_vec(message).expect("a message serialises");
    let mut out = BytesMut::with_capacity(PREFIX + json.len());
    out.put_u8(flags);
    out.put_u32(json.len() as u32);
    out.extend_from_slice(&json);
    out.freeze()
}

/// The end-of-stream envelope: `{}`, or the error the stream ends with.
pub fn end_of_stream(error: Option<&E2bError>) -> Bytes {
    let body = match error {
        None => serde_json::json!({}),
        Some(e) => serde_json::json!({"error": {"code": e.code.as_str(), "message": e.message}}),
    };
    envelope(FLAG_END_STREAM, &body)
}

/// A server stream's response around `frames` (each an [`envelope`], the last an
/// [`end_of_stream`]).
pub fn stream_response(frames: impl futures::Stream<Item = Bytes> + Send + 'static) -> Response {
    use futures::StreamExt;
    let body = Body::from_stream(frames.map(Ok::<_, std::convert::Infallible>));
    let mut response = Response::new(body);
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(STREAM_JSON));
    response
}

/// Which kind of call a method is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Unary,
    ServerStream,
}

/// The request message of a call of `shape`: the content type checked (415 otherwise), the body
/// read under [`MAX_REQUEST_BYTES`], a stream's single envelope unwrapped, the JSON decoded.
pub async fn request<T: DeserializeOwned>(req: Request, shape: Shape) -> Result<T, E2bError> {
    check_content_type(req.headers(), shape)?;
    let bytes = axum::body::to_bytes(req.into_body(), MAX_REQUEST_BYTES)
        .await
        .map_err(|e| match BodyError::find(&e) {
            Some(e) => E2bError::from(crate::problem::Problem::from(e)),
            None => E2bError::too_large(format!(
                "a request message may have at most {MAX_REQUEST_BYTES} bytes"
            )),
        })?;
    let json = match shape {
        Shape::Unary => &bytes[..],
        Shape::ServerStream => single_envelope(&bytes)?,
    };
    // An empty unary body is the empty message.
    let json: &[u8] = if json.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        json
    };
    serde_json::from_slice(json).map_err(|e| E2bError::invalid(format!("the request message: {e}")))
}

fn check_content_type(headers: &HeaderMap, shape: Shape) -> Result<(), E2bError> {
    let wanted = match shape {
        Shape::Unary => UNARY_JSON,
        Shape::ServerStream => STREAM_JSON,
    };
    let sent = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let media = sent.split(';').next().unwrap_or("").trim();
    if media.eq_ignore_ascii_case(wanted) {
        return Ok(());
    }
    Err(E2bError {
        status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
        code: Code::InvalidArgument,
        message: format!("content type {sent:?}: this method takes {wanted} (the JSON codec)"),
    })
}

/// The one message of a server stream's request: exactly one uncompressed envelope.
pub fn single_envelope(body: &[u8]) -> Result<&[u8], E2bError> {
    let bad = |why: &str| E2bError::invalid(format!("the request envelope: {why}"));
    if body.len() < PREFIX {
        return Err(bad("shorter than its 5-byte prefix"));
    }
    let flags = body[0];
    if flags & FLAG_COMPRESSED != 0 {
        return Err(bad("compressed, and no compression was offered"));
    }
    if flags != 0 {
        return Err(bad("flags other than a message's"));
    }
    let length = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    let rest = &body[PREFIX..];
    match rest.len().cmp(&length) {
        std::cmp::Ordering::Equal => Ok(rest),
        std::cmp::Ordering::Less => Err(bad(&format!(
            "declares {length} bytes, {} came",
            rest.len()
        ))),
        std::cmp::Ordering::Greater => Err(bad("more than one message; this method takes one")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn an_envelope_round_trips_and_ends_with_its_flag() {
        let frame = envelope(0, &serde_json::json!({"a": 1}));
        assert_eq!(single_envelope(&frame).unwrap(), br#"{"a":1}"#);
        let end = end_of_stream(Some(&E2bError::not_found("no pid 7")));
        assert_eq!(end[0], FLAG_END_STREAM);
        let json: serde_json::Value = serde_json::from_slice(&end[PREFIX..]).unwrap();
        assert_eq!(json["error"]["code"], "not_found");
        assert_eq!(&end_of_stream(None)[PREFIX..], b"{}");
    }

    #[test]
    fn bad_envelopes_are_invalid_arguments() {
        let good = envelope(0, &serde_json::json!({}));
        let mut compressed = good.to_vec();
        compressed[0] = FLAG_COMPRESSED;
        let mut end = good.to_vec();
        end[0] = FLAG_END_STREAM;
        let mut huge = good.to_vec();
        huge[1..5].copy_from_slice(&u32::MAX.to_be_bytes());
        let mut two = good.to_vec();
        two.extend_from_slice(&good);
        for bad in [
            &b""[..],
            b"\0\0\0",
            &compressed,
            &end,
            &huge,
            &two,
            &good[..6],
        ] {
            let e = single_envelope(bad).unwrap_err();
            assert_eq!(e.code, Code::InvalidArgument, "{bad:?}");
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
        }
    }

    #[test]
    fn statuses_and_codes_agree() {
        for code in [
            Code::InvalidArgument,
            Code::NotFound,
            Code::AlreadyExists,
            Code::PermissionDenied,
            Code::Unimplemented,
            Code::Unavailable,
            Code::Unauthenticated,
            Code::DeadlineExceeded,
            Code::ResourceExhausted,
        ] {
            assert_eq!(Code::of_status(code.http_status()), code, "{code:?}");
        }
    }

    proptest! {
        /// Whatever the bytes, decoding answers (a message or an error), and accepts only
        /// what its prefix says exactly.
        #[test]
        fn any_bytes_decode_or_fail_cleanly(body in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(message) = single_envelope(&body) {
                prop_assert_eq!(body[0], 0);
                let length = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
                prop_assert_eq!(message.len(), length);
                prop_assert_eq!(length + PREFIX, body.len());
            }
        }
    }
}
