//! Real sockets for the proxy tests: upstreams on 127.0.0.1, a raw client on the proxy's Unix
//! socket (raw, so malformed requests can be sent), and a proxy whose decisions land in a
//! channel. Each test binary uses part of it.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use egress::{EgressEvent, EgressProxy, NetworkPolicy, StaticResolver};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UnixStream};
use tokio::sync::mpsc;

/// Bounds every read in these tests: a hang fails the test instead of stalling it.
pub const LIMIT: Duration = Duration::from_secs(10);
pub const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// A policy from its JSON form, as callers send it.
pub fn policy(json: serde_json::Value) -> NetworkPolicy {
    serde_json::from_value(json).expect("test policy")
}

/// A proxy on a fresh socket in `dir`, with `resolver`, and the channel of its decisions.
pub fn proxy(
    dir: &Path,
    policy: NetworkPolicy,
    resolver: StaticResolver,
) -> (EgressProxy, mpsc::UnboundedReceiver<EgressEvent>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let proxy = EgressProxy::builder(policy)
        .resolver(resolver)
        .header_timeout(Duration::from_millis(500))
        .observer(move |event| {
            let _ = tx.send(event.clone());
        })
        .bind(dir.join(format!("egress-{}.sock", messages::new_id())))
        .expect("bind the egress proxy");
    (proxy, rx)
}

/// An HTTP/1.1 upstream answering every request with its request line and Host header (and a
/// redirect for `/redirect`), counting the connections it accepted.
pub struct HttpUpstream {
    pub addr: SocketAddr,
    pub accepted: Arc<AtomicUsize>,
}

pub async fn http_upstream() -> HttpUpstream {
    let listener = TcpListener::bind((LOOPBACK, 0))
        .await
        .expect("bind upstream");
    let addr = listener.local_addr().expect("upstream address");
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let Ok(head) = read_head(&mut stream).await else {
                    return;
                };
                let request_line = head.lines().next().unwrap_or_default().to_string();
                let host = head
                    .lines()
                    .find_map(|l| l.strip_prefix("host: ").or(l.strip_prefix("Host: ")))
                    .unwrap_or("-");
                let body = format!("{request_line}\nhost={host}\n");
                // `/redirect` sends the client on to a name the test resolver makes internal.
                let status = match request_line.contains(" /redirect ") {
                    true => "302 Found\r\nlocation: http://metadata.test/",
                    false => "200 OK",
                };
                let response = format!(
                    "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
            });
        }
    });
    HttpUpstream { addr, accepted }
}

/// A TCP upstream that sends back whatever it receives.
pub async fn echo_upstream() -> SocketAddr {
    let listener = TcpListener::bind((LOOPBACK, 0)).await.expect("bind echo");
    let addr = listener.local_addr().expect("echo address");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = stream.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

/// Reads up to the blank line ending a head (at most 64 KiB).
pub async fn read_head<S: AsyncReadExt + Unpin>(stream: &mut S) -> anyhow::Result<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 64 * 1024 {
            bail!("head too long");
        }
        if stream.read(&mut byte).await? == 0 {
            bail!("connection closed after {} bytes of head", head.len());
        }
        head.push(byte[0]);
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

/// A response as the client saw it.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub body: String,
}

/// Sends `raw` on a new connection to the proxy at `socket` and reads one response.
pub async fn send(socket: &Path, raw: &[u8]) -> anyhow::Result<Reply> {
    let mut stream = UnixStream::connect(socket)
        .await
        .context("connect to proxy")?;
    stream.write_all(raw).await?;
    tokio::time::timeout(LIMIT, read_reply(&mut stream))
        .await
        .context("no reply in time")?
}

pub async fn read_reply(stream: &mut UnixStream) -> anyhow::Result<Reply> {
    let head = read_head(stream).await?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("status line")?;
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length: ")?
                .parse()
                .ok()
        })
        .unwrap_or(0);
    let mut body = vec![0; length];
    stream.read_exact(&mut body).await?;
    Ok(Reply {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// `GET http://{host}/` through the proxy.
pub async fn get(socket: &Path, host: &str) -> anyhow::Result<Reply> {
    let raw = format!("GET http://{host}/ HTTP/1.1\r\nhost: {host}\r\n\r\n");
    send(socket, raw.as_bytes()).await
}

/// The next decision the proxy reported.
pub async fn next_event(events: &mut mpsc::UnboundedReceiver<EgressEvent>) -> EgressEvent {
    tokio::time::timeout(LIMIT, events.recv())
        .await
        .expect("a decision in time")
        .expect("the proxy is alive")
}

/// `upstream.test` and friends resolve to the loopback upstreams.
pub fn resolver() -> StaticResolver {
    StaticResolver::new()
        .with("upstream.test", &[LOOPBACK])
        .with("secret.test", &[LOOPBACK])
        .with("other.test", &[LOOPBACK])
        .with("loop.test", &[LOOPBACK])
        .with("metadata.test", &["169.254.169.254".parse().unwrap()])
        .with("private.test", &["10.0.0.5".parse().unwrap()])
        .with("mixed.test", &["10.0.0.5".parse().unwrap(), LOOPBACK])
}

pub fn loopback_policy(domains: &[&str], port: u16) -> egress::NetworkPolicy {
    policy(json!({
        "allow_domains": domains,
        "allow_cidrs": ["127.0.0.1/32"],
        "ports": [port, 22],
    }))
}
