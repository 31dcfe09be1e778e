//! Per-tenant quotas: set in the tenancy file, followed by the running
//! scheduler (no restart), answered with 429 naming the quota — tried as the tenant's own agent
//! over raw NATS credentials, with another tenant beside it unaffected. And the confirmation
//! events a tenant imports name its executions as it did.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::*;
use futures::StreamExt;
use messages::confirm::Confirmation;
use messages::exec::{ExecRequest, Language};
use messages::quota::Quotas;
use messages::session::SessionOpen;
use messages::tenancy::Tenant;
use messages::{ServiceName, Subjects};
use sandmesh_auth::Tenancy;
use sandmesh_client::{ClientError, ErrorKind, MeshClient};

/// The next confirmation event, within 20 s.
async fn next_event(events: &mut async_nats::Subscriber) -> Confirmation {
    let m = tokio::time::timeout(Duration::from_secs(20), events.next())
        .await
        .expect("an event in time")
        .expect("subscribed");
    serde_json::from_slice(&m.payload).unwrap()
}

async fn agent(mesh: &Mesh, tenant: &str) -> MeshClient {
    MeshClient::new(
        connect(&mesh.nats.agent_url(tenant)).await,
        Subjects::default(),
    )
    .with_timeout(Duration::from_secs(30))
}

fn open(id: &str) -> SessionOpen {
    SessionOpen {
        session_id: Some(id.into()),
        ..Default::default()
    }
}

/// Writes `quotas` for `tenant` into the tenancy file the scheduler follows.
fn set_quotas(file: &Path, tenancy: &Tenancy, tenant: &str, quotas: Quotas) {
    let mut t = tenancy.clone();
    t.set_quotas(&Tenant::new(tenant).unwrap(), quotas);
    t.save(file).unwrap();
}

/// A mesh whose scheduler follows a tenancy file (in the returned directory, at the returned
/// path) giving acme `quotas`; the scheduler's config, for another one like it.
async fn mesh_with_acme_quotas(
    tenants: &[&str],
    quotas: Quotas,
) -> (Mesh, tempfile::TempDir, PathBuf, scheduler::SchedulerConfig) {
    let mut mesh = Mesh::builder()
        .risk()
        .workspace()
        .executor("node-a", 8)
        .tenants(tenants, &[])
        .scheduler(|_| {})
        .start()
        .await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tenancy.json");
    set_quotas(&file, &mesh.nats.tenancy().clone(), "acme", quotas);
    let mut config = mesh.config();
    config.kit.tenancy_file = Some(file.clone());
    mesh.stop_scheduler().await;
    mesh.start_scheduler(config.clone()).await;
    (mesh, dir, file, config)
}

/// The 429 of quota `name`, with its limit.
fn over_quota<T: std::fmt::Debug>(outcome: Result<T, ClientError>, name: &str, limit: u64) {
    let e = match outcome {
        Err(e) if e.kind() == ErrorKind::Overloaded => e,
        other => panic!("expected 429 for the {name} quota, got {other:?}"),
    };
    let body = e.service_error().expect("an error body from the mesh");
    let details = body.details.as_ref().expect("details name the quota");
    assert_eq!(details["quota"], name, "{body:?}");
    assert_eq!(details["limit"], limit, "{body:?}");
    assert!(details["retry_after_ms"].as_u64().is_some(), "{body:?}");
}

#[tokio::test]
async fn a_tenant_over_its_session_and_execution_quotas_gets_429_and_a_raised_quota_applies_at_once(
) {
    let quotas = Quotas {
        sessions: Some(1),
        concurrent_executions: Some(1),
        ..Default::default()
    };
    let (mesh, _dir, file, _) = mesh_with_acme_quotas(&["acme", "beta"], quotas).await;
    let tenancy = mesh.nats.tenancy().clone();
    let (acme, beta) = (agent(&mesh, "acme").await, agent(&mesh, "beta").await);

    // Sessions: the second open one is refused, another tenant's are not counted, a closed
    // one frees its place.
    acme.sessions().open(&open("s1")).await.unwrap();
    over_quota(acme.sessions().open(&open("s2")).await, "sessions", 1);
    // An execution naming a new session opens it: the same quota.
    let in_s3 = ExecRequest {
        session_id: Some("s3".into()),
        language: Language::Python,
        code: "print(1)".into(),
        ..Default::default()
    };
    over_quota(acme.exec().exec(&in_s3).await, "sessions", 1);
    for id in ["s1", "s2"] {
        beta.sessions().open(&open(id)).await.unwrap();
    }
    acme.sessions().close("s1").await.unwrap();
    acme.sessions().open(&open("s2")).await.unwrap();

    // Executions: with one in flight, a second is refused; beta runs meanwhile.
    let slow = ExecRequest {
        language: Language::Python,
        code: "sleep:4000".into(),
        ..Default::default()
    };
    // The slow one tries until it is in (a quick one below may hold acme's slot a moment).
    let first = {
        let acme = acme.clone();
        tokio::spawn(async move {
            loop {
                match acme.exec().exec(&slow).await {
                    Err(e) if e.kind() == ErrorKind::Overloaded => {
                        tokio::time::sleep(Duration::from_millis(50)).await
                    }
                    other => return other,
                }
            }
        })
    };
    let quick = ExecRequest {
        language: Language::Python,
        code: "print(1)".into(),
        ..Default::default()
    };
    let refused = eventually("acme's second execution refused", || async {
        match acme.exec().exec(&quick).await {
            Err(e) if e.kind() == ErrorKind::Overloaded => Some(e),
            _ => None,
        }
    })
    .await;
    over_quota::<()>(Err(refused), "concurrent_executions", 1);
    beta.exec().exec(&quick).await.expect("beta is not acme");
    first.await.unwrap().expect("the first one ran");

    // Raised in the file: the running scheduler follows it.
    set_quotas(
        &file,
        &tenancy,
        "acme",
        Quotas {
            sessions: Some(2),
            ..Default::default()
        },
    );
    acme.sessions().open(&open("s4")).await.unwrap();
    over_quota(acme.sessions().open(&open("s5")).await, "sessions", 2);
    mesh.shutdown().await;
}

/// The confirmation events a tenant's agent follows name the execution as the
/// agent did, not the tenant-scoped id the mesh stores; the parked execution still resumes on
/// the decision (the scheduler scopes the id again).
#[tokio::test]
async fn confirmation_events_name_the_execution_as_the_agent_did_and_it_resumes() {
    let mesh = Mesh::builder()
        .risk()
        .confirm(&[])
        .executor("node-a", 4)
        .tenants(&["acme"], &[])
        .scheduler(|_| {})
        .start()
        .await;
    let acme = agent(&mesh, "acme").await;
    let mut events = acme
        .nats()
        .subscribe("sandbox.v1.confirm.*.acme.*")
        .await
        .unwrap();
    acme.nats().flush().await.unwrap();
    let risky = ExecRequest {
        execution_id: Some("mine-1".into()),
        language: Language::Python,
        code: "import os\nos.system('id')".into(),
        ..Default::default()
    };
    let run = {
        let acme = acme.clone();
        tokio::spawn(async move { acme.exec().exec(&risky).await })
    };
    let pending = next_event(&mut events).await;
    assert_eq!(pending.execution_id.as_deref(), Some("mine-1"));
    assert_eq!(pending.tenant, Some(Tenant::new("acme").unwrap()));

    let operator = MeshClient::new(
        connect(&mesh.nats.operator_url("operator")).await,
        Subjects::default(),
    );
    let decide = messages::confirm::ConfirmDecide {
        id: pending.id.clone(),
        approve: true,
        by: "operator".into(),
        reason: None,
        scope: messages::confirm::ConfirmScope::Once,
        by_account: None,
    };
    operator.confirm().decide(&decide).await.unwrap();
    let decided = next_event(&mut events).await;
    assert_eq!(decided.id, pending.id);
    assert_eq!(decided.execution_id.as_deref(), Some("mine-1"));
    let result = run.await.unwrap().expect("resumed after the approval");
    assert_eq!(result.execution_id, "mine-1");
    mesh.shutdown().await;
}

/// `concurrent_executions` is the tenant's over the whole mesh. Two schedulers share
/// one nats-server (requests spread over both by the queue group); with two slow executions in
/// flight, wherever they landed, every further one is refused, whichever scheduler takes it;
/// once they end, the next one runs.
#[tokio::test]
async fn the_executions_quota_counts_the_executions_on_every_scheduler() {
    let quotas = Quotas {
        concurrent_executions: Some(2),
        ..Default::default()
    };
    let (mesh, _dir, _, config) = mesh_with_acme_quotas(&["acme"], quotas).await;
    let first = config.kit.instance_id.clone();
    let mut second = config;
    second.kit.instance_id = "scheduler-two".into();
    second.kit.metrics_addr = None;
    let stop_second = kit::CancellationToken::new();
    let second = tokio::spawn(scheduler::run(second, stop_second.clone()));
    let url = mesh.nats.service_url(ServiceName::Scheduler);
    let schedulers = [first.as_str(), "scheduler-two"];
    let acme_held =
        || test_support::reported_holdings(&url, ServiceName::Scheduler, &schedulers, "acme");
    eventually("both schedulers beat", || async { acme_held().await }).await;

    let acme = agent(&mesh, "acme").await;
    let slow = ExecRequest {
        language: Language::Python,
        code: "sleep:8000".into(),
        ..Default::default()
    };
    let running: Vec<_> = (0..2)
        .map(|_| {
            let (acme, slow) = (acme.clone(), slow.clone());
            tokio::spawn(async move { acme.exec().exec(&slow).await })
        })
        .collect();
    // Both schedulers hear each other's counts through the heartbeats: once these report
    // both executions, every scheduler has had them (bounded staleness: one interval).
    eventually("the heartbeats report acme's two executions", || async {
        (acme_held().await? == 2).then_some(())
    })
    .await;
    let quick = ExecRequest {
        language: Language::Python,
        code: "print(1)".into(),
        ..Default::default()
    };
    let refused = eventually("acme's third execution refused", || async {
        match acme.exec().exec(&quick).await {
            Err(e) if e.kind() == ErrorKind::Overloaded => Some(e),
            _ => None,
        }
    })
    .await;
    over_quota::<()>(Err(refused), "concurrent_executions", 2);
    // Counted per scheduler, about half of these would land where fewer than two run.
    for _ in 0..12 {
        over_quota(acme.exec().exec(&quick).await, "concurrent_executions", 2);
    }
    for run in running {
        run.await.unwrap().expect("the slow ones ran");
    }
    eventually("acme runs again once its executions ended", || async {
        acme.exec().exec(&quick).await.ok()
    })
    .await;
    stop_second.cancel();
    second
        .await
        .unwrap()
        .expect("the second scheduler stopped cleanly");
    mesh.shutdown().await;
}
