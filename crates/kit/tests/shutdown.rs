//! A service's graceful stop ends even when its NATS server is gone: every NATS step of it
//! (unsubscribe, flush, heartbeat key delete, drain) is skipped or bounded.

use crate::common::*;
use kit::shutdown::NATS_STEP_LIMIT;
use kit::EndpointOptions;
use test_support::NatsServer;

#[tokio::test]
async fn shutdown_ends_when_nats_is_gone() {
    let mut nats = NatsServer::start();
    let mut rt = start_echo(&nats.url(), "gone", EndpointOptions::default()).await;
    rt.start_heartbeat(std::sync::Arc::new(kit::heartbeat::Load::default))
        .await
        .unwrap();
    let grace = rt.config.shutdown_grace;
    nats.stop();
    // Nothing is in flight, so nothing waits for the grace period; with NATS gone at most
    // one step waits for its limit before the client notices, each further one is skipped.
    let bound = grace + NATS_STEP_LIMIT * 3;
    let stopped = tokio::time::timeout(bound, rt.shutdown()).await;
    assert!(
        stopped.is_ok(),
        "shutdown still running {bound:?} after NATS went away"
    );
}
