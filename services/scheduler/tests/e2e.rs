//! End to end: the real risk-assessor, confirmation, workspace-store, docker-executor and
//! scheduler over a real nats-server and the real Docker daemon.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::{eventually, Mesh};
use async_nats::jetstream::{self, message::PublishMessage};
use futures::StreamExt;
use messages::confirm::{ConfirmDecide, ConfirmList, ConfirmListReply, ConfirmScope, Confirmation};
use messages::exec::{
    Decision, ExecRequest, ExecResult, ExecStatus, Language, OutputChunk, OutputStream, ResultGet,
    ResultLookup, Tier,
};
use messages::risk::RiskLevel;
use messages::session::{SessionOpen, SessionRecord, SessionRef, SessionState};
use messages::subjects::{ConfirmOp, SessionOp};
use messages::{ErrorKind, Subjects};

/// The real services, `executors` docker-executor nodes, and (when `tune` is given) the
/// scheduler; `policy` is the confirmation service's.
async fn real_mesh(
    executors: usize,
    policy: &[(&str, &str)],
    tune: Option<fn(&mut scheduler::SchedulerConfig)>,
) -> Mesh {
    let mesh = Mesh::builder()
        .real_risk()
        .confirm(policy)
        .real_workspace()
        .docker_executors(executors);
    match tune {
        Some(tune) => mesh.scheduler(tune),
        None => mesh,
    }
    .start()
    .await
}

fn req(language: Language, code: &str) -> ExecRequest {
    ExecRequest {
        language,
        code: code.into(),
        ..Default::default()
    }
}

async fn exec(mesh: &Mesh, r: &ExecRequest) -> ExecResult {
    mesh.client
        .request(Subjects::default().exec(), r)
        .await
        .unwrap_or_else(|e| panic!("exec {r:?}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn python_javascript_and_shell_run_sync_and_async() {
    let mesh = real_mesh(1, &[], Some(|_| {})).await;
    let s = Subjects::default();
    let cases = [
        (
            Language::Python,
            "print('hello from python')",
            "hello from python\n",
        ),
        (Language::Javascript, "console.log(6 * 7)", "42\n"),
        (Language::Shell, "echo shell-$((1+2))", "shell-3\n"),
    ];
    for (language, code, out) in cases {
        let r = exec(&mesh, &req(language, code)).await;
        assert_eq!((r.status, r.exit_code), (ExecStatus::Ok, Some(0)), "{r:?}");
        assert_eq!(r.stdout, out);
        assert_eq!((r.tier, r.risk.level), (Tier::Ephemeral, RiskLevel::Safe));
        assert!(r.node.is_some());
    }

    // Async: accepted by JetStream, read back by id.
    let js = jetstream::new(mesh.client.nats().clone());
    let mut ids = BTreeMap::new();
    for (language, code, out) in cases {
        let id = messages::new_id();
        let mut r = req(language, code);
        r.execution_id = Some(id.clone());
        js.send_publish(
            s.jobs_exec(),
            PublishMessage::build()
                .payload(serde_json::to_vec(&r).unwrap().into())
                .message_id(&id),
        )
        .await
        .unwrap()
        .await
        .unwrap();
        ids.insert(id, out);
    }
    for (id, out) in ids {
        let result = eventually(&format!("async result {id}"), || {
            let (c, id, subject) = (mesh.client.clone(), id.clone(), s.results_get());
            async move {
                match c
                    .request::<_, ResultLookup>(
                        subject,
                        &ResultGet {
                            wait_ms: None,
                            execution_id: id,
                        },
                    )
                    .await
                {
                    Ok(ResultLookup::Done { result }) => Some(*result),
                    _ => None,
                }
            }
        })
        .await;
        assert_eq!(
            (result.status, result.stdout.as_str()),
            (ExecStatus::Ok, out)
        );
    }

    // Live output: chunks arrive on output.<id>, in order, ending with eof.
    let id = messages::new_id();
    let mut sub = mesh
        .client
        .nats()
        .subscribe(s.output_any(&id))
        .await
        .unwrap();
    let mut streamed = req(
        Language::Python,
        "import time\nfor i in range(3):\n    print('line', i, flush=True)\n    time.sleep(0.2)",
    );
    streamed.execution_id = Some(id.clone());
    streamed.stream_output = true;
    let result = exec(&mesh, &streamed).await;
    let mut text = String::new();
    let mut next_seq = 0;
    loop {
        let m = tokio::time::timeout(Duration::from_secs(5), sub.next())
            .await
            .expect("a chunk")
            .unwrap();
        let enc = messages::Encoding::from_content_type(
            m.headers
                .as_ref()
                .and_then(|h| h.get("Content-Type"))
                .map(|v| v.as_str()),
        )
        .unwrap();
        let chunk: OutputChunk = enc.decode(&m.payload).unwrap();
        assert_eq!(chunk.seq, next_seq, "no gaps");
        next_seq += 1;
        if chunk.stream == OutputStream::Stdout {
            text.push_str(&chunk.data);
        }
        if chunk.eof {
            break;
        }
    }
    assert_eq!(text, result.stdout);
    assert_eq!(text, "line 0\nline 1\nline 2\n");
    // `sandmesh exec` itself is tested as the real binary in cli/tests/e2e.rs.
    mesh.shutdown().await;
}

async fn pending_for(mesh: &Mesh, execution_id: &str) -> Confirmation {
    let s = Subjects::default();
    eventually("the pending confirmation", || {
        let c = mesh.client.clone();
        let subject = s.confirm(ConfirmOp::List);
        async move {
            let list: ConfirmListReply = c.request(subject, &ConfirmList::default()).await.ok()?;
            list.confirmations
                .into_iter()
                .find(|c| c.execution_id.as_deref() == Some(execution_id))
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rm_rf_is_rejected_a_deny_policy_denies_and_an_approval_runs() {
    let deny_critical = [("SANDMESH_CONFIRM_AUTO_DENY_LEVELS", "critical")];
    let mesh = real_mesh(1, &deny_critical, Some(|_| {})).await;
    let s = Subjects::default();

    let r = exec(&mesh, &req(Language::Shell, "rm -rf /")).await;
    assert_eq!((r.status, r.tier), (ExecStatus::Rejected, Tier::Reject));
    assert_eq!(r.risk.level, RiskLevel::Critical);
    assert!(r.node.is_none(), "never placed");

    let r = exec(&mesh, &req(Language::Python, "import os\nos.system('id')")).await;
    assert_eq!(r.status, ExecStatus::Denied, "{r:?}");
    assert_eq!(r.confirmation.decision, Decision::Denied);
    assert!(r.node.is_none(), "never reached an executor");

    // High (not critical): a person decides. Approve it through confirm.decide.
    let id = messages::new_id();
    let mut risky = req(
        Language::Python,
        "import sys\nprint('approved run')\nsys.exit(3)",
    );
    risky.execution_id = Some(id.clone());
    let c = mesh.client.clone();
    let running = tokio::spawn(async move {
        c.request::<_, ExecResult>(Subjects::default().exec(), &risky)
            .await
    });
    let pending = pending_for(&mesh, &id).await;
    let decided: Confirmation = mesh
        .client
        .request(
            s.confirm(ConfirmOp::Decide),
            &ConfirmDecide {
                by_account: None,
                id: pending.id,
                approve: true,
                by: "tester".into(),
                reason: Some("looks fine".into()),
                scope: ConfirmScope::Once,
            },
        )
        .await
        .unwrap();
    assert_eq!(decided.by.as_deref(), Some("tester"));
    let r = running.await.unwrap().unwrap();
    assert_eq!(
        (r.status, r.exit_code),
        (ExecStatus::Error, Some(3)),
        "{r:?}"
    );
    assert_eq!(r.stdout, "approved run\n");
    assert_eq!(r.confirmation.decision, Decision::Approved);
    assert_eq!(r.confirmation.by.as_deref(), Some("tester"));
    assert_eq!(r.tier, Tier::Session, "strict mode isolates high-risk code");
    assert!(r.timing.confirm_ms > 0);

    // Malformed and hostile input: clear errors, and the mesh keeps serving.
    let raw = mesh
        .client
        .nats()
        .request(s.exec(), "{\"language\":\"cobol\"".into())
        .await
        .unwrap();
    let code = raw
        .headers
        .unwrap()
        .get("Nats-Service-Error-Code")
        .unwrap()
        .to_string();
    assert_eq!(code, "400");
    let e = mesh
        .client
        .request::<_, ExecResult>(s.exec(), &req(Language::Python, &"#".repeat(300 * 1024)))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TooLarge);
    let bomb = exec(&mesh, &req(Language::Shell, ":(){ :|:& };:")).await;
    assert_eq!(bomb.status, ExecStatus::Rejected);
    let mut spin = req(Language::Python, "while True: pass");
    spin.timeout_ms = Some(1000);
    assert_eq!(exec(&mesh, &spin).await.status, ExecStatus::Timeout);
    let ok = exec(&mesh, &req(Language::Python, "print(sum(range(10)))")).await;
    assert_eq!((ok.status, ok.stdout.as_str()), (ExecStatus::Ok, "45\n"));
    mesh.shutdown().await;
}

async fn session_get(mesh: &Mesh, id: &str) -> SessionRecord {
    mesh.client
        .request(
            Subjects::default().sessions(SessionOp::Get),
            &SessionRef {
                session_id: id.into(),
            },
        )
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sessions_persist_two_executors_share_load_and_a_dead_node_loses_no_files() {
    // Development policy: confirmations approve themselves, so file writes just run.
    let auto = [("SANDMESH_CONFIRM_AUTO_APPROVE", "true")];
    let tune = |c: &mut scheduler::SchedulerConfig| {
        c.placement = scheduler::placement::Strategy::LeastLoaded
    };
    let mut mesh = real_mesh(2, &auto, Some(tune)).await;
    let s = Subjects::default();

    // Two executors share ephemeral work.
    let tasks: Vec<_> = (0..6)
        .map(|i| {
            let c = mesh.client.clone();
            tokio::spawn(async move {
                let r = req(
                    Language::Python,
                    &format!("import time\ntime.sleep(1)\nprint({i})"),
                );
                c.request::<_, ExecResult>(Subjects::default().exec(), &r)
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
        *per_node.entry(r.node.unwrap()).or_default() += 1;
    }
    assert_eq!(per_node.len(), 2, "both executors took work: {per_node:?}");

    // A session keeps its files across executions, on one node.
    let session = format!("e2e-{}", messages::new_id().to_ascii_lowercase());
    let opened: SessionRecord = mesh
        .client
        .request(
            s.sessions(SessionOp::Open),
            &SessionOpen {
                session_id: Some(session.clone()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(opened.state, SessionState::Open);
    let in_session = |code: &str| ExecRequest {
        session_id: Some(session.clone()),
        ..req(Language::Python, code)
    };
    let wrote = exec(
        &mesh,
        &in_session("open('data/note.txt', 'w').write('persisted')"),
    )
    .await;
    assert_eq!(wrote.status, ExecStatus::Ok, "{wrote:?}");
    assert_eq!(wrote.tier, Tier::Session);
    assert!(
        wrote.files_created.iter().any(|f| f == "data/note.txt"),
        "{wrote:?}"
    );
    let read = exec(&mesh, &in_session("print(open('data/note.txt').read())")).await;
    assert_eq!(read.stdout, "persisted\n");
    assert_eq!(read.node, wrote.node, "session affinity");
    assert!(!read.session_restored);

    // Kill the node holding it: the next execution runs elsewhere, files intact.
    let holder = read.node.clone().unwrap();
    mesh.crash_docker_executor(&holder).await;
    let after = exec(&mesh, &in_session("print(open('data/note.txt').read())")).await;
    assert_eq!(after.status, ExecStatus::Ok, "{after:?}");
    assert_eq!(after.stdout, "persisted\n", "the workspace was restored");
    assert_ne!(after.node.as_deref(), Some(holder.as_str()));
    assert!(
        after.session_restored,
        "the result says process state was lost"
    );
    let record = session_get(&mesh, &session).await;
    assert_eq!((record.state, record.restores), (SessionState::Active, 1));

    let closed: SessionRecord = mesh
        .client
        .request(
            s.sessions(SessionOp::Close),
            &SessionRef {
                session_id: session.clone(),
            },
        )
        .await
        .unwrap();
    assert_eq!(closed.state, SessionState::Closed);
    crate::common::docker::remove_containers(&holder);
    mesh.shutdown().await;
}

/// A node dies while it runs an execution: the execution ends `executor_lost` once the node's
/// heartbeat expires (half a second's beats here), not when its 60 s deadline runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_on_a_node_that_dies_is_lost_when_its_heartbeat_expires_not_at_its_deadline() {
    let auto = [("SANDMESH_CONFIRM_AUTO_APPROVE", "true")];
    let mut mesh = real_mesh(1, &auto, Some(|_| {})).await;
    let s = Subjects::default();
    // Its first output line says the program runs in the container.
    let id = messages::new_id();
    let mut output = mesh
        .client
        .nats()
        .subscribe(s.output_any(&id))
        .await
        .unwrap();
    let long = ExecRequest {
        execution_id: Some(id),
        timeout_ms: Some(60_000),
        stream_output: true,
        ..req(
            Language::Python,
            "import time\nprint('running', flush=True)\ntime.sleep(55)\nprint('survived')",
        )
    };
    let client = mesh.client.clone();
    let running = tokio::spawn(async move {
        client
            .request::<_, ExecResult>(Subjects::default().exec(), &long)
            .await
    });
    let mut running = running;
    tokio::select! {
        first = output.next() => assert!(first.is_some(), "output subscription open"),
        done = &mut running => panic!("the execution ended before it printed: {done:?}"),
        () = tokio::time::sleep(Duration::from_secs(60)) => panic!("the program did not start"),
    }
    let node = mesh.docker_nodes().pop().expect("one node");
    let crashed = std::time::Instant::now();
    mesh.crash_docker_executor(&node).await;
    let r = running.await.unwrap().expect("an answer");
    let took = crashed.elapsed();
    assert_eq!(r.status, ExecStatus::ExecutorLost, "{r:?}");
    assert!(
        r.error
            .as_ref()
            .is_some_and(|e| e.message.contains("heartbeat")),
        "{r:?}"
    );
    assert!(
        took < Duration::from_secs(30),
        "lost after {took:?}, not at the heartbeat's expiry"
    );
    crate::common::docker::remove_containers(&node);
    mesh.shutdown().await;
}

/// The scheduler binary is SIGKILLed with async jobs in flight on the real mesh; a new
/// scheduler takes over. Every accepted job ends with exactly one result.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_scheduler_leaves_every_accepted_job_with_exactly_one_result() {
    let mut mesh = real_mesh(1, &[], None).await;
    let s = Subjects::default();
    let settings = [
        ("SANDMESH_SCHED_JOB_ACK_WAIT_MS", "3000"),
        ("SANDMESH_SCHED_CLAIM_TTL_MS", "3000"),
        ("SANDMESH_SCHED_MAX_QUEUE", "4"),
    ];
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sandmesh-scheduler"))
        .env("SANDMESH_NATS_URL", &mesh.url)
        .env("SANDMESH_INSTANCE_ID", "doomed")
        .envs(settings)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    mesh.wait_ready().await;

    let js = jetstream::new(mesh.client.nats().clone());
    let mut accepted = std::collections::BTreeSet::new();
    for i in 0..12 {
        let id = format!("kill-{i:02}-{}", messages::new_id());
        let mut r = req(
            Language::Python,
            &format!("import time\ntime.sleep(0.5)\nprint({i})"),
        );
        r.execution_id = Some(id.clone());
        crate::common::publish_job(&js, &r).await;
        accepted.insert(id);
    }
    let results = js.get_stream(s.results_stream()).await.unwrap();
    let stored = |id: String| {
        let results = results.clone();
        async move {
            results
                .direct_get_last_for_subject(Subjects::default().result(&id))
                .await
                .ok()
        }
    };
    // Kill it while it holds a claim on work that has not finished (each job sleeps 0.5 s),
    // after it stored at least one result.
    let claims = js.get_key_value(s.exec_claims_bucket()).await.unwrap();
    let in_flight = || {
        let (stored, accepted, claims) = (&stored, &accepted, &claims);
        async move {
            let (mut done, mut held) = (0, 0);
            for id in accepted {
                if stored(id.clone()).await.is_some() {
                    done += 1;
                } else if claims.get(id.as_str()).await.ok().flatten().is_some() {
                    held += 1;
                }
            }
            (done >= 1 && held >= 1).then_some(held)
        }
    };
    eventually("a stored result and work in flight", in_flight).await;
    child.kill().unwrap();
    child.wait().unwrap();
    // Executions the dead scheduler held claims on were in flight when it died.
    let mut held = 0;
    for id in &accepted {
        if claims.get(id.as_str()).await.unwrap().is_some() && stored(id.clone()).await.is_none() {
            held += 1;
        }
    }
    assert!(held > 0, "the kill should interrupt running executions");

    let mut config = mesh.config();
    config.job_ack_wait = Duration::from_secs(3);
    config.claim_ttl = Duration::from_secs(3);
    config.max_queue = 4;
    mesh.start_scheduler(config).await;
    let mut ended = std::collections::BTreeSet::new();
    for id in &accepted {
        let m = eventually(&format!("the result of {id}"), || stored(id.clone())).await;
        let r: ExecResult = serde_json::from_slice(&m.payload).unwrap();
        assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
        ended.insert(r.execution_id);
    }
    assert_eq!(ended, accepted, "acked ids == result ids");
    let mut results = js.get_stream(s.results_stream()).await.unwrap();
    let state = results.info().await.unwrap().state.clone();
    assert_eq!(state.messages, accepted.len() as u64);
    assert_eq!(
        state.last_sequence, state.messages,
        "no result was written twice"
    );
    mesh.shutdown().await;
}
