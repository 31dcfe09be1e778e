//! A CDP connection to the instance's current page, for `/v1/browser/page/*` and
//! `/v1/browser/screenshot`: Chromium's page target over its WebSocket on 127.0.0.1, one
//! connection per call (a client's own CDP connections through the relay are untouched), each
//! command bounded in time. The console listener and the recorder keep a connection of their
//! own open ([`Page::attach`]) and read its events ([`Page::next_event`]).

use std::collections::VecDeque;
use std::time::Duration;

use async_tungstenite::tokio::{client_async, TokioAdapter};
use async_tungstenite::tungstenite::Message;
use async_tungstenite::WebSocketStream;
use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio::net::TcpStream;

use crate::browser::{local_request, BrowserError};

#[derive(Debug, thiserror::Error)]
pub enum CdpError {
    #[error(transparent)]
    Browser(#[from] BrowserError),
    #[error("chromium lists no page and opened none")]
    NoPage,
    #[error("connecting to the page's CDP socket")]
    Connect(#[source] async_tungstenite::tungstenite::Error),
    #[error("the page's CDP socket closed")]
    Closed,
    #[error("{method} did not answer within {limit:?}")]
    Timeout { method: String, limit: Duration },
    #[error("{method}: {message}")]
    Protocol { method: String, message: String },
    #[error("the page's script threw: {0}")]
    Script(String),
}

/// Events a long-lived connection holds while it waits for a command's answer; more are
/// dropped (oldest first), so a page flooding events cannot grow the agent.
const MAX_PENDING_EVENTS: usize = 1024;

/// One page target, driven over CDP.
pub struct Page {
    socket: WebSocketStream<TokioAdapter<TcpStream>>,
    target: String,
    next_id: u64,
    limit: Duration,
    /// Events that arrived while a command waited, for [`Page::next_event`]; only kept once
    /// someone reads events (per-call connections drop them).
    events: VecDeque<Value>,
    keep_events: bool,
}

impl Page {
    /// The first page Chromium lists (a new blank one when it has none). `limit` bounds each
    /// command.
    pub async fn connect(port: u16, limit: Duration) -> Result<Self, CdpError> {
        let list = local_request(port, "GET", "/json/list").await?;
        let targets: Vec<Value> = serde_json::from_slice(&list).map_err(BrowserError::Json)?;
        let page = match targets.into_iter().find(|t| t["type"] == "page") {
            Some(page) => page,
            None => {
                let made = local_request(port, "PUT", "/json/new?about:blank").await?;
                serde_json::from_slice(&made).map_err(BrowserError::Json)?
            }
        };
        let target = page["id"].as_str().ok_or(CdpError::NoPage)?;
        Self::attach(port, target, limit).await
    }

    /// The page target `target` (an id from `/json/list`).
    pub async fn attach(port: u16, target: &str, limit: Duration) -> Result<Self, CdpError> {
        let url = format!("ws://127.0.0.1:{port}/devtools/page/{target}");
        let stream = TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| CdpError::Connect(e.into()))?;
        let (socket, _) = client_async(url, stream).await.map_err(CdpError::Connect)?;
        Ok(Self {
            socket,
            target: target.to_string(),
            next_id: 0,
            limit,
            events: VecDeque::new(),
            keep_events: false,
        })
    }

    /// The target id this connection drives.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// Keeps the events that arrive while a command waits, for [`Page::next_event`] (set it
    /// before enabling a domain: the enable's own replay comes before its answer).
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
        loop {
            match self.socket.next().await {
                Some(Ok(Message::Text(text))) => {
                    if let Ok(message) = serde_json::from_str::<Value>(&text) {
                        return Ok(message);
                    }
                }
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return Err(CdpError::Closed),
                Some(Ok(_)) => {}
            }
        }
    }

    /// Sends one command and waits for its answer (events in between are dropped, or kept
    /// for [`Page::next_event`]).
    pub async fn call(&mut self, method: &str, params: Value) -> Result<Value, CdpError> {
        self.next_id += 1;
        let id = self.next_id;
        let request = json!({ "id": id, "method": method, "params": params }).to_string();
        let limit = self.limit;
        let exchange = async {
            self.socket
                .send(Message::Text(request.into()))
                .await
                .map_err(|_| CdpError::Closed)?;
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

    /// Evaluates `expression` in the page (promises awaited) and returns its value.
    pub async fn evaluate(&mut self, expression: &str) -> Result<Value, CdpError> {
        let result = self
            .call(
                "Runtime.evaluate",
                json!({
                    "expression": expression,
                    "returnByValue": true,
                    "awaitPromise": true,
                    "userGesture": true,
                }),
            )
            .await?;
        if let Some(details) = result.get("exceptionDetails") {
            let text = details["exception"]["description"]
                .as_str()
                .or_else(|| details["text"].as_str())
                .unwrap_or("exception")
                .to_string();
            return Err(CdpError::Script(text));
        }
        Ok(result["result"]["value"].clone())
    }
}
