//! Tier `aio` end to end: the scheduler (with the real risk-assessor) runs executions in the
//! session's AIO instance through the aio-pool.

use std::time::Duration;

use crate::common::Harness;
use futures::StreamExt;
use kit::config::env_map;
use kit::CancellationToken;
use messages::browser::{AioAcquire, AioExec, AioExecResult, AioRelease};
use messages::confirm::ConfirmDecide;
use messages::exec::{
    ExecRequest, ExecStatus, Language, Tier, TierChoice, NOTIFY_HEADER,
    STATUS_AWAITING_CONFIRMATION, STATUS_HEADER,
};
use messages::session::SessionOpen;
use messages::Subjects;
use sandmesh_client::{ErrorKind, MeshClient};
use test_support::{eventually_true, NatsServer};

/// The risk-assessor, the workspace-store, confirmation (approving everything when `auto_approve`: the CDP probe
/// opens sockets, which is high risk) and a scheduler (`mode`) beside the pool `h`.
pub(crate) async fn front(h: &Harness, mode: &str, auto_approve: bool) -> CancellationToken {
    front_allowing(h, mode, auto_approve, "").await
}

/// [`front`] with the operator's egress ceiling `allow` (`SANDMESH_NETWORK_ALLOW`).
async fn front_allowing(
    h: &Harness,
    mode: &str,
    auto_approve: bool,
    allow: &str,
) -> CancellationToken {
    let stop = CancellationToken::new();
    let url = h.nats.url();
    let confirm = confirmation::ConfirmationConfig::from_env(&env_map(&[
        ("SANDMESH_NATS_URL", &url),
        ("SANDMESH_CONFIRM_AUTO_APPROVE", &auto_approve.to_string()),
    ]))
    .unwrap();
    tokio::spawn(confirmation::run(confirm, stop.clone()));
    let risk =
        risk_assessor::RiskAssessorConfig::from_env(&env_map(&[("SANDMESH_NATS_URL", &url)]))
            .unwrap();
    tokio::spawn(risk_assessor::run(risk, stop.clone()));
    // Sessions (`sessions.open`) have a workspace.
    let ws = workspace_store::WorkspaceConfig::for_url(&url);
    tokio::spawn(workspace_store::run(ws, stop.clone()));
    let scheduler = scheduler::SchedulerConfig::from_env(&env_map(&[
        ("SANDMESH_NATS_URL", &url),
        ("SANDMESH_SECURITY_MODE", mode),
        ("SANDMESH_NETWORK_ALLOW", allow),
    ]))
    .unwrap();
    tokio::spawn(scheduler::run(scheduler, stop.clone()));
    stop
}

pub(crate) fn python(session: Option<&str>, tier: TierChoice, code: &str) -> ExecRequest {
    ExecRequest {
        session_id: session.map(str::to_string),
        language: Language::Python,
        code: code.into(),
        tier,
        timeout_ms: Some(30_000),
        ..Default::default()
    }
}

pub(crate) async fn exec(h: &Harness, req: &ExecRequest) -> messages::exec::ExecResult {
    let exec = h.mesh.exec();
    let mut last = None;
    // The scheduler and the assessor start beside the pool: the first call may find them
    // not yet serving.
    for _ in 0..100 {
        match exec.exec_timeout(req, Duration::from_secs(60)).await {
            Ok(r) => return r,
            Err(e) if e.kind() == ErrorKind::Unavailable => last = Some(e),
            Err(e) => panic!("exec: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the mesh never served the execution: {last:?}");
}

#[tokio::test]
async fn tier_aio_runs_in_the_sessions_bound_instance() {
    let h = Harness::start(&[]).await;
    let stop = front(&h, "strict", true).await;

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
    let stop = front_allowing(&h, "permissive", true, "pkgs.example.org").await;
    // The assessor suggests aio for a browser library; Debian's image has no playwright, so
    // the import fails — in the AIO instance, which is the point.
    let browsing = python(
        Some("b"),
        TierChoice::Auto,
        "from playwright.sync_api import sync_playwright",
    );
    let r = exec(&h, &browsing).await;
    assert_eq!(r.tier, Tier::Aio, "{r:?}");
    assert_eq!(r.risk.suggested_tier, Tier::Aio);
    assert!(r.stderr.contains("playwright"), "{r:?}");
    // AIO instances have no egress: the same code under a network policy is refused, naming
    // the policy, instead of running without it.
    let policy = serde_json::json!({"allow_domains": ["pkgs.example.org"]});
    let with_policy = ExecRequest {
        session_id: None,
        network: Some(serde_json::from_value(policy).unwrap()),
        ..browsing
    };
    let r = exec(&h, &with_policy).await;
    assert_eq!(
        (r.status, r.tier),
        (ExecStatus::Rejected, Tier::Aio),
        "{r:?}"
    );
    let e = r.error.expect("the refusal says why");
    assert!(e.message.contains("network policy"), "{e:?}");
    stop.cancel();
    h.stop().await;
}

/// An agent of `tenant`, connected with its own credentials.
async fn agent(h: &Harness, tenant: &str) -> MeshClient {
    let client = test_support::connect(&h.nats.agent_url(tenant)).await;
    MeshClient::new(client, Subjects::default()).with_timeout(Duration::from_secs(60))
}

fn aio_exec(session: &str, command: &str) -> AioExec {
    AioExec {
        session_id: session.into(),
        command: command.into(),
        timeout_ms: Some(30_000),
        instance_id: None,
    }
}

/// `aio.exec` as `mesh`, retried while the scheduler and assessor beside the pool start.
async fn aio_exec_when_up(mesh: &MeshClient, req: &AioExec) -> AioExecResult {
    let mut last = None;
    for _ in 0..100 {
        match mesh.aio().exec(req).await {
            Ok(r) => return r,
            Err(e) if e.kind() == ErrorKind::Unavailable => last = Some(e),
            Err(e) => panic!("aio.exec: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the mesh never served aio.exec: {last:?}");
}

/// Every door checked, as tenants' agents do it with their own
/// credentials: `aio.*` is scoped by tenant (two tenants' `s1` are two instances, another
/// tenant's id is a 404), `aio.exec` is an execution like `exec` (a risky command waits for a
/// person and, denied, never runs), and closing a session releases its instance.
#[tokio::test]
async fn aio_is_scoped_by_tenant_and_its_commands_pass_risk_and_approval() {
    let h = Harness::start_on(
        NatsServer::start_with_tenants(&["acme"]),
        &crate::common::unique("pool"),
        &[],
    )
    .await;
    let stop = front(&h, "strict", false).await;
    let (acme, other) = (agent(&h, "acme").await, agent(&h, "default").await);

    let acme_lease = acme.aio().acquire(&acquire("s1")).await.unwrap();
    let other_lease = other.aio().acquire(&acquire("s1")).await.unwrap();
    assert_eq!(
        acme_lease.session_id, "s1",
        "the agent's own name comes back"
    );
    assert_ne!(
        acme_lease.instance_id, other_lease.instance_id,
        "two tenants naming s1 share nothing"
    );
    let ran = aio_exec_when_up(&acme, &aio_exec("s1", "echo hi")).await;
    assert_eq!((ran.status.as_str(), ran.stdout.as_str()), ("ok", "hi\n"));
    assert_eq!(
        ran.instance_id, acme_lease.instance_id,
        "aio.exec runs in the instance the agent acquired"
    );

    // The other tenant naming acme's stored id reaches nothing of acme's.
    let scoped = format!("acme-{}", "s1");
    let e = other.aio().release(&release(&scoped)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    let own = other.aio().acquire(&acquire(&scoped)).await.unwrap();
    assert_ne!(own.instance_id, acme_lease.instance_id);
    other.aio().release(&release(&scoped)).await.unwrap();

    // A command the assessor rates high waits for a person, then is denied and never runs.
    // Raw NATS, as any client sends it: the notice first, then the answer.
    aio_exec_when_up(&acme, &aio_exec("s1", "mkdir -p ~/x")).await;
    let client = acme.nats().clone();
    let inbox = client.new_inbox();
    let mut replies = client.subscribe(inbox.clone()).await.unwrap();
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(NOTIFY_HEADER, "1");
    let body = serde_json::to_vec(&aio_exec("s1", "rm -rf ~/x")).unwrap();
    client
        .publish_with_reply_and_headers(
            Subjects::default().aio("exec"),
            inbox,
            headers,
            body.into(),
        )
        .await
        .unwrap();
    let notice = next_reply(&mut replies).await;
    let status = notice.headers.as_ref().and_then(|h| h.get(STATUS_HEADER));
    assert_eq!(
        status.map(|v| v.as_str()),
        Some(STATUS_AWAITING_CONFIRMATION),
        "{notice:?}"
    );
    let waiting: serde_json::Value = serde_json::from_slice(&notice.payload).unwrap();
    let id = waiting["confirmation_id"].as_str().unwrap().to_string();
    h.mesh
        .confirm()
        .decide(&ConfirmDecide {
            id,
            approve: false,
            by: "test".into(),
            reason: Some("not on my watch".into()),
            scope: Default::default(),
            by_account: None,
        })
        .await
        .unwrap();
    let answer = next_reply(&mut replies).await;
    let code = answer
        .headers
        .as_ref()
        .and_then(|h| h.get(messages::codec::SERVICE_ERROR_CODE))
        .map(|v| v.as_str().to_string());
    assert_eq!(code.as_deref(), Some("403"), "{answer:?}");
    let still = aio_exec_when_up(&acme, &aio_exec("s1", "ls -d ~/x")).await;
    assert_eq!(
        still.status, "ok",
        "the denied command did not run: {still:?}"
    );

    // Closing a session releases its AIO instance.
    acme.sessions()
        .open(&SessionOpen {
            session_id: Some("w".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut req = python(Some("w"), TierChoice::Aio, "print(1)");
    req.timeout_ms = Some(30_000);
    let r = acme
        .exec()
        .exec_timeout(&req, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    let instance = r.node.clone().unwrap();
    acme.sessions().close("w").await.unwrap();
    let h_ref = &h;
    eventually_true(
        "the closed session's AIO instance is removed",
        Duration::from_secs(30),
        || {
            let instance = instance.clone();
            async move { !h_ref.containers().await.contains(&instance) }
        },
    )
    .await;
    stop.cancel();
    h.stop().await;
}

async fn next_reply(replies: &mut async_nats::Subscriber) -> async_nats::Message {
    tokio::time::timeout(Duration::from_secs(60), replies.next())
        .await
        .expect("an answer within 60 s")
        .expect("the subscription is open")
}

fn acquire(session: &str) -> AioAcquire {
    AioAcquire {
        session_id: session.into(),
        browser: false,
    }
}

fn release(session: &str) -> AioRelease {
    AioRelease {
        session_id: session.into(),
        instance_id: None,
    }
}

/// A pool following a tenancy file (in the returned directory, at the returned path) that
/// gives acme one AIO instance.
async fn pool_with_one_aio_instance_for_acme() -> (Harness, tempfile::TempDir, String) {
    let nats = NatsServer::start_with_tenants(&["acme"]);
    let mut tenancy = nats.tenancy().clone();
    let quota = messages::quota::Quotas {
        aio_instances: Some(1),
        ..Default::default()
    };
    tenancy.set_quotas(&messages::tenancy::Tenant::new("acme").unwrap(), quota);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tenancy.json");
    tenancy.save(&file).unwrap();
    let file = file.display().to_string();
    let h = Harness::start_on(
        nats,
        &crate::common::unique("pool"),
        &[("SANDMESH_TENANCY_FILE", &file)],
    )
    .await;
    (h, dir, file)
}

/// A tenant's `aio_instances` quota, from the tenancy file the pool follows: its
/// agent's second instance is a 429 naming the quota (its first again is not), the scheduler
/// binding a session of that tenant (an internal caller naming the scoped id) counts against
/// it too, another tenant is not counted, and a released instance frees its place.
#[tokio::test]
async fn a_tenant_over_its_aio_instances_quota_gets_429() {
    let (h, _dir, _) = pool_with_one_aio_instance_for_acme().await;
    let (acme, other) = (agent(&h, "acme").await, agent(&h, "default").await);
    let over = |outcome: Result<_, sandmesh_client::ClientError>| {
        let e = outcome.expect_err("over the quota");
        let body = e.service_error().expect("the pool refused").clone();
        assert_eq!(body.kind, messages::ErrorKind::Overloaded, "{body:?}");
        let d = body.details.unwrap();
        assert_eq!(
            (d["quota"].as_str(), d["limit"].as_u64()),
            (Some("aio_instances"), Some(1))
        );
    };
    let first = acme.aio().acquire(&acquire("s1")).await.unwrap();
    over(acme.aio().acquire(&acquire("s2")).await);
    let again = acme.aio().acquire(&acquire("s1")).await.unwrap();
    assert_eq!(
        again.instance_id, first.instance_id,
        "its own instance again"
    );
    over(h.aio.acquire(&acquire("acme-s3")).await);
    other
        .aio()
        .acquire(&acquire("s2"))
        .await
        .expect("default is not acme");

    acme.aio().release(&release("s1")).await.unwrap();
    acme.aio()
        .acquire(&acquire("s2"))
        .await
        .expect("released: room again");
    h.stop().await;
}

/// `aio_instances` is the tenant's over the whole mesh. Two pools serve one
/// nats-server (acquires spread over both by the queue group); with acme's one instance bound
/// on either, every further acquire is refused, whichever pool takes it.
#[tokio::test]
async fn the_aio_instances_quota_counts_the_instances_of_every_pool() {
    let (h, _dir, file) = pool_with_one_aio_instance_for_acme().await;
    let second_owner = crate::common::unique("pool");
    let mut env = crate::common::base_env(&h.nats, &second_owner);
    env.insert("SANDMESH_TENANCY_FILE".into(), file.clone());
    let stop_second = CancellationToken::new();
    // As the harness does for the first: a failing test still tells the pool to stop.
    let _stop_on_panic = stop_second.clone().drop_guard();
    let second = tokio::spawn(aio_pool::run(
        aio_pool::AioPoolConfig::from_env(&env).unwrap(),
        stop_second.clone(),
    ));
    let url = h.nats.url();
    let pools = [h.owner.as_str(), second_owner.as_str()];
    let acme_held =
        || test_support::reported_holdings(&url, messages::ServiceName::AioPool, &pools, "acme");
    test_support::eventually("both pools beat", Duration::from_secs(30), || async {
        acme_held().await
    })
    .await;

    let acme = agent(&h, "acme").await;
    acme.aio().acquire(&acquire("s1")).await.unwrap();
    test_support::eventually(
        "the heartbeats report acme's instance",
        Duration::from_secs(10),
        || async { (acme_held().await? == 1).then_some(()) },
    )
    .await;
    // Counted per pool, about half of these would land on the pool without acme's instance.
    for n in 2..12 {
        let e = acme
            .aio()
            .acquire(&acquire(&format!("s{n}")))
            .await
            .expect_err("over the quota, whichever pool answers");
        let body = e.service_error().expect("a pool refused").clone();
        assert_eq!(body.kind, messages::ErrorKind::Overloaded, "{body:?}");
        let d = body.details.unwrap();
        assert_eq!(
            (d["quota"].as_str(), d["limit"].as_u64(), d["used"].as_u64()),
            (Some("aio_instances"), Some(1), Some(1)),
            "{d}"
        );
        assert!(d["retry_after_ms"].as_u64().is_some(), "{d}");
    }
    stop_second.cancel();
    second
        .await
        .unwrap()
        .expect("the second pool stopped cleanly");
    h.stop().await;
}
