//! Async exec through `SANDBOX_JOBS` over a real nats-server: every accepted job ends with
//! exactly one stored result — across duplicates, missing services, poison jobs, and a
//! scheduler killed mid-flight.

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::*;
use async_nats::jetstream::{self, message::PublishMessage};
use messages::exec::{ExecRequest, ExecResult, ExecStatus, Language, ResultGet, ResultLookup};
use messages::{ErrorKind, Subjects};

/// Publishes a job as a client does: Nats-Msg-Id = execution id. Returns whether JetStream
/// accepted it as new (not a duplicate).
async fn submit(js: &jetstream::Context, id: &str, code: &str) -> bool {
    let req = ExecRequest {
        execution_id: Some(id.into()),
        language: Language::Python,
        code: code.into(),
        ..Default::default()
    };
    submit_raw(js, id, serde_json::to_vec(&req).unwrap()).await
}

async fn submit_raw(js: &jetstream::Context, id: &str, payload: Vec<u8>) -> bool {
    let ack = js
        .send_publish(
            Subjects::default().jobs_exec(),
            PublishMessage::build()
                .payload(payload.into())
                .message_id(id),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    !ack.duplicate
}

async fn wait_result(js: &jetstream::Context, id: &str) -> ExecResult {
    eventually(&format!("the result of {id}"), || async move {
        stored_result(js, id).await
    })
    .await
}

/// (results stored, results ever written): equal means no result was ever replaced.
async fn results_counts(js: &jetstream::Context) -> (u64, u64) {
    let mut stream = js
        .get_stream(Subjects::default().results_stream())
        .await
        .unwrap();
    let state = stream.info().await.unwrap().state.clone();
    (state.messages, state.last_sequence)
}

async fn jobs_left(js: &jetstream::Context) -> u64 {
    let mut stream = js
        .get_stream(Subjects::default().jobs_stream())
        .await
        .unwrap();
    stream.info().await.unwrap().state.messages
}

#[tokio::test]
async fn jobs_run_once_each_and_duplicates_are_dropped_by_the_stream() {
    let mesh = Mesh::builder()
        .risk()
        .executor("node-a", 8)
        .scheduler(|_| {})
        .start()
        .await;
    let (js, runs) = (mesh.js.clone(), mesh.runs.clone());

    let ids: Vec<String> = (0..10).map(|i| format!("job-{i}")).collect();
    for id in &ids {
        assert!(submit(&js, id, "print(1)").await);
    }
    assert!(
        !submit(&js, "job-3", "print(1)").await,
        "same id within the window is a duplicate"
    );
    for id in &ids {
        let r = wait_result(&js, id).await;
        assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
        assert!(r.timing.total_ms >= r.timing.queued_ms);
    }
    let ran: Vec<String> = runs
        .lock()
        .unwrap()
        .iter()
        .map(|r| r.execution_id.clone())
        .collect();
    assert_eq!(ran.len(), ids.len(), "{ran:?}");
    assert_eq!(results_counts(&js).await, (10, 10));
    eventually("the jobs stream to drain", || {
        let js = js.clone();
        async move { (jobs_left(&js).await == 0).then_some(()) }
    })
    .await;

    // The same id again after its result exists: found, not run.
    let again = "job-late-repeat";
    assert!(submit(&js, again, "print(2)").await);
    wait_result(&js, again).await;
    let sync_repeat: ExecResult = mesh
        .client
        .request(
            Subjects::default().exec(),
            &ExecRequest {
                execution_id: Some(again.into()),
                language: Language::Python,
                code: "print(2)".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(sync_repeat, wait_result(&js, again).await);
    assert_eq!(
        runs.lock()
            .unwrap()
            .iter()
            .filter(|r| r.execution_id == again)
            .count(),
        1
    );
    mesh.shutdown().await;
}

#[tokio::test]
async fn async_jobs_respect_the_queue_bound_and_all_complete() {
    let mesh = Mesh::builder()
        .risk()
        .executor("node-a", 16)
        .scheduler(|c| c.max_queue = 2)
        .start()
        .await;
    let (js, runs) = (mesh.js.clone(), mesh.runs.clone());

    for i in 0..8 {
        submit(&js, &format!("bounded-{i}"), "sleep:200").await;
    }
    for i in 0..8 {
        assert_eq!(
            wait_result(&js, &format!("bounded-{i}")).await.status,
            ExecStatus::Ok
        );
    }
    let peak = runs
        .lock()
        .unwrap()
        .iter()
        .map(|r| r.in_flight)
        .max()
        .unwrap();
    assert!(peak <= 2, "at most max_queue jobs ran at once, saw {peak}");
    assert_eq!(results_counts(&js).await, (8, 8));
    mesh.shutdown().await;
}

#[tokio::test]
async fn invalid_jobs_get_a_stored_rejected_result() {
    let mesh = Mesh::builder()
        .risk()
        .executor("node-a", 8)
        .scheduler(|_| {})
        .start()
        .await;
    let (js, runs) = (mesh.js.clone(), mesh.runs.clone());

    submit_raw(&js, "bad-json", b"{nope".to_vec()).await;
    submit(&js, "bad-size", &"x".repeat(300 * 1024)).await;
    submit(&js, "bad-risk", "rm -rf /").await;
    for (id, kind) in [
        ("bad-json", ErrorKind::BadRequest),
        ("bad-size", ErrorKind::TooLarge),
    ] {
        let r = wait_result(&js, id).await;
        assert_eq!(r.status, ExecStatus::Rejected, "{id}");
        assert_eq!(r.error.unwrap().kind, kind, "{id}");
    }
    assert_eq!(
        wait_result(&js, "bad-risk").await.status,
        ExecStatus::Rejected
    );
    assert!(runs.lock().unwrap().is_empty());
    mesh.shutdown().await;
}

/// An accepted job keeps trying while no executor can take it (one is
/// restarting), with backoff, until its own queue deadline — not for a few quick deliveries —
/// and one finally given up ends `unavailable`, never `internal`.
#[tokio::test]
async fn a_job_waits_for_a_missing_executor_and_gives_up_only_at_its_queue_deadline() {
    let mut mesh = Mesh::builder()
        .risk()
        .scheduler(|c| c.job_queue_ttl = Duration::from_secs(8))
        .start()
        .await;
    let (js, c, runs) = (mesh.js.clone(), mesh.client.clone(), mesh.runs.clone());

    // No executor yet: the job is retried, not lost; lookups say it is unknown or queued.
    submit(&js, "waits", "print(1)").await;
    let seen_pending_or_queued = c
        .request::<_, ResultLookup>(
            Subjects::default().results_get(),
            &ResultGet {
                wait_ms: None,
                execution_id: "waits".into(),
            },
        )
        .await;
    match seen_pending_or_queued {
        Ok(ResultLookup::Pending { .. }) => {}
        Err(e) => assert_eq!(e.kind(), ErrorKind::NotFound),
        Ok(other) => panic!("no executor yet, got {other:?}"),
    }
    // Longer than the old give-up (four deliveries within about three seconds) took.
    tokio::time::sleep(Duration::from_secs(4)).await;
    mesh.add_executor("node-a", 8).await;
    assert_eq!(wait_result(&js, "waits").await.status, ExecStatus::Ok);

    // An executor that always fails transiently: retried until the deadline, then ends
    // `unavailable` saying why.
    submit(&js, "poison", "fail:503").await;
    let r = wait_result(&js, "poison").await;
    assert_eq!(r.status, ExecStatus::Unavailable, "{r:?}");
    let error = r.error.unwrap();
    assert_eq!(error.kind, ErrorKind::Unavailable);
    assert!(error.message.contains("queue time"), "{error:?}");
    let tries = runs
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.execution_id == "poison")
        .count();
    assert!(
        tries >= 3,
        "retried with backoff until its deadline: {tries} tries"
    );
    mesh.shutdown().await;
}

/// The scheduler binary is killed (SIGKILL) with jobs in flight; a second scheduler takes
/// over. Every accepted job ends with exactly one stored result.
#[tokio::test]
async fn killing_the_scheduler_mid_flight_loses_and_duplicates_nothing() {
    let mut mesh = Mesh::builder().risk().executor("node-a", 64).start().await;
    let (js, runs, url) = (mesh.js.clone(), mesh.runs.clone(), mesh.url.clone());

    let mut child = Command::new(env!("CARGO_BIN_EXE_sandmesh-scheduler"))
        .env("SANDMESH_NATS_URL", &url)
        .env("SANDMESH_INSTANCE_ID", "doomed")
        .env("SANDMESH_SCHED_JOB_ACK_WAIT_MS", "3000")
        .env("SANDMESH_SCHED_CLAIM_TTL_MS", "3000")
        .env("SANDMESH_SCHED_MAX_QUEUE", "8")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    mesh.wait_ready().await;

    let mut accepted = BTreeSet::new();
    for i in 0..24 {
        let id = format!("kill-{i:02}");
        if submit(&js, &id, "sleep:400").await {
            accepted.insert(id);
        }
    }
    // Kill it once it is mid-way: some jobs done, some running, some still queued.
    eventually("the doomed scheduler to be mid-way", || {
        let runs = runs.clone();
        async move { (runs.lock().unwrap().len() >= 10).then_some(()) }
    })
    .await;
    child.kill().unwrap();
    child.wait().unwrap();
    // Prove the kill hit work in flight: started by the dead scheduler, no result stored.
    let started: BTreeSet<String> = runs
        .lock()
        .unwrap()
        .iter()
        .map(|r| r.execution_id.clone())
        .collect();
    let mut orphaned = 0;
    for id in &started {
        if stored_result(&js, id).await.is_none() {
            orphaned += 1;
        }
    }
    assert!(orphaned > 0, "the kill should interrupt running jobs");
    eprintln!(
        "killed with {} started, {orphaned} of them without a result",
        started.len()
    );

    let mut cfg = mesh.config();
    cfg.job_ack_wait = Duration::from_secs(3);
    cfg.claim_ttl = Duration::from_secs(3);
    mesh.start_scheduler(cfg).await;
    let mut results = BTreeSet::new();
    for id in &accepted {
        let r = wait_result(&js, id).await;
        assert_eq!(r.status, ExecStatus::Ok, "{id}: {r:?}");
        results.insert(r.execution_id);
    }
    assert_eq!(results, accepted, "acked ids == result ids");
    let (stored, written) = results_counts(&js).await;
    assert_eq!(stored, accepted.len() as u64);
    assert_eq!(written, stored, "no result was ever written twice");
    eventually("the jobs stream to drain", || {
        let js = js.clone();
        async move { (jobs_left(&js).await == 0).then_some(()) }
    })
    .await;
    mesh.shutdown().await;
}

#[tokio::test]
async fn graceful_shutdown_finishes_running_jobs_before_acking() {
    let mut mesh = Mesh::builder()
        .risk()
        .executor("node-a", 8)
        .scheduler(|_| {})
        .start()
        .await;
    let (js, runs) = (mesh.js.clone(), mesh.runs.clone());

    submit(&js, "slow-at-shutdown", "sleep:1500").await;
    eventually("the job to start", || {
        let runs = runs.clone();
        async move { (!runs.lock().unwrap().is_empty()).then_some(()) }
    })
    .await;
    mesh.stop_scheduler().await;
    let r = stored_result(&js, "slow-at-shutdown")
        .await
        .expect("stored before run() returned");
    assert_eq!(r.status, ExecStatus::Ok);
    assert_eq!(jobs_left(&js).await, 0, "acked before run() returned");
}

/// One tenant flooding the queue cannot starve another. Tenant `acme` publishes 500
/// async jobs; `beta`'s single sync `exec` is served while acme's backlog is still queued
/// (before the per-tenant share, acme's jobs held every queue slot and beta got 429).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_flooding_the_queue_does_not_starve_another() {
    let mesh = Mesh::builder()
        .risk()
        .executor("node-a", 8)
        .tenants(&["acme", "beta"], &[])
        .scheduler(|c| {
            c.max_queue = 8;
            c.tenant_max = 6;
        })
        .start()
        .await;
    let agent = |tenant: &str| {
        let url = mesh.nats.agent_url(tenant);
        async move {
            sandmesh_client::MeshClient::new(connect(&url).await, Subjects::default())
                .with_timeout(Duration::from_secs(60))
        }
    };
    let (acme, beta) = (agent("acme").await, agent("beta").await);
    for i in 0..500 {
        let flood = ExecRequest {
            execution_id: Some(format!("flood-{i:03}")),
            language: Language::Python,
            code: "sleep:200".into(),
            ..Default::default()
        };
        acme.exec().submit(&flood).await.unwrap();
    }
    // acme's jobs are running (at most its share at a time) when beta asks.
    let runs = mesh.runs.clone();
    eventually("acme's jobs to run", || async {
        (runs.lock().unwrap().len() >= 6).then_some(())
    })
    .await;
    let mine = ExecRequest {
        execution_id: Some("mine".into()),
        language: Language::Python,
        code: "print(1)".into(),
        ..Default::default()
    };
    let served = beta
        .exec()
        .exec(&mine)
        .await
        .expect("beta is served, not refused");
    assert_eq!(served.status, ExecStatus::Ok, "{served:?}");
    let (acme_started, most) = {
        let log = runs.lock().unwrap();
        let acme: Vec<_> = log
            .iter()
            .filter(|r| r.execution_id.starts_with("acme-flood-"))
            .collect();
        (
            acme.len(),
            acme.iter().map(|r| r.in_flight).max().unwrap_or(0),
        )
    };
    assert!(
        acme_started < 500,
        "beta finished while acme's backlog was still queued ({acme_started} of 500 started)"
    );
    // acme's share (6) plus beta's one run: acme never held the whole queue (8).
    assert!(most <= 7, "runs in flight beside acme's: {most}");
    mesh.shutdown().await;
}
