//! Decisions by people over a real nats-server: approve, deny, timeout, conflicts, bad input,
//! listing and idempotency.

use crate::common::*;
use messages::confirm::{ConfirmList, ConfirmListReply, ConfirmScope, ConfirmState};
use messages::subjects::ConfirmOp;
use messages::ErrorKind;
use test_support::NatsServer;

#[tokio::test]
async fn approval_releases_the_waiting_request_and_is_announced() {
    let nats = NatsServer::start();
    let instance = Instance::start(&nats.url(), "a").await;
    let client = connect(&nats.url()).await;
    let c = caller(&client);
    let mut events = confirm_events(&client).await;

    let req = request(Some("s1"), &["net.socket"], true);
    let waiting = ask_in_background(&c, req.clone());
    let pending = pending_event(&mut events, req.execution_id.as_deref().unwrap()).await;
    assert_eq!(pending.state, ConfirmState::Pending);
    assert_eq!(pending.summary, req.summary);
    assert_eq!(pending.risk, req.risk);
    assert_eq!(
        get(&c, &pending.id).await.unwrap().state,
        ConfirmState::Pending
    );

    let decided = decide(
        &c,
        &decision(&pending.id, true, "alice", ConfirmScope::Once),
    )
    .await
    .unwrap();
    assert_eq!(decided.state, ConfirmState::Approved);
    assert_eq!(decided.by.as_deref(), Some("alice"));
    assert!(decided.decided_at.is_some());

    let released = within("waiter released", waiting).await.unwrap().unwrap();
    assert_eq!(released, decided);
    let (subject, event) = next_event(&mut events).await;
    assert_eq!(subject, subjects().confirm_decided(None, &pending.id));
    assert_eq!(event, decided);
    assert_eq!(get(&c, &pending.id).await.unwrap(), decided);
    instance.stop().await;
}

#[tokio::test]
async fn denial_with_a_reason() {
    let nats = NatsServer::start();
    let instance = Instance::start(&nats.url(), "a").await;
    let c = caller(&connect(&nats.url()).await);

    let pending = ask(&c, &request(None, &["fs.delete"], false))
        .await
        .unwrap();
    assert_eq!(pending.state, ConfirmState::Pending);
    let waiting = ask_in_background(
        &c,
        messages::confirm::ConfirmRequest {
            wait: true,
            ..request_for(&pending)
        },
    );
    let denied = decide(&c, &decision(&pending.id, false, "bob", ConfirmScope::Once))
        .await
        .unwrap();
    assert_eq!(denied.state, ConfirmState::Denied);
    assert_eq!(denied.reason.as_deref(), Some("not on a Friday"));
    assert_eq!(within("waiter", waiting).await.unwrap().unwrap(), denied);
    instance.stop().await;
}

/// The same execution asked again (the idempotency key).
fn request_for(c: &messages::confirm::Confirmation) -> messages::confirm::ConfirmRequest {
    messages::confirm::ConfirmRequest {
        execution_id: c.execution_id.clone(),
        ..request(None, &[], false)
    }
}

#[tokio::test]
async fn an_unanswered_request_times_out_as_denied_and_stays_decided() {
    let nats = NatsServer::start();
    let instance = Instance::start(&nats.url(), "a").await;
    let c = caller(&connect(&nats.url()).await);

    let mut req = request(None, &["net.socket"], true);
    req.timeout_ms = Some(300);
    let timed_out = ask(&c, &req).await.unwrap();
    assert_eq!(timed_out.state, ConfirmState::Timeout);
    assert_eq!(timed_out.by.as_deref(), Some("policy:timeout"));
    assert!(timed_out.decided_at.unwrap() >= timed_out.expires_at);

    let late = decide(
        &c,
        &decision(&timed_out.id, true, "alice", ConfirmScope::Once),
    )
    .await
    .unwrap_err();
    assert_eq!(late.kind(), ErrorKind::Conflict);
    assert_eq!(get(&c, &timed_out.id).await.unwrap(), timed_out);
    instance.stop().await;
}

#[tokio::test]
async fn a_second_decision_is_a_conflict_and_the_first_stands() {
    let nats = NatsServer::start();
    let instance = Instance::start(&nats.url(), "a").await;
    let c = caller(&connect(&nats.url()).await);

    let pending = ask(&c, &request(None, &["net.socket"], false))
        .await
        .unwrap();
    let first = decide(
        &c,
        &decision(&pending.id, true, "alice", ConfirmScope::Once),
    )
    .await
    .unwrap();
    let second = decide(
        &c,
        &decision(&pending.id, false, "mallory", ConfirmScope::Once),
    )
    .await
    .unwrap_err();
    assert_eq!(second.kind(), ErrorKind::Conflict);
    let body = second.into_body();
    assert_eq!(body.code, 409);
    let kept: messages::confirm::Confirmation =
        serde_json::from_value(body.details.unwrap()["confirmation"].clone()).unwrap();
    assert_eq!(kept, first);
    assert_eq!(get(&c, &pending.id).await.unwrap(), first);
    instance.stop().await;
}

#[tokio::test]
async fn concurrent_decisions_have_exactly_one_winner() {
    let nats = NatsServer::start();
    let instance = Instance::start(&nats.url(), "a").await;
    let c = caller(&connect(&nats.url()).await);

    let pending = ask(&c, &request(None, &["net.socket"], false))
        .await
        .unwrap();
    let attempts: Vec<_> = (0..8)
        .map(|i| {
            let c = c.clone();
            let d = decision(
                &pending.id,
                i % 2 == 0,
                &format!("person-{i}"),
                ConfirmScope::Once,
            );
            tokio::spawn(async move { decide(&c, &d).await })
        })
        .collect();
    let mut winners = Vec::new();
    for a in attempts {
        match within("decision", a).await.unwrap() {
            Ok(record) => winners.push(record),
            Err(e) => assert_eq!(e.kind(), ErrorKind::Conflict),
        }
    }
    assert_eq!(winners.len(), 1, "{winners:?}");
    assert_eq!(get(&c, &pending.id).await.unwrap(), winners[0]);
    instance.stop().await;
}

#[tokio::test]
async fn unknown_ids_are_not_found() {
    let nats = NatsServer::start();
    let instance = Instance::start(&nats.url(), "a").await;
    let c = caller(&connect(&nats.url()).await);
    let id = messages::new_id();
    assert_eq!(get(&c, &id).await.unwrap_err().kind(), ErrorKind::NotFound);
    let e = decide(&c, &decision(&id, true, "alice", ConfirmScope::Once))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    instance.stop().await;
}

#[tokio::test]
async fn malformed_requests_are_refused_with_400() {
    let nats = NatsServer::start();
    let instance = Instance::start(&nats.url(), "a").await;
    let client = connect(&nats.url()).await;
    let c = caller(&client);
    let s = subjects();

    // Not JSON, wrong types, missing required fields.
    for (op, payload) in [
        (ConfirmOp::Request, "{not json"),
        (
            ConfirmOp::Request,
            r#"{"risk": {"level": "apocalyptic", "suggested_tier": "session"}}"#,
        ),
        (ConfirmOp::Decide, r#"{"id": "01J"}"#),
        (
            ConfirmOp::Decide,
            r#"{"id": "01J", "approve": "yes", "by": "alice"}"#,
        ),
        (ConfirmOp::Get, r#"{}"#),
        (ConfirmOp::List, r#"{"state": "maybe"}"#),
    ] {
        let reply = client
            .request(s.confirm(op), payload.as_bytes().to_vec().into())
            .await
            .unwrap();
        let code = reply
            .headers
            .as_ref()
            .and_then(|h| h.get(messages::codec::SERVICE_ERROR_CODE))
            .map(|v| v.as_str().to_string());
        assert_eq!(code.as_deref(), Some("400"), "{op:?} {payload}");
    }

    // Well-formed but invalid values.
    let mut bad_exec = request(None, &[], false);
    bad_exec.execution_id = Some("../etc".into());
    let mut zero_timeout = request(None, &[], false);
    zero_timeout.timeout_ms = Some(0);
    let mut huge_summary = request(None, &[], false);
    huge_summary.summary = "x".repeat(10_000);
    for req in [bad_exec, zero_timeout, huge_summary] {
        assert_eq!(
            ask(&c, &req).await.unwrap_err().kind(),
            ErrorKind::BadRequest
        );
    }
    let pending = ask(&c, &request(None, &["r"], false)).await.unwrap();
    for d in [
        decision("a.b", true, "alice", ConfirmScope::Once),
        decision(&pending.id, true, "", ConfirmScope::Once),
        decision(&pending.id, false, "alice", ConfirmScope::Session),
        // No session to scope the approval to.
        decision(&pending.id, true, "alice", ConfirmScope::Session),
    ] {
        assert_eq!(
            decide(&c, &d).await.unwrap_err().kind(),
            ErrorKind::BadRequest,
            "{d:?}"
        );
    }
    let bad_list: Result<ConfirmListReply, _> = c
        .request(
            s.confirm(ConfirmOp::List),
            &ConfirmList {
                limit: Some(0),
                ..Default::default()
            },
        )
        .await;
    assert_eq!(bad_list.unwrap_err().kind(), ErrorKind::BadRequest);
    // None of that decided anything.
    assert_eq!(
        get(&c, &pending.id).await.unwrap().state,
        ConfirmState::Pending
    );
    instance.stop().await;
}

#[tokio::test]
async fn list_shows_pending_by_default_and_filters_by_session_and_state() {
    let nats = NatsServer::start();
    let instance = Instance::start(&nats.url(), "a").await;
    let c = caller(&connect(&nats.url()).await);
    let list = |filter: ConfirmList| {
        let c = c.clone();
        async move {
            let reply: ConfirmListReply = c
                .request(subjects().confirm(ConfirmOp::List), &filter)
                .await
                .unwrap();
            reply
                .confirmations
                .into_iter()
                .map(|c| c.id)
                .collect::<Vec<_>>()
        }
    };

    let a = ask(&c, &request(Some("s1"), &["r"], false)).await.unwrap();
    let b = ask(&c, &request(Some("s2"), &["r"], false)).await.unwrap();
    let d = ask(&c, &request(Some("s1"), &["r"], false)).await.unwrap();
    // Right after the writes: list reads its own writes, newest first.
    assert_eq!(
        list(ConfirmList::default()).await,
        vec![d.id.clone(), b.id.clone(), a.id.clone()]
    );
    assert_eq!(
        list(ConfirmList {
            session_id: Some("s1".into()),
            ..Default::default()
        })
        .await,
        vec![d.id.clone(), a.id.clone()]
    );
    decide(&c, &decision(&a.id, true, "alice", ConfirmScope::Once))
        .await
        .unwrap();
    assert_eq!(
        list(ConfirmList::default()).await,
        vec![d.id.clone(), b.id.clone()]
    );
    assert_eq!(
        list(ConfirmList {
            state: Some(ConfirmState::Approved),
            ..Default::default()
        })
        .await,
        vec![a.id.clone()]
    );
    assert_eq!(
        list(ConfirmList {
            limit: Some(1),
            ..Default::default()
        })
        .await,
        vec![d.id.clone()]
    );
    instance.stop().await;
}

#[tokio::test]
async fn the_same_execution_gets_the_same_confirmation() {
    let nats = NatsServer::start();
    let instance = Instance::start(&nats.url(), "a").await;
    let c = caller(&connect(&nats.url()).await);

    let req = request(Some("s1"), &["r"], false);
    let asks: Vec<_> = (0..4).map(|_| ask_in_background(&c, req.clone())).collect();
    let mut ids = Vec::new();
    for a in asks {
        ids.push(within("ask", a).await.unwrap().unwrap().id);
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "one confirmation per execution: {ids:?}");
    let decided = decide(&c, &decision(&ids[0], true, "alice", ConfirmScope::Once))
        .await
        .unwrap();
    assert_eq!(ask(&c, &req).await.unwrap(), decided);
    instance.stop().await;
}
