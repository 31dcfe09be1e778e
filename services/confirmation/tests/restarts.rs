//! Nothing is lost: restarts of the service and of NATS, and two instances sharing the work.

use crate::common::*;
use async_nats::jetstream;
use messages::audit::AuditKind;
use messages::confirm::{ConfirmScope, ConfirmState};
use messages::subjects::ConfirmOp;
use messages::ErrorKind;
use test_support::NatsServer;

#[tokio::test]
async fn a_service_restart_between_request_and_decision_loses_nothing() {
    let nats = NatsServer::start();
    let a = Instance::start(&nats.url(), "a").await;
    let client = connect(&nats.url()).await;
    let js = jetstream::new(client.clone());
    let c = caller(&client);
    let mut events = confirm_events(&client).await;

    let req = request(Some("s1"), &["net.socket"], true);
    let execution_id = req.execution_id.clone().unwrap();
    let waiting = ask_in_background(&c, req.clone());
    let pending = pending_event(&mut events, &execution_id).await;
    let mut short = request(None, &["r"], false);
    short.timeout_ms = Some(500);
    let expiring = ask(&c, &short).await.unwrap();

    // The instance holding the waiter stops: the waiter gets an error it can retry.
    a.stop().await;
    let error = within("waiter answered", waiting)
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Unavailable, "{error}");

    let a = Instance::start(&nats.url(), "a").await;
    // Retrying the same execution waits on the same confirmation, not a new one.
    let waiting = ask_in_background(&c, req.clone());
    eventually("the retried request waits", || {
        let js = js.clone();
        async move {
            let n = heartbeat_metric(&js, "a", "confirmation_waiters").await?;
            (n == 1.0).then_some(())
        }
    })
    .await;
    let decided = decide(
        &c,
        &decision(&pending.id, true, "alice", ConfirmScope::Once),
    )
    .await
    .unwrap();
    let released = within("waiter released", waiting).await.unwrap().unwrap();
    assert_eq!(released, decided);
    assert_eq!(released.id, pending.id);

    // The expiry of a request made before the restart is applied by the new instance.
    let expired = eventually("expiry after restart", || {
        let c = c.clone();
        let id = expiring.id.clone();
        async move { Some(get(&c, &id).await.unwrap()).filter(|r| r.state.is_final()) }
    })
    .await;
    assert_eq!(expired.state, ConfirmState::Timeout);

    let kinds = eventually("audit events", || {
        let js = js.clone();
        let execution_id = execution_id.clone();
        async move {
            let kinds: Vec<AuditKind> = audit_events(&js, &execution_id)
                .await
                .into_iter()
                .map(|e| e.kind())
                .collect();
            (kinds.len() >= 2).then_some(kinds)
        }
    })
    .await;
    assert_eq!(
        kinds,
        vec![
            AuditKind::ConfirmationRequested,
            AuditKind::ConfirmationDecided
        ]
    );
    a.stop().await;
}

#[tokio::test]
async fn a_decision_taken_while_the_requesters_instance_is_down_is_found_on_asking_again() {
    let nats = NatsServer::start();
    let a = Instance::start(&nats.url(), "a").await;
    let client = connect(&nats.url()).await;
    let c = caller(&client);
    let mut events = confirm_events(&client).await;

    let req = request(None, &["net.socket"], true);
    let waiting = ask_in_background(&c, req.clone());
    let pending = pending_event(&mut events, req.execution_id.as_deref().unwrap()).await;
    let b = Instance::start(&nats.url(), "b").await;
    a.stop().await;
    assert_eq!(
        within("waiter", waiting).await.unwrap().unwrap_err().kind(),
        ErrorKind::Unavailable
    );

    let decided = decide(&c, &decision(&pending.id, false, "bob", ConfirmScope::Once))
        .await
        .unwrap();
    assert_eq!(ask(&c, &req).await.unwrap(), decided);
    b.stop().await;
}

#[tokio::test]
async fn a_nats_restart_loses_nothing_pending() {
    let mut nats = NatsServer::start();
    let a = Instance::start(&nats.url(), "a").await;
    let client = connect(&nats.url()).await;
    let c = caller(&client);

    let mut events = confirm_events(&client).await;
    let kept = ask(&c, &request(Some("s1"), &["net.socket"], false))
        .await
        .unwrap();
    let held = request(None, &["net.socket"], true);
    let waiting = ask_in_background(&c, held.clone());
    let held = pending_event(&mut events, held.execution_id.as_deref().unwrap()).await;
    let mut short = request(None, &["r"], false);
    short.timeout_ms = Some(1500);
    let expiring = ask(&c, &short).await.unwrap();

    nats.restart();

    let impatient = kit::mesh_client(client.clone(), Default::default())
        .with_timeout(std::time::Duration::from_secs(1))
        .with_encoding(messages::Encoding::Json);
    let after = eventually("service answers after the NATS restart", || {
        let c = impatient.clone();
        let id = kept.id.clone();
        async move { get(&c, &id).await.ok() }
    })
    .await;
    assert_eq!(after, kept);
    let decided = decide(&c, &decision(&kept.id, true, "alice", ConfirmScope::Once))
        .await
        .unwrap();
    assert_eq!(decided.state, ConfirmState::Approved);
    // A request waiting through the restart is answered by a decision after it.
    let decided = decide(&c, &decision(&held.id, true, "alice", ConfirmScope::Once))
        .await
        .unwrap();
    assert_eq!(within("waiter", waiting).await.unwrap().unwrap(), decided);
    // The watch feeding the registry recovered: a request written after the restart is listed
    // (the pending list is read from the watch's replica).
    let fresh = ask(&c, &request(None, &["r"], false)).await.unwrap();
    let listed: messages::confirm::ConfirmListReply = c
        .request(
            subjects().confirm(ConfirmOp::List),
            &messages::confirm::ConfirmList::default(),
        )
        .await
        .unwrap();
    assert!(listed.confirmations.iter().any(|l| l.id == fresh.id));
    // The expiry of a request from before the restart still applies; a waiter sees it.
    let mut req = request(None, &["r"], true);
    req.execution_id = expiring.execution_id.clone();
    let timed_out = within("expiry after NATS restart", ask(&c, &req))
        .await
        .unwrap();
    assert_eq!(timed_out.id, expiring.id);
    assert_eq!(timed_out.state, ConfirmState::Timeout);
    a.stop().await;
}

#[tokio::test]
async fn a_decision_through_either_instance_releases_waiters_held_by_the_other() {
    const WAITERS: usize = 16;
    let nats = NatsServer::start();
    let a = Instance::start(&nats.url(), "a").await;
    let client = connect(&nats.url()).await;
    let js = jetstream::new(client.clone());
    let c = caller(&client);
    let mut events = confirm_events(&client).await;

    // Only `a` runs, so `a` holds every waiter.
    let mut waiting = Vec::new();
    let mut ids = Vec::new();
    for _ in 0..WAITERS {
        let req = request(None, &["net.socket"], true);
        waiting.push(ask_in_background(&c, req.clone()));
        ids.push(
            pending_event(&mut events, req.execution_id.as_deref().unwrap())
                .await
                .id,
        );
    }
    eventually("a holds every waiter", || {
        let js = js.clone();
        async move {
            let n = heartbeat_metric(&js, "a", "confirmation_waiters").await?;
            (n == WAITERS as f64).then_some(())
        }
    })
    .await;

    // Decisions now go to either instance (one queue group).
    let b = Instance::start(&nats.url(), "b").await;
    for (id, waiter) in ids.iter().zip(waiting) {
        let decided = decide(&c, &decision(id, true, "alice", ConfirmScope::Once))
            .await
            .unwrap();
        assert_eq!(
            within("waiter released", waiter).await.unwrap().unwrap(),
            decided
        );
    }
    let served = requests_served(&client, &subjects().confirm(ConfirmOp::Decide), 2).await;
    let by_b = served.iter().find(|(i, _)| i == "b").map(|(_, n)| *n);
    // The chance that all 16 went to `a` is 2^-16.
    assert!(by_b.unwrap_or(0) > 0, "b decided none: {served:?}");
    b.stop().await;
    a.stop().await;
}
