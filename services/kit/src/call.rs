//! Typed request-reply to another service: encodes, carries trace context, checks the micro
//! error headers (an error reply is a *successful* NATS request) and decodes the typed body.

use std::time::Duration;

use async_nats::{Client, HeaderMap};
use messages::codec::{self, Encoding};
use messages::{ErrorBody, ErrorKind};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::telemetry;

#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("no service answers on {0}")]
    NoResponders(String),
    #[error("{subject} did not answer within {timeout:?}")]
    TimedOut { subject: String, timeout: Duration },
    #[error("{0}")]
    Service(ErrorBody),
    #[error("request to {subject} failed: {message}")]
    Transport { subject: String, message: String },
    #[error("reply from {subject} could not be decoded: {message}")]
    Decode { subject: String, message: String },
}

impl CallError {
    /// The error kind as a caller should report it onwards.
    pub fn kind(&self) -> ErrorKind {
        match self {
            CallError::NoResponders(_) => ErrorKind::Unavailable,
            CallError::TimedOut { .. } => ErrorKind::Timeout,
            CallError::Service(e) => e.kind,
            CallError::Transport { .. } | CallError::Decode { .. } => ErrorKind::Internal,
        }
    }

    pub fn into_body(self) -> ErrorBody {
        match self {
            CallError::Service(e) => e,
            other => ErrorBody::new(other.kind(), other.to_string()),
        }
    }
}

/// Sends typed requests in one encoding with one default timeout.
#[derive(Debug, Clone)]
pub struct Caller {
    client: Client,
    encoding: Encoding,
    timeout: Duration,
}

impl Caller {
    pub fn new(client: Client, timeout: Duration) -> Self {
        // Services talk msgpack to each other: smaller and faster than JSON.
        Self {
            client,
            encoding: Encoding::MsgPack,
            timeout,
        }
    }

    pub fn with_encoding(mut self, encoding: Encoding) -> Self {
        self.encoding = encoding;
        self
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    pub async fn call<Req: Serialize + ?Sized, Resp: DeserializeOwned>(
        &self,
        subject: String,
        request: &Req,
    ) -> Result<Resp, CallError> {
        self.call_timeout(subject, request, self.timeout).await
    }

    pub async fn call_timeout<Req: Serialize + ?Sized, Resp: DeserializeOwned>(
        &self,
        subject: String,
        request: &Req,
        timeout: Duration,
    ) -> Result<Resp, CallError> {
        let payload = self
            .encoding
            .encode(request)
            .map_err(|e| CallError::Transport {
                subject: subject.clone(),
                message: e.to_string(),
            })?;
        let mut headers = HeaderMap::new();
        headers.insert(codec::CONTENT_TYPE, self.encoding.content_type());
        telemetry::inject_current(&mut headers);
        let message = self
            .client
            .send_request(
                subject.clone(),
                async_nats::Request::new()
                    .payload(payload.into())
                    .headers(headers)
                    .timeout(Some(timeout)),
            )
            .await
            .map_err(|e| match e.kind() {
                async_nats::RequestErrorKind::NoResponders => {
                    CallError::NoResponders(subject.clone())
                }
                async_nats::RequestErrorKind::TimedOut => CallError::TimedOut {
                    subject: subject.clone(),
                    timeout,
                },
                _ => CallError::Transport {
                    subject: subject.clone(),
                    message: e.to_string(),
                },
            })?;
        decode_reply(&subject, message.headers.as_ref(), &message.payload)
    }
}

/// Decodes a reply, turning the micro error headers into `CallError::Service`.
pub fn decode_reply<Resp: DeserializeOwned>(
    subject: &str,
    headers: Option<&HeaderMap>,
    payload: &[u8],
) -> Result<Resp, CallError> {
    let get = |name| {
        headers
            .and_then(|h| h.get(name))
            .map(|v| v.as_str().to_string())
    };
    let encoding =
        Encoding::from_content_type(get(codec::CONTENT_TYPE).as_deref()).map_err(|e| {
            CallError::Decode {
                subject: subject.into(),
                message: e.to_string(),
            }
        })?;
    if let Some(code) = get(codec::SERVICE_ERROR_CODE) {
        let body = encoding.decode::<ErrorBody>(payload).unwrap_or_else(|_| {
            let code = code.parse().unwrap_or(500);
            ErrorBody::new(
                ErrorKind::from_code(code),
                get(codec::SERVICE_ERROR).unwrap_or_else(|| "service error".into()),
            )
        });
        return Err(CallError::Service(body));
    }
    encoding.decode(payload).map_err(|e| CallError::Decode {
        subject: subject.into(),
        message: e.to_string(),
    })
}
