//! The egress proxy as a per-container resource over real sockets: bounded reads of bad
//! requests, one socket per container, and what dropping or closing a proxy leaves behind.

use std::time::Duration;

use crate::common::*;
use egress::EgressStats;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

#[tokio::test]
async fn malformed_and_oversized_requests_get_400_or_431_and_never_hang() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (proxy, _events) = proxy(
        dir.path(),
        policy(json!({"allow_domains": ["*.test"]})),
        resolver(),
    );
    let socket = proxy.socket_path();

    let huge_header = format!(
        "GET http://a.test/ HTTP/1.1\r\nx: {}\r\n\r\n",
        "y".repeat(20_000)
    );
    let many_headers = format!(
        "GET http://a.test/ HTTP/1.1\r\n{}\r\n",
        "x: y\r\n".repeat(100)
    );
    let long_line = format!("GET http://a.test/{} HTTP/1.1\r\n\r\n", "p".repeat(20_000));
    let cases: [(&[u8], u16); 7] = [
        (b"garbage\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nhost: a.test\r\n\r\n", 400),
        (b"GET https://a.test/ HTTP/1.1\r\n\r\n", 400),
        (b"CONNECT a.test HTTP/1.1\r\n\r\n", 400),
        (huge_header.as_bytes(), 431),
        (many_headers.as_bytes(), 431),
        (long_line.as_bytes(), 431),
    ];
    for (raw, status) in cases {
        let reply = send(socket, raw).await?;
        let shown = String::from_utf8_lossy(&raw[..raw.len().min(40)]).into_owned();
        assert_eq!(reply.status, status, "{shown:?}: {}", reply.body);
    }

    // A client that never finishes its head, or never starts one, is cut off after the header
    // timeout.
    let mut slow = UnixStream::connect(socket).await?;
    slow.write_all(b"GET http://a.test/ HTTP/1.1\r\nx: ")
        .await?;
    let mut silent = UnixStream::connect(socket).await?;
    for stream in [&mut slow, &mut silent] {
        let mut rest = Vec::new();
        tokio::time::timeout(LIMIT, stream.read_to_end(&mut rest)).await??;
    }
    assert_eq!(proxy.stats(), EgressStats::default(), "nothing was decided");
    Ok(())
}

#[tokio::test]
async fn each_proxy_serves_only_its_own_container_policy() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let upstream = http_upstream().await;
    let port = upstream.addr.port();
    let (a, mut a_events) = proxy(
        dir.path(),
        loopback_policy(&["upstream.test"], port),
        resolver(),
    );
    let (b, mut b_events) = proxy(
        dir.path(),
        loopback_policy(&["other.test"], port),
        resolver(),
    );
    assert_ne!(a.socket_path(), b.socket_path());

    let through = |socket, host: &str| {
        let host = format!("{host}:{port}");
        async move { get(socket, &host).await.map(|r| r.status) }
    };
    assert_eq!(through(a.socket_path(), "upstream.test").await?, 200);
    assert_eq!(through(a.socket_path(), "other.test").await?, 403);
    assert_eq!(through(b.socket_path(), "other.test").await?, 200);
    assert_eq!(through(b.socket_path(), "upstream.test").await?, 403);

    for (proxy, events, allowed_host) in [
        (&a, &mut a_events, "upstream.test"),
        (&b, &mut b_events, "other.test"),
    ] {
        assert_eq!((proxy.stats().allowed, proxy.stats().denied), (1, 1));
        let first = next_event(events).await;
        assert_eq!((first.host.as_str(), first.allowed), (allowed_host, true));
        assert!(!next_event(events).await.allowed);
        assert!(events.try_recv().is_err(), "no decision of the other proxy");
    }
    Ok(())
}

#[tokio::test]
async fn dropping_the_proxy_removes_its_socket_and_ends_its_tunnels() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let echo = echo_upstream().await;
    let (proxy, _events) = proxy(
        dir.path(),
        loopback_policy(&["upstream.test"], echo.port()),
        resolver(),
    );
    let socket = proxy.socket_path().to_path_buf();
    assert!(socket.exists());

    let mut tunnel = UnixStream::connect(&socket).await?;
    let target = format!("upstream.test:{}", echo.port());
    tunnel
        .write_all(format!("CONNECT {target} HTTP/1.1\r\n\r\n").as_bytes())
        .await?;
    assert_eq!(
        tokio::time::timeout(LIMIT, read_reply(&mut tunnel))
            .await??
            .status,
        200
    );
    let mut idle = UnixStream::connect(&socket).await?;

    drop(proxy);

    assert!(!socket.exists(), "socket file removed");
    assert!(UnixStream::connect(&socket).await.is_err());
    for stream in [&mut tunnel, &mut idle] {
        let mut rest = Vec::new();
        let ended = tokio::time::timeout(LIMIT, stream.read_to_end(&mut rest)).await;
        assert!(ended.is_ok(), "connection ended after drop");
    }
    Ok(())
}

#[tokio::test]
async fn closing_the_proxy_waits_for_it_and_removes_the_socket() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (proxy, _events) = proxy(dir.path(), policy(json!({})), resolver());
    let socket = proxy.socket_path().to_path_buf();
    tokio::time::timeout(Duration::from_secs(5), proxy.close()).await?;
    assert!(!socket.exists());
    Ok(())
}

#[tokio::test]
async fn binding_refuses_an_invalid_policy_and_an_existing_path() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let bad = egress::EgressProxy::builder(policy(json!({"allow_domains": ["*"]})))
        .bind(dir.path().join("bad.sock"));
    assert!(matches!(bad, Err(egress::EgressError::Policy(_))));
    let taken = dir.path().join("taken.sock");
    std::fs::write(&taken, b"")?;
    let again = egress::EgressProxy::builder(policy(json!({}))).bind(&taken);
    assert!(matches!(again, Err(egress::EgressError::Bind { .. })));
    Ok(())
}
