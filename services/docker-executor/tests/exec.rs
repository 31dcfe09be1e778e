//! Executions over real NATS in real containers: the ephemeral tier, every language, stdin,
//! env, request files, streaming, validation.

mod common;

use common::{run, Harness};
use messages::exec::{ExecStatus, Language, Tier};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ephemeral_python_runs_once_and_its_container_is_gone() {
    let h = Harness::start().await;
    let r = h.ephemeral(Language::Python, "print(1 + 1)").await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    assert_eq!(r.stdout, "2\n");
    assert_eq!(r.exit_code, Some(0));
    assert_eq!(r.tier, Tier::Ephemeral);
    assert_eq!(r.node.as_deref(), Some(h.node.as_str()));
    assert!(r.usage.unwrap().peak_memory_bytes > 0);
    // The used container is removed and the pool (size 1) refilled.
    h.wait_containers(1).await;
    let _ = run;
    h.stop().await;
}
