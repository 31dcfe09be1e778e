//! The scheduler's supervision is real: the registry actor it draws is restarted when it dies,
//! and `run()` fails when it cannot be kept running.

use crate::common::*;
use messages::exec::{ExecRequest, ExecStatus, Language};

fn req(code: &str) -> ExecRequest {
    ExecRequest {
        language: Language::Python,
        code: code.into(),
        ..Default::default()
    }
}

/// The registry actor dies: its supervisor restarts it (re-preloaded from the heartbeats), so
/// placement keeps working; when it keeps dying, the scheduler's `run()` fails instead of
/// serving without a registry.
#[tokio::test]
async fn a_killed_registry_is_restarted_and_a_crash_loop_fails_run() {
    let mut mesh = Mesh::builder()
        .risk()
        .executor("node-a", 4)
        .scheduler(|c| c.kit.instance_id = "registry-killer".into())
        .start()
        .await;
    let name = scheduler::registry::actor_name("registry-killer");
    let registry = || ractor::registry::where_is(name.clone()).expect("the registry actor");
    let ok = mesh.exec(&req("print(1)")).await;
    assert_eq!(ok.unwrap().node.as_deref(), Some("node-a"));

    let first = registry();
    first.kill();
    let dead = first.get_id();
    let second = eventually("a new registry actor", || {
        let registry = ractor::registry::where_is(name.clone());
        async move { registry.filter(|r| r.get_id() != dead) }
    })
    .await;
    // Preloaded from KV: the node is known at once, no heartbeat needed.
    let r = mesh.exec(&req("print(2)")).await.unwrap();
    assert_eq!(
        (r.status, r.node.as_deref()),
        (ExecStatus::Ok, Some("node-a"))
    );
    assert!(!mesh.scheduler_finished());

    // A crash loop: past the restart budget the root gives up and run() fails.
    let mut last = second;
    for _ in 1..scheduler::root::MAX_RESTARTS {
        last.kill();
        let dead = last.get_id();
        last = eventually("the registry to be replaced or given up", || {
            let registry = ractor::registry::where_is(name.clone());
            async move {
                match registry {
                    Some(r) if r.get_id() != dead => Some(r),
                    _ => None,
                }
            }
        })
        .await;
    }
    last.kill();
    eventually("run() to fail", || {
        let finished = mesh.scheduler_finished();
        async move { finished.then_some(()) }
    })
    .await;
    let e = mesh.stop_service_result("scheduler").await.unwrap_err();
    assert!(e.contains("registry"), "{e}");
    mesh.shutdown().await;
}
