//! A client for the documented AIO sandbox HTTP API (`reference/aio-sandbox-openapi.json`):
//! only the calls the pool makes, over the instance's control socket (instances have no
//! network; the agent serves the API there, see `crate::docker`). One HTTP/1 connection per call: the socket is local, and a fresh connection
//! cannot be poisoned by an earlier cancelled call.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{HeaderName, HeaderValue, CONTENT_TYPE, HOST};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use std::path::PathBuf;

use tokio::net::UnixStream;

/// How the instance's key is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyHeader {
    /// `Authorization: Bearer <key>`.
    Bearer,
    /// `<name>: <key>` (upstream's `X-AIO-API-Key`).
    Named(HeaderName),
}

impl KeyHeader {
    pub fn parse(s: &str) -> Option<Self> {
        if s.eq_ignore_ascii_case("authorization") || s.eq_ignore_ascii_case("bearer") {
            return Some(KeyHeader::Bearer);
        }
        HeaderName::try_from(s).ok().map(KeyHeader::Named)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AioError {
    #[error("connecting to {addr}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("HTTP to {addr}")]
    Http {
        addr: String,
        #[source]
        source: hyper::Error,
    },
    #[error("{addr} did not answer within {0:?}", .limit)]
    Timeout { addr: String, limit: Duration },
    #[error("{addr} answered {status}: {message}")]
    Status {
        addr: String,
        status: StatusCode,
        message: String,
    },
    #[error("{addr}: the answer is larger than {limit} bytes")]
    TooLarge { addr: String, limit: usize },
    #[error("{addr}: unexpected answer")]
    Decode {
        addr: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{addr}: the call failed: {message}")]
    Failed { addr: String, message: String },
}

/// One instance's API.
#[derive(Debug, Clone)]
pub struct AioClient {
    /// The control socket's path on the host (also what errors name).
    pub socket: PathBuf,
    addr: String,
    /// The `Host` the calls carry: the agent's address inside the instance, so the URLs it
    /// writes from it (the CDP URL) are right for code in the instance.
    host: String,
    key: String,
    key_header: KeyHeader,
    /// Largest answer read (output caps keep real answers far below it).
    max_answer: usize,
}

/// `Response[T]`.
#[derive(Debug, Deserialize)]
struct Envelope<T> {
    #[serde(default = "yes")]
    success: bool,
    #[serde(default)]
    message: Option<String>,
    data: Option<T>,
}

fn yes() -> bool {
    true
}

/// `BashExecResult` (the fields the pool reads).
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct BashExecResult {
    pub status: String,
    #[serde(default)]
    pub stdout: Option<String>,
    #[serde(default)]
    pub stderr: Option<String>,
    #[serde(default)]
    pub exit_code: Option<i32>,
}

/// `BrowserInfoResult` (the fields the pool reads).
#[derive(Debug, Clone, Deserialize)]
pub struct BrowserInfo {
    pub cdp_url: String,
}

impl AioClient {
    pub fn new(
        socket: PathBuf,
        port: u16,
        key: String,
        key_header: KeyHeader,
        max_answer: usize,
    ) -> Self {
        Self {
            addr: socket.display().to_string(),
            socket,
            host: format!("127.0.0.1:{port}"),
            key,
            key_header,
            max_answer,
        }
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
        limit: Duration,
    ) -> Result<Bytes, AioError> {
        let addr = self.addr.clone();
        let exchange = async {
            let stream =
                UnixStream::connect(&self.socket)
                    .await
                    .map_err(|source| AioError::Connect {
                        addr: addr.clone(),
                        source,
                    })?;
            let http = |source| AioError::Http {
                addr: addr.clone(),
                source,
            };
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(http)?;
            tokio::spawn(conn);
            let mut req = Request::builder()
                .method(method)
                .uri(path)
                .header(HOST, &self.host);
            let key = HeaderValue::try_from(match &self.key_header {
                KeyHeader::Bearer => format!("Bearer {}", self.key),
                KeyHeader::Named(_) => self.key.clone(),
            })
            .map_err(|e| AioError::Failed {
                addr: addr.clone(),
                message: format!("the API key is not a header value: {e}"),
            })?;
            req = match &self.key_header {
                KeyHeader::Bearer => req.header(hyper::header::AUTHORIZATION, key),
                KeyHeader::Named(name) => req.header(name, key),
            };
            let body = match body {
                Some(v) => {
                    req = req.header(CONTENT_TYPE, "application/json");
                    Bytes::from(serde_json::to_vec(&v).expect("a JSON value encodes"))
                }
                None => Bytes::new(),
            };
            let req = req.body(Full::new(body)).map_err(|e| AioError::Failed {
                addr: addr.clone(),
                message: e.to_string(),
            })?;
            let res = sender.send_request(req).await.map_err(http)?;
            let status = res.status();
            let bytes = Limited::new(res.into_body(), self.max_answer)
                .collect()
                .await
                .map_err(|_| AioError::TooLarge {
                    addr: addr.clone(),
                    limit: self.max_answer,
                })?
                .to_bytes();
            if !status.is_success() {
                let message = serde_json::from_slice::<Envelope<serde_json::Value>>(&bytes)
                    .ok()
                    .and_then(|e| e.message)
                    .unwrap_or_else(|| String::from_utf8_lossy(&bytes).chars().take(500).collect());
                return Err(AioError::Status {
                    addr: addr.clone(),
                    status,
                    message,
                });
            }
            Ok(bytes)
        };
        tokio::time::timeout(limit, exchange)
            .await
            .map_err(|_| AioError::Timeout {
                addr: self.addr.clone(),
                limit,
            })?
    }

    async fn call_data<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
        limit: Duration,
    ) -> Result<T, AioError> {
        let bytes = self.call(method, path, body, limit).await?;
        let envelope: Envelope<T> =
            serde_json::from_slice(&bytes).map_err(|source| AioError::Decode {
                addr: self.addr.clone(),
                source,
            })?;
        match (envelope.success, envelope.data) {
            (true, Some(data)) => Ok(data),
            (_, _) => Err(AioError::Failed {
                addr: self.addr.clone(),
                message: envelope.message.unwrap_or_else(|| "no data".into()),
            }),
        }
    }

    /// `GET /v1/sandbox`: the instance answers (upstream's own health check).
    pub async fn health(&self, limit: Duration) -> Result<(), AioError> {
        self.call(Method::GET, "/v1/sandbox", None, limit)
            .await
            .map(|_| ())
    }

    /// `POST /v1/bash/exec`: runs `command`, bounded by `timeout` (`hard_timeout`).
    pub async fn bash_exec(
        &self,
        command: &str,
        timeout: Duration,
        max_output_length: usize,
    ) -> Result<BashExecResult, AioError> {
        let body = serde_json::json!({
            "command": command,
            "timeout": timeout.as_secs_f64(),
            "hard_timeout": timeout.as_secs_f64(),
            "max_output_length": max_output_length,
        });
        // The HTTP wait outlives the command's own bound by a margin for the answer.
        let limit = timeout + Duration::from_secs(10);
        self.call_data(Method::POST, "/v1/bash/exec", Some(body), limit)
            .await
    }

    /// `GET /v1/browser/info`: the CDP URL (the browser may start now).
    pub async fn browser_info(&self, limit: Duration) -> Result<BrowserInfo, AioError> {
        self.call_data(Method::GET, "/v1/browser/info", None, limit)
            .await
    }
}
