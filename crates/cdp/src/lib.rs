//! The Chrome DevTools Protocol as sandmesh speaks it: no generated protocol, only the
//! commands the mesh sends, as JSON values.
//!
//! - [`request`]: Chromium's HTTP discovery endpoints (`/json/version`, `/json/list`,
//!   `/json/new`), bounded in time.
//! - [`Connection`]: one CDP WebSocket. Commands go one at a time (`&mut self`), each bounded
//!   in time; events that arrive while a command waits are dropped, or kept up to a cap for
//!   readers of events. No background task: a connection nobody calls costs nothing.
//! - [`Page`]: one page target (on its own socket, or a session of a browser connection)
//!   and the actions the browser-router and the AIO agent share: evaluate, find and click an
//!   element, press keys, insert text, screenshots, the page's text and HTML, waiting for a
//!   condition.
//! - [`LocalChromium`]: a headless Chromium of its own on this host (the tests' browser).
//!
//! An endpoint's address is `host:port`, or `unix:<path>` for a Unix socket ([`dial`]).

mod connection;
mod keys;
mod launch;
mod page;
mod stream;

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;

pub use connection::{Connection, MAX_PENDING_EVENTS};
pub use keys::{key_event, modifier_bit};
pub use launch::{chromium_binary, LocalChromium};
pub use page::{ImageFormat, Page};
pub use stream::{dial, Stream, UNIX_PREFIX};

#[derive(Debug, thiserror::Error)]
pub enum CdpError {
    #[error("asking {addr} for {path}")]
    Http {
        addr: String,
        path: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("{addr} did not answer {path} within {limit:?}")]
    HttpTimeout {
        addr: String,
        path: String,
        limit: Duration,
    },
    #[error("{what} is not the JSON expected")]
    Json {
        what: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{0} is not a ws:// URL")]
    Url(String),
    #[error("chromium lists no page and opened none")]
    NoPage,
    #[error("connecting to the CDP socket {url}")]
    Connect {
        url: String,
        #[source]
        source: async_tungstenite::tungstenite::Error,
    },
    #[error("the CDP socket closed")]
    Closed,
    #[error("{method} did not answer within {limit:?}")]
    Timeout { method: String, limit: Duration },
    #[error("{method}: {message}")]
    Protocol { method: String, message: String },
    #[error("the page's script threw: {0}")]
    Script(String),
    #[error("unknown key {0:?}")]
    UnknownKey(String),
    #[error("{method} answered without {field}")]
    Missing { method: String, field: &'static str },
    #[error(
        "no chromium found: install Debian's (`apt-get install chromium`, or \
         `scripts/install-tools.sh --tests`) or point SANDMESH_CHROMIUM at a Chromium binary"
    )]
    NoChromium,
    #[error("starting {bin}")]
    Spawn {
        bin: String,
        #[source]
        source: std::io::Error,
    },
    #[error("chromium did not open its debugging port within {0:?}")]
    StartTimeout(Duration),
}

/// One HTTP request to a DevTools endpoint at `addr` (`host:port` or `unix:<path>`), with
/// `Host: addr` (an IP address or `localhost`, which Chromium's Host check accepts; `localhost`
/// for a socket), bounded by `limit`.
/// `PUT` for `/json/new`, which Chromium refuses over `GET`.
pub async fn request(
    addr: &str,
    method: &str,
    path: &str,
    limit: Duration,
) -> Result<Bytes, CdpError> {
    let failed = |e: Box<dyn std::error::Error + Send + Sync>| CdpError::Http {
        addr: addr.to_string(),
        path: path.to_string(),
        source: e,
    };
    let exchange = async {
        let stream = dial(addr).await.map_err(|e| failed(e.into()))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| failed(e.into()))?;
        tokio::spawn(conn);
        let req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, stream::host_of(addr))
            .body(Empty::<Bytes>::new())
            .map_err(|e| failed(e.into()))?;
        let res = sender
            .send_request(req)
            .await
            .map_err(|e| failed(e.into()))?;
        Ok(res
            .into_body()
            .collect()
            .await
            .map_err(|e| failed(e.into()))?
            .to_bytes())
    };
    tokio::time::timeout(limit, exchange)
        .await
        .map_err(|_| CdpError::HttpTimeout {
            addr: addr.to_string(),
            path: path.to_string(),
            limit,
        })?
}

/// `GET path` at `addr`, decoded as JSON.
async fn get_json(addr: &str, path: &str, limit: Duration) -> Result<serde_json::Value, CdpError> {
    let body = request(addr, "GET", path, limit).await?;
    serde_json::from_slice(&body).map_err(|source| CdpError::Json {
        what: format!("{path} of {addr}"),
        source,
    })
}

/// `value` as a JavaScript literal (JSON is valid JavaScript): how values reach page
/// scripts, never spliced into script text.
pub fn js_literal(value: &impl serde::Serialize) -> String {
    serde_json::to_string(value).expect("a JSON value encodes")
}

#[cfg(test)]
mod tests {
    use super::js_literal;

    #[test]
    fn hostile_strings_stay_one_string_literal() {
        let s = js_literal(&"a'); alert(1); ('\"\n</script>");
        assert!(s.starts_with('"') && s.ends_with('"'));
        let back: String = serde_json::from_str(&s).unwrap();
        assert_eq!(back, "a'); alert(1); ('\"\n</script>");
    }
}
