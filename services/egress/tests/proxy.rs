//! The egress proxy over real sockets: a Unix socket per "container", upstreams on 127.0.0.1
//! (reachable only because each policy allows 127.0.0.1/32 explicitly), a stub resolver.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use egress::{EgressStats, StaticResolver};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// `upstream.test` and friends resolve to the loopback upstreams.
fn resolver() -> StaticResolver {
    StaticResolver::new()
        .with("upstream.test", &[LOOPBACK])
        .with("secret.test", &[LOOPBACK])
        .with("other.test", &[LOOPBACK])
        .with("loop.test", &[LOOPBACK])
        .with("metadata.test", &["169.254.169.254".parse().unwrap()])
        .with("private.test", &["10.0.0.5".parse().unwrap()])
        .with("mixed.test", &["10.0.0.5".parse().unwrap(), LOOPBACK])
}

fn loopback_policy(domains: &[&str], port: u16) -> egress::NetworkPolicy {
    policy(json!({
        "allow_domains": domains,
        "allow_cidrs": ["127.0.0.1/32"],
        "ports": [port, 22],
    }))
}

#[tokio::test]
async fn allowed_http_is_forwarded_in_origin_form_with_its_host() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let upstream = http_upstream().await;
    let port = upstream.addr.port();
    let (proxy, mut events) = proxy(
        dir.path(),
        loopback_policy(&["upstream.test"], port),
        resolver(),
    );

    let host = format!("upstream.test:{port}");
    let raw = format!(
        "GET http://{host}/path?q=1 HTTP/1.1\r\nhost: {host}\r\nproxy-authorization: x\r\n\r\n"
    );
    let reply = send(proxy.socket_path(), raw.as_bytes()).await?;

    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.body, format!("GET /path?q=1 HTTP/1.1\nhost={host}\n"));
    let event = next_event(&mut events).await;
    assert!(event.allowed);
    assert_eq!((event.host.as_str(), event.port), ("upstream.test", port));
    assert_eq!(event.address, Some(LOOPBACK));
    assert_eq!(
        event.rule,
        "allowed by allow_domains upstream.test, allow_cidrs 127.0.0.1/32"
    );
    Ok(())
}

#[tokio::test]
async fn connect_tunnel_passes_bytes_both_ways_and_counts_them() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let echo = echo_upstream().await;
    let (proxy, _events) = proxy(
        dir.path(),
        loopback_policy(&["*.test"], echo.port()),
        resolver(),
    );

    let mut client = UnixStream::connect(proxy.socket_path()).await?;
    let target = format!("upstream.test:{}", echo.port());
    client
        .write_all(format!("CONNECT {target} HTTP/1.1\r\nhost: {target}\r\n\r\n").as_bytes())
        .await?;
    let reply = tokio::time::timeout(LIMIT, read_reply(&mut client)).await??;
    assert_eq!(reply.status, 200);

    let hello = b"\x16\x03\x01 a TLS-shaped hello";
    client.write_all(hello).await?;
    let mut echoed = vec![0; hello.len()];
    tokio::time::timeout(LIMIT, client.read_exact(&mut echoed)).await??;
    assert_eq!(echoed, hello);

    let n = hello.len() as u64;
    let want = EgressStats {
        allowed: 1,
        denied: 0,
        bytes_up: n,
        bytes_down: n,
    };
    test_support::eventually_true("tunnel bytes counted", LIMIT, || async {
        proxy.stats() == want
    })
    .await;
    Ok(())
}

#[tokio::test]
async fn a_denied_domain_gets_403_naming_the_rule() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let policy = policy(json!({
        "allow_domains": ["*.test"],
        "deny_domains": ["secret.test"],
        "allow_cidrs": ["127.0.0.1/32"],
    }));
    let (proxy, mut events) = proxy(dir.path(), policy, resolver());

    let reply = send(
        proxy.socket_path(),
        b"CONNECT secret.test:443 HTTP/1.1\r\n\r\n",
    )
    .await?;
    assert_eq!(reply.status, 403);
    assert_eq!(reply.body, "denied by deny_domains secret.test\n");

    let reply = get(proxy.socket_path(), "elsewhere.org").await?;
    assert_eq!(
        (reply.status, reply.body.as_str()),
        (403, "elsewhere.org is not in allow_domains\n")
    );

    let event = next_event(&mut events).await;
    assert!(!event.allowed);
    assert_eq!((event.host.as_str(), event.port), ("secret.test", 443));
    assert_eq!(event.rule, "denied by deny_domains secret.test");
    Ok(())
}

#[tokio::test]
async fn names_resolving_to_internal_addresses_are_refused_without_a_cidr() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (proxy, mut events) = proxy(
        dir.path(),
        policy(json!({"allow_domains": ["*.test"]})),
        resolver(),
    );

    for (host, rule) in [
        ("loop.test", "resolves to 127.0.0.1: loopback"),
        (
            "metadata.test",
            "resolves to 169.254.169.254: link-local (cloud metadata)",
        ),
        ("private.test", "resolves to 10.0.0.5: private range"),
    ] {
        let reply = get(proxy.socket_path(), host).await?;
        assert_eq!((reply.status, reply.body.trim_end()), (403, rule), "{host}");
        let event = next_event(&mut events).await;
        assert_eq!(
            (event.host.as_str(), event.allowed, event.rule.as_str()),
            (host, false, rule)
        );
        assert!(event.address.is_some());
    }
    let reply = send(
        proxy.socket_path(),
        b"CONNECT [::ffff:127.0.0.1]:443 HTTP/1.1\r\n\r\n",
    )
    .await?;
    assert_eq!(
        (reply.status, reply.body.as_str()),
        (403, "127.0.0.1 is not in allow_cidrs\n")
    );
    assert_eq!(proxy.stats().denied, 4);
    Ok(())
}

#[tokio::test]
async fn a_redirect_to_an_internal_address_is_passed_back_and_its_target_refused(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let upstream = http_upstream().await;
    let port = upstream.addr.port();
    let policy = policy(json!({
        "allow_domains": ["upstream.test", "metadata.test"],
        "allow_cidrs": ["127.0.0.1/32"],
        "ports": [port, 80],
    }));
    let (proxy, _events) = proxy(dir.path(), policy, resolver());

    let host = format!("upstream.test:{port}");
    let raw = format!("GET http://{host}/redirect HTTP/1.1\r\nhost: {host}\r\n\r\n");
    let reply = send(proxy.socket_path(), raw.as_bytes()).await?;
    assert_eq!(
        reply.status, 302,
        "the proxy does not follow redirects itself"
    );

    // Following it is a new request, judged again after resolution.
    let followed = get(proxy.socket_path(), "metadata.test").await?;
    assert_eq!(
        (followed.status, followed.body.trim_end()),
        (
            403,
            "resolves to 169.254.169.254: link-local (cloud metadata)"
        )
    );
    assert_eq!(upstream.accepted.load(Ordering::SeqCst), 1);
    Ok(())
}

#[tokio::test]
async fn a_mixed_answer_is_served_only_from_the_address_that_passed() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let upstream = http_upstream().await;
    let port = upstream.addr.port();
    let (proxy, mut events) = proxy(
        dir.path(),
        loopback_policy(&["mixed.test"], port),
        resolver(),
    );

    let reply = get(proxy.socket_path(), &format!("mixed.test:{port}")).await?;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(next_event(&mut events).await.address, Some(LOOPBACK));
    Ok(())
}

#[tokio::test]
async fn a_smuggled_host_header_is_refused_before_any_upstream_is_reached() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let upstream = http_upstream().await;
    let port = upstream.addr.port();
    let (proxy, mut events) = proxy(
        dir.path(),
        loopback_policy(&["upstream.test"], port),
        resolver(),
    );

    for extra in [
        "host: metadata.test",
        "host: upstream.test:1",
        "host: upstream.test:{port}\r\nhost: x.test",
    ] {
        let extra = extra.replace("{port}", &port.to_string());
        let raw = format!("GET http://upstream.test:{port}/ HTTP/1.1\r\n{extra}\r\n\r\n");
        let reply = send(proxy.socket_path(), raw.as_bytes()).await?;
        assert_eq!(reply.status, 400, "{extra}: {}", reply.body);
        assert_eq!(
            reply.body,
            "Host header does not match the request target\n"
        );
        assert!(!next_event(&mut events).await.allowed);
    }
    assert_eq!(upstream.accepted.load(Ordering::SeqCst), 0);
    Ok(())
}

#[tokio::test]
async fn connect_to_an_allowed_name_on_port_22_is_refused() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (proxy, mut events) = proxy(
        dir.path(),
        policy(json!({"allow_domains": ["upstream.test"], "allow_cidrs": ["127.0.0.1/32"]})),
        resolver(),
    );

    let reply = send(
        proxy.socket_path(),
        b"CONNECT upstream.test:22 HTTP/1.1\r\n\r\n",
    )
    .await?;
    assert_eq!(
        (reply.status, reply.body.as_str()),
        (403, "port 22 not allowed\n")
    );
    assert_eq!(next_event(&mut events).await.rule, "port 22 not allowed");
    Ok(())
}

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
