//! The agent's HTTP answers: a JSON value, the envelope of an error, and the status a failed
//! file operation answers with. Every handler answers through these, so they sit below the
//! handlers and the router that calls them.

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Response, StatusCode};
use serde::Serialize;

use crate::api::Envelope;
use crate::files::FileError;

pub(crate) type Reply = Response<Full<Bytes>>;

pub(crate) fn json<T: Serialize>(status: StatusCode, value: &T) -> Reply {
    let body = serde_json::to_vec(value).unwrap_or_else(|e| {
        format!(r#"{{"success":false,"message":"encoding the answer: {e}"}}"#).into_bytes()
    });
    let mut res = Response::new(Full::new(Bytes::from(body)));
    *res.status_mut() = status;
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    res
}

pub(crate) fn error(status: StatusCode, message: String) -> Reply {
    json(status, &Envelope::error(message))
}

/// The status of a failed file operation outside the file API's own calls (which answer
/// upstream's 200 with `success: false`): a path out of the workspace is forbidden.
pub(crate) fn file_status(e: &FileError) -> StatusCode {
    match e {
        FileError::Outside { .. } | FileError::Symlink(_) | FileError::Parent(_) => {
            StatusCode::FORBIDDEN
        }
        FileError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        FileError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            StatusCode::NOT_FOUND
        }
        FileError::Io { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::UNPROCESSABLE_ENTITY,
    }
}
