//! The kit's edge over a real nats-server: encodings, error replies, discovery, queue groups,
//! admission, heartbeats and graceful shutdown.

use std::time::Duration;

use crate::common::*;
use async_nats::HeaderMap;
use kit::{EndpointOptions, KitConfig};
use messages::codec::{CONTENT_TYPE, MSGPACK, SERVICE_ERROR, SERVICE_ERROR_CODE};
use messages::{Encoding, ErrorBody, ErrorKind};
use sandmesh_client::{ClientError, MeshClient};
use test_support::{eventually_true, NatsServer};

async fn raw(
    client: &async_nats::Client,
    content_type: Option<&str>,
    payload: Vec<u8>,
) -> async_nats::Message {
    let mut headers = HeaderMap::new();
    if let Some(ct) = content_type {
        headers.insert(CONTENT_TYPE, ct);
    }
    client
        .request_with_headers(ECHO_SUBJECT, headers, payload.into())
        .await
        .unwrap()
}

fn error_of(msg: &async_nats::Message) -> (u16, ErrorBody) {
    let headers = msg.headers.as_ref().expect("error headers");
    let code: u16 = headers
        .get(SERVICE_ERROR_CODE)
        .expect("code header")
        .as_str()
        .parse()
        .unwrap();
    assert!(headers.get(SERVICE_ERROR).is_some());
    let ct = headers.get(CONTENT_TYPE).map(|v| v.as_str().to_string());
    let body: ErrorBody = Encoding::from_content_type(ct.as_deref())
        .unwrap()
        .decode(&msg.payload)
        .unwrap();
    (code, body)
}

#[tokio::test]
async fn json_and_msgpack_clients_get_answers_in_their_encoding() {
    let nats = NatsServer::start();
    let rt = start_echo(&nats.url(), "a", EndpointOptions::default()).await;
    let client = test_support::connect(&nats.url()).await;

    let reply = raw(&client, None, br#"{"text":"hi"}"#.to_vec()).await;
    let resp: EchoResp = serde_json::from_slice(&reply.payload).unwrap();
    assert_eq!(resp.text, "hi");

    let req = EchoReq {
        text: "packed".into(),
        delay_ms: 0,
        fail_with: None,
        repeat: 0,
    };
    let reply = raw(
        &client,
        Some(MSGPACK),
        rmp_serde::to_vec_named(&req).unwrap(),
    )
    .await;
    assert_eq!(
        reply
            .headers
            .as_ref()
            .unwrap()
            .get(CONTENT_TYPE)
            .unwrap()
            .as_str(),
        MSGPACK
    );
    let resp: EchoResp = rmp_serde::from_slice(&reply.payload).unwrap();
    assert_eq!(resp.text, "packed");

    // The mesh client speaks msgpack and checks error headers.
    let caller = caller(client.clone(), Duration::from_secs(5));
    let resp: EchoResp = caller.request(ECHO_SUBJECT.into(), &req).await.unwrap();
    assert_eq!(resp.instance, "a");
    let failing = EchoReq {
        fail_with: Some(409),
        ..req
    };
    let err = caller
        .request::<_, EchoResp>(ECHO_SUBJECT.into(), &failing)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict);
    rt.shutdown().await;
}

#[tokio::test]
async fn bad_payloads_get_the_right_codes_in_headers_and_body() {
    let nats = NatsServer::start();
    let options = EndpointOptions {
        max_payload: 1024,
        max_in_flight: 16,
    };
    let rt = start_echo(&nats.url(), "a", options).await;
    let client = test_support::connect(&nats.url()).await;

    let cases: Vec<(Option<&str>, Vec<u8>, u16)> = vec![
        (None, b"{not json".to_vec(), 400),
        (None, br#"{"text": 5}"#.to_vec(), 400),
        (None, Vec::new(), 400),
        (Some(MSGPACK), b"\xc1\xc1".to_vec(), 400),
        (Some("text/xml"), br#"{"text":"x"}"#.to_vec(), 400),
        (
            None,
            format!(r#"{{"text":"{}"}}"#, "x".repeat(2000)).into_bytes(),
            413,
        ),
        (None, "[".repeat(100_000).into_bytes(), 413),
    ];
    for (ct, payload, want) in cases {
        let (code, body) = error_of(&raw(&client, ct, payload).await);
        assert_eq!(code, want, "{body:?}");
        assert_eq!(body.code, want);
        assert_eq!(body.kind, ErrorKind::from_code(want));
    }
    // Deep nesting under the size limit is refused without overflowing the stack (an
    // endpoint that accepts 1 MiB, beside the small one).
    let big = start_echo_on(
        KitConfig::for_url(&nats.url()),
        "big",
        EndpointOptions {
            max_payload: 1 << 20,
            max_in_flight: 16,
        },
        "sandbox.v1.echo-big",
    )
    .await;
    let nested = client
        .request("sandbox.v1.echo-big", "[".repeat(500_000).into())
        .await
        .unwrap();
    assert_eq!(error_of(&nested).0, 400);
    // Both still healthy afterwards.
    let ok = raw(&client, None, br#"{"text":"alive"}"#.to_vec()).await;
    let ok: EchoResp = serde_json::from_slice(&ok.payload).unwrap();
    assert_eq!(ok.text, "alive");
    let ok = client
        .request(
            "sandbox.v1.echo-big",
            br#"{"text":"alive"}"#.to_vec().into(),
        )
        .await;
    assert_eq!(
        serde_json::from_slice::<EchoResp>(&ok.unwrap().payload)
            .unwrap()
            .text,
        "alive"
    );
    rt.shutdown().await;
    big.shutdown().await;
}

#[tokio::test]
async fn discovery_and_queue_groups() {
    let nats = NatsServer::start();
    let a = start_echo(&nats.url(), "a", EndpointOptions::default()).await;
    let b = start_echo(&nats.url(), "b", EndpointOptions::default()).await;
    let client = test_support::connect(&nats.url()).await;

    let ping = client.request("$SRV.PING.echo", "".into()).await.unwrap();
    let ping: serde_json::Value = serde_json::from_slice(&ping.payload).unwrap();
    assert_eq!(ping["name"], "echo");
    let info = client.request("$SRV.INFO.echo", "".into()).await.unwrap();
    let info: serde_json::Value = serde_json::from_slice(&info.payload).unwrap();
    let subjects: Vec<&str> = info["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["subject"].as_str())
        .collect();
    assert_eq!(subjects, vec![ECHO_SUBJECT]);

    let caller = caller(client.clone(), Duration::from_secs(5));
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..60 {
        let req = EchoReq {
            text: i.to_string(),
            delay_ms: 0,
            fail_with: None,
            repeat: 0,
        };
        let resp: EchoResp = caller.request(ECHO_SUBJECT.into(), &req).await.unwrap();
        seen.insert(resp.instance);
    }
    assert_eq!(
        seen.len(),
        2,
        "both instances of the queue group take requests: {seen:?}"
    );
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn beyond_max_in_flight_callers_get_429_at_once() {
    let nats = NatsServer::start();
    let rt = start_echo(
        &nats.url(),
        "a",
        EndpointOptions {
            max_payload: 1 << 20,
            max_in_flight: 1,
        },
    )
    .await;
    let client = test_support::connect(&nats.url()).await;
    let caller = caller(client, Duration::from_secs(10));
    let slow = EchoReq {
        text: "slow".into(),
        delay_ms: 1500,
        fail_with: None,
        repeat: 0,
    };
    let first = {
        let caller = caller.clone();
        // Retried until it holds the slot (a fast request may hold it for an instant).
        tokio::spawn(async move {
            loop {
                match caller
                    .request::<_, EchoResp>(ECHO_SUBJECT.into(), &slow)
                    .await
                {
                    Err(e) if e.kind() == ErrorKind::Overloaded => continue,
                    other => return other,
                }
            }
        })
    };
    let fast = EchoReq {
        text: "fast".into(),
        delay_ms: 0,
        fail_with: None,
        repeat: 0,
    };
    // Bounded poll: once the slow one holds the only slot, the next is refused with 429.
    eventually_true(
        "a 429 once the slot is held",
        Duration::from_secs(5),
        || {
            let caller = caller.clone();
            let fast = fast.clone();
            async move {
                let r = caller
                    .request::<_, EchoResp>(ECHO_SUBJECT.into(), &fast)
                    .await;
                matches!(r, Err(e) if e.kind() == ErrorKind::Overloaded)
            }
        },
    )
    .await;
    assert_eq!(first.await.unwrap().unwrap().text, "slow");
    rt.shutdown().await;
}

#[tokio::test]
async fn heartbeat_key_lives_while_the_instance_does() {
    let nats = NatsServer::start();
    let client = test_support::connect(&nats.url()).await;
    let js = async_nats::jetstream::new(client.clone());
    let mut rt = start_echo(&nats.url(), "hb1", EndpointOptions::default()).await;
    rt.start_heartbeat(std::sync::Arc::new(|| kit::heartbeat::Load {
        capacity: 8,
        load: 3,
        ..Default::default()
    }))
    .await
    .unwrap();
    let kv = js.get_key_value("sandbox_nodes").await.unwrap();
    let entry = kv
        .get("echo.hb1")
        .await
        .unwrap()
        .expect("heartbeat key present");
    let hb: messages::heartbeat::Heartbeat = serde_json::from_slice(&entry).unwrap();
    assert_eq!((hb.capacity, hb.load, hb.version.as_str()), (8, 3, "1.0.0"));

    // A clean stop removes the key at once.
    rt.shutdown().await;
    assert!(kv.get("echo.hb1").await.unwrap().is_none());
}

#[tokio::test]
async fn a_crashed_instance_disappears_within_its_ttl() {
    use kit::heartbeat::{HeartbeatActor, HeartbeatArgs, Load};
    let nats = NatsServer::start();
    let client = test_support::connect(&nats.url()).await;
    let js = async_nats::jetstream::new(client.clone());
    let subjects = messages::Subjects::default();
    let kv = kit::bootstrap::nodes_kv(&js, &subjects, 1).await.unwrap();
    let args = HeartbeatArgs {
        js: js.clone(),
        bucket: subjects.nodes_bucket(),
        service: "echo".into(),
        instance_id: "crash".into(),
        version: "1.0.0".into(),
        interval: Duration::from_millis(300),
        probe: std::sync::Arc::new(Load::default),
        tenants: None,
    };
    let mut watch = kv.watch("echo.crash").await.unwrap();
    let (actor, handle) = ractor::Actor::spawn(None, HeartbeatActor, args)
        .await
        .unwrap();
    assert!(kv.get("echo.crash").await.unwrap().is_some());
    // kill() skips post_stop: like a crash, nothing deletes the key; only the TTL can.
    actor.kill();
    handle.await.unwrap();
    assert!(
        kv.get("echo.crash").await.unwrap().is_some(),
        "a killed actor must not delete its key"
    );
    let gone = tokio::time::timeout(Duration::from_secs(10), async {
        use futures::StreamExt;
        while let Some(Ok(entry)) = watch.next().await {
            if matches!(
                entry.operation,
                async_nats::jetstream::kv::Operation::Purge
                    | async_nats::jetstream::kv::Operation::Delete
            ) {
                return true;
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    assert!(gone, "watchers see the key expire");
    assert!(kv.get("echo.crash").await.unwrap().is_none());
}

/// `PeerCounts`: another instance's per-tenant report arrives with its beats and follows
/// them, the instance's own is never counted, and a crashed peer's report goes with its key.
#[tokio::test]
async fn peer_counts_follow_the_peers_beats_and_forget_a_crashed_peer() {
    use kit::heartbeat::{HeartbeatActor, HeartbeatArgs, Load};
    use kit::PeerCounts;
    use messages::tenancy::Tenant;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    let nats = NatsServer::start();
    let client = test_support::connect(&nats.url()).await;
    let js = async_nats::jetstream::new(client.clone());
    let subjects = messages::Subjects::default();
    let kv = kit::bootstrap::nodes_kv(&js, &subjects, 1).await.unwrap();
    let held = Arc::new(AtomicU32::new(2));
    let report = held.clone();
    let beat = |instance: &str| HeartbeatArgs {
        js: js.clone(),
        bucket: subjects.nodes_bucket(),
        service: "echo".into(),
        instance_id: instance.into(),
        version: "1.0.0".into(),
        interval: Duration::from_millis(300),
        probe: Arc::new(Load::default),
        tenants: Some(Arc::new({
            let report = report.clone();
            move || [("acme".to_string(), report.load(Ordering::Relaxed))].into()
        })),
    };
    let (peer, peer_task) = ractor::Actor::spawn(None, HeartbeatActor, beat("a"))
        .await
        .unwrap();
    let (acme, beta) = (Tenant::new("acme").unwrap(), Tenant::new("beta").unwrap());
    let seen_by_b = PeerCounts::watch(kv.clone(), "echo", "b");
    let seen_by_a = PeerCounts::watch(kv.clone(), "echo", "a");
    let other_service = PeerCounts::watch(kv.clone(), "echo2", "b");
    eventually_true("b hears a's report", Duration::from_secs(10), || async {
        seen_by_b.held(&acme) == 2
    })
    .await;
    assert_eq!(seen_by_b.held(&beta), 0, "only what was reported");
    held.store(1, Ordering::Relaxed);
    eventually_true(
        "b follows a's next beat",
        Duration::from_secs(10),
        || async { seen_by_b.held(&acme) == 1 },
    )
    .await;
    assert_eq!(seen_by_a.held(&acme), 0, "an instance is not its own peer");
    assert_eq!(
        other_service.held(&acme),
        0,
        "another service's beats are not peers"
    );
    // Killed, like a crash: nothing deletes the key, its TTL does, and the report goes.
    peer.kill();
    peer_task.await.unwrap();
    eventually_true(
        "a crashed peer's report goes with its key",
        Duration::from_secs(10),
        || async { seen_by_b.held(&acme) == 0 },
    )
    .await;
}

#[tokio::test]
async fn shutdown_finishes_in_flight_requests_and_refuses_new_ones() {
    let nats = NatsServer::start();
    let rt = start_echo(&nats.url(), "shut", EndpointOptions::default()).await;
    let client = test_support::connect(&nats.url()).await;
    let caller = caller(client.clone(), Duration::from_secs(10));
    let mut in_flight = Vec::new();
    for i in 0..5 {
        let caller = caller.clone();
        let req = EchoReq {
            text: format!("r{i}"),
            delay_ms: 800,
            fail_with: None,
            repeat: 0,
        };
        in_flight.push(tokio::spawn(async move {
            caller
                .request::<_, EchoResp>(ECHO_SUBJECT.into(), &req)
                .await
        }));
    }
    eventually_true("5 requests in flight", Duration::from_secs(5), || async {
        started("shut") == 5
    })
    .await;
    let finished = rt.shutdown().await;
    assert!(
        finished,
        "all in-flight requests finished within the grace period"
    );
    for (i, r) in in_flight.into_iter().enumerate() {
        assert_eq!(r.await.unwrap().unwrap().text, format!("r{i}"));
    }
    let req = EchoReq {
        text: "late".into(),
        delay_ms: 0,
        fail_with: None,
        repeat: 0,
    };
    let err = caller
        .request::<_, EchoResp>(ECHO_SUBJECT.into(), &req)
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::NoResponders { .. }), "{err:?}");
}

#[tokio::test]
async fn a_reply_too_large_for_nats_is_an_error_not_a_silent_timeout() {
    // A small max payload, so a modest reply is too large to carry.
    let nats = NatsServer::start_with_config("max_payload: 65536");
    let rt = start_echo(&nats.url(), "big", EndpointOptions::default()).await;
    let client = test_support::connect(&nats.url()).await;
    let caller = caller(client, Duration::from_secs(20));
    let req = EchoReq {
        text: "x".repeat(20_000),
        delay_ms: 0,
        fail_with: None,
        repeat: 5,
    };
    let err = caller
        .request::<_, EchoResp>(ECHO_SUBJECT.into(), &req)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ClientError::Service { body, .. } if body.kind == ErrorKind::Internal),
        "{err:?}"
    );
    rt.shutdown().await;
}

/// A sessions bucket an earlier version made without limit markers: opening it turns them on,
/// and the purge with a TTL the session reaper makes (a closed session's record) then works —
/// before, it failed at every sweep.
#[tokio::test]
async fn a_bucket_made_without_limit_markers_gets_them_when_opened() {
    let nats = NatsServer::start();
    let client = test_support::connect(&nats.url()).await;
    let js = async_nats::jetstream::new(client.clone());
    let subjects = messages::Subjects::default();
    let old = js
        .create_key_value(async_nats::jetstream::kv::Config {
            bucket: subjects.sessions_bucket(),
            history: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    old.put("s1", "open".into()).await.unwrap();
    async fn markers(
        js: &async_nats::jetstream::Context,
        bucket: &str,
    ) -> (bool, Option<Duration>) {
        let mut stream = js.get_stream(format!("KV_{bucket}")).await.unwrap();
        let config = stream.info().await.unwrap().config.clone();
        (config.allow_message_ttl, config.subject_delete_marker_ttl)
    }
    let bucket = subjects.sessions_bucket();
    assert_eq!(
        markers(&js, &bucket).await,
        (false, None),
        "made the old way"
    );
    let revision = old.entry("s1").await.unwrap().unwrap().revision;
    assert!(
        old.purge_expect_revision_with_ttl("s1", revision, Duration::from_secs(60))
            .await
            .is_err(),
        "a purge with a TTL needs the markers"
    );

    let kv = kit::bootstrap::sessions_kv(&js, &subjects, 1)
        .await
        .unwrap();
    assert_eq!(
        markers(&js, &bucket).await,
        (true, Some(Duration::from_secs(60)))
    );
    assert_eq!(kv.get("s1").await.unwrap().as_deref(), Some(&b"open"[..]));
    let revision = kv.entry("s1").await.unwrap().unwrap().revision;
    kv.purge_expect_revision_with_ttl("s1", revision, Duration::from_secs(60))
        .await
        .expect("the purge the reaper makes");
    assert!(kv.get("s1").await.unwrap().is_none());
    // Opening it again changes nothing.
    kit::bootstrap::sessions_kv(&js, &subjects, 1)
        .await
        .unwrap();
}

/// How a service calls another, with a test's timeout.
fn caller(client: async_nats::Client, timeout: Duration) -> MeshClient {
    kit::mesh_client(client, Default::default()).with_timeout(timeout)
}
