//! Sessions and placement over a real nats-server with executor stand-ins: affinity, load
//! sharing, failover when the node holding a session dies, close.

use sandmesh_client::{ClientError, MeshClient};
use std::collections::BTreeMap;

use crate::common::docker::session_containers;
use crate::common::*;
use messages::audit::AuditDetails;
use messages::exec::{ExecRequest, ExecResult, ExecStatus, Language, Tier};
use messages::filesystem::FilesystemPolicy;
use messages::session::{
    CloseReason, SessionList, SessionListReply, SessionOpen, SessionRecord, SessionRef,
    SessionState,
};
use messages::subjects::SessionOp;
use messages::{ErrorBody, ErrorKind, Subjects};
use scheduler::placement::Strategy;

fn in_session(session: &str, code: &str) -> ExecRequest {
    ExecRequest {
        session_id: Some(session.into()),
        language: Language::Python,
        code: code.into(),
        ..Default::default()
    }
}

async fn exec(c: &MeshClient, r: &ExecRequest) -> ExecResult {
    c.request(Subjects::default().exec(), r).await.unwrap()
}

async fn get(c: &MeshClient, id: &str) -> SessionRecord {
    c.request(
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
        .request(
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
        .request(s.sessions(SessionOp::List), &SessionList::default())
        .await
        .unwrap();
    let ids: Vec<&str> = list
        .sessions
        .iter()
        .map(|r| r.session_id.as_str())
        .collect();
    assert_eq!(ids, ["s-1", "s-implicit"]);

    let closed: SessionRecord = c
        .request(
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
        .request::<_, SessionRecord>(
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
        .request::<_, SessionRecord>(
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

async fn futures_nodes(c: &MeshClient, session: &str, n: usize) -> Vec<String> {
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
    let mut mesh = Mesh::sessions(8).start().await;
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
    let mesh = Mesh::sessions(1).start().await;
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

fn shell(session: &str, code: &str) -> ExecRequest {
    ExecRequest {
        session_id: Some(session.into()),
        language: Language::Shell,
        code: code.into(),
        ..Default::default()
    }
}

async fn open(c: &MeshClient, open: &SessionOpen) -> Result<SessionRecord, ClientError> {
    c.request(Subjects::default().sessions(SessionOp::Open), open)
        .await
}

fn refused(e: ClientError) -> messages::ErrorBody {
    match e {
        ClientError::Service { body, .. } => body,
        other => panic!("expected a service error, got {other}"),
    }
}

/// A session's configuration over the real docker-executor: its env reaches the code (the
/// request's own wins), its timeout applies to runs that set none, its template is fixed
/// (another one is refused: its container runs one image), and its TTL closes it — container
/// removed, `session_closed` audited with the reason — and its record is removed after the
/// retention time, so the id is free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sessions_configuration_reaches_its_runs_until_its_ttl_closes_it() {
    let mesh = Mesh::docker_sessions()
        .scheduler(|c| {
            c.sessions.sweep = std::time::Duration::from_millis(200);
            c.sessions.retention = std::time::Duration::from_secs(1);
        })
        .start()
        .await;
    let c = mesh.client.clone();

    let configured = SessionOpen {
        session_id: Some("cfg".into()),
        env: BTreeMap::from([
            ("MODE".to_string(), "session".to_string()),
            ("WHO".to_string(), "session".to_string()),
        ]),
        timeout_ms: Some(1_500),
        ..Default::default()
    };
    let record = open(&c, &configured).await.unwrap();
    assert_eq!(record.env, configured.env);
    assert_eq!(record.timeout_ms, Some(1_500));
    let mut own_env = shell("cfg", "echo \"$MODE $WHO\"");
    own_env.env = BTreeMap::from([("WHO".to_string(), "request".to_string())]);
    let r = exec(&c, &own_env).await;
    assert_eq!(
        (r.status, r.stdout.as_str()),
        (ExecStatus::Ok, "session request\n"),
        "{r:?}"
    );
    // The session's timeout for a run that sets none; a run's own wins.
    let r = exec(&c, &shell("cfg", "sleep 20; echo late")).await;
    assert_eq!(r.status, ExecStatus::Timeout, "{r:?}");
    let r = exec(
        &c,
        &ExecRequest {
            timeout_ms: Some(30_000),
            ..shell("cfg", "sleep 2; echo in time")
        },
    )
    .await;
    assert_eq!(
        (r.status, r.stdout.as_str()),
        (ExecStatus::Ok, "in time\n"),
        "{r:?}"
    );

    // Placed without a template, the session's container runs the sandbox image: a run
    // naming a template would not get its image, so it is refused.
    let other = ExecRequest {
        template: Some("python-default".into()),
        ..shell("cfg", "echo never")
    };
    let e = refused(mesh.exec(&other).await.unwrap_err());
    assert_eq!(e.kind, ErrorKind::Conflict, "{e:?}");
    assert!(e.message.contains("no template"), "{e:?}");

    // Opened without a template, a session takes its first run's; then it is fixed.
    open(
        &c,
        &SessionOpen {
            session_id: Some("adopt".into()),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let first = ExecRequest {
        template: Some("python-default".into()),
        ..shell("adopt", "echo first")
    };
    assert_eq!(exec(&c, &first).await.status, ExecStatus::Ok);
    assert_eq!(
        get(&c, "adopt").await.template.as_deref(),
        Some("python-default")
    );
    let data = ExecRequest {
        template: Some("python-data".into()),
        ..shell("adopt", "echo never")
    };
    let e = refused(mesh.exec(&data).await.unwrap_err());
    assert_eq!(e.kind, ErrorKind::Conflict, "{e:?}");
    assert!(e.message.contains("template python-default"), "{e:?}");
    let r = exec(&c, &shell("adopt", "echo again")).await;
    assert_eq!(
        r.template.map(|t| t.name).as_deref(),
        Some("python-default")
    );

    // The TTL closes the session by itself: its container goes, the close is audited with
    // its reason, and its record is removed after the retention time.
    let short = SessionOpen {
        session_id: Some("short".into()),
        ttl_ms: Some(3_000),
        ..Default::default()
    };
    let record = open(&c, &short).await.unwrap();
    assert_eq!(
        record.expires_at,
        Some(record.created_at + 3_000),
        "{record:?}"
    );
    assert_eq!(
        exec(&c, &shell("short", "echo hi")).await.status,
        ExecStatus::Ok
    );
    assert!(!session_containers("short").unwrap().is_empty());
    let url = mesh.url.clone();
    let closed = eventually("the TTL to close the session", || {
        let url = url.clone();
        async move {
            audit_events(&url)
                .await
                .into_iter()
                .find_map(|e| match e.details {
                    AuditDetails::SessionClosed(closed)
                        if e.session_id.as_deref() == Some("short") =>
                    {
                        Some(closed)
                    }
                    _ => None,
                })
        }
    })
    .await;
    assert_eq!(closed.reason, CloseReason::Ttl, "{closed:?}");
    eventually("the session's container to go", || async {
        session_containers("short")
            .unwrap()
            .is_empty()
            .then_some(())
    })
    .await;
    let gone = eventually("the closed session's record to be removed", || {
        let c = c.clone();
        async move {
            c.request::<_, SessionRecord>(
                Subjects::default().sessions(SessionOp::Get),
                &SessionRef {
                    session_id: "short".into(),
                },
            )
            .await
            .err()
        }
    })
    .await;
    assert_eq!(refused(gone).kind, ErrorKind::NotFound);
    let again = open(&c, &short).await.unwrap();
    assert_eq!(again.state, SessionState::Open, "the id is free again");
    mesh.shutdown().await;
}

/// Hostile session settings, sent raw as any client could: each refused with an error naming
/// what is wrong, and nothing opened.
#[tokio::test]
async fn hostile_session_settings_are_refused_clearly() {
    let mesh = Mesh::sessions(2).start().await;
    let c = mesh.client.clone();
    let subject = Subjects::default().sessions(SessionOp::Open);
    let many: serde_json::Map<String, serde_json::Value> = (0..65)
        .map(|i| (format!("V{i}"), serde_json::json!("x")))
        .collect();
    let week_and_a_ms = 7 * 24 * 3600 * 1000 + 1u64;
    let too_many_dirs: Vec<String> = (0..17).map(|i| format!("/d{i}")).collect();
    let cases: Vec<(serde_json::Value, ErrorKind, &str)> = vec![
        (
            serde_json::json!({"env": {"LD_PRELOAD": "/tmp/x.so"}}),
            ErrorKind::BadRequest,
            "env.LD_PRELOAD",
        ),
        (
            serde_json::json!({"env": {"1BAD": "x"}}),
            ErrorKind::BadRequest,
            "env.1BAD",
        ),
        (
            serde_json::json!({"env": {"A=B": "x"}}),
            ErrorKind::BadRequest,
            "env.A=B",
        ),
        (
            serde_json::json!({"env": {"BIG": "x".repeat(5000)}}),
            ErrorKind::TooLarge,
            "env.BIG",
        ),
        (
            serde_json::json!({"env": {"NUL": "a\u{0}b"}}),
            ErrorKind::BadRequest,
            "env.NUL",
        ),
        (
            serde_json::json!({"env": many}),
            ErrorKind::BadRequest,
            "at most 64",
        ),
        (
            serde_json::json!({"env": ["A=B"]}),
            ErrorKind::BadRequest,
            "malformed",
        ),
        (
            serde_json::json!({"timeout_ms": 0}),
            ErrorKind::BadRequest,
            "timeout_ms",
        ),
        (
            serde_json::json!({"timeout_ms": -5}),
            ErrorKind::BadRequest,
            "malformed",
        ),
        (
            serde_json::json!({"ttl_ms": 0}),
            ErrorKind::BadRequest,
            "ttl_ms",
        ),
        (
            serde_json::json!({"ttl_ms": week_and_a_ms}),
            ErrorKind::BadRequest,
            "ttl_ms",
        ),
        (
            serde_json::json!({"ttl_ms": u64::MAX}),
            ErrorKind::BadRequest,
            "ttl_ms",
        ),
        (
            serde_json::json!({"ttl_ms": "soon"}),
            ErrorKind::BadRequest,
            "malformed",
        ),
        (
            serde_json::json!({"idle_ms": 0}),
            ErrorKind::BadRequest,
            "idle_ms",
        ),
        (
            serde_json::json!({"filesystem": {"deny_read": ["/workspace/secrets"]}}),
            ErrorKind::BadRequest,
            "filesystem.deny_read",
        ),
        (
            serde_json::json!({"filesystem": {"deny_read": ["/etc/../root"]}}),
            ErrorKind::BadRequest,
            "filesystem.deny_read",
        ),
        (
            serde_json::json!({"filesystem": {"deny_write": ["*.pem"]}}),
            ErrorKind::BadRequest,
            "filesystem.deny_write",
        ),
        (
            serde_json::json!({"filesystem": {"deny_write": ["/etc"]}}),
            ErrorKind::BadRequest,
            "read-only already",
        ),
        (
            serde_json::json!({"filesystem": {"allow_write": ["/proc/sys"]}}),
            ErrorKind::BadRequest,
            "filesystem.allow_write",
        ),
        (
            serde_json::json!({"filesystem": {"deny_read": too_many_dirs}}),
            ErrorKind::BadRequest,
            "at most 16",
        ),
    ];
    for (i, (body, kind, names)) in cases.into_iter().enumerate() {
        let mut body = body;
        body["session_id"] = serde_json::json!(format!("hostile-{i}"));
        let e = c
            .request::<_, SessionRecord>(subject.clone(), &body)
            .await
            .map(|r| panic!("{body} opened {r:?}"))
            .unwrap_err();
        let e = refused(e);
        assert_eq!(e.kind, kind, "{body}: {e:?}");
        assert!(e.message.contains(names), "{body}: {e:?}");
    }
    let list: SessionListReply = c
        .request(
            Subjects::default().sessions(SessionOp::List),
            &SessionList::default(),
        )
        .await
        .unwrap();
    assert!(list.sessions.is_empty(), "{:?}", list.sessions);
    // A huge timeout is not an error: it is clamped by the ceiling.
    let clamped = open(
        &c,
        &SessionOpen {
            timeout_ms: Some(u64::MAX),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let ceiling = messages::validate::Ceilings::default().max_timeout_ms;
    assert_eq!(clamped.timeout_ms, Some(ceiling));
    // An AIO instance cannot mount a session's filesystem policy: tier aio is refused there.
    let policy = FilesystemPolicy {
        deny_read: vec!["/etc/apt".into()],
        ..Default::default()
    };
    open(
        &c,
        &SessionOpen {
            session_id: Some("fs-aio".into()),
            filesystem: Some(policy),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let in_aio = ExecRequest {
        tier: messages::exec::TierChoice::Aio,
        ..in_session("fs-aio", "print(1)")
    };
    let r = exec(&c, &in_aio).await;
    assert_eq!(r.status, ExecStatus::Rejected, "{r:?}");
    let e = r.error.expect("the refusal says why");
    assert!(e.message.contains("filesystem policy"), "{e:?}");
    assert_eq!(e.details.as_ref().unwrap()["field"], "filesystem", "{e:?}");
    mesh.shutdown().await;
}

/// The filesystem policies of a template and of a session opened in it, over the real
/// docker-executor: both are mounted in the session's container and crossed from inside (a
/// hidden directory shows nothing, an allowed one takes writes, a read-only one in it
/// refuses them); a run of the template without a session gets the template's in a container
/// of its own; a run without either sees the directory. A bad policy in a template is refused
/// when it is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn template_and_session_filesystem_policies_are_mounted_and_hold_from_inside() {
    let mesh = Mesh::docker_sessions().start().await;
    let c = mesh.client.clone();
    let admin = sandmesh_client::MeshClient::new(
        test_support::connect(&mesh.url).await,
        Subjects::default(),
    );
    let hidden = messages::template::Template {
        name: "no-apt".into(),
        filesystem: Some(FilesystemPolicy {
            deny_read: vec!["/etc/apt".into()],
            ..Default::default()
        }),
        ..Default::default()
    };
    eventually("the templates service", || {
        let (admin, hidden) = (admin.clone(), hidden.clone());
        async move { admin.templates().create(&hidden).await.ok() }
    })
    .await;
    let bad = messages::template::Template {
        name: "bad-fs".into(),
        filesystem: Some(FilesystemPolicy {
            allow_write: vec!["/workspace".into()],
            ..Default::default()
        }),
        ..Default::default()
    };
    let refused_template = admin.templates().create(&bad).await.unwrap_err();
    assert_eq!(
        refused_template.kind(),
        sandmesh_client::ErrorKind::BadRequest,
        "{refused_template}"
    );

    let probe = "\
echo \"listed: $(ls -A /etc/apt | wc -l)\"
for f in /var/tmp/f /var/tmp/locked/f /workspace/f; do
  if (echo x > $f) 2>/dev/null; then echo \"$f: written\"; else echo \"$f: refused\"; fi
done";
    open(
        &c,
        &SessionOpen {
            session_id: Some("fs".into()),
            template: Some("no-apt".into()),
            filesystem: Some(FilesystemPolicy {
                allow_write: vec!["/var/tmp".into()],
                deny_write: vec!["/var/tmp/locked".into()],
                ..Default::default()
            }),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let r = exec(&c, &shell("fs", probe)).await;
    assert_eq!(
        (r.status, r.stdout.as_str()),
        (
            ExecStatus::Ok,
            "listed: 0\n/var/tmp/f: written\n/var/tmp/locked/f: refused\n/workspace/f: written\n"
        ),
        "{r:?}"
    );
    // The session's container keeps them for its next run.
    let again = exec(&c, &shell("fs", "cat /var/tmp/f; ls -A /etc/apt | wc -l")).await;
    assert_eq!(again.stdout, "x\n0\n", "{again:?}");

    let count = "ls -A /etc/apt | wc -l";
    let in_template = ExecRequest {
        language: Language::Shell,
        code: count.into(),
        template: Some("no-apt".into()),
        ..Default::default()
    };
    let r = exec(&c, &in_template).await;
    assert_eq!(
        (r.status, r.stdout.as_str()),
        (ExecStatus::Ok, "0\n"),
        "{r:?}"
    );
    let plain = ExecRequest {
        template: None,
        ..in_template
    };
    let r = exec(&c, &plain).await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    assert_ne!(
        r.stdout, "0\n",
        "without a policy the directory has files: {r:?}"
    );
    mesh.shutdown().await;
}

/// Sessions close by themselves when unused for their idle time (the reason recorded), but
/// never under a running execution: a run longer than the idle time keeps its session open.
#[tokio::test]
async fn an_idle_session_closes_but_not_under_a_running_execution() {
    let mesh = Mesh::sessions(2)
        .scheduler(|c| c.sessions.sweep = std::time::Duration::from_millis(100))
        .start()
        .await;
    let c = mesh.client.clone();
    let idle = |id: &str, ms| SessionOpen {
        session_id: Some(id.into()),
        idle_ms: Some(ms),
        ..Default::default()
    };
    open(&c, &idle("unused", 500)).await.unwrap();
    let closed = eventually("the unused session to close", || {
        let c = c.clone();
        async move {
            let r = get(&c, "unused").await;
            (r.state == SessionState::Closed).then_some(r)
        }
    })
    .await;
    assert_eq!(closed.close_reason, Some(CloseReason::Idle), "{closed:?}");
    assert!(closed.closed_at.is_some(), "{closed:?}");

    open(&c, &idle("busy", 1_000)).await.unwrap();
    let r = exec(&c, &in_session("busy", "sleep:2500")).await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    let after = get(&c, "busy").await;
    assert_eq!(
        after.state,
        SessionState::Active,
        "closed under its run: {after:?}"
    );
    mesh.shutdown().await;
}

/// A request as an outsider sends it (plain JSON on the subject), answered with the wire's
/// error headers and body.
async fn raw_refusal(mesh: &Mesh, subject: String, body: serde_json::Value) -> (String, ErrorBody) {
    let reply = mesh
        .client
        .nats()
        .request(subject, serde_json::to_vec(&body).unwrap().into())
        .await
        .unwrap();
    let headers = reply.headers.expect("an error reply has headers");
    let code = headers
        .get(messages::codec::SERVICE_ERROR_CODE)
        .expect("an error code")
        .to_string();
    let error: ErrorBody = serde_json::from_slice(&reply.payload).unwrap();
    assert_eq!(
        headers
            .get(messages::codec::SERVICE_ERROR)
            .unwrap()
            .as_str(),
        error.message
    );
    (code, error)
}

/// The session look-ups and the result look-up refuse with typed errors inside the scheduler;
/// outside, each is its wire code and a message naming what was asked for.
#[tokio::test]
async fn session_and_result_refusals_reach_an_outsider_as_wire_errors() {
    let mesh = Mesh::sessions(2).start().await;
    let s = Subjects::default();
    let c = mesh.client.clone();
    let opened = open(
        &c,
        &SessionOpen {
            session_id: Some("done".into()),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(opened.state, SessionState::Open);
    let close = serde_json::json!({"session_id": "done"});
    let closed: SessionRecord = c
        .request(s.sessions(SessionOp::Close), &close)
        .await
        .unwrap();
    assert_eq!(closed.state, SessionState::Closed);

    let get = serde_json::json!({"session_id": "nope"});
    let (code, e) = raw_refusal(&mesh, s.sessions(SessionOp::Get), get.clone()).await;
    assert_eq!((code.as_str(), e.kind), ("404", ErrorKind::NotFound));
    assert_eq!(e.message, "no session nope");
    let (code, e) = raw_refusal(&mesh, s.sessions(SessionOp::Close), get).await;
    assert_eq!(
        (code.as_str(), e.message.as_str()),
        ("404", "no session nope")
    );
    let (code, e) = raw_refusal(&mesh, s.sessions(SessionOp::Open), close).await;
    assert_eq!((code.as_str(), e.kind), ("409", ErrorKind::Conflict));
    assert_eq!(e.message, "session done is closed; open a new session");
    let unknown = serde_json::json!({"execution_id": "never-ran"});
    let (code, e) = raw_refusal(&mesh, s.results_get(), unknown).await;
    assert_eq!((code.as_str(), e.kind), ("404", ErrorKind::NotFound));
    assert!(
        e.message.starts_with("no result for execution never-ran: "),
        "{}",
        e.message
    );
    mesh.shutdown().await;
}

/// The refusals of `sessions.open` that the scheduler types as its own errors (an unknown
/// template, a network policy beyond the operator's ceiling) reach an outsider as the wire's
/// errors: code, kind, message and the details naming what was refused.
#[tokio::test]
async fn session_open_refusals_reach_an_outsider_as_wire_errors() {
    let mesh = Mesh::sessions(2).templates().start().await;
    let open = Subjects::default().sessions(SessionOp::Open);
    let unknown = serde_json::json!({"session_id": "t1", "template": "no-such"});
    let (code, e) = raw_refusal(&mesh, open.clone(), unknown).await;
    assert_eq!((code.as_str(), e.kind), ("400", ErrorKind::BadRequest));
    assert_eq!(
        e.message,
        "unknown template \"no-such\"; `sandmesh template list` shows the templates"
    );
    assert_eq!(e.details, Some(serde_json::json!({"field": "template"})));

    // The tests' scheduler permits no network at all.
    let beyond = serde_json::json!({
        "session_id": "n1",
        "network": {"allow_domains": ["pkgs.example.org"]},
    });
    let (code, e) = raw_refusal(&mesh, open, beyond).await;
    assert_eq!((code.as_str(), e.kind), ("403", ErrorKind::Denied));
    assert!(
        e.message
            .starts_with("network policy beyond what this deployment permits: "),
        "{}",
        e.message
    );
    assert!(e.message.contains("pkgs.example.org"), "{}", e.message);
    let refused = &e
        .details
        .as_ref()
        .expect("details list the refused entries")["refused"];
    assert_eq!(refused.as_array().map(Vec::len), Some(1), "{refused}");
    mesh.shutdown().await;
}
