//! One CDP WebSocket: commands one at a time, each bounded in time, and the events that
//! arrive in between (dropped, or kept up to a cap).

use std::collections::VecDeque;
use std::time::Duration;

use crate::{CdpError, Stream};
use async_tungstenite::tokio::{client_async_with_config, TokioAdapter};
use async_tungstenite::tungstenite::protocol::WebSocketConfig;
use async_tungstenite::tungstenite::Message;
use async_tungstenite::WebSocketStream;
use futures_util::StreamExt;
use serde_json::{json, Value};

/// Events a connection holds while it waits for a command's answer; more are dropped (oldest
/// first), so a page flooding events cannot grow the reader.
pub const MAX_PENDING_EVENTS: usize = 1024;

/// The largest message read: a full-page screenshot arrives as one base64 message, larger
/// than tungstenite's default frame bound.
const MAX_MESSAGE_BYTES: usize = 128 << 20;

/// One CDP WebSocket (a browser's or a page's).
pub struct Connection {
    socket: WebSocketStream<TokioAdapter<Stream>>,
    next_id: u64,
    limit: Duration,
    /// Events that arrived while a command waited, for [`Connection::next_event`]; only kept
    /// once someone reads events.
    events: VecDeque<Value>,
    keep_events: bool,
    /// The socket failed or closed: every later call fails at once.
    closed: bool,
}

impl Connection {
    /// Connects to `url` (`ws://host:port/devtools/...`); `limit` bounds the connect and
    /// each command.
    pub async fn open(url: &str, limit: Duration) -> Result<Self, CdpError> {
        let addr = url
            .strip_prefix("ws://")
            .and_then(|rest| rest.split('/').next())
            .filter(|a| !a.is_empty())
            .ok_or_else(|| CdpError::Url(url.to_string()))?;
        Self::open_at(addr, url, limit).await
    }

    /// Connects to `url` through `addr` (`host:port` or `unix:<path>`).
    async fn open_at(addr: &str, url: &str, limit: Duration) -> Result<Self, CdpError> {
        let failed = |source| CdpError::Connect {
            url: url.to_string(),
            source,
        };
        let config = WebSocketConfig::default()
            .max_message_size(Some(MAX_MESSAGE_BYTES))
            .max_frame_size(Some(MAX_MESSAGE_BYTES));
        let connect = async {
            let stream = crate::dial(addr).await.map_err(|e| failed(e.into()))?;
            let (socket, _) = client_async_with_config(url, stream, Some(config))
                .await
                .map_err(failed)?;
            Ok(socket)
        };
        let socket =
            tokio::time::timeout(limit, connect)
                .await
                .map_err(|_| CdpError::Timeout {
                    method: format!("connecting to {url}"),
                    limit,
                })??;
        Ok(Self {
            socket,
            next_id: 0,
            limit,
            events: VecDeque::new(),
            keep_events: false,
            closed: false,
        })
    }

    /// The browser's own connection, found through `endpoint`'s `/json/version`
    /// (`http://host:port`, or `unix:<path>` for a Unix socket). Chromium names itself
    /// `127.0.0.1` in `webSocketDebuggerUrl` even when reached from elsewhere (a relay), so
    /// the socket goes to the endpoint that answered, with the path Chromium gave.
    pub async fn browser(endpoint: &str, limit: Duration) -> Result<Self, CdpError> {
        let addr = if endpoint.starts_with(crate::UNIX_PREFIX) {
            endpoint
        } else {
            endpoint
                .strip_prefix("http://")
                .map(|rest| rest.trim_end_matches('/'))
                .ok_or_else(|| CdpError::Url(endpoint.to_string()))?
        };
        let version = crate::get_json(addr, "/json/version", limit).await?;
        let ws = version["webSocketDebuggerUrl"]
            .as_str()
            .ok_or_else(|| CdpError::Missing {
                method: "/json/version".into(),
                field: "webSocketDebuggerUrl",
            })?;
        let path = ws
            .strip_prefix("ws://")
            .and_then(|rest| rest.find('/').map(|at| &rest[at..]))
            .ok_or_else(|| CdpError::Url(ws.to_string()))?;
        let host = crate::stream::host_of(addr);
        Self::open_at(addr, &format!("ws://{host}{path}"), limit).await
    }

    /// Whether the socket failed or closed (a later call fails at once).
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Keeps the events that arrive while a command waits, for
    /// [`Connection::next_event`] (set it before enabling a domain: the enable's own replay
    /// comes before its answer).
    pub fn keep_events(&mut self) {
        self.keep_events = true;
    }

    /// The events kept while commands waited, oldest first.
    pub fn drain_events(&mut self) -> impl Iterator<Item = Value> + '_ {
        self.events.drain(..)
    }

    /// The next event (`{method, params}`), waiting as long as it takes: callers bound it
    /// with their own `select!` (reading the socket is cancel-safe).
    pub async fn next_event(&mut self) -> Result<Value, CdpError> {
        if let Some(event) = self.events.pop_front() {
            return Ok(event);
        }
        loop {
            let message = self.receive().await?;
            if message.get("method").is_some() {
                return Ok(message);
            }
        }
    }

    /// The next JSON message from the socket (non-JSON and non-text frames skipped).
    async fn receive(&mut self) -> Result<Value, CdpError> {
        if self.closed {
            return Err(CdpError::Closed);
        }
        loop {
            match self.socket.next().await {
                Some(Ok(Message::Text(text))) => {
                    if let Ok(message) = serde_json::from_str::<Value>(&text) {
                        return Ok(message);
                    }
                }
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => {
                    self.closed = true;
                    return Err(CdpError::Closed);
                }
                Some(Ok(_)) => {}
            }
        }
    }

    /// Sends one command to the browser (or the page this socket is) and waits for its
    /// answer.
    pub async fn call(&mut self, method: &str, params: Value) -> Result<Value, CdpError> {
        self.call_in(None, method, params).await
    }

    /// Sends one command, in the attached session `session` if given, and waits for its
    /// answer (events in between are dropped, or kept for [`Connection::next_event`]). An
    /// answer that comes after the bound is skipped by the next call (ids never repeat).
    pub async fn call_in(
        &mut self,
        session: Option<&str>,
        method: &str,
        params: Value,
    ) -> Result<Value, CdpError> {
        if self.closed {
            return Err(CdpError::Closed);
        }
        self.next_id += 1;
        let id = self.next_id;
        let mut request = json!({ "id": id, "method": method, "params": params });
        if let Some(session) = session {
            request["sessionId"] = json!(session);
        }
        let limit = self.limit;
        let exchange = async {
            if self
                .socket
                .send(Message::Text(request.to_string().into()))
                .await
                .is_err()
            {
                self.closed = true;
                return Err(CdpError::Closed);
            }
            loop {
                let message = self.receive().await?;
                if message["id"] != id {
                    if self.keep_events && message.get("method").is_some() {
                        if self.events.len() == MAX_PENDING_EVENTS {
                            self.events.pop_front();
                        }
                        self.events.push_back(message);
                    }
                    continue;
                }
                if let Some(error) = message.get("error") {
                    return Err(CdpError::Protocol {
                        method: method.to_string(),
                        message: error["message"].as_str().unwrap_or("error").to_string(),
                    });
                }
                return Ok(message["result"].clone());
            }
        };
        tokio::time::timeout(limit, exchange)
            .await
            .map_err(|_| CdpError::Timeout {
                method: method.to_string(),
                limit,
            })?
    }
}
