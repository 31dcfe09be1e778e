//! Prometheus metrics through a real mesh: the real risk-assessor, confirmation and
//! docker-executor and the scheduler over a real nats-server and the real Docker daemon, all
//! serving one `/metrics` endpoint (as `sandmesh up` does). The counters must say what the
//! results say.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use crate::common::{eventually, Mesh};
use messages::exec::{Decision, ExecRequest, ExecResult, ExecStatus, Language};
use messages::heartbeat::Heartbeat;
use messages::Subjects;
use sandmesh_client::metrics::{request, scrape};

fn req(language: Language, code: &str) -> ExecRequest {
    ExecRequest {
        language,
        code: code.into(),
        ..Default::default()
    }
}

/// A free loopback address for the shared endpoint.
fn metrics_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], test_support::free_port()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn counters_match_the_results_and_executors_report_their_host() {
    let addr = metrics_addr();
    let deny_critical = [("SANDMESH_CONFIRM_AUTO_DENY_LEVELS", "critical")];
    let mesh = Mesh::builder()
        .metrics(addr)
        .real_risk()
        .confirm(&deny_critical)
        .docker_executors(1)
        .scheduler(|_| {})
        .start()
        .await;

    let mut timeout = req(Language::Python, "import time\ntime.sleep(30)");
    timeout.timeout_ms = Some(1000);
    let requests = [
        req(Language::Python, "print(1)"),
        req(Language::Javascript, "console.log(2)"),
        req(Language::Shell, "echo 3"),
        req(Language::Shell, "exit 3"),
        timeout,
        // Critical: rejected by the tiering, never run.
        req(Language::Shell, "rm -rf /"),
        // Needs a person; the policy denies it at once.
        req(Language::Python, "import os\nos.system('id')"),
    ];
    let mut results: Vec<ExecResult> = Vec::new();
    for r in &requests {
        let result = mesh
            .exec(r)
            .await
            .unwrap_or_else(|e| panic!("exec {r:?}: {e}"));
        results.push(result);
    }
    let statuses: Vec<ExecStatus> = results.iter().map(|r| r.status).collect();
    let wanted = [
        ExecStatus::Ok,
        ExecStatus::Error,
        ExecStatus::Timeout,
        ExecStatus::Rejected,
        ExecStatus::Denied,
    ];
    for status in wanted {
        assert!(statuses.contains(&status), "{status:?} among {statuses:?}");
    }

    // A result is counted once stored, which is after its caller has it: wait for all.
    let n = results.len() as f64;
    let s = eventually("every result to be counted", || async {
        let s = scrape(addr).await.ok()?;
        (s.sum("sandbox_executions_total", &[]) >= n).then_some(s)
    })
    .await;
    // Per status and tier, exactly what the results say.
    let mut expected: BTreeMap<(&str, &str), f64> = BTreeMap::new();
    for r in &results {
        *expected
            .entry((r.status.as_str(), r.tier.as_str()))
            .or_default() += 1.0;
    }
    let mut counted: BTreeMap<(&str, &str), f64> = BTreeMap::new();
    for sample in s.matching("sandbox_executions_total", &[]) {
        let status = results
            .iter()
            .map(|r| r.status.as_str())
            .find(|x| *x == sample.labels["status"])
            .unwrap_or_else(|| panic!("a status no result has: {sample:?}"));
        let tier = results
            .iter()
            .map(|r| r.tier.as_str())
            .find(|x| *x == sample.labels["tier"])
            .unwrap_or_else(|| panic!("a tier no result has: {sample:?}"));
        counted.insert((status, tier), sample.value);
    }
    assert_eq!(counted, expected);
    assert_eq!(s.sum("sandbox_execution_duration_seconds_count", &[]), n);
    let inf = [("le", "+Inf")];
    assert_eq!(s.sum("sandbox_execution_duration_seconds_bucket", &inf), n);

    // A repeat of a stored execution id answers from the store and is not counted again.
    let mut again = req(Language::Python, "print('once')");
    again.execution_id = Some(messages::new_id());
    mesh.exec(&again).await.unwrap();
    mesh.exec(&again).await.unwrap();
    let after = eventually("the new result to be counted", || async {
        let s = scrape(addr).await.ok()?;
        (s.sum("sandbox_executions_total", &[]) > n).then_some(s)
    })
    .await;
    assert_eq!(after.sum("sandbox_executions_total", &[]), n + 1.0);

    // Confirmations and risk, counted by the services that decide them.
    let asked = results
        .iter()
        .filter(|r| r.confirmation.decision != Decision::NotRequired)
        .count() as f64;
    let denied = results
        .iter()
        .filter(|r| r.confirmation.decision == Decision::Denied)
        .count() as f64;
    assert_eq!(
        after.sum("sandbox_confirmations_requested_total", &[]),
        asked
    );
    let denied_label = [("decision", "denied")];
    assert_eq!(
        after.sum("sandbox_confirmations_decided_total", &denied_label),
        denied
    );
    let critical = [("level", "critical"), ("content_type", "shell")];
    assert!(after.sum("sandbox_risk_assessments_total", &critical) >= 1.0);
    // The harness asked once or more before the first execution; every execution once more.
    assert!(after.sum("sandbox_risk_assessments_total", &[]) >= n + 1.0);

    // The executor: warm pool traffic and its host, refreshed by its heartbeat.
    let executor = [("service", "docker-executor")];
    let takes = after.sum("sandbox_warm_pool_hits_total", &executor)
        + after.sum("sandbox_warm_pool_misses_total", &executor);
    assert!(takes >= 1.0, "pooled runs take from the warm pool");
    let host = eventually("the executor's host gauges", || async move {
        let s = scrape(addr).await.ok()?;
        let mem = s.sum("sandbox_runtime_memory_usage_bytes", &executor);
        (mem > 0.0).then_some(s)
    })
    .await;
    assert_eq!(
        host.matching("sandbox_runtime_cpu_usage_percent", &executor)
            .count(),
        1
    );
    assert_eq!(
        host.matching("sandbox_warm_pool_size", &executor).count(),
        1
    );
    let docker = [("backend", "docker")];
    assert_eq!(host.sum("sandbox_runtime_nodes_healthy", &docker), 1.0);

    // The heartbeat carries the same figures, for placement.
    let node = &mesh.docker_nodes()[0];
    let kv = mesh
        .js
        .get_key_value(Subjects::default().nodes_bucket())
        .await
        .unwrap();
    let entry = kv
        .get(format!("docker-executor.{node}"))
        .await
        .unwrap()
        .expect("the executor's heartbeat");
    let hb: Heartbeat = serde_json::from_slice(&entry).unwrap();
    let resources = hb.resources.expect("the executor reports its resources");
    assert!(resources.is_usable(), "{resources:?}");

    // The endpoint refuses what it does not serve.
    let limit = Duration::from_secs(10);
    let wrong_path = request(addr, "GET", "/", limit).await.unwrap();
    assert_eq!(wrong_path.status, 404);
    let wrong_method = request(addr, "POST", "/metrics", limit).await.unwrap();
    assert_eq!(wrong_method.status, 405);

    mesh.shutdown().await;
    assert_closed(addr).await;
}

/// Every service stopped: nobody serves the endpoint any more.
async fn assert_closed(addr: SocketAddr) {
    eventually("the metrics endpoint to close", || async move {
        scrape(addr).await.is_err().then_some(())
    })
    .await;
}
