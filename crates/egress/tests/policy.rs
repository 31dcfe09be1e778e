//! The egress proxy over real sockets: a Unix socket per "container", upstreams on 127.0.0.1
//! (reachable only because each policy allows 127.0.0.1/32 explicitly), a stub resolver.

use std::sync::atomic::Ordering;

use crate::common::*;
use egress::EgressStats;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

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
