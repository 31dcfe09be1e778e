//! The `/metrics` endpoint over real HTTP on loopback: what it serves, what it refuses, and
//! that services of one process given one address share it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kit::metrics::{ExecutionLabels, MetricsEndpoint, NodeLabels};
use sandmesh_client::metrics::{raw, request, scrape};

const LIMIT: Duration = Duration::from_secs(10);

fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

#[tokio::test]
async fn serves_the_vocabulary_in_the_prometheus_text_format() {
    let endpoint = MetricsEndpoint::shared(any_port()).unwrap();
    let m = endpoint.metrics();
    m.execution_finished("ok", "ephemeral", 0.2);
    m.execution_finished("ok", "ephemeral", 3.0);
    m.execution_finished("denied", "reject", 0.01);
    let at = NodeLabels {
        service: "docker-executor",
        node: "n0".into(),
    };
    m.warm_pool_size.get_or_create(&at).set(2);

    let r = request(endpoint.addr(), "GET", "/metrics", LIMIT)
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.headers["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    assert!(
        r.body.contains("# TYPE sandbox_executions_total counter\n"),
        "{}",
        r.body
    );
    let s = scrape(endpoint.addr()).await.unwrap();
    let ok = [("status", "ok"), ("tier", "ephemeral")];
    assert_eq!(s.sum("sandbox_executions_total", &ok), 2.0);
    assert_eq!(s.sum("sandbox_executions_total", &[]), 3.0);
    assert_eq!(s.sum("sandbox_execution_duration_seconds_count", &[]), 3.0);
    let le = [("tier", "ephemeral"), ("le", "0.25")];
    assert_eq!(
        s.sum("sandbox_execution_duration_seconds_bucket", &le),
        1.0,
        "0.2 s falls in the 0.25 bucket, 3 s does not"
    );
    assert_eq!(s.sum("sandbox_warm_pool_size", &[("node", "n0")]), 2.0);
    // A family nobody updated has no samples, not a misleading zero.
    assert_eq!(s.matching("sandbox_risk_assessments_total", &[]).count(), 0);
    // Label sets are distinct series, not overwritten.
    let labels = ExecutionLabels {
        status: "ok",
        tier: "ephemeral",
    };
    assert_eq!(m.executions.get_or_create(&labels).get(), 2);
}

#[tokio::test]
async fn other_paths_and_methods_and_garbage_are_refused() {
    let endpoint = MetricsEndpoint::shared(any_port()).unwrap();
    let addr = endpoint.addr();
    for path in ["/", "/metric", "/metrics/", "/metrics/../x", "/debug/pprof"] {
        let r = request(addr, "GET", path, LIMIT).await.unwrap();
        assert_eq!(r.status, 404, "{path}: {}", r.body);
    }
    for method in ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"] {
        let r = request(addr, method, "/metrics", LIMIT).await.unwrap();
        assert_eq!(r.status, 405, "{method}");
        assert_eq!(r.headers["allow"], "GET, HEAD");
    }
    let head = request(addr, "HEAD", "/metrics", LIMIT).await.unwrap();
    assert_eq!((head.status, head.body.as_str()), (200, ""));
    // A query string does not change the path.
    let q = request(addr, "GET", "/metrics?name[]=x", LIMIT)
        .await
        .unwrap();
    assert_eq!(q.status, 200);

    // Not HTTP at all, and a request head far beyond any sane size: a 4xx, never a hang.
    let garbage = raw(addr, b"\x00\x01\x02 hello\r\n\r\n", LIMIT)
        .await
        .unwrap();
    assert_eq!(garbage.status, 400);
    let headers: String = (0..200).map(|i| format!("X-H{i}: {i}\r\n")).collect();
    let crowded = format!("GET /metrics HTTP/1.1\r\nHost: x\r\n{headers}\r\n");
    let r = raw(addr, crowded.as_bytes(), LIMIT).await.unwrap();
    assert_eq!(r.status, 431, "a head with too many fields is refused");
    // The endpoint still serves after all that.
    assert!(scrape(addr).await.is_ok());
}

#[tokio::test]
async fn one_address_is_one_endpoint_until_its_last_user_stops() {
    let first = MetricsEndpoint::shared(any_port()).unwrap();
    let addr = first.addr();
    let second = MetricsEndpoint::shared(addr).unwrap();
    assert!(Arc::ptr_eq(&first, &second), "same address, same endpoint");
    second.metrics().confirmations_requested.inc();
    let s = scrape(addr).await.unwrap();
    assert_eq!(s.sum("sandbox_confirmations_requested_total", &[]), 1.0);

    // Port 0 is a fresh endpoint each time.
    let other = MetricsEndpoint::shared(any_port()).unwrap();
    assert_ne!(other.addr(), addr);

    drop(first);
    assert!(scrape(addr).await.is_ok(), "one user left: still serving");
    drop(second);
    test_support::eventually_true("the endpoint to close", LIMIT, || async {
        scrape(addr).await.is_err()
    })
    .await;
    // The address is free again: a new endpoint binds it, with fresh counters.
    let again = MetricsEndpoint::shared(addr).unwrap();
    let s = scrape(again.addr()).await.unwrap();
    assert_eq!(s.sum("sandbox_confirmations_requested_total", &[]), 0.0);
}

#[tokio::test]
async fn a_taken_address_fails_the_start_with_its_cause() {
    let squatter = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = squatter.local_addr().unwrap();
    let e = MetricsEndpoint::shared(addr).unwrap_err();
    assert_eq!(e.addr, addr);
    assert_eq!(e.source.kind(), std::io::ErrorKind::AddrInUse);
}
