//! Decisions without a person: configured policies, session-scoped approvals, timeouts that
//! approve (when so configured).

use std::time::Duration;

use crate::common::*;
use confirmation::{PolicyConfig, TimeoutAction};
use messages::confirm::{ConfirmScope, ConfirmState};
use messages::risk::RiskLevel;
use test_support::NatsServer;

#[tokio::test]
async fn a_session_scoped_approval_covers_the_same_rules_for_that_session_only() {
    let nats = NatsServer::start();
    let instance = Instance::start(&nats.url(), "a").await;
    let c = caller(&connect(&nats.url()).await);

    let first = ask(&c, &request(Some("s1"), &["net.socket", "fs.write"], false))
        .await
        .unwrap();
    // Already waiting in the same session, covered by the grant to come.
    let queued = ask(&c, &request(Some("s1"), &["net.socket"], false))
        .await
        .unwrap();
    let watcher = connect(&nats.url()).await;
    let mut queued_events = watcher
        .subscribe(subjects().confirm_decided(None, &queued.id))
        .await
        .unwrap();
    kit::connect::sync_with_server(&watcher).await.unwrap();
    decide(
        &c,
        &decision(&first.id, true, "alice", ConfirmScope::Session),
    )
    .await
    .unwrap();

    let covered = ask(&c, &request(Some("s1"), &["fs.write"], true))
        .await
        .unwrap();
    assert_eq!(covered.state, ConfirmState::Approved);
    assert_eq!(covered.by.as_deref(), Some("session-scope:alice"));

    let (_, settled) = next_event(&mut queued_events).await;
    assert_eq!(settled.state, ConfirmState::Approved);
    assert_eq!(settled.by.as_deref(), Some("session-scope:alice"));

    // A new rule in the same session, or the same rule in another session, needs a person.
    let new_rule = ask(
        &c,
        &request(Some("s1"), &["net.socket", "proc.exec"], false),
    )
    .await
    .unwrap();
    assert_eq!(new_rule.state, ConfirmState::Pending);
    let other_session = ask(&c, &request(Some("s2"), &["net.socket"], false))
        .await
        .unwrap();
    assert_eq!(other_session.state, ConfirmState::Pending);
    instance.stop().await;
}

#[tokio::test]
async fn policies_decide_without_a_person() {
    let nats = NatsServer::start();
    let mut policy = PolicyConfig {
        auto_approve: true,
        ..Default::default()
    };
    policy.auto_deny_levels.insert(RiskLevel::Critical);
    let instance = Instance::start_with(&nats.url(), "a", policy).await;
    let c = caller(&connect(&nats.url()).await);

    let approved = ask(&c, &request(None, &["net.socket"], true))
        .await
        .unwrap();
    assert_eq!(approved.state, ConfirmState::Approved);
    assert_eq!(approved.by.as_deref(), Some("policy:auto_approve"));

    let mut critical = request(None, &["fs.rm_rf_root"], true);
    critical.risk.level = RiskLevel::Critical;
    let denied = ask(&c, &critical).await.unwrap();
    assert_eq!(denied.state, ConfirmState::Denied);
    assert_eq!(denied.by.as_deref(), Some("policy:auto_deny_levels"));
    // Stored like any decision.
    assert_eq!(get(&c, &denied.id).await.unwrap(), denied);
    instance.stop().await;
}

#[tokio::test]
async fn levels_outside_require_levels_are_approved_and_timeouts_can_be_configured() {
    let nats = NatsServer::start();
    let policy = PolicyConfig {
        require_levels: [RiskLevel::High, RiskLevel::Critical].into_iter().collect(),
        default_timeout: Duration::from_millis(200),
        ..Default::default()
    };
    let instance = Instance::start_with(&nats.url(), "a", policy).await;
    let c = caller(&connect(&nats.url()).await);

    let mut medium = request(None, &["net.dns"], true);
    medium.risk.level = RiskLevel::Medium;
    let approved = ask(&c, &medium).await.unwrap();
    assert_eq!(approved.by.as_deref(), Some("policy:require_levels"));

    let mut high = request(None, &["net.socket"], true);
    high.timeout_ms = None;
    let timed_out = ask(&c, &high).await.unwrap();
    assert_eq!(timed_out.state, ConfirmState::Timeout);
    assert_eq!(timed_out.expires_at - timed_out.created_at, 200);
    instance.stop().await;
}

#[tokio::test]
async fn a_timeout_can_be_configured_to_approve() {
    let nats = NatsServer::start();
    let policy = PolicyConfig {
        timeout_action: TimeoutAction::Approve,
        ..Default::default()
    };
    let instance = Instance::start_with(&nats.url(), "a", policy).await;
    // Services call each other in MessagePack: the same contract in the other encoding.
    let c = caller(&connect(&nats.url()).await).with_encoding(messages::Encoding::MsgPack);
    let mut req = request(None, &["net.socket"], true);
    req.timeout_ms = Some(200);
    let approved = ask(&c, &req).await.unwrap();
    assert_eq!(approved.state, ConfirmState::Approved);
    assert_eq!(approved.by.as_deref(), Some("policy:timeout_action"));
    instance.stop().await;
}
