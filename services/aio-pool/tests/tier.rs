//! Tier `aio` end to end: the scheduler (with the real risk-assessor) runs executions in the
//! session's AIO instance through the aio-pool.

mod common;

use std::time::Duration;

use common::Harness;
use kit::config::env_map;
use kit::CancellationToken;
use messages::exec::{ExecRequest, ExecStatus, Language, Tier, TierChoice};
use test_support::eventually_true;

/// The risk-assessor, confirmation (approving everything: the CDP probe opens sockets, which
/// is high risk) and a scheduler (`mode`) beside the pool `h`.
async fn front(h: &Harness, mode: &str) -> CancellationToken {
    let stop = CancellationToken::new();
    let url = h.nats.url();
    let confirm = confirmation::ConfirmationConfig::from_env(&env_map(&[
        ("SANDMESH_NATS_URL", &url),
        ("SANDMESH_CONFIRM_AUTO_APPROVE", "true"),
    ]))
    .unwrap();
    tokio::spawn(confirmation::run(confirm, stop.clone()));
    let risk =
        risk_assessor::RiskAssessorConfig::from_env(&env_map(&[("SANDMESH_NATS_URL", &url)]))
            .unwrap();
    tokio::spawn(risk_assessor::run(risk, stop.clone()));
    let scheduler = scheduler::SchedulerConfig::from_env(&env_map(&[
        ("SANDMESH_NATS_URL", &url),
        ("SANDMESH_SECURITY_MODE", mode),
    ]))
    .unwrap();
    tokio::spawn(scheduler::run(scheduler, stop.clone()));
    stop
}

fn python(session: Option<&str>, tier: TierChoice, code: &str) -> ExecRequest {
    ExecRequest {
        session_id: session.map(str::to_string),
        language: Language::Python,
        code: code.into(),
        tier,
        timeout_ms: Some(30_000),
        ..Default::default()
    }
}

async fn exec(h: &Harness, req: &ExecRequest) -> messages::exec::ExecResult {
    let exec = h.mesh.exec();
    let mut last = None;
    // The scheduler and the assessor start beside the pool: the first call may find them
    // not yet serving.
    for _ in 0..100 {
        match exec.exec_timeout(req, Duration::from_secs(60)).await {
            Ok(r) => return r,
            Err(e) if e.kind() == sandmesh_client::ErrorKind::Unavailable => last = Some(e),
            Err(e) => panic!("exec: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the mesh never served the execution: {last:?}");
}

#[tokio::test]
async fn tier_aio_runs_in_the_sessions_bound_instance() {
    let h = Harness::start(&[]).await;
    let stop = front(&h, "strict").await;

    let first = exec(
        &h,
        &python(
            Some("w"),
            TierChoice::Aio,
            "open('note.txt','w').write('kept')\nprint(1)",
        ),
    )
    .await;
    assert_eq!(
        (first.status, first.tier, first.stdout.as_str()),
        (ExecStatus::Ok, Tier::Aio, "1\n"),
        "{first:?}"
    );
    let second = exec(
        &h,
        &python(Some("w"), TierChoice::Aio, "print(open('note.txt').read())"),
    )
    .await;
    assert_eq!(second.stdout, "kept\n", "{second:?}");
    // Session affinity: the same instance ran both.
    assert_eq!(second.node, first.node);
    assert!(first
        .node
        .as_deref()
        .is_some_and(|n| n.starts_with("sandmesh-aio-")));

    let failing = exec(
        &h,
        &python(
            Some("w"),
            TierChoice::Aio,
            "import sys\nsys.stderr.write('bad')\nsys.exit(2)",
        ),
    )
    .await;
    assert_eq!(
        (failing.status, failing.exit_code, failing.stderr.as_str()),
        (ExecStatus::Error, Some(2), "bad")
    );

    // Python in the instance drives its Chromium over CDP, through tier aio.
    let probe = exec(
        &h,
        &python(Some("w"), TierChoice::Aio, include_str!("cdp_probe.py")),
    )
    .await;
    assert_eq!(probe.status, ExecStatus::Ok, "{probe:?}");
    assert!(probe.stdout.contains("\"value\": 42"), "{probe:?}");

    // Without a session the execution gets an instance of its own, destroyed after.
    let lone = exec(&h, &python(None, TierChoice::Aio, "print(2)")).await;
    assert_eq!((lone.status, lone.stdout.as_str()), (ExecStatus::Ok, "2\n"));
    assert_ne!(lone.node, first.node);
    let (h_ref, lone_node) = (&h, lone.node.clone().unwrap());
    eventually_true(
        "the session-less instance is removed",
        Duration::from_secs(20),
        || {
            let lone_node = lone_node.clone();
            async move { !h_ref.containers().await.contains(&lone_node) }
        },
    )
    .await;
    stop.cancel();
    h.stop().await;
}

#[tokio::test]
async fn code_that_needs_a_browser_is_routed_to_aio() {
    let h = Harness::start(&[]).await;
    let stop = front(&h, "permissive").await;
    // The assessor suggests aio for a browser library; Debian's image has no playwright, so
    // the import fails — in the AIO instance, which is the point.
    let r = exec(
        &h,
        &python(
            Some("b"),
            TierChoice::Auto,
            "from playwright.sync_api import sync_playwright",
        ),
    )
    .await;
    assert_eq!(r.tier, Tier::Aio, "{r:?}");
    assert_eq!(r.risk.suggested_tier, Tier::Aio);
    assert!(r.stderr.contains("playwright"), "{r:?}");
    stop.cancel();
    h.stop().await;
}
