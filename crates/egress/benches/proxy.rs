//! `cargo bench -p sandmesh-egress --bench proxy`: what the egress proxy costs, measured beside
//! the direct baseline in the same run, on the host (the in-container relay adds one more
//! loopback hop, not measured here).
//!
//! - Latency added per HTTPS-style connection: connect + `CONNECT` + first byte echoed back,
//!   through the proxy's Unix socket, vs connect + first byte directly.
//! - Throughput of a 50 MB download through a `CONNECT` tunnel vs directly (ratio).
//!
//! Upstreams are servers this bench runs on 127.0.0.1 (allowed by the policy's CIDR).

use std::path::Path;
use std::time::{Duration, Instant};

use egress::{EgressProxy, NetworkPolicy};
use test_support::upstream::echo_server;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixStream};

const CONNECTIONS: usize = 300;
const DOWNLOAD: usize = 50 * 1024 * 1024;
const DOWNLOADS: usize = 5;

/// Sends [`DOWNLOAD`] bytes to every connection, then closes it.
async fn download_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let block = vec![7u8; 256 * 1024];
        while let Ok((mut conn, _)) = listener.accept().await {
            let block = block.clone();
            tokio::spawn(async move {
                let mut sent = 0;
                while sent < DOWNLOAD {
                    if conn.write_all(&block).await.is_err() {
                        return;
                    }
                    sent += block.len();
                }
                let _ = conn.shutdown().await;
            });
        }
    });
    port
}

/// Opens a tunnel to 127.0.0.1:`port` through the proxy.
async fn tunnel(socket: &Path, port: u16) -> UnixStream {
    let mut s = UnixStream::connect(socket).await.unwrap();
    let request = format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    s.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    s
}

async fn first_byte(mut s: impl AsyncRead + AsyncWrite + Unpin) {
    s.write_all(b"x").await.unwrap();
    let mut b = [0u8; 1];
    s.read_exact(&mut b).await.unwrap();
}

async fn drain(mut s: impl AsyncRead + Unpin) -> usize {
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0;
    loop {
        match s.read(&mut buf).await.unwrap() {
            0 => return total,
            n => total += n,
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

#[tokio::main]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("egress.sock");
    let (echo, download) = (echo_server().await, download_server().await);
    let policy = NetworkPolicy {
        allow_cidrs: vec!["127.0.0.1/32".into()],
        ports: Some(vec![echo, download]),
        ..Default::default()
    };
    let proxy = EgressProxy::builder(policy).bind(&socket).unwrap();

    // Warm both paths once.
    first_byte(TcpStream::connect(("127.0.0.1", echo)).await.unwrap()).await;
    first_byte(tunnel(&socket, echo).await).await;
    let (mut direct, mut proxied) = (Vec::new(), Vec::new());
    // Interleaved, so drift of the machine's load hits both alike.
    for _ in 0..CONNECTIONS {
        let t = Instant::now();
        first_byte(TcpStream::connect(("127.0.0.1", echo)).await.unwrap()).await;
        direct.push(t.elapsed());
        let t = Instant::now();
        first_byte(tunnel(&socket, echo).await).await;
        proxied.push(t.elapsed());
    }
    direct.sort();
    proxied.sort();
    let (d50, p50) = (percentile(&direct, 0.5), percentile(&proxied, 0.5));
    let (d99, p99) = (percentile(&direct, 0.99), percentile(&proxied, 0.99));
    println!("connection + first byte, {CONNECTIONS} each (µs):");
    println!(
        "  direct   p50 {:>8.0}  p99 {:>8.0}",
        micros(d50),
        micros(d99)
    );
    println!(
        "  proxied  p50 {:>8.0}  p99 {:>8.0}",
        micros(p50),
        micros(p99)
    );
    println!(
        "  added    p50 {:>8.0}  p99 {:>8.0}",
        micros(p50.saturating_sub(d50)),
        micros(p99.saturating_sub(d99))
    );

    let (mut direct, mut proxied) = (Vec::new(), Vec::new());
    for _ in 0..DOWNLOADS {
        let t = Instant::now();
        let n = drain(TcpStream::connect(("127.0.0.1", download)).await.unwrap()).await;
        assert!(n >= DOWNLOAD);
        direct.push(n as f64 / t.elapsed().as_secs_f64() / 1e6);
        let t = Instant::now();
        let n = drain(tunnel(&socket, download).await).await;
        assert!(n >= DOWNLOAD);
        proxied.push(n as f64 / t.elapsed().as_secs_f64() / 1e6);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (d, p) = (median(&mut direct), median(&mut proxied));
    println!("50 MB download, median of {DOWNLOADS} (MB/s):");
    println!("  direct  {d:>8.0}");
    println!("  proxied {p:>8.0}");
    println!("  ratio   {:>8.2}", p / d);
    let stats = proxy.stats();
    println!(
        "proxy counted {} connections allowed, {} MB down",
        stats.allowed,
        stats.bytes_down / 1_000_000
    );
}
