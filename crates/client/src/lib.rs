//! `sandmesh-client`: typed clients for every sandmesh service, over one NATS connection.
//!
//! ```no_run
//! # async fn demo() -> Result<(), sandmesh_client::ClientError> {
//! # let nats = async_nats::connect("127.0.0.1:4222").await.unwrap();
//! use sandmesh_client::MeshClient;
//! let mesh = MeshClient::new(nats, messages::Subjects::default());
//! let mut req = messages::exec::ExecRequest::default();
//! req.code = "print(1)".into();
//! let result = mesh.exec().exec(&req).await?;
//! # Ok(()) }
//! ```
//!
//! One [`MeshClient`] holds the connection, the mesh's subjects, the encoding and the default
//! timeout; [`MeshClient::exec`], [`sessions`](MeshClient::sessions),
//! [`workspace`](MeshClient::workspace), [`confirm`](MeshClient::confirm),
//! [`risk`](MeshClient::risk), [`templates`](MeshClient::templates), [`audit`](MeshClient::audit) and
//! [`status`](MeshClient::status) hand out the typed clients; [`metrics`] reads a service's
//! Prometheus endpoint.
//! Every call checks the NATS micro error headers (an error reply is a *successful* request)
//! and fails with one [`ClientError`] whose [`kind`](ClientError::kind) callers branch on.
//!
//! The crate depends on `messages` and async-nats only, so services, the CLI, the loadtest and
//! programs outside this repository use the same code: services call each other through it
//! too (`kit::mesh_client` passes [`MeshClient::with_headers`] the trace-context injector, so
//! one trace spans the calls). The feature `internal` adds the clients of subjects only
//! services reach (the executor nodes').

pub mod aio;
pub mod audit;
pub mod browser;
pub mod confirm;
pub mod error;
pub mod exec;
#[cfg(feature = "internal")]
pub mod executor;
pub mod metrics;
pub mod objects;
pub mod ports;
pub mod proc;
pub mod risk;
pub mod sessions;
pub mod status;
pub mod templates;
pub mod tunnel;
pub mod upload;
pub mod workspace;

use std::time::Duration;

use async_nats::{jetstream, HeaderMap};
use futures::StreamExt;
use messages::codec::{self, Encoding};
use messages::exec::{
    AwaitingConfirmation, NOTIFY_HEADER, STATUS_AWAITING_CONFIRMATION, STATUS_HEADER,
};
use messages::{ErrorBody, Subjects};
use serde::de::DeserializeOwned;
use serde::Serialize;

pub use aio::AioClient;
pub use audit::AuditClient;
pub use browser::BrowserClient;
pub use confirm::ConfirmClient;
pub use error::{ClientError, ErrorKind, Result, StreamError};
pub use exec::ExecClient;
#[cfg(feature = "internal")]
pub use executor::ExecutorClient;
pub use ports::{PortsClient, Tunnel};
pub use proc::ProcClient;
pub use risk::RiskClient;
pub use sessions::SessionClient;
pub use status::StatusClient;
pub use templates::TemplateClient;
pub use upload::Staged;
pub use workspace::{Transfer, WorkspaceClient};

/// Requests that are answered at once (look-ups, decisions, small writes) get this long unless
/// the caller sets another default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Adds headers to every request and publish (W3C trace context, for instance).
pub type HeaderHook = fn(&mut HeaderMap);

/// The connection to one mesh: cheap to clone, shared by every typed client.
#[derive(Debug, Clone)]
pub struct MeshClient {
    nats: async_nats::Client,
    js: jetstream::Context,
    subjects: Subjects,
    encoding: Encoding,
    timeout: Duration,
    headers: Option<HeaderHook>,
}

impl MeshClient {
    /// MessagePack (smaller and faster than JSON) and [`DEFAULT_TIMEOUT`].
    pub fn new(nats: async_nats::Client, subjects: Subjects) -> Self {
        Self {
            js: jetstream::new(nats.clone()),
            nats,
            subjects,
            encoding: Encoding::MsgPack,
            timeout: DEFAULT_TIMEOUT,
            headers: None,
        }
    }

    /// JSON is what a person reads in `nats sub` while debugging.
    pub fn with_encoding(mut self, encoding: Encoding) -> Self {
        self.encoding = encoding;
        self
    }

    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// A JetStream context of the caller's own (tuned ack limits for bulk submits, say) for
    /// async jobs, the object store and the audit trail.
    pub fn with_jetstream(mut self, js: jetstream::Context) -> Self {
        self.js = js;
        self
    }

    pub fn with_headers(mut self, hook: HeaderHook) -> Self {
        self.headers = Some(hook);
        self
    }

    pub fn nats(&self) -> &async_nats::Client {
        &self.nats
    }

    pub fn jetstream(&self) -> &jetstream::Context {
        &self.js
    }

    pub fn subjects(&self) -> &Subjects {
        &self.subjects
    }

    pub fn encoding(&self) -> Encoding {
        self.encoding
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    pub fn exec(&self) -> ExecClient {
        ExecClient::new(self.clone())
    }

    pub fn sessions(&self) -> SessionClient {
        SessionClient::new(self.clone())
    }

    /// A session's background processes.
    pub fn procs(&self) -> ProcClient {
        ProcClient::new(self.clone())
    }

    pub fn workspace(&self) -> WorkspaceClient {
        WorkspaceClient::new(self.clone())
    }

    pub fn confirm(&self) -> ConfirmClient {
        ConfirmClient::new(self.clone())
    }

    pub fn risk(&self) -> RiskClient {
        RiskClient::new(self.clone())
    }

    pub fn templates(&self) -> TemplateClient {
        TemplateClient::new(self.clone())
    }

    pub fn browser(&self) -> BrowserClient {
        BrowserClient::new(self.clone())
    }

    pub fn aio(&self) -> AioClient {
        AioClient::new(self.clone())
    }

    /// The executor nodes' own subjects, which only services reach.
    #[cfg(feature = "internal")]
    pub fn executors(&self) -> ExecutorClient {
        ExecutorClient::new(self.clone())
    }

    pub fn ports(&self) -> PortsClient {
        PortsClient::new(self.clone())
    }

    pub fn audit(&self) -> AuditClient {
        AuditClient::new(self.clone())
    }

    pub fn status(&self) -> StatusClient {
        StatusClient::new(self.clone())
    }

    /// Headers every message carries: the content type and whatever the hook adds.
    pub(crate) fn headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(codec::CONTENT_TYPE, self.encoding.content_type());
        if let Some(hook) = self.headers {
            hook(&mut headers);
        }
        headers
    }

    pub(crate) fn encode<T: Serialize + ?Sized>(
        &self,
        subject: &str,
        value: &T,
    ) -> Result<Vec<u8>> {
        self.encoding
            .encode(value)
            .map_err(|e| ClientError::codec(format!("encoding a request for {subject}"), e))
    }

    /// Subscribes to `subject` and returns once the server holds the subscription (an echo on
    /// the same connection came back), so no message published afterwards is missed.
    pub async fn subscribe_live(&self, subject: String) -> Result<async_nats::Subscriber> {
        let failed = |e| ClientError::transport(format!("subscribing to {subject}"), e);
        let subscriber = self.nats.subscribe(subject.clone()).await.map_err(failed)?;
        let inbox = self.nats.new_inbox();
        let mut echo = self.nats.subscribe(inbox.clone()).await.map_err(failed)?;
        self.nats
            .publish(inbox.clone(), Default::default())
            .await
            .map_err(|e| ClientError::transport(format!("subscribing to {subject}"), e))?;
        match tokio::time::timeout(self.timeout, echo.next()).await {
            Ok(Some(_)) => Ok(subscriber),
            _ => Err(ClientError::TimedOut {
                subject: inbox,
                timeout: self.timeout,
            }),
        }
    }

    /// A typed request with the default timeout.
    pub async fn request<Req, Resp>(&self, subject: String, request: &Req) -> Result<Resp>
    where
        Req: Serialize + ?Sized,
        Resp: DeserializeOwned,
    {
        self.request_timeout(subject, request, self.timeout).await
    }

    /// A typed request: encoded, sent, its error headers checked, its reply decoded.
    pub async fn request_timeout<Req, Resp>(
        &self,
        subject: String,
        request: &Req,
        timeout: Duration,
    ) -> Result<Resp>
    where
        Req: Serialize + ?Sized,
        Resp: DeserializeOwned,
    {
        self.request_with_headers(subject, request, self.headers(), timeout)
            .await
    }

    /// A typed request whose reply may be preceded by awaiting-confirmation notices (`exec`,
    /// `aio.exec`, `browser.<action>`): `on_wait` hears of a person's pending decision at once
    /// (confirmation id and expiry) while the call goes on waiting for the reply. The services
    /// send notices only to callers that ask in the `Sandmesh-Notify` header, so plain
    /// request-reply clients see one reply.
    pub async fn request_notified<Req, Resp>(
        &self,
        subject: String,
        request: &Req,
        timeout: Duration,
        mut on_wait: impl FnMut(AwaitingConfirmation) + Send + 'static,
    ) -> Result<Resp>
    where
        Req: Serialize + ?Sized,
        Resp: DeserializeOwned,
    {
        // Notices and the reply arrive on one inbox: notices carry a status header.
        let inbox = self.nats.new_inbox();
        let mut replies = self
            .nats
            .subscribe(inbox.clone())
            .await
            .map_err(|e| ClientError::transport(format!("subscribing to {inbox}"), e))?;
        let mut headers = self.headers();
        headers.insert(NOTIFY_HEADER, "1");
        let payload = self.encode(&subject, request)?;
        self.nats
            .publish_with_reply_and_headers(subject.clone(), inbox, headers, payload.into())
            .await
            .map_err(|e| ClientError::transport(format!("request to {subject}"), e))?;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let message = match tokio::time::timeout_at(deadline, replies.next()).await {
                Ok(Some(message)) => message,
                Ok(None) => {
                    return Err(ClientError::transport(
                        format!("request to {subject}"),
                        std::io::Error::other("the connection closed"),
                    ))
                }
                Err(_) => return Err(ClientError::TimedOut { subject, timeout }),
            };
            let status = message.headers.as_ref().and_then(|h| h.get(STATUS_HEADER));
            if status.map(|v| v.as_str()) == Some(STATUS_AWAITING_CONFIRMATION) {
                if let Ok(notice) = serde_json::from_slice(&message.payload) {
                    on_wait(notice);
                }
                continue;
            }
            if message.status == Some(async_nats::StatusCode::NO_RESPONDERS) {
                return Err(ClientError::NoResponders { subject });
            }
            return decode_reply(&subject, message.headers.as_ref(), &message.payload);
        }
    }

    /// [`Self::request_timeout`] with headers of the caller's (built from [`Self::headers`]).
    pub(crate) async fn request_with_headers<Req, Resp>(
        &self,
        subject: String,
        request: &Req,
        headers: HeaderMap,
        timeout: Duration,
    ) -> Result<Resp>
    where
        Req: Serialize + ?Sized,
        Resp: DeserializeOwned,
    {
        let payload = self.encode(&subject, request)?;
        let message = self
            .nats
            .send_request(
                subject.clone(),
                async_nats::Request::new()
                    .payload(payload.into())
                    .headers(headers)
                    .timeout(Some(timeout)),
            )
            .await
            .map_err(|e| match e.kind() {
                async_nats::RequestErrorKind::NoResponders => ClientError::NoResponders {
                    subject: subject.clone(),
                },
                async_nats::RequestErrorKind::TimedOut => ClientError::TimedOut {
                    subject: subject.clone(),
                    timeout,
                },
                _ => ClientError::transport(format!("request to {subject}"), e),
            })?;
        decode_reply(&subject, message.headers.as_ref(), &message.payload)
    }
}

/// Decodes a reply (or a stored message) by its `Content-Type`, turning the micro error
/// headers into [`ClientError::Service`].
pub fn decode_reply<Resp: DeserializeOwned>(
    subject: &str,
    headers: Option<&HeaderMap>,
    payload: &[u8],
) -> Result<Resp> {
    let header = |name| headers.and_then(|h| h.get(name)).map(|v| v.as_str());
    let encoding = Encoding::from_content_type(header(codec::CONTENT_TYPE))
        .map_err(|e| ClientError::codec(format!("reply from {subject}"), e))?;
    if let Some(code) = header(codec::SERVICE_ERROR_CODE) {
        // A body that does not decode still has its code and text in the headers.
        let body = encoding.decode::<ErrorBody>(payload).unwrap_or_else(|_| {
            ErrorBody::new(
                ErrorKind::from_code(code.parse().unwrap_or(500)),
                header(codec::SERVICE_ERROR).unwrap_or("service error"),
            )
        });
        return Err(ClientError::Service {
            subject: subject.to_string(),
            body,
        });
    }
    encoding
        .decode(payload)
        .map_err(|e| ClientError::codec(format!("reply from {subject}"), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_headers_win_over_the_body() {
        let mut h = HeaderMap::new();
        h.insert(codec::SERVICE_ERROR_CODE, "429");
        h.insert(codec::SERVICE_ERROR, "busy");
        let e = decode_reply::<serde_json::Value>("s", Some(&h), b"").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Overloaded);
        assert_eq!(e.service_error().unwrap().message, "busy");
    }

    #[test]
    fn replies_decode_in_either_encoding() {
        let value = serde_json::json!({"a": 1});
        let json = Encoding::Json.encode(&value).unwrap();
        assert_eq!(
            decode_reply::<serde_json::Value>("s", None, &json).unwrap(),
            value
        );
        let mut h = HeaderMap::new();
        h.insert(codec::CONTENT_TYPE, codec::MSGPACK);
        let mp = Encoding::MsgPack.encode(&value).unwrap();
        assert_eq!(
            decode_reply::<serde_json::Value>("s", Some(&h), &mp).unwrap(),
            value
        );
        let bad = decode_reply::<serde_json::Value>("s", None, b"{no").unwrap_err();
        assert_eq!(bad.kind(), ErrorKind::Internal);
    }
}
