//! `ConfirmClient`, `RiskClient`, `AuditClient` and `StatusClient` against the real confirmation service and
//! risk-assessor: round trips, the watch, error kinds, discovery.

use std::time::Duration;

use crate::common::{Mesh, BOUND};
use futures::StreamExt;
use messages::audit::{AuditDetails, AuditKind};
use messages::confirm::{ConfirmDecide, ConfirmList, ConfirmRequest, ConfirmScope, ConfirmState};
use messages::risk::{AssessRequest, ContentType, RiskAssessment, RiskLevel};
use messages::ServiceName;
use sandmesh_client::audit::AuditQuery;
use sandmesh_client::ErrorKind;

fn pending(session: &str) -> ConfirmRequest {
    ConfirmRequest {
        execution_id: Some(messages::new_id()),
        session_id: Some(session.into()),
        risk: RiskAssessment {
            level: RiskLevel::High,
            requires_confirmation: true,
            ..Default::default()
        },
        summary: "opens a socket".into(),
        timeout_ms: Some(60_000),
        wait: false,
        ..Default::default()
    }
}

fn decision(id: &str, approve: bool) -> ConfirmDecide {
    ConfirmDecide {
        by_account: None,
        id: id.into(),
        approve,
        by: "alice".into(),
        reason: None,
        scope: ConfirmScope::Once,
    }
}

#[tokio::test]
async fn confirmations_are_asked_listed_decided_and_watched() {
    let mesh = Mesh::new()
        .await
        .confirmation()
        .ready(ServiceName::Confirmation)
        .await;
    let confirm = mesh.client.confirm();
    let mut events = confirm.watch().await.unwrap();

    let asked = confirm.request(&pending("s1")).await.unwrap();
    assert_eq!(asked.state, ConfirmState::Pending);
    let listed = confirm
        .list(&ConfirmList {
            session_id: Some("s1".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        listed.iter().map(|c| &c.id).collect::<Vec<_>>(),
        [&asked.id]
    );

    let decided = confirm.decide(&decision(&asked.id, true)).await.unwrap();
    assert_eq!(decided.state, ConfirmState::Approved);
    assert_eq!(
        confirm.get(&asked.id).await.unwrap().by.as_deref(),
        Some("alice")
    );

    // The watch saw both changes, in order.
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let event = tokio::time::timeout(BOUND, events.next())
            .await
            .expect("an event");
        let c = event.expect("open").expect("decodes");
        if c.id == asked.id {
            seen.push(c.state);
        }
    }
    assert_eq!(seen, [ConfirmState::Pending, ConfirmState::Approved]);

    let again = confirm
        .decide(&decision(&asked.id, false))
        .await
        .unwrap_err();
    assert_eq!(again.kind(), ErrorKind::Conflict, "{again}");
    let unknown = confirm.get(&messages::new_id()).await.unwrap_err();
    assert_eq!(unknown.kind(), ErrorKind::NotFound, "{unknown}");
}

#[tokio::test]
async fn risk_is_assessed_and_oversized_content_is_too_large() {
    let mesh = Mesh::new()
        .await
        .risk_assessor()
        .ready(ServiceName::RiskAssessor)
        .await;
    let risk = mesh.client.risk();
    let assess = |content: String| AssessRequest {
        content,
        content_type: ContentType::Shell,
        params: None,
        mode: None,
        files: Vec::new(),
    };
    let safe = risk.assess(&assess("echo hello".into())).await.unwrap();
    assert_eq!(safe.level, RiskLevel::Safe);
    let wipe = risk.assess(&assess("rm -rf /".into())).await.unwrap();
    assert!(wipe.level >= RiskLevel::High, "{wipe:?}");
    let huge = risk
        .assess(&assess("#".repeat(300 * 1024)))
        .await
        .unwrap_err();
    assert_eq!(huge.kind(), ErrorKind::TooLarge, "{huge}");
}

#[tokio::test]
async fn status_finds_instances_and_their_heartbeats() {
    let mesh = Mesh::new()
        .await
        .confirmation()
        .ready(ServiceName::Confirmation)
        .await;
    let status = mesh.client.status();
    let window = Duration::from_millis(300);
    let pings = status.ping(None, window).await.unwrap();
    assert_eq!(pings.len(), 1, "{pings:?}");
    assert_eq!(pings[0].service_name(), Some(ServiceName::Confirmation));
    assert!(status
        .ping(Some(ServiceName::Scheduler), window)
        .await
        .unwrap()
        .is_empty());
    let info = status
        .info(Some(ServiceName::Confirmation), window)
        .await
        .unwrap();
    assert!(info[0].endpoints.len() >= 4, "request, decide, get, list");

    let beats = test_support::eventually("a heartbeat", BOUND, || {
        let status = status.clone();
        async move { status.heartbeats().await.ok().filter(|b| !b.is_empty()) }
    })
    .await;
    let key = ServiceName::Confirmation.heartbeat_key(&pings[0].instance_id);
    assert_eq!(beats[0].key(), key);
}

#[tokio::test]
async fn a_service_nobody_runs_is_unavailable_and_a_slow_one_times_out() {
    let mesh = Mesh::new().await;
    let e = mesh.client.confirm().get("01J").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");

    // Someone listens but never answers.
    let subject = mesh.client.subjects().risk_assess();
    let _silent = mesh.client.nats().subscribe(subject).await.unwrap();
    mesh.client.nats().flush().await.unwrap();
    let quick = mesh.client.clone().with_timeout(Duration::from_millis(200));
    let req = AssessRequest {
        content: "echo".into(),
        content_type: ContentType::Shell,
        params: None,
        mode: None,
        files: Vec::new(),
    };
    let e = quick.risk().assess(&req).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
}

#[tokio::test]
async fn the_audit_trail_is_read_to_its_end_or_followed() {
    let mesh = Mesh::new()
        .await
        .confirmation()
        .ready(ServiceName::Confirmation)
        .await;
    let confirm = mesh.client.confirm();
    let audit = mesh.client.audit();
    let first = confirm.request(&pending("s1")).await.unwrap();
    confirm.decide(&decision(&first.id, true)).await.unwrap();

    // Events are stored in the background: read the trail until the decision is in it. Each
    // read ends by itself at the end of the trail.
    let decided = AuditQuery {
        kind: Some(AuditKind::ConfirmationDecided.as_str().into()),
        last: 100,
        follow: false,
    };
    let events = test_support::eventually("the decision in the trail", BOUND, || {
        let audit = audit.clone();
        let decided = decided.clone();
        async move {
            let events = audit.events(&decided).await.ok()?;
            let read = tokio::time::timeout(BOUND, events.collect::<Vec<_>>());
            let events = read.await.expect("a read ends at the trail's end");
            Some(events).filter(|e| !e.is_empty())
        }
    })
    .await;
    let event = events.into_iter().next().unwrap().unwrap();
    let AuditDetails::ConfirmationDecided(decided) = &event.details else {
        panic!("{event:?}");
    };
    assert_eq!(decided.id, first.id);

    // Following from now on: only what happens next.
    let follow = AuditQuery {
        kind: None,
        last: 0,
        follow: true,
    };
    let mut live = audit.events(&follow).await.unwrap();
    let second = confirm.request(&pending("s2")).await.unwrap();
    let next = tokio::time::timeout(BOUND, live.next())
        .await
        .expect("a new event");
    let event = next.expect("open").expect("decodes");
    assert_eq!(event.kind(), AuditKind::ConfirmationRequested);
    assert_eq!(
        event.session_id.as_deref(),
        Some("s2"),
        "{event:?} for {}",
        second.id
    );
}

#[tokio::test]
async fn every_request_carries_the_hooks_headers() {
    let mesh = Mesh::new().await;
    let nats = mesh.client.nats().clone();
    let mut requests = nats.subscribe("test.echo").await.unwrap();
    // Answers with the `traceparent` it was sent, as JSON.
    let echo = tokio::spawn(async move {
        let msg = requests.next().await.expect("a request");
        let header = msg.headers.as_ref().and_then(|h| h.get("traceparent"));
        let seen = serde_json::json!(header.map(|v| v.as_str().to_string()));
        let reply = msg.reply.expect("a reply subject");
        nats.publish(reply, serde_json::to_vec(&seen).unwrap().into())
            .await
            .unwrap();
    });
    fn trace(headers: &mut async_nats::HeaderMap) {
        headers.insert(
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        );
    }
    let traced = mesh
        .client
        .clone()
        .with_encoding(messages::Encoding::Json)
        .with_headers(trace);
    let seen: Option<String> = traced.request("test.echo".into(), &()).await.unwrap();
    assert_eq!(
        seen.as_deref(),
        Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    );
    echo.await.unwrap();
}
