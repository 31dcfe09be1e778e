//! The scheduler on a three-node NATS cluster with every JetStream asset at three replicas
//! (`SANDMESH_JS_REPLICAS=3`): a burst of async jobs during which one server is killed
//! (SIGKILL) and restarted, and then the JetStream meta leader is killed. Every accepted job
//! ends `ok` with exactly one stored result and ran once — none `executor_lost`: a run whose
//! request or reply was in flight through a killed server is recovered by asking its node
//! what happened to it; sessions keep their node; confirmations
//! pending before the failures are decided after them; the services reconnect and their
//! heartbeats resume without a restart.
//!
//! The real scheduler and confirmation service run in-process, and the executors are the real
//! executor node (`executor_node::serve`: one run per execution id, kept answers, `status`)
//! over a backend that starts no sandbox ([`NodeStandin`]); the risk-assessor and workspace
//! are the harness's stand-ins (the failures under test are NATS's, and 2,000 container runs
//! would measure Docker on this machine instead). The burst is
//! `SANDMESH_CLUSTER_JOBS` jobs, 2,000 by default (about 50 s on the 2-core machine).

use sandmesh_client::MeshClient;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::fakes::{self, Runs};
use crate::common::stored_result;
use crate::common::NodeStandin;
use async_nats::jetstream::{self, message::PublishMessage};
use futures::StreamExt;
use kit::{CancellationToken, RetryPolicy};
use messages::confirm::{ConfirmDecide, ConfirmList, ConfirmListReply, ConfirmScope, Confirmation};
use messages::exec::{ExecRequest, ExecResult, ExecStatus, Language, Tier, TierChoice};
use messages::heartbeat::Heartbeat;
use messages::session::{SessionOpen, SessionRecord};
use messages::subjects::{ConfirmOp, SessionOp};
use messages::{Encoding, ServiceName, Subjects};
use test_support::NatsCluster;

/// Code the risk stand-in rates high: it waits for a person.
const RISKY: &str = "import os\nos.system('id')";
const REPLICAS: usize = 3;
const SESSIONS: usize = 4;
const CONFIRMATIONS: usize = 3;
/// The bound of the waits that span a failover.
const HEAL: Duration = Duration::from_secs(90);
/// How long a burst job "runs" on a node: long enough that a failure finds runs in flight
/// (their requests and replies crossing the killed server), short enough for the burst.
const BURST_RUN_MS: u64 = 250;
/// Every job's timeout: the scheduler's wait for a reply is this plus its 5 s grace, after
/// which a run whose reply was lost is asked for.
const JOB_TIMEOUT_MS: u64 = 5_000;

fn burst_size() -> usize {
    std::env::var("SANDMESH_CLUSTER_JOBS")
        .ok()
        .map(|v| v.parse().expect("SANDMESH_CLUSTER_JOBS: a number of jobs"))
        .unwrap_or(2000)
}

fn job(id: &str, code: &str) -> ExecRequest {
    ExecRequest {
        execution_id: Some(id.into()),
        language: Language::Python,
        code: code.into(),
        timeout_ms: Some(JOB_TIMEOUT_MS),
        ..Default::default()
    }
}

/// Publishes a job as a careful client does: `Nats-Msg-Id` = execution id, retried through a
/// failover (the id makes a repeat a duplicate JetStream drops). `true` once JetStream acked
/// it: accepted.
async fn submit(js: &jetstream::Context, id: &str, code: &str) -> bool {
    let payload = bytes::Bytes::from(serde_json::to_vec(&job(id, code)).unwrap());
    let subject = Subjects::default().jobs_exec();
    let publish = || async {
        let message = PublishMessage::build()
            .payload(payload.clone())
            .message_id(id);
        js.send_publish(subject.clone(), message).await?.await
    };
    kit::retry("submitting a job", RetryPolicy::JETSTREAM, publish)
        .await
        .is_ok()
}

/// (results stored, results ever written): equal means no result was written twice.
async fn results_counts(js: &jetstream::Context) -> (u64, u64) {
    let mut stream = js
        .get_stream(Subjects::default().results_stream())
        .await
        .unwrap();
    let state = stream.info().await.unwrap().state.clone();
    (state.messages, state.last_sequence)
}

async fn pending(client: &MeshClient) -> BTreeMap<String, Confirmation> {
    let list = ConfirmList {
        limit: Some(1000),
        ..Default::default()
    };
    let reply: ConfirmListReply = client
        .request(Subjects::default().confirm(ConfirmOp::List), &list)
        .await
        .unwrap();
    reply
        .confirmations
        .into_iter()
        .filter_map(|c| Some((c.execution_id.clone()?, c)))
        .collect()
}

async fn run_in_session(client: &MeshClient, session: &str, n: usize) -> ExecResult {
    let req = ExecRequest {
        session_id: Some(session.into()),
        tier: TierChoice::Session,
        ..job(&format!("{session}-run-{n}"), "print('in session')")
    };
    client
        .request(Subjects::default().exec(), &req)
        .await
        .unwrap()
}

/// Every service of the test, in-process, stopped on drop.
struct Services {
    stop: CancellationToken,
    scheduler: tokio::task::JoinHandle<Result<(), scheduler::RunError>>,
    confirmation: tokio::task::JoinHandle<Result<(), confirmation::ConfirmationError>>,
    _standins: Vec<kit::serve::ServiceHost>,
    executors: Vec<NodeStandin>,
}

impl Drop for Services {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn start_services(cluster: &NatsCluster, runs: &Runs) -> Services {
    let stop = CancellationToken::new();
    let replicas = REPLICAS.to_string();
    let mut env: std::collections::HashMap<String, String> = [
        (
            "SANDMESH_NATS_URL",
            cluster.service_url(ServiceName::Confirmation),
        ),
        ("SANDMESH_JS_REPLICAS", replicas.clone()),
        (
            "SANDMESH_OPERATOR_SCOPES",
            cluster.tenancy().operator_scopes(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let c = confirmation::ConfirmationConfig::from_env(&env).unwrap();
    let confirmation = tokio::spawn(confirmation::run(c, stop.clone()));

    let admin = cluster.url();
    let standins = vec![
        fakes::serve_risk(&admin).await,
        fakes::serve_workspace(&admin).await,
    ];
    env.insert(
        "SANDMESH_NATS_URL".into(),
        cluster.service_url(ServiceName::Scheduler),
    );
    env.insert("SANDMESH_INSTANCE_ID".into(), "sched-1".into());
    env.remove("SANDMESH_OPERATOR_SCOPES");
    let mut config = scheduler::SchedulerConfig::from_env(&env).unwrap();
    config.kit.heartbeat_interval = Duration::from_millis(500);
    config.parked_sweep = Duration::from_millis(500);
    config.exec_grace = Duration::from_secs(5);
    let scheduler = tokio::spawn(scheduler::run(config, stop.clone()));

    let probe = test_support::connect(&admin).await;
    let executor_url = cluster.service_url(ServiceName::DockerExecutor);
    let mut executors = Vec::new();
    for node in ["exec-a", "exec-b"] {
        let e = NodeStandin::start(&executor_url, &probe, node, 64, runs.clone(), REPLICAS).await;
        executors.push(e);
    }
    Services {
        stop,
        scheduler,
        confirmation,
        _standins: standins,
        executors,
    }
}

/// The node holding the scheduler's connection.
fn scheduler_node(cluster: &NatsCluster) -> Option<usize> {
    (0..cluster.size()).find(|&i| {
        cluster
            .connections(i)
            .iter()
            .any(|name| name.starts_with("scheduler-sched-1"))
    })
}

/// Every heartbeat in `sandbox_nodes`, by key.
async fn heartbeats(js: &jetstream::Context) -> BTreeMap<String, Heartbeat> {
    let Ok(kv) = js.get_key_value(Subjects::default().nodes_bucket()).await else {
        return BTreeMap::new();
    };
    let Ok(keys) = kv.keys().await else {
        return BTreeMap::new();
    };
    let keys: Vec<String> = keys.filter_map(|k| async { k.ok() }).collect().await;
    let mut out = BTreeMap::new();
    for key in keys {
        if let Ok(Some(value)) = kv.get(&key).await {
            if let Ok(hb) = serde_json::from_slice(&value) {
                out.insert(key, hb);
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn accepted_jobs_sessions_and_confirmations_survive_node_and_meta_leader_loss() {
    // `RUST_LOG=scheduler::executor_runner=info` shows each run the scheduler asked a node
    // about ("asked the node what happened").
    test_support::trace_to_test_output();
    let jobs = burst_size();
    let mut cluster = NatsCluster::start();
    let runs = Runs::default();
    let services = start_services(&cluster, &runs).await;
    let nc = test_support::connect(&cluster.url()).await;
    let js = jetstream::new(nc.clone());
    let client = kit::mesh_client(nc, Default::default())
        .with_timeout(Duration::from_secs(120))
        .with_encoding(Encoding::Json);
    let s = Subjects::default();

    test_support::eventually("the scheduler to answer", HEAL, || {
        let (client, sessions) = (client.clone(), s.sessions(SessionOp::List));
        async move {
            let list = serde_json::json!({});
            client
                .request::<_, serde_json::Value>(sessions, &list)
                .await
                .ok()
        }
    })
    .await;
    // Every asset the services made has three replicas.
    let mut names = js.stream_names();
    let mut streams = BTreeSet::new();
    while let Some(name) = names.next().await {
        let name = name.unwrap();
        let mut stream = js.get_stream(&name).await.unwrap();
        let replicas = stream.info().await.unwrap().config.num_replicas;
        assert_eq!(replicas, REPLICAS, "stream {name}");
        streams.insert(name);
    }
    for asset in [
        s.jobs_stream(),
        s.results_stream(),
        s.audit_stream(),
        format!("KV_{}", s.nodes_bucket()),
        format!("KV_{}", s.confirmations_bucket()),
        format!("KV_{}", s.sessions_bucket()),
        format!("KV_{}", s.exec_claims_bucket()),
        format!("KV_{}", s.parked_executions_bucket()),
    ] {
        assert!(streams.contains(&asset), "{asset} missing from {streams:?}");
    }

    // Before the failures: sessions on their nodes, and executions waiting for a person.
    let mut homes = BTreeMap::new();
    for i in 0..SESSIONS {
        let id = format!("session-{i}");
        let open = SessionOpen {
            session_id: Some(id.clone()),
            tier: Some(Tier::Session),
            ..Default::default()
        };
        let _: SessionRecord = client
            .request(s.sessions(SessionOp::Open), &open)
            .await
            .unwrap();
        let r = run_in_session(&client, &id, 0).await;
        assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
        homes.insert(id, r.node.expect("a node"));
    }
    let risky: Vec<String> = (0..CONFIRMATIONS).map(|i| format!("risky-{i}")).collect();
    for id in &risky {
        assert!(submit(&js, id, RISKY).await, "{id} not accepted");
    }
    let waiting = test_support::eventually("the risky jobs to wait for a person", HEAL, || {
        let client = client.clone();
        async move {
            let p = pending(&client).await;
            (p.len() == CONFIRMATIONS).then_some(p)
        }
    })
    .await;

    // The burst, published concurrently while the servers fail: its first half at once, its
    // second half once the first failure is over, so both failures hit jobs in flight however
    // fast this machine runs them.
    let ids: Vec<String> = (0..jobs).map(|i| format!("burst-{i:05}")).collect();
    let accepted_count = Arc::new(AtomicUsize::new(0));
    let second_half = Arc::new(tokio::sync::Notify::new());
    let publisher = {
        let (js, ids, count) = (js.clone(), ids.clone(), accepted_count.clone());
        let second_half = second_half.clone();
        tokio::spawn(async move {
            let publish = |ids: Vec<String>| {
                let (js, count) = (js.clone(), count.clone());
                futures::stream::iter(ids)
                    .map(move |id| {
                        let (js, count) = (js.clone(), count.clone());
                        async move {
                            let code = format!("print('{id}')  # sleep:{BURST_RUN_MS}");
                            let ok = submit(&js, &id, &code).await;
                            if ok {
                                count.fetch_add(1, Ordering::SeqCst);
                            }
                            (id, ok)
                        }
                    })
                    .buffer_unordered(32)
                    .collect::<Vec<_>>()
            };
            let (first, second) = ids.split_at(ids.len() / 2);
            let mut published = publish(first.to_vec()).await;
            second_half.notified().await;
            published.extend(publish(second.to_vec()).await);
            published
        })
    };
    let ran = |runs: &Runs| {
        runs.lock()
            .unwrap()
            .iter()
            .filter(|r| r.execution_id.starts_with("burst-"))
            .count()
    };
    let started = Instant::now();
    test_support::eventually("an eighth of the burst to run", HEAL, || {
        let n = ran(&runs);
        async move { (n >= jobs / 8).then_some(()) }
    })
    .await;

    // One server dies with the scheduler's connection on it, and comes back.
    let victim = scheduler_node(&cluster).expect("the scheduler is connected somewhere");
    let killed_at = ran(&runs);
    cluster.kill(victim);
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.restart(victim);
    cluster.wait_healthy(HEAL).await;
    eprintln!(
        "killed node {} at {killed_at} runs; healthy again after {:?}",
        cluster.name(victim),
        started.elapsed()
    );

    // Then the JetStream meta leader dies (and stays down while the burst goes on).
    let before_second = ran(&runs);
    second_half.notify_one();
    test_support::eventually("the second half to start running", HEAL, || {
        let n = ran(&runs);
        async move { (n >= before_second + jobs / 16).then_some(()) }
    })
    .await;
    let leader = cluster.meta_leader().expect("a meta leader");
    let leader_killed_at = ran(&runs);
    cluster.kill(leader);
    let leader_killed = Instant::now();
    cluster.wait_healthy(HEAL).await;
    let new_leader = cluster.meta_leader().expect("a new meta leader");
    assert_ne!(new_leader, leader);
    eprintln!(
        "killed meta leader {} at {leader_killed_at} runs; {} leads after {:?}",
        cluster.name(leader),
        cluster.name(new_leader),
        leader_killed.elapsed()
    );

    let published = tokio::time::timeout(Duration::from_secs(600), publisher)
        .await
        .expect("the burst is published in time")
        .unwrap();
    let accepted: Vec<String> = published
        .iter()
        .filter(|(_, ok)| *ok)
        .map(|(id, _)| id.clone())
        .collect();
    assert_eq!(accepted.len(), accepted_count.load(Ordering::SeqCst));

    // Every accepted job ends with one stored result, its output. An executor request or reply
    // in flight through a killed server is lost (core request-reply is at-most-once); the
    // scheduler asks the node what happened instead of calling the run lost.
    let mut missing: BTreeSet<String> = accepted.iter().cloned().collect();
    let mut lost_replies = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(600);
    while !missing.is_empty() {
        let mut found = Vec::new();
        for id in &missing {
            if let Some(r) = stored_result(&js, id).await {
                assert_eq!(&r.execution_id, id);
                match r.status {
                    ExecStatus::Ok => {}
                    ExecStatus::ExecutorLost => {
                        lost_replies.insert(id.clone());
                    }
                    _ => panic!("{id} ended {:?}: {r:?}", r.status),
                }
                found.push(id.clone());
            }
        }
        for id in found {
            missing.remove(&id);
        }
        assert!(
            Instant::now() < deadline,
            "{} accepted jobs have no result after 10 minutes: {:?}",
            missing.len(),
            missing.iter().take(10).collect::<Vec<_>>()
        );
        if !missing.is_empty() {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    let burst_took = started.elapsed();
    assert!(
        lost_replies.is_empty(),
        "{} jobs ended executor_lost: {lost_replies:?}",
        lost_replies.len()
    );

    // Sessions kept their nodes; the confirmations asked before the failures are decidable.
    for (i, (session, home)) in homes.iter().enumerate() {
        let r = run_in_session(&client, session, i + 1).await;
        assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
        assert_eq!(r.node.as_deref(), Some(home.as_str()), "{session} moved");
        assert!(!r.session_restored, "{session} was re-placed");
    }
    for id in &risky {
        let decide = ConfirmDecide {
            by_account: None,
            id: waiting[id].id.clone(),
            approve: true,
            by: "tester".into(),
            reason: Some("after the failover".into()),
            scope: ConfirmScope::Once,
        };
        let decided: Confirmation = client
            .request(s.confirm(ConfirmOp::Decide), &decide)
            .await
            .unwrap();
        assert_eq!(decided.id, waiting[id].id);
    }
    for id in &risky {
        let r = test_support::eventually(&format!("the approved {id}"), HEAL, || {
            let js = js.clone();
            async move { stored_result(&js, id).await }
        })
        .await;
        assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    }

    // Exactly once: no result written twice, no job run twice.
    let (messages, written) = results_counts(&js).await;
    assert_eq!(messages, written, "a result was written twice");
    let expected = (accepted.len() + 2 * SESSIONS + CONFIRMATIONS) as u64;
    assert_eq!(messages, expected);
    let mut per_job: BTreeMap<String, usize> = BTreeMap::new();
    for run in runs.lock().unwrap().iter() {
        *per_job.entry(run.execution_id.clone()).or_default() += 1;
    }
    let twice: Vec<_> = per_job.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "jobs run more than once: {twice:?}");
    // Every job ran: one whose request never reached its node was sent again.
    let never_ran: Vec<&String> = accepted
        .iter()
        .filter(|id| !per_job.contains_key(*id))
        .collect();
    assert!(never_ran.is_empty(), "jobs that never ran: {never_ran:?}");

    // No service was restarted: all still run, reconnected, and beating again.
    assert!(!services.scheduler.is_finished(), "the scheduler stopped");
    assert!(!services.confirmation.is_finished(), "confirmation stopped");
    assert!(
        services.executors.iter().all(NodeStandin::is_running),
        "an executor node stopped"
    );
    let now = messages::now_ms();
    let beats = test_support::eventually("fresh heartbeats of every service", HEAL, || {
        let js = js.clone();
        async move {
            let beats = heartbeats(&js).await;
            let fresh = |key: &str| beats.get(key).is_some_and(|hb| hb.sent_at > now);
            let all = [
                "scheduler.sched-1",
                "docker-executor.exec-a",
                "docker-executor.exec-b",
            ];
            all.iter().all(|k| fresh(k)).then_some(beats)
        }
    })
    .await;
    assert!(
        beats.keys().any(|k| k.starts_with("confirmation.")),
        "{beats:?}"
    );
    assert!(scheduler_node(&cluster).is_some_and(|n| n != leader));
    cluster.restart(leader);
    cluster.wait_healthy(HEAL).await;
    // A new execution after all of it.
    let r: ExecResult = client
        .request(s.exec(), &job("after-all", "print('after')"))
        .await
        .unwrap();
    assert_eq!(r.status, ExecStatus::Ok);
    eprintln!(
        "cluster failover: {} jobs accepted of {jobs}, all stored once in {burst_took:?}, \
         {} executor_lost; {} results written for {} stored; no job ran twice",
        accepted.len(),
        lost_replies.len(),
        written,
        messages
    );
    drop(services);
}
