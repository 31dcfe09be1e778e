//! Sessions and placement over a real nats-server with executor stand-ins: affinity, load
//! sharing, failover when the node holding a session dies, close.

use std::collections::BTreeMap;

use crate::common::*;
use messages::exec::{ExecRequest, ExecResult, ExecStatus, Language, Tier};
use messages::session::{
    SessionList, SessionListReply, SessionOpen, SessionRecord, SessionRef, SessionState,
};
use messages::subjects::SessionOp;
use messages::{ErrorKind, Subjects};
use scheduler::placement::Strategy;

fn in_session(session: &str, code: &str) -> ExecRequest {
    ExecRequest {
        session_id: Some(session.into()),
        language: Language::Python,
        code: code.into(),
        ..Default::default()
    }
}

async fn exec(c: &kit::Caller, r: &ExecRequest) -> ExecResult {
    c.call(Subjects::default().exec(), r).await.unwrap()
}

async fn get(c: &kit::Caller, id: &str) -> SessionRecord {
    c.call(
        Subjects::default().sessions(SessionOp::Get),
        &SessionRef {
            session_id: id.into(),
        },
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn open_get_list_close_and_affinity() {
    let mesh = Mesh::builder()
        .risk()
        .workspace()
        .executor("node-a", 8)
        .executor("node-b", 8)
        .scheduler(|c| c.placement = Strategy::RoundRobin)
        .start()
        .await;
    let (c, runs) = (mesh.client.clone(), mesh.runs.clone());
    let s = Subjects::default();

    let opened: SessionRecord = c
        .call(
            s.sessions(SessionOp::Open),
            &SessionOpen {
                session_id: Some("s-1".into()),
                requested_by: Some("agent-7".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(opened.state, SessionState::Open);
    assert_eq!(opened.requested_by.as_deref(), Some("agent-7"));

    // Round-robin would alternate; the session's executions all stay on its node.
    let nodes: Vec<String> = futures_nodes(&c, "s-1", 4).await;
    assert!(nodes.iter().all(|n| n == &nodes[0]), "{nodes:?}");
    let record = get(&c, "s-1").await;
    assert_eq!(record.state, SessionState::Active);
    assert_eq!(record.node.as_deref(), Some(nodes[0].as_str()));
    // The use count is recorded after the reply, in the background.
    eventually("the use count", || {
        let c = c.clone();
        async move { (get(&c, "s-1").await.executions == 4).then_some(()) }
    })
    .await;
    assert!(runs.lock().unwrap().iter().all(|r| r.tier == Tier::Session));

    // A session used without opening is opened on first use.
    let r = exec(&c, &in_session("s-implicit", "print(1)")).await;
    assert_eq!(r.status, ExecStatus::Ok);
    let list: SessionListReply = c
        .call(s.sessions(SessionOp::List), &SessionList::default())
        .await
        .unwrap();
    let ids: Vec<&str> = list
        .sessions
        .iter()
        .map(|r| r.session_id.as_str())
        .collect();
    assert_eq!(ids, ["s-1", "s-implicit"]);

    let closed: SessionRecord = c
        .call(
            s.sessions(SessionOp::Close),
            &SessionRef {
                session_id: "s-1".into(),
            },
        )
        .await
        .unwrap();
    assert_eq!(closed.state, SessionState::Closed);
    let after = exec(&c, &in_session("s-1", "print(1)")).await;
    assert_eq!(after.status, ExecStatus::Rejected);
    assert_eq!(after.error.unwrap().kind, ErrorKind::Conflict);
    let reopen = c
        .call::<_, SessionRecord>(
            s.sessions(SessionOp::Open),
            &SessionOpen {
                session_id: Some("s-1".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(reopen.kind(), ErrorKind::Conflict);
    let missing = c
        .call::<_, SessionRecord>(
            s.sessions(SessionOp::Get),
            &SessionRef {
                session_id: "nope".into(),
            },
        )
        .await
        .unwrap_err();
    assert_eq!(missing.kind(), ErrorKind::NotFound);
    mesh.shutdown().await;
}

async fn futures_nodes(c: &kit::Caller, session: &str, n: usize) -> Vec<String> {
    let mut nodes = Vec::new();
    for i in 0..n {
        let r = exec(c, &in_session(session, &format!("print({i})"))).await;
        assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
        nodes.push(r.node.unwrap());
    }
    nodes
}

#[tokio::test]
async fn two_executors_share_ephemeral_load_under_every_strategy() {
    let mut mesh = Mesh::builder().risk().start().await;
    let c = mesh.client.clone();
    for strategy in [
        Strategy::RoundRobin,
        Strategy::LeastLoaded,
        Strategy::ResourceAware,
    ] {
        mesh.add_executor("node-a", 4).await;
        mesh.add_executor("node-b", 4).await;
        let mut cfg = mesh.config();
        cfg.placement = strategy;
        mesh.start_scheduler(cfg).await;
        // Concurrent work: placement must spread it, since each node reports load 0 until
        // its next heartbeat.
        let tasks: Vec<_> = (0..8)
            .map(|i| {
                let c = c.clone();
                tokio::spawn(async move {
                    let r = ExecRequest {
                        language: Language::Python,
                        code: format!("sleep:300 {i}"),
                        ..Default::default()
                    };
                    exec(&c, &r).await
                })
            })
            .collect();
        let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
        for t in tasks {
            let r = t.await.unwrap();
            assert_eq!(r.status, ExecStatus::Ok);
            *per_node.entry(r.node.unwrap()).or_default() += 1;
        }
        assert_eq!(per_node.len(), 2, "{strategy:?}: {per_node:?}");
        assert!(
            per_node.values().all(|n| *n >= 2),
            "{strategy:?}: {per_node:?}"
        );
        mesh.stop_scheduler().await;
        mesh.stop_executor("node-a").await;
        mesh.stop_executor("node-b").await;
    }
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_session_whose_node_dies_is_re_placed_with_its_state_restored() {
    let mut mesh = Mesh::builder()
        .risk()
        .workspace()
        .executor("node-a", 8)
        .scheduler(|_| {})
        .start()
        .await;
    let (c, runs) = (mesh.client.clone(), mesh.runs.clone());

    let first = exec(&c, &in_session("s-fail", "x = 1")).await;
    assert_eq!(first.node.as_deref(), Some("node-a"));
    assert!(!first.session_restored);
    mesh.add_executor("node-b", 8).await;

    // Killed: its heartbeat key is still there, but nobody answers on its subjects.
    mesh.crash_executor("node-a").await;
    let next = exec(&c, &in_session("s-fail", "print(x)")).await;
    assert_eq!(next.status, ExecStatus::Ok);
    assert_eq!(next.node.as_deref(), Some("node-b"));
    assert!(
        next.session_restored,
        "the result says process state was lost"
    );
    let last = runs.lock().unwrap().last().cloned().unwrap();
    assert!(
        last.restored,
        "the executor was told to restore the workspace"
    );
    let record = get(&c, "s-fail").await;
    assert_eq!((record.state, record.restores), (SessionState::Active, 1));
    assert_eq!(record.node.as_deref(), Some("node-b"));

    // Later executions stay on the new node and are not restores.
    let again = exec(&c, &in_session("s-fail", "print(x)")).await;
    assert_eq!(again.node.as_deref(), Some("node-b"));
    assert!(!again.session_restored);

    // A node that goes away cleanly: its heartbeat key is deleted and the registry marks its
    // sessions lost before anyone executes.
    mesh.add_executor("node-c", 8).await;
    mesh.stop_executor("node-b").await;
    let lost = eventually("the session to be marked lost", || {
        let c = c.clone();
        async move {
            let r = get(&c, "s-fail").await;
            (r.state == SessionState::Lost).then_some(r)
        }
    })
    .await;
    assert_eq!(lost.lost_from.as_deref(), Some("node-b"));
    let moved = exec(&c, &in_session("s-fail", "print(x)")).await;
    assert_eq!(moved.node.as_deref(), Some("node-c"));
    assert!(moved.session_restored);
    mesh.shutdown().await;
}

/// New sessions beyond the free slots wait for one (bounded by their deadline) instead of
/// failing with 503 while the node is busy: one slot, three sessions at once, all run.
#[tokio::test]
async fn new_sessions_wait_for_a_free_slot() {
    let mesh = Mesh::builder()
        .risk()
        .workspace()
        .executor("node-a", 1)
        .scheduler(|_| {})
        .start()
        .await;
    let c = mesh.client.clone();

    let mut running = Vec::new();
    for i in 0..3 {
        let c = c.clone();
        running.push(tokio::spawn(async move {
            exec(&c, &in_session(&format!("busy-{i}"), "sleep:300")).await
        }));
    }
    for r in running {
        let result = r.await.unwrap();
        assert_eq!(result.status, ExecStatus::Ok, "{:?}", result.error);
        assert_eq!(result.node.as_deref(), Some("node-a"));
    }
    mesh.shutdown().await;
}
