//! The edge of every service: endpoints served through async-nats' `service` API (so
//! `$SRV.PING|INFO|STATS` discovery works), each request decoded by `Content-Type`, handed to a
//! handler (usually a ractor actor), and answered in the caller's encoding.
//!
//! The read loop per endpoint stays thin — size check, decode, admission — and runs each
//! request in its own task, so a slow handler never makes NATS drop messages. Admission is
//! bounded: past `max_in_flight` a caller gets a 429 at once instead of waiting.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_nats::service::{Service, ServiceExt};
use async_nats::{Client, HeaderMap};
use bytes::Bytes;
use futures::StreamExt;
use messages::codec::{self, Encoding};
use messages::tenancy::{self, Caller};
use messages::ErrorBody;
use ractor::{ActorRef, RpcReplyPort};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::{shutdown, telemetry, KitError};

/// What a handler knows about the request besides its payload.
#[derive(Debug, Clone)]
pub struct RequestContext {
    /// The subject the request was sent to (for a wildcard endpoint, the concrete one).
    pub subject: String,
    pub encoding: Encoding,
    pub headers: Option<HeaderMap>,
    /// The W3C trace id of the request's span.
    pub trace_id: Option<String>,
    /// Who sent it, from the server-stamped `Nats-Request-Info` header only.
    pub caller: Caller,
    /// Where replies go. A handler may send status notices there before its reply (the
    /// endpoint must be exported with `response_type: stream` for tenants to get them).
    pub reply: Option<String>,
}

pub type HandlerFuture<Resp> = Pin<Box<dyn Future<Output = Result<Resp, ErrorBody>> + Send>>;
/// A request handler: typed request in, typed reply or error out.
pub type Handler<Req, Resp> = Arc<dyn Fn(RequestContext, Req) -> HandlerFuture<Resp> + Send + Sync>;

/// A handler over the wire's bytes: the request's payload in (the context says its encoding),
/// the reply encoded in `ctx.encoding` out.
type BytesHandler = Arc<dyn Fn(RequestContext, Bytes) -> HandlerFuture<Vec<u8>> + Send + Sync>;

/// The typed handler behind a bytes one: decodes the request by its `Content-Type`, encodes
/// the reply in the encoding the caller asked for.
fn typed<Req, Resp>(handler: Handler<Req, Resp>) -> BytesHandler
where
    Req: DeserializeOwned + Send + 'static,
    Resp: Serialize + Send + 'static,
{
    Arc::new(move |ctx, payload| {
        let handler = handler.clone();
        Box::pin(async move {
            let encoding = ctx.encoding;
            let request = decode_request::<Req>(ctx.headers.as_ref(), &payload)?;
            let reply = handler(ctx, request).await?;
            Ok(encoding.encode(&reply)?)
        })
    })
}

/// Wraps an async function as a handler.
pub fn handler<Req, Resp, F, Fut>(f: F) -> Handler<Req, Resp>
where
    F: Fn(RequestContext, Req) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Resp, ErrorBody>> + Send + 'static,
{
    Arc::new(move |ctx, req| Box::pin(f(ctx, req)))
}

/// A handler that casts each request to an actor and awaits its reply port. The actor answers
/// when it likes (it may spawn the work and reply from the task), so it never stalls. Its error
/// is the service's own (a `thiserror` enum keeping its causes); the wire's [`ErrorBody`] is
/// made from it here, at the edge, once.
pub fn actor_handler<M, Req, Resp, E>(
    actor: ActorRef<M>,
    make: fn(RequestContext, Req, RpcReplyPort<Result<Resp, E>>) -> M,
) -> Handler<Req, Resp>
where
    M: ractor::Message,
    Req: Send + 'static,
    Resp: Send + 'static,
    E: Into<ErrorBody> + Send + 'static,
{
    handler(move |ctx, req| {
        let actor = actor.clone();
        async move {
            match actor.call(|port| make(ctx, req, port), None).await {
                Ok(ractor::rpc::CallResult::Success(reply)) => reply.map_err(Into::into),
                Ok(_) => Err(ErrorBody::unavailable(
                    "the handling actor stopped before replying",
                )),
                Err(e) => Err(ErrorBody::unavailable(format!(
                    "the handling actor is gone: {e}"
                ))),
            }
        }
    })
}

/// Per-endpoint settings.
#[derive(Debug, Clone, Copy)]
pub struct EndpointOptions {
    /// Largest accepted request payload; larger ones get 413 before decoding.
    pub max_payload: usize,
    /// Requests handled at once; more get 429.
    pub max_in_flight: usize,
}

impl Default for EndpointOptions {
    fn default() -> Self {
        Self {
            max_payload: 1024 * 1024,
            max_in_flight: 256,
        }
    }
}

/// Name, version and description announced on `$SRV.INFO`.
#[derive(Debug, Clone)]
pub struct ServiceInfo {
    /// `[A-Za-z0-9_-]+`, e.g. `risk-assessor`.
    pub name: String,
    /// Semver.
    pub version: String,
    pub description: String,
}

/// One running micro service with its endpoints.
pub struct ServiceHost {
    client: Client,
    service: Service,
    stop: CancellationToken,
    loops: TaskTracker,
    in_flight: TaskTracker,
}

impl ServiceHost {
    pub async fn start(
        client: &Client,
        info: &ServiceInfo,
        instance_id: &str,
    ) -> Result<Self, KitError> {
        let service = client
            .service_builder()
            .description(&info.description)
            .metadata([("instance_id".to_string(), instance_id.to_string())].into())
            .start(&info.name, &info.version)
            .await
            .map_err(|e| KitError::nats(format!("starting service {}", info.name), e))?;
        Ok(Self {
            client: client.clone(),
            service,
            stop: CancellationToken::new(),
            loops: TaskTracker::new(),
            in_flight: TaskTracker::new(),
        })
    }

    /// Serves `subject` (in the queue group shared by all instances of this service).
    pub async fn serve<Req, Resp>(
        &self,
        subject: String,
        options: EndpointOptions,
        handler: Handler<Req, Resp>,
    ) -> Result<(), KitError>
    where
        Req: DeserializeOwned + Send + 'static,
        Resp: Serialize + Send + 'static,
    {
        self.serve_bytes(subject, options, typed(handler)).await
    }

    /// The endpoint's read loop, the same code for every request and reply type: only
    /// [`typed`]'s decode/encode closure is made per type, which keeps each service's binary
    /// (and its compile time) from holding one copy of this loop per endpoint.
    async fn serve_bytes(
        &self,
        subject: String,
        options: EndpointOptions,
        handler: BytesHandler,
    ) -> Result<(), KitError> {
        let mut endpoint = self
            .service
            .endpoint_builder()
            .name(subject.replace(['.', '*', '>'], "-"))
            .add(subject.clone())
            .await
            .map_err(|e| KitError::nats(format!("serving {subject}"), e))?;
        let stop = self.stop.clone();
        let in_flight = self.in_flight.clone();
        let admission = Arc::new(Semaphore::new(options.max_in_flight));
        let client = self.client.clone();
        let max_reply = client.server_info().max_payload;
        self.loops.spawn(async move {
            loop {
                let request = tokio::select! {
                    _ = stop.cancelled() => break,
                    r = endpoint.next() => match r { Some(r) => r, None => break },
                };
                let Ok(permit) = admission.clone().try_acquire_owned() else {
                    let error = ErrorBody::overloaded(format!(
                        "{} requests already in flight; retry later",
                        options.max_in_flight
                    ));
                    let encoding = reply_encoding(request.message.headers.as_ref());
                    tokio::spawn(respond(
                        request,
                        Err(error),
                        encoding.unwrap_or_default(),
                        max_reply,
                    ));
                    continue;
                };
                let handler = handler.clone();
                let subject = subject.clone();
                in_flight.spawn(async move {
                    let _permit = permit;
                    handle_one(subject, request, options, max_reply, handler).await;
                });
            }
            // Unsubscribe so that new requests find no responder (or another instance).
            shutdown::bounded(&client, "unsubscribe", endpoint.stop()).await;
            shutdown::bounded(&client, "flush", client.flush()).await;
        });
        // Once `serve` returns the subscription is live on the server, so a caller that
        // starts right after never sees "no responders".
        crate::connect::sync_with_server(&self.client).await
    }

    /// Stops taking requests, lets in-flight ones finish for at most `grace`, then stops the
    /// service. Returns whether everything finished in time.
    pub async fn shutdown(self, grace: Duration) -> bool {
        self.stop.cancel();
        self.loops.close();
        self.loops.wait().await;
        self.in_flight.close();
        let finished = tokio::time::timeout(grace, self.in_flight.wait())
            .await
            .is_ok();
        if !finished {
            tracing::warn!(
                ?grace,
                "in-flight requests did not finish within the grace period"
            );
        }
        let client = &self.client;
        shutdown::bounded(client, "stop the service", self.service.stop()).await;
        shutdown::bounded(client, "flush", client.flush()).await;
        finished
    }

    pub fn client(&self) -> &Client {
        &self.client
    }
}

/// The encoding to answer in: `Accept` when given, else the request's `Content-Type`.
fn reply_encoding(headers: Option<&HeaderMap>) -> Result<Encoding, messages::CodecError> {
    let get = |name| headers.and_then(|h| h.get(name)).map(|v| v.as_str());
    if let Some(accept) = get(codec::ACCEPT) {
        if let Ok(e) = Encoding::from_content_type(Some(accept)) {
            return Ok(e);
        }
    }
    Encoding::from_content_type(get(codec::CONTENT_TYPE))
}

async fn handle_one(
    subject: String,
    request: async_nats::service::Request,
    options: EndpointOptions,
    max_reply: usize,
    handler: BytesHandler,
) {
    let headers = request.message.headers.clone();
    let span = tracing::info_span!("request", subject = %subject, otel.kind = "server");
    telemetry::set_parent_from(&span, headers.as_ref());
    async move {
        let (encoding, outcome) = match reply_encoding(headers.as_ref()) {
            // An unknown content type is answered in JSON, the default.
            Err(e) => (Encoding::Json, Err(ErrorBody::from(e))),
            Ok(encoding) => {
                let payload = &request.message.payload;
                let outcome = if payload.len() > options.max_payload {
                    Err(ErrorBody::too_large(format!(
                        "request is {} bytes; this endpoint accepts at most {}",
                        payload.len(),
                        options.max_payload
                    )))
                } else {
                    match caller_of(headers.as_ref()) {
                        Err(e) => Err(e),
                        Ok(caller) => {
                            let ctx = RequestContext {
                                subject: request.message.subject.to_string(),
                                encoding,
                                headers: headers.clone(),
                                trace_id: telemetry::current_trace_id(),
                                caller,
                                reply: request.message.reply.as_ref().map(|r| r.to_string()),
                            };
                            handler(ctx, payload.clone()).await
                        }
                    }
                };
                (encoding, outcome)
            }
        };
        if let Err(e) = &outcome {
            tracing::debug!(code = e.code, message = %e.message, "request failed");
        }
        respond(request, outcome, encoding, max_reply).await;
    }
    .instrument(span)
    .await
}

/// The caller as the server stamped it. A header the caller wrote itself never gets here:
/// the server replaces `Nats-Request-Info` on every request through a `share: true` import,
/// and inside the services' account nobody but a service can publish.
pub fn caller_of(headers: Option<&HeaderMap>) -> Result<Caller, ErrorBody> {
    let info = headers
        .and_then(|h| h.get(tenancy::REQUEST_INFO_HEADER))
        .map(|v| v.as_str());
    Caller::from_header(info)
}

fn decode_request<Req: DeserializeOwned>(
    headers: Option<&HeaderMap>,
    payload: &[u8],
) -> Result<Req, ErrorBody> {
    let content_type = headers
        .and_then(|h| h.get(codec::CONTENT_TYPE))
        .map(|v| v.as_str());
    let encoding = Encoding::from_content_type(content_type)?;
    if payload.is_empty() {
        return Err(ErrorBody::bad_request("empty request payload"));
    }
    Ok(encoding.decode(payload)?)
}

/// Bytes kept free for headers (content type, error headers, trace context) in a reply.
const REPLY_HEADER_ROOM: usize = 4096;

/// Sends a reply or an error reply. Errors carry the NATS micro headers *and* a typed body.
/// A reply larger than the server's max payload (`max_reply`, 0 when unknown) would never
/// arrive and leave the caller waiting out its timeout: it becomes a 500 error instead.
async fn respond(
    request: async_nats::service::Request,
    outcome: Result<Vec<u8>, ErrorBody>,
    encoding: Encoding,
    max_reply: usize,
) {
    let mut headers = HeaderMap::new();
    headers.insert(codec::CONTENT_TYPE, encoding.content_type());
    let body = outcome.and_then(|bytes| {
        // Headers travel in the same message; keep room for them.
        let limit = max_reply.saturating_sub(REPLY_HEADER_ROOM);
        if max_reply > 0 && bytes.len() > limit {
            Err(ErrorBody::internal(format!(
                "the reply is {} bytes, over the {limit} a NATS message can carry here",
                bytes.len()
            )))
        } else {
            Ok(bytes)
        }
    });
    let body = match body {
        Ok(bytes) => bytes,
        Err(error) => {
            headers.insert(
                codec::SERVICE_ERROR,
                error.message.replace(['\r', '\n'], " ").as_str(),
            );
            headers.insert(codec::SERVICE_ERROR_CODE, error.code.to_string().as_str());
            encoding.encode(&error).unwrap_or_default()
        }
    };
    if let Err(e) = request
        .respond_with_headers(Ok(Bytes::from(body)), headers)
        .await
    {
        tracing::warn!(error = %e, "could not send reply");
    }
}
