//! Exactly once when a run's reply does not come: the scheduler asks the node what
//! happened (`executor.<backend>.<node>.status`) before it calls the run `executor_lost`, and
//! sends it again only to attach to it or to run what never arrived. The executor is the real
//! executor node over a backend that starts no sandbox ([`NodeStandin`]), so what is tested
//! is the product's node: one run per execution id, kept answers, `status`.
//!
//! A node that is really gone still ends its run `executor_lost` at once (`e2e.rs`, real
//! Docker), and a node that never says what happened within the run's budget too
//! (`sync_exec.rs`, `executor_errors_become_terminal_statuses`).

use std::time::Duration;

use crate::common::{Mesh, NodeStandin};
use messages::exec::{ExecRequest, ExecResult, ExecStatus, Language, Tier, TierChoice};
use messages::session::{SessionOpen, SessionRecord, SessionState};
use messages::subjects::{ExecutorOp, SessionOp};
use messages::{ServiceName, Subjects};

const NODE: &str = "node-a";

/// The risk stand-in, then a real node, then the scheduler (which finds the node in the
/// heartbeats it preloads, so work goes to the node, not the queue group), with a grace of
/// half a second past an execution's timeout.
async fn mesh_with_node(tenants: &[&str]) -> (Mesh, NodeStandin) {
    test_support::trace_to_test_output();
    let mut builder = Mesh::builder().risk().workspace();
    if !tenants.is_empty() {
        builder = builder.tenants(tenants, &[]);
    }
    let mut mesh = builder.start().await;
    let probe = crate::common::connect(&mesh.url).await;
    let node = NodeStandin::start(
        &mesh.nats.service_url(ServiceName::DockerExecutor),
        &probe,
        NODE,
        4,
        mesh.runs.clone(),
        1,
    )
    .await;
    let mut config = mesh.config();
    config.exec_grace = Duration::from_millis(500);
    mesh.start_scheduler(config).await;
    (mesh, node)
}

fn request(id: &str, code: &str, timeout_ms: u64) -> ExecRequest {
    ExecRequest {
        execution_id: Some(id.into()),
        language: Language::Python,
        code: code.into(),
        timeout_ms: Some(timeout_ms),
        ..Default::default()
    }
}

/// How many runs the node took of client id `id` (scoped by its tenant inside the mesh).
fn runs_of(mesh: &Mesh, id: &str) -> usize {
    let suffix = format!("-{id}");
    mesh.runs
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.execution_id == id || r.execution_id.ends_with(&suffix))
        .count()
}

/// The scheduler's wait for the reply (200 ms timeout + 500 ms grace) runs out while the node
/// still runs it (1.5 s): asked, the node says `running`, and the run sent again attaches to
/// it — the caller gets its output, and it ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reply_not_come_in_time_is_asked_for_and_the_run_attached_to_not_run_twice() {
    let (mesh, _node) = mesh_with_node(&[]).await;
    let r = mesh
        .exec(&request("slow-1", "sleep:1500", 200))
        .await
        .unwrap();
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    assert_eq!(r.stdout, format!("ran on {NODE}\n"));
    assert_eq!(runs_of(&mesh, "slow-1"), 1, "one run");
    // A repeat of the id is the stored result, not a run.
    let again = mesh
        .exec(&request("slow-1", "sleep:1500", 200))
        .await
        .unwrap();
    assert_eq!(
        (again.status, runs_of(&mesh, "slow-1")),
        (ExecStatus::Ok, 1)
    );
}

/// The node's heartbeat key vanishes while it runs (as when its beats were lost in a NATS
/// failover): the heartbeat watchdog ends the wait, but the node answers `running` when asked,
/// so the scheduler attaches to the run instead of calling it lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_alive_after_its_heartbeat_lapsed_keeps_its_run() {
    let (mesh, _node) = mesh_with_node(&[]).await;
    let client = mesh.client.clone();
    let running = tokio::spawn(async move {
        client
            .request::<_, ExecResult>(
                Subjects::default().exec(),
                &request("beat-1", "sleep:3000", 10_000),
            )
            .await
    });
    crate::common::eventually("the run to start", || {
        let n = runs_of(&mesh, "beat-1");
        async move { (n == 1).then_some(()) }
    })
    .await;
    let kv = mesh
        .js
        .get_key_value(Subjects::default().nodes_bucket())
        .await
        .unwrap();
    kv.delete(ServiceName::DockerExecutor.heartbeat_key(NODE))
        .await
        .unwrap();
    let r = running.await.unwrap().expect("an answer");
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    assert_eq!(runs_of(&mesh, "beat-1"), 1, "one run");
}

/// A node whose heartbeat lapsed but that still answers keeps its sessions: its beats were
/// lost, not its containers. (With one node, a session marked lost would have nowhere to go.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_that_answers_after_its_heartbeat_lapsed_keeps_its_sessions() {
    let (mesh, _node) = mesh_with_node(&[]).await;
    let s = Subjects::default();
    let open = SessionOpen {
        session_id: Some("kept".into()),
        tier: Some(Tier::Session),
        ..Default::default()
    };
    let _: SessionRecord = mesh
        .client
        .request(s.sessions(SessionOp::Open), &open)
        .await
        .unwrap();
    let in_session = |n: usize| ExecRequest {
        session_id: Some("kept".into()),
        tier: TierChoice::Session,
        ..request(&format!("kept-{n}"), "print('in session')", 5_000)
    };
    let first = mesh.exec(&in_session(0)).await.unwrap();
    assert_eq!(first.node.as_deref(), Some(NODE), "{first:?}");

    let kv = mesh.js.get_key_value(s.nodes_bucket()).await.unwrap();
    let key = ServiceName::DockerExecutor.heartbeat_key(NODE);
    kv.delete(&key).await.unwrap();
    crate::common::eventually("the node's next heartbeat", || {
        let (kv, key) = (kv.clone(), key.clone());
        async move { kv.get(key).await.ok().flatten() }
    })
    .await;
    let get = serde_json::json!({"session_id": "kept"});
    let record: SessionRecord = mesh
        .client
        .request(s.sessions(SessionOp::Get), &get)
        .await
        .unwrap();
    assert_eq!(record.state, SessionState::Active, "{record:?}");
    let next = mesh.exec(&in_session(1)).await.unwrap();
    assert_eq!(next.status, ExecStatus::Ok, "{next:?}");
    assert_eq!(next.node.as_deref(), Some(NODE));
    assert!(
        !next.session_restored,
        "the session was re-placed: {next:?}"
    );
}

/// "What happened to X?" is the mesh's internal question: a tenant's agent asking the node
/// directly — even about its own execution — gets no answer (its account has no such
/// subject), while the node answers the mesh's own clients.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_cannot_ask_a_node_what_happened() {
    let (mesh, _node) = mesh_with_node(&["acme"]).await;
    let acme = crate::common::connect(&mesh.nats.agent_url("acme")).await;
    let agent = kit::mesh_client(acme.clone(), Default::default())
        .with_timeout(Duration::from_secs(60))
        .with_encoding(messages::Encoding::Json);
    let r: ExecResult = agent
        .request(
            Subjects::default().exec(),
            &request("asked-1", "print('x')", 5_000),
        )
        .await
        .unwrap();
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    let subject = Subjects::default().executor_node(NODE, ExecutorOp::Status);
    let query = serde_json::json!({"execution_id": "acme-asked-1", "tenant": "acme"});
    let payload: bytes::Bytes = serde_json::to_vec(&query).unwrap().into();
    let asked = acme.request(subject.clone(), payload.clone()).await;
    assert!(asked.is_err(), "a tenant got an answer: {asked:?}");
    let inside = crate::common::connect(&mesh.url).await;
    let answer = inside.request(subject, payload).await.expect("an answer");
    let status: serde_json::Value = serde_json::from_slice(&answer.payload).unwrap();
    assert_eq!(status["state"], "finished", "{status}");
}

/// The node's status subject refuses what it cannot read: not JSON, wrong types, a missing
/// id (400), ids no run can have — too long, subject wildcards, path tricks, another tenant's
/// prefix (400) — and a payload past the server's limit never reaches it. None of it touches
/// the node's runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn malformed_oversized_and_hostile_status_queries_are_refused() {
    let (mesh, node) = mesh_with_node(&[]).await;
    let inside = crate::common::connect(&mesh.url).await;
    let subject = Subjects::default().executor_node(NODE, ExecutorOp::Status);
    let too_long = "x".repeat(messages::validate::MAX_ID_LEN + 1);
    let hostile = [
        "{not json".to_string(),
        r#"{"execution_id": 7}"#.to_string(),
        r#"{"tenant": "acme"}"#.to_string(),
        format!(r#"{{"execution_id": "{too_long}"}}"#),
        r#"{"execution_id": "a.>"}"#.to_string(),
        r#"{"execution_id": "../x"}"#.to_string(),
        r#"{"execution_id": "beta-x1", "tenant": "acme"}"#.to_string(),
        r#"{"execution_id": "acme-x1", "tenant": "ACME"}"#.to_string(),
    ];
    let code_of = |reply: async_nats::Message| {
        reply
            .headers
            .as_ref()
            .and_then(|h| h.get(messages::codec::SERVICE_ERROR_CODE))
            .map(|v| v.as_str().to_string())
    };
    for payload in &hostile {
        let reply = inside
            .request(subject.clone(), payload.clone().into_bytes().into())
            .await
            .unwrap();
        assert_eq!(code_of(reply).as_deref(), Some("400"), "{payload}");
    }
    // The largest payload the server takes reaches the node and is refused for its id; one
    // byte more never leaves the client (the shipped `max_payload`, which the node's own
    // 1 MiB bound equals).
    let max = inside.server_info().max_payload;
    let sized = |n: usize| {
        let id = "x".repeat(n - r#"{"execution_id":""}"#.len());
        format!(r#"{{"execution_id":"{id}"}}"#).into_bytes()
    };
    let largest = inside
        .request(subject.clone(), sized(max).into())
        .await
        .unwrap();
    assert_eq!(code_of(largest).as_deref(), Some("400"));
    let oversized = inside.request(subject, sized(max + 1).into()).await;
    assert!(oversized.is_err(), "{oversized:?}");
    assert!(node.is_running(), "the node still serves");
    let r = mesh
        .exec(&request("after-1", "print('x')", 5_000))
        .await
        .unwrap();
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
}
