//! The Root supervises the Registry: a crashed registry is restarted with its state reloaded
//! from the bucket, and a registry that keeps dying ends `run()` with an error (and the
//! heartbeat with it), never a zombie instance that answers 503 while it beats.

use crate::common::*;
use async_nats::jetstream;
use confirmation::root::{registry_name_prefix, MAX_RESTARTS};
use confirmation::ConfirmationError;
use messages::confirm::{ConfirmList, ConfirmListReply, ConfirmScope, ConfirmState};
use messages::subjects::ConfirmOp;
use ractor::ActorCell;
use test_support::NatsServer;

/// The registry actor of this instance, found by its name (instance ids are unique per test).
fn registry_of(instance_id: &str) -> Option<ActorCell> {
    let prefix = registry_name_prefix(instance_id);
    ractor::registry::registered()
        .into_iter()
        .find(|name| name.starts_with(&prefix))
        .and_then(ractor::registry::where_is)
}

/// Kills the instance's registry and returns once a new one runs.
async fn kill_registry(instance_id: &str) {
    let dead = registry_of(instance_id).expect("the registry is registered by name");
    dead.kill();
    eventually("a restarted registry", || {
        let found = registry_of(instance_id).filter(|r| r.get_id() != dead.get_id());
        async move { found.map(|_| ()) }
    })
    .await;
}

#[tokio::test]
async fn a_killed_registry_is_restarted_and_the_instance_still_decides() {
    let nats = NatsServer::start();
    let instance = Instance::start(&nats.url(), "supervised").await;
    let c = caller(&connect(&nats.url()).await);
    let pending = ask(&c, &request(None, &["net.socket"], false))
        .await
        .unwrap();

    kill_registry("supervised").await;

    // The new registry reloaded the pending one from the bucket (its list is the replica).
    let listed: ConfirmListReply = c
        .request(subjects().confirm(ConfirmOp::List), &ConfirmList::default())
        .await
        .unwrap();
    assert!(listed.confirmations.iter().any(|l| l.id == pending.id));
    let decided = decide(
        &c,
        &decision(&pending.id, true, "alice", ConfirmScope::Once),
    )
    .await
    .unwrap();
    assert_eq!(decided.state, ConfirmState::Approved);
    // New requests are served, waiters included.
    let mut short = request(None, &["r"], true);
    short.timeout_ms = Some(300);
    assert_eq!(ask(&c, &short).await.unwrap().state, ConfirmState::Timeout);
    instance.stop().await;
}

#[tokio::test]
async fn an_instance_whose_registry_keeps_dying_stops_with_an_error_and_stops_beating() {
    let nats = NatsServer::start();
    let instance = Instance::start(&nats.url(), "doomed").await;
    let js = jetstream::new(connect(&nats.url()).await);
    for _ in 0..MAX_RESTARTS {
        kill_registry("doomed").await;
    }
    registry_of("doomed").unwrap().kill();

    let outcome = instance.ended().await;
    assert!(
        matches!(outcome, Err(ConfirmationError::RegistryLost)),
        "{outcome:?}"
    );
    let key = messages::heartbeat::heartbeat_key(confirmation::SERVICE_NAME, "doomed");
    let nodes = js.get_key_value(subjects().nodes_bucket()).await.unwrap();
    assert_eq!(nodes.get(&key).await.unwrap(), None, "no heartbeat left");
}
