//! Sync exec over a real nats-server, with small real stand-ins for the other services.

use sandmesh_client::{ClientError, MeshClient};
use std::time::Duration;

use futures::StreamExt;

use crate::common::*;
use messages::exec::{
    Decision, ExecRequest, ExecResult, ExecStatus, Language, ResultGet, ResultLookup, Tier,
};
use messages::executor::RunKind;
use messages::{ErrorKind, Subjects};

fn req(language: Language, code: &str) -> ExecRequest {
    ExecRequest {
        language,
        code: code.into(),
        ..Default::default()
    }
}

async fn exec(c: &MeshClient, r: &ExecRequest) -> Result<ExecResult, ClientError> {
    c.request(Subjects::default().exec(), r).await
}

async fn look_up(c: &MeshClient, id: &str) -> Result<ResultLookup, ClientError> {
    let get = ResultGet {
        wait_ms: None,
        execution_id: id.into(),
    };
    c.request(Subjects::default().results_get(), &get).await
}

#[tokio::test]
async fn runs_stores_audits_and_answers_a_repeat_from_the_store() {
    let mesh = Mesh::one_executor(4).start().await;
    let (c, url, runs) = (mesh.client.clone(), mesh.url.clone(), mesh.runs.clone());

    for language in [Language::Python, Language::Javascript, Language::Shell] {
        let r = exec(&c, &req(language, "print(1)")).await.unwrap();
        assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
        assert_eq!(r.tier, Tier::Ephemeral);
        assert_eq!(r.node.as_deref(), Some("node-a"));
        assert_eq!(r.confirmation.decision, Decision::NotRequired);
    }

    let mut again = req(Language::Python, "print(2)");
    again.execution_id = Some("exec-repeat-1".into());
    let first = exec(&c, &again).await.unwrap();
    let second = exec(&c, &again).await.unwrap();
    assert_eq!(first, second, "a repeat answers the stored result");
    let ran = runs
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.execution_id == "exec-repeat-1")
        .count();
    assert_eq!(ran, 1, "a repeated id never runs twice");

    let lookup = look_up(&c, "exec-repeat-1").await.unwrap();
    assert!(matches!(lookup, ResultLookup::Done { result } if *result == first));
    let missing = look_up(&c, "never-ran").await.unwrap_err();
    assert_eq!(missing.kind(), ErrorKind::NotFound);

    let kinds = eventually("the audit trail", || {
        let url = url.clone();
        async move {
            let k = audit_kinds(&url, "exec-repeat-1").await;
            k.iter().any(|k| k == "finished").then_some(k)
        }
    })
    .await;
    let expected = [
        "request_received",
        "risk_assessed",
        "placed",
        "started",
        "finished",
    ];
    for kind in expected {
        assert_eq!(
            kinds.iter().filter(|k| *k == kind).count(),
            1,
            "{kind} in {kinds:?}"
        );
    }
    mesh.shutdown().await;
}

/// A sync request without an id gets one from the scheduler; nobody else can know it, so it is
/// neither claimed nor looked up first — and its result is still stored under it.
#[tokio::test]
async fn a_request_without_an_id_runs_unclaimed_and_is_stored() {
    let mesh = Mesh::one_executor(4).start().await;
    let c = mesh.client.clone();
    let mut r = req(Language::Python, "print(1)");
    r.execution_id = None;
    let done = exec(&c, &r).await.unwrap();
    assert_eq!(done.status, ExecStatus::Ok, "{done:?}");
    let id = done.execution_id.clone();
    assert!(!id.is_empty());

    let lookup = look_up(&c, &id).await.unwrap();
    assert!(matches!(lookup, ResultLookup::Done { result } if *result == done));
    let js = async_nats::jetstream::new(c.nats().clone());
    let claims = js
        .get_key_value(Subjects::default().exec_claims_bucket())
        .await
        .unwrap();
    let mut history = claims.history(&id).await.unwrap();
    assert!(
        history.next().await.is_none(),
        "the claims bucket never held {id}"
    );
    mesh.shutdown().await;
}

/// A sync caller is answered while its result's store finishes (an fsync on the server): an
/// id looked up in that moment is waited for, not called unknown.
#[tokio::test]
async fn a_result_stored_just_after_its_look_up_began_is_found() {
    let mesh = Mesh::builder().scheduler(|_| {}).start().await;
    let c = mesh.client.clone();
    let lookup = tokio::spawn({
        let c = c.clone();
        async move { look_up(&c, "late-1").await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let result = ExecResult {
        execution_id: "late-1".into(),
        status: ExecStatus::Ok,
        stdout: "late\n".into(),
        ..Default::default()
    };
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(messages::codec::CONTENT_TYPE, messages::codec::JSON);
    let js = async_nats::jetstream::new(c.nats().clone());
    let payload = serde_json::to_vec(&result).unwrap();
    js.publish_with_headers(
        Subjects::default().result("late-1"),
        headers,
        payload.into(),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    match lookup.await.unwrap().unwrap() {
        ResultLookup::Done { result: found } => assert_eq!(*found, result),
        other => panic!("{other:?}"),
    }
    mesh.shutdown().await;
}

#[tokio::test]
async fn risk_policy_rejects_and_confirmation_decides() {
    let mut mesh = Mesh::builder()
        .risk()
        .confirm_standin(false)
        .executor("node-a", 4)
        .scheduler(|_| {})
        .start()
        .await;
    let (c, url, runs, asked) = (
        mesh.client.clone(),
        mesh.url.clone(),
        mesh.runs.clone(),
        mesh.asked.clone(),
    );

    let r = exec(&c, &req(Language::Shell, "rm -rf /")).await.unwrap();
    assert_eq!(r.status, ExecStatus::Rejected);
    assert_eq!(r.error.as_ref().unwrap().kind, ErrorKind::Denied);
    let kinds = eventually("the rejection audit", || {
        let (url, id) = (url.clone(), r.execution_id.clone());
        async move {
            let k = audit_kinds(&url, &id).await;
            k.iter().any(|k| k == "finished").then_some(k)
        }
    })
    .await;
    assert!(kinds.contains(&"rejected".to_string()), "{kinds:?}");

    let risky = req(Language::Python, "import os\nos.system('id')");
    let r = exec(&c, &risky).await.unwrap();
    assert_eq!(r.status, ExecStatus::Denied);
    assert_eq!(r.confirmation.decision, Decision::Denied);
    assert_eq!(r.confirmation.by.as_deref(), Some("policy:deny"));
    assert_eq!(asked.lock().unwrap().len(), 1);
    assert!(
        runs.lock().unwrap().is_empty(),
        "nothing rejected or denied reached an executor"
    );

    mesh.stop_standin("confirm").await;
    mesh.serve_confirm_standin(true).await;
    let r = exec(&c, &risky).await.unwrap();
    assert_eq!(r.status, ExecStatus::Ok);
    assert_eq!(r.confirmation.decision, Decision::Approved);
    assert_eq!(r.confirmation.by.as_deref(), Some("alice"));
    assert_eq!(r.tier, Tier::Session, "strict mode isolates high-risk code");
    assert_eq!(r.session_id, None, "the client's request had no session");
    let last = runs.lock().unwrap().last().cloned().unwrap();
    assert_eq!(
        (last.kind, last.session_id),
        (
            RunKind::Isolated {
                session_grade: true
            },
            None
        ),
        "a fresh container of its own, no session"
    );
    assert!(r.timing.total_ms >= r.timing.confirm_ms);
    mesh.shutdown().await;
}

#[tokio::test]
async fn permissive_mode_follows_the_suggestion_and_clients_can_only_tighten() {
    let mut mesh = Mesh::one_executor(4)
        .scheduler(|c| c.security_mode = messages::risk::SecurityMode::Permissive)
        .start()
        .await;
    let c = mesh.client.clone();

    let medium = req(Language::Python, "import os\nprint(os.getcwd())");
    assert_eq!(exec(&c, &medium).await.unwrap().tier, Tier::Ephemeral);
    let mut stricter = medium.clone();
    stricter.tier = messages::exec::TierChoice::Session;
    assert_eq!(exec(&c, &stricter).await.unwrap().tier, Tier::Session);
    mesh.stop_scheduler().await;

    // Strict mode: the same code needs session isolation, and asking for less changes nothing.
    mesh.start_scheduler(mesh.config()).await;
    let mut looser = medium.clone();
    looser.tier = messages::exec::TierChoice::Ephemeral;
    assert_eq!(exec(&c, &looser).await.unwrap().tier, Tier::Session);
    mesh.shutdown().await;
}

#[tokio::test]
async fn hostile_and_malformed_requests_get_clear_errors_and_the_mesh_keeps_serving() {
    let mesh = Mesh::one_executor(4).start().await;
    let (c, runs) = (mesh.client.clone(), mesh.runs.clone());
    let nc = c.nats().clone();
    let s = Subjects::default();

    let raw = |payload: &'static [u8]| {
        let nc = nc.clone();
        let subject = s.exec();
        async move {
            let m = nc.request(subject, payload.into()).await.unwrap();
            let h = m.headers.expect("error headers");
            h.get("Nats-Service-Error-Code")
                .unwrap()
                .as_str()
                .to_string()
        }
    };
    assert_eq!(raw(b"{not json").await, "400");
    assert_eq!(raw(b"{\"language\":\"cobol\",\"code\":\"x\"}").await, "400");
    assert_eq!(raw(b"[1,2,3]").await, "400");

    let cases: Vec<(ExecRequest, ErrorKind)> = vec![
        (
            req(Language::Python, &"x".repeat(300 * 1024)),
            ErrorKind::TooLarge,
        ),
        (req(Language::Python, "a\0b"), ErrorKind::BadRequest),
        (
            ExecRequest {
                session_id: Some("../etc".into()),
                ..req(Language::Shell, "ls")
            },
            ErrorKind::BadRequest,
        ),
        (
            ExecRequest {
                execution_id: Some("a.b.>".into()),
                ..req(Language::Shell, "ls")
            },
            ErrorKind::BadRequest,
        ),
        (
            ExecRequest {
                env: [("LD_PRELOAD".to_string(), "/x.so".to_string())].into(),
                ..req(Language::Shell, "ls")
            },
            ErrorKind::BadRequest,
        ),
        (
            ExecRequest {
                timeout_ms: Some(0),
                ..req(Language::Shell, "ls")
            },
            ErrorKind::BadRequest,
        ),
        (
            ExecRequest {
                files: vec![messages::exec::FileSpec {
                    path: "/etc/passwd".into(),
                    content: "x".into(),
                    encoding: Default::default(),
                }],
                ..req(Language::Shell, "ls")
            },
            ErrorKind::BadRequest,
        ),
    ];
    for (bad, kind) in cases {
        let e = exec(&c, &bad).await.unwrap_err();
        assert_eq!(e.kind(), kind, "{e}");
    }
    // Just under the server's 1 MiB payload limit: still refused by the code ceiling.
    let huge = req(Language::Python, &"y".repeat(1000 * 1024));
    assert_eq!(
        exec(&c, &huge).await.unwrap_err().kind(),
        ErrorKind::TooLarge
    );

    assert!(
        runs.lock().unwrap().is_empty(),
        "no bad request reached an executor"
    );
    let ok = exec(&c, &req(Language::Python, "print('still here')"))
        .await
        .unwrap();
    assert_eq!(ok.status, ExecStatus::Ok);
    mesh.shutdown().await;
}

#[tokio::test]
async fn missing_services_are_named_and_nothing_is_stored_so_a_retry_can_run() {
    // A confirmation service that does not come up is waited for this long.
    let mut mesh = Mesh::builder()
        .scheduler(|c| c.confirm_timeout = Duration::from_secs(1))
        .start()
        .await;
    let c = mesh.client.clone();
    let mut r = req(Language::Python, "print(1)");
    r.execution_id = Some("retry-me".into());

    let e = exec(&c, &r).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert!(e.to_string().contains("risk-assessor"), "{e}");

    mesh.serve_risk_standin().await;
    // Code the stand-in rates high needs a person, and no confirmation service runs: the
    // failed call's cause reaches the client, naming the service and what was not answered.
    let risky = req(Language::Python, "import os\nos.system('id')");
    let e = exec(&c, &risky).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    let message = &e.service_error().expect("the scheduler's answer").message;
    assert!(
        message.contains("confirmation service") && message.contains("confirm.request"),
        "{message}"
    );

    let e = exec(&c, &r).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert!(e.to_string().contains("executor"), "{e}");

    mesh.add_executor("node-a", 4).await;
    let done = exec(&c, &r).await.unwrap();
    assert_eq!(done.status, ExecStatus::Ok);
    mesh.shutdown().await;
}

#[tokio::test]
async fn beyond_the_queue_bound_callers_get_429_at_once() {
    let mesh = Mesh::one_executor(4)
        .scheduler(|c| c.max_queue = 1)
        .start()
        .await;
    let (c, runs) = (mesh.client.clone(), mesh.runs.clone());

    let slow = tokio::spawn({
        let c = c.clone();
        async move { exec(&c, &req(Language::Python, "sleep:3000")).await }
    });
    eventually("the slow run to start", || {
        let runs = runs.clone();
        async move { (!runs.lock().unwrap().is_empty()).then_some(()) }
    })
    .await;
    let e = exec(&c, &req(Language::Python, "print(1)"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Overloaded);
    assert!(e.to_string().contains("queue is full"), "{e}");
    assert_eq!(slow.await.unwrap().unwrap().status, ExecStatus::Ok);
    assert_eq!(
        exec(&c, &req(Language::Python, "print(1)"))
            .await
            .unwrap()
            .status,
        ExecStatus::Ok,
        "room again once the slow run ended"
    );
    mesh.shutdown().await;
}

#[tokio::test]
async fn executor_errors_become_terminal_statuses() {
    let mesh = Mesh::one_executor(4)
        .scheduler(|c| c.exec_grace = Duration::from_millis(500))
        .start()
        .await;
    let c = mesh.client.clone();

    let r = exec(&c, &req(Language::Python, "fail:500")).await.unwrap();
    assert_eq!(r.status, ExecStatus::Internal);
    let r = exec(&c, &req(Language::Python, "fail:400")).await.unwrap();
    assert_eq!(r.status, ExecStatus::Rejected);
    // An executor that takes the work and never answers within timeout + grace is lost.
    let mut hang = req(Language::Python, "sleep:5000");
    hang.timeout_ms = Some(200);
    let r = exec(&c, &hang).await.unwrap();
    assert_eq!(r.status, ExecStatus::ExecutorLost);
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_confirmation_service_that_is_not_up_yet_is_waited_for() {
    let mut mesh = Mesh::one_executor(4).start().await;
    let (c, url) = (mesh.client.clone(), mesh.url.clone());
    let mut risky = req(Language::Python, "import os\nos.system('id')");
    risky.execution_id = Some("awaits-confirmation".into());
    let pending = {
        let (c, risky) = (c.clone(), risky.clone());
        tokio::spawn(async move { exec(&c, &risky).await })
    };
    // The scheduler has reached the confirm stage (and found no confirmation service) before
    // one starts.
    eventually("the risk assessment", || {
        let url = url.clone();
        async move {
            let k = audit_kinds(&url, "awaits-confirmation").await;
            k.iter().any(|k| k == "risk_assessed").then_some(())
        }
    })
    .await;
    mesh.serve_confirm_standin(true).await;
    let r = pending.await.unwrap().unwrap();
    assert_eq!(r.status, ExecStatus::Ok);
    assert_eq!(r.confirmation.decision, Decision::Approved);
    assert_eq!(mesh.asked.lock().unwrap().len(), 1);
    mesh.shutdown().await;
}

#[tokio::test]
async fn placement_counts_return_to_zero_so_sessions_keep_finding_nodes() {
    let mesh = Mesh::sessions(2).start().await;
    let c = mesh.client.clone();
    // More finished executions than the node's capacity: each must give its slot back.
    for _ in 0..5 {
        let r = exec(&c, &req(Language::Python, "print(1)")).await.unwrap();
        assert_eq!(r.status, ExecStatus::Ok);
    }
    let mut in_session = req(Language::Python, "print(1)");
    in_session.session_id = Some("after-many".into());
    let r = exec(&c, &in_session).await.unwrap();
    assert_eq!(r.status, ExecStatus::Ok, "{:?}", r.error);
    assert_eq!(r.node.as_deref(), Some("node-a"));
    mesh.shutdown().await;
}

#[tokio::test]
async fn work_beyond_executor_capacity_waits_for_a_slot() {
    let mesh = Mesh::one_executor(1).start().await;
    let (c, runs) = (mesh.client.clone(), mesh.runs.clone());
    let mut pending = Vec::new();
    for _ in 0..3 {
        let c = c.clone();
        pending.push(tokio::spawn(async move {
            exec(&c, &req(Language::Python, "# sleep:300\nprint(1)")).await
        }));
    }
    for p in pending {
        assert_eq!(p.await.unwrap().unwrap().status, ExecStatus::Ok);
    }
    let most = runs.lock().unwrap().iter().map(|r| r.in_flight).max();
    assert_eq!(most, Some(1), "the node never held more than its capacity");
    mesh.shutdown().await;
}

/// A run that starts late, after the executor refused it (429) for most of the wait, still gets
/// its whole time budget: it is not cut off with what was left of the wait and called lost.
#[tokio::test]
async fn a_run_accepted_after_waiting_for_a_slot_gets_its_whole_budget() {
    let mesh = Mesh::one_executor(4)
        .scheduler(|c| c.exec_grace = Duration::from_millis(500))
        .start()
        .await;
    let c = mesh.client.clone();

    // Budget 500 + 500 ms; refused for the first 500 ms, then runs for 600 ms.
    let mut r = req(Language::Python, "busy:500 sleep:600");
    r.timeout_ms = Some(500);
    let result = exec(&c, &r).await.unwrap();
    assert_eq!(result.status, ExecStatus::Ok, "{:?}", result.error);
    mesh.shutdown().await;
}
