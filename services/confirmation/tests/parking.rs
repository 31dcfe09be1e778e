//! The contract a parked execution relies on: `confirm.request` without `wait` answers at once
//! with the pending confirmation (id, expiry), and `confirm.decided.<id>` follows for every
//! final state — approval, denial and expiry — also when nobody waits and across a restart of
//! this service.

use crate::common::*;
use messages::confirm::{ConfirmScope, ConfirmState, Confirmation};
use test_support::NatsServer;

/// The `decided` event of confirmation `id`, skipping every other event.
async fn decided_event(sub: &mut async_nats::Subscriber, id: &str) -> Confirmation {
    loop {
        let (subject, record) = next_event(sub).await;
        if subject == subjects().confirm_decided(None, id) {
            return record;
        }
    }
}

#[tokio::test]
async fn without_wait_the_pending_confirmation_comes_at_once_and_decisions_are_announced() {
    let nats = NatsServer::start();
    let instance = Instance::start(&nats.url(), "a").await;
    let client = connect(&nats.url()).await;
    let c = caller(&client);
    let mut events = confirm_events(&client).await;

    let approved = ask(&c, &request(None, &["net.socket"], false))
        .await
        .unwrap();
    assert_eq!(approved.state, ConfirmState::Pending);
    assert_eq!(approved.expires_at - approved.created_at, 60_000);
    let denied = ask(&c, &request(None, &["net.socket"], false))
        .await
        .unwrap();

    let yes = decide(
        &c,
        &decision(&approved.id, true, "alice", ConfirmScope::Once),
    )
    .await
    .unwrap();
    assert_eq!(decided_event(&mut events, &approved.id).await, yes);
    let no = decide(&c, &decision(&denied.id, false, "bob", ConfirmScope::Once))
        .await
        .unwrap();
    assert_eq!(decided_event(&mut events, &denied.id).await, no);
    instance.stop().await;
}

#[tokio::test]
async fn an_expiry_is_announced_though_nobody_waits() {
    let nats = NatsServer::start();
    let instance = Instance::start(&nats.url(), "a").await;
    let client = connect(&nats.url()).await;
    let c = caller(&client);
    let mut events = confirm_events(&client).await;

    let mut req = request(None, &["net.socket"], false);
    req.timeout_ms = Some(500);
    let pending = ask(&c, &req).await.unwrap();
    assert_eq!(pending.state, ConfirmState::Pending);

    let expired = decided_event(&mut events, &pending.id).await;
    assert_eq!(expired.state, ConfirmState::Timeout);
    assert_eq!(expired.by.as_deref(), Some("policy:timeout"));
    assert_eq!(get(&c, &pending.id).await.unwrap(), expired);
    instance.stop().await;
}

#[tokio::test]
async fn a_restarted_service_keeps_pending_confirmations_and_expires_them_on_time() {
    /// How late an expiry may be announced: the restarted instance's timers, not a sweep.
    const LATENESS_MS: u64 = 2_000;
    let nats = NatsServer::start();
    let first = Instance::start(&nats.url(), "a").await;
    let client = connect(&nats.url()).await;
    let c = caller(&client);
    let mut events = confirm_events(&client).await;

    let mut req = request(None, &["net.socket"], false);
    req.timeout_ms = Some(3_000);
    let pending = ask(&c, &req).await.unwrap();
    first.stop().await;

    let second = Instance::start(&nats.url(), "a").await;
    // A parked execution asking again (say, after its scheduler restarted) finds the same one.
    let again = ask(&c, &req).await.unwrap();
    assert_eq!(again, pending);

    let expired = decided_event(&mut events, &pending.id).await;
    assert_eq!(expired.state, ConfirmState::Timeout);
    let decided_at = expired.decided_at.unwrap();
    assert!(decided_at >= pending.expires_at);
    assert!(
        decided_at - pending.expires_at < LATENESS_MS,
        "announced {} ms after its expiry",
        decided_at - pending.expires_at
    );
    second.stop().await;
}
