//! The scheduler stops when NATS is gone: every NATS call on its stop path is bounded, so a
//! cancelled `run` returns within its grace period plus a few bounded steps.

use std::time::{Duration, Instant};

use crate::common::*;
use async_nats::connection::State;

/// The grace the scheduler is given in this test.
const GRACE: Duration = Duration::from_secs(2);
/// What the bounded steps of a stop may add to the grace: six NATS steps of the stop path, each
/// bounded by `kit::shutdown::NATS_STEP_LIMIT` (the three loops' joins, the claims' releases,
/// the heartbeat watch's join, the endpoints), and the supervision tree's own 5 s. A stop that
/// hangs — what this test catches — never ends; a loaded machine may take each step's bound.
const STEPS: Duration = Duration::from_secs(6 * kit::shutdown::NATS_STEP_LIMIT.as_secs() + 5);
/// How long the scheduler runs on without NATS before it is stopped: longer than a jobs fetch
/// (1 s) and a few parked sweeps (500 ms here), so both are caught waiting on the dead server —
/// those waits are what used to keep the stop from ever finishing.
const ORPHANED: Duration = Duration::from_secs(3);

#[tokio::test]
async fn a_scheduler_whose_nats_is_gone_stops_within_its_grace() {
    let mut mesh = Mesh::builder()
        .risk()
        .executor("node-a", 2)
        .scheduler(|c| c.kit.shutdown_grace = GRACE)
        .start()
        .await;

    mesh.nats.stop();
    let client = mesh.js.client();
    eventually("the loss of NATS to be noticed", || {
        let state = client.connection_state();
        async move { (state != State::Connected).then_some(()) }
    })
    .await;
    // Not a wait for a condition: the scenario is a scheduler left running without NATS.
    tokio::time::sleep(ORPHANED).await;

    let started = Instant::now();
    let ended = tokio::time::timeout(GRACE + STEPS, mesh.stop_service_result("scheduler")).await;
    let took = started.elapsed();
    let ended = ended.unwrap_or_else(|_| panic!("run still stopping after {took:?}"));
    if let Err(e) = ended {
        panic!("run failed instead of stopping: {e}");
    }
}
