//! The warm pool sized by demand (`docker_executor::demand`): a burst of new sessions grows
//! the pool so the next burst of that size starts every session warm, and the surplus goes
//! once the burst is forgotten. Warm and cold starts are told apart by the node's own
//! counters (`sandbox_warm_pool_{hits,misses}_total`), never by timing.

use std::net::SocketAddr;
use std::time::Duration;

use messages::exec::{ExecStatus, Language};
use sandmesh_client::metrics::scrape;
use test_support::{eventually_true, free_port};

use crate::common::{DockerRuns, Harness, WARM_POOL_MAX};

const BURST: usize = 4;

/// Warm and cold takes so far.
async fn takes(metrics: SocketAddr) -> (f64, f64) {
    let s = scrape(metrics).await.expect("the node's /metrics");
    let hits = s.sum("sandbox_warm_pool_hits_total", &[]);
    let misses = s.sum("sandbox_warm_pool_misses_total", &[]);
    (hits, misses)
}

/// `BURST` new sessions at once, each running its first execution; then they are closed.
async fn burst(h: &Harness, tag: &str) {
    let sessions: Vec<String> = (0..BURST).map(|i| format!("{tag}-{i}")).collect();
    let runs = sessions
        .iter()
        .map(|s| h.session(s, Language::Python, "print(1)"));
    for r in futures::future::join_all(runs).await {
        assert_eq!(
            (r.status, r.stdout.as_str()),
            (ExecStatus::Ok, "1\n"),
            "{r:?}"
        );
    }
    for s in &sessions {
        assert!(h.close(s).await, "{s} was open");
    }
}

async fn wait_target(h: &Harness, target: usize, within: Duration) {
    let what = format!("a warm pool target of {target} and as many ready");
    eventually_true(&what, within, || async {
        let Some(hb) = h.heartbeat().await else {
            return false;
        };
        let gauge = |k: &str| hb.metrics.get(k).copied();
        gauge("warm_pool_target") == Some(target as f64)
            && gauge("warm_pool_size") == Some(target as f64)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_grows_the_pool_for_the_next_and_the_surplus_goes_after_the_window() {
    let metrics: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    // The window must outlast the pool's growth on a busy host, and keeps the test short.
    let h = Harness::start_with(&[
        ("SANDMESH_EXEC_WARM_POOL", "1"),
        (WARM_POOL_MAX, "6"),
        ("SANDMESH_EXEC_WARM_POOL_WINDOW_MS", "30000"),
        ("SANDMESH_METRICS_ADDR", &metrics.to_string()),
    ])
    .await;
    h.wait_warm(1).await;

    burst(&h, "first").await;
    let (hits, misses) = takes(metrics).await;
    assert_eq!(
        hits + misses,
        BURST as f64,
        "every new session took from the pool"
    );

    wait_target(&h, BURST, Duration::from_secs(25)).await;
    burst(&h, "second").await;
    let (hits2, misses2) = takes(metrics).await;
    assert_eq!(
        (hits2 - hits, misses2 - misses),
        (BURST as f64, 0.0),
        "every session of the second burst started warm"
    );

    // The bursts are forgotten 30 s after they began; then the pool shrinks to its floor and
    // the surplus containers are removed, not only forgotten.
    wait_target(&h, 1, Duration::from_secs(60)).await;
    h.wait_containers(1).await;
    h.stop().await;
}
