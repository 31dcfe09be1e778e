//! Identity and tenancy with the shipped accounts, users and
//! permissions in a real nats-server: tenants `acme` and `beta`, the operator `operator` (every
//! tenant) and `bob` (acme only). Each test tries to cross a boundary and shows it holds.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use async_nats::jetstream;
use futures::StreamExt;
use messages::audit::AuditEvent;
use messages::confirm::{ConfirmDecide, ConfirmGet, ConfirmList, ConfirmScope, ConfirmState};
use messages::exec::{ExecRequest, ExecStatus, Language};
use messages::session::SessionOpen;
use messages::subjects::ConfirmOp;
use messages::{ServiceName, Subjects};
use sandmesh_client::{ClientError, ErrorKind, MeshClient};

/// Code the risk stand-in rates high: it needs a person's approval.
const RISKY: &str = "import os\nos.system('id')";

fn req(id: &str, code: &str) -> ExecRequest {
    ExecRequest {
        execution_id: Some(id.into()),
        language: Language::Python,
        code: code.into(),
        ..Default::default()
    }
}

/// A client connected with `url`, and the errors the server sent it (permission violations
/// arrive that way, not as replies).
struct Client {
    mesh: MeshClient,
    server_errors: Arc<Mutex<Vec<String>>>,
}

impl Client {
    async fn connect(url: &str) -> Self {
        let server_errors = Arc::new(Mutex::new(Vec::new()));
        let seen = server_errors.clone();
        let (options, plain) = test_support::connect_options(url);
        let nats = options
            .event_callback(move |event| {
                let seen = seen.clone();
                async move {
                    if let async_nats::Event::ServerError(e) = event {
                        seen.lock().unwrap().push(e.to_string());
                    }
                }
            })
            .connect(plain)
            .await
            .expect("connect");
        Self {
            mesh: MeshClient::new(nats, Subjects::default()).with_timeout(Duration::from_secs(10)),
            server_errors,
        }
    }

    fn nats(&self) -> &async_nats::Client {
        self.mesh.nats()
    }

    /// Waits until the server has reported a permissions violation naming `subject`.
    async fn refused(&self, subject: &str) {
        let errors = self.server_errors.clone();
        eventually(&format!("a permissions violation for {subject}"), || {
            let errors = errors.clone();
            async move {
                let errors = errors.lock().unwrap();
                errors
                    .iter()
                    .any(|e| e.contains("Permissions Violation") && e.contains(subject))
                    .then_some(())
            }
        })
        .await;
    }
}

async fn mesh() -> Mesh {
    Mesh::builder()
        .risk()
        .confirm(&[])
        .real_workspace()
        .executor("node-a", 4)
        .tenants(&["acme", "beta"], &[("bob", &["acme"])])
        .scheduler(|_| {})
        .start()
        .await
}

fn decision(id: &str, approve: bool) -> ConfirmDecide {
    ConfirmDecide {
        id: id.into(),
        approve,
        by: "whoever".into(),
        reason: Some("test".into()),
        scope: ConfirmScope::Once,
        by_account: None,
    }
}

fn not_found<T: std::fmt::Debug>(outcome: Result<T, ClientError>) {
    match outcome {
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        other => panic!("expected 404, got {other:?}"),
    }
}

/// The pending confirmation of `tenant`'s `execution_id` as `who` sees it: operators, like
/// agents, read the id the agent chose, beside the tenant.
async fn pending_confirmation(who: &Client, tenant: &str, execution_id: &str) -> String {
    eventually(
        &format!("a pending confirmation for {execution_id}"),
        || async {
            let list = ConfirmList {
                limit: Some(100),
                ..Default::default()
            };
            let listed = who.mesh.confirm().list(&list).await.ok()?;
            listed
                .into_iter()
                .find(|c| {
                    c.state == ConfirmState::Pending
                        && c.execution_id.as_deref() == Some(execution_id)
                        && c.tenant.as_ref().is_some_and(|t| t.as_str() == tenant)
                })
                .map(|c| c.id)
        },
    )
    .await
}

#[tokio::test]
async fn an_agent_cannot_decide_and_the_execution_waits_for_an_operator() {
    let mesh = mesh().await;
    let acme = Client::connect(&mesh.nats.agent_url("acme")).await;
    let beta = Client::connect(&mesh.nats.agent_url("beta")).await;
    let operator = Client::connect(&mesh.nats.operator_url("operator")).await;

    let submitted = acme
        .mesh
        .exec()
        .submit(&req("risky-1", RISKY))
        .await
        .unwrap();
    let id = pending_confirmation(&operator, "acme", &submitted.execution_id).await;

    // The agent itself, and another tenant's agent: the server refuses the publish.
    let decide = ConfirmDecide {
        id: id.clone(),
        approve: true,
        by: "operator".into(),
        reason: None,
        scope: ConfirmScope::Once,
        by_account: Some("OPERATORS".into()),
    };
    let subject = Subjects::default().confirm(ConfirmOp::Decide);
    for agent in [&acme, &beta] {
        let _ = agent
            .mesh
            .request_timeout::<_, serde_json::Value>(
                subject.clone(),
                &decide,
                Duration::from_secs(1),
            )
            .await;
        agent.refused(&subject).await;
    }
    let still: messages::confirm::Confirmation = operator
        .mesh
        .request(
            Subjects::default().confirm(ConfirmOp::Get),
            &ConfirmGet { id: id.clone() },
        )
        .await
        .unwrap();
    assert_eq!(still.state, ConfirmState::Pending);
    assert!(acme.mesh.exec().result("risky-1").await.unwrap().is_none());

    // The operator decides; the record names the operator the server authenticated, not
    // the `by` the request claimed.
    let claimed = ConfirmDecide {
        by: "someone-else".into(),
        by_account: None,
        ..decide
    };
    let decided: messages::confirm::Confirmation =
        operator.mesh.request(subject, &claimed).await.unwrap();
    assert_eq!(decided.by.as_deref(), Some("operator"));
    assert_eq!(decided.by_account.as_deref(), Some("OPERATORS"));
    let result = acme.mesh.exec().wait_result("risky-1", WAIT).await.unwrap();
    assert_eq!(result.execution_id, "risky-1");
    assert_eq!(result.status, ExecStatus::Ok);
    assert_eq!(result.confirmation.by.as_deref(), Some("operator"));
    mesh.shutdown().await;
}

#[tokio::test]
async fn an_operator_sees_and_decides_only_the_tenants_in_scope() {
    let mesh = mesh().await;
    let acme = Client::connect(&mesh.nats.agent_url("acme")).await;
    let beta = Client::connect(&mesh.nats.agent_url("beta")).await;
    let operator = Client::connect(&mesh.nats.operator_url("operator")).await;
    let bob = Client::connect(&mesh.nats.operator_url("bob")).await;

    acme.mesh.exec().submit(&req("a-1", RISKY)).await.unwrap();
    beta.mesh.exec().submit(&req("b-1", RISKY)).await.unwrap();
    let for_acme = pending_confirmation(&operator, "acme", "a-1").await;
    let for_beta = pending_confirmation(&operator, "beta", "b-1").await;

    // Bob lists acme's, never beta's; beta's id is unknown to him.
    let listed = bob
        .mesh
        .confirm()
        .list(&ConfirmList::default())
        .await
        .unwrap();
    let ids: Vec<&str> = listed.iter().map(|c| c.id.as_str()).collect();
    assert!(ids.contains(&for_acme.as_str()), "{ids:?}");
    assert!(!ids.contains(&for_beta.as_str()), "{ids:?}");
    not_found(bob.mesh.confirm().get(&for_beta).await);
    not_found(bob.mesh.confirm().decide(&decision(&for_beta, true)).await);
    // Agents see their own tenant's confirmation, and 404 for the other's.
    let own = acme.mesh.confirm().get(&for_acme).await.unwrap();
    assert_eq!(own.id, for_acme);
    // Under the id acme chose, not the stored (tenant-scoped) one.
    assert_eq!(own.execution_id.as_deref(), Some("a-1"));
    not_found(acme.mesh.confirm().get(&for_beta).await);
    // Bob may decide acme's.
    let decided = bob
        .mesh
        .confirm()
        .decide(&decision(&for_acme, false))
        .await
        .unwrap();
    assert_eq!(decided.state, ConfirmState::Denied);
    assert_eq!(decided.by.as_deref(), Some("bob"));
    let denied = acme.mesh.exec().wait_result("a-1", WAIT).await.unwrap();
    assert_eq!(denied.status, ExecStatus::Denied);
    mesh.shutdown().await;
}

#[tokio::test]
async fn tenants_cannot_reach_each_others_results_sessions_or_workspaces() {
    let mesh = mesh().await;
    let acme = Client::connect(&mesh.nats.agent_url("acme")).await;
    let beta = Client::connect(&mesh.nats.agent_url("beta")).await;

    let open = SessionOpen {
        session_id: Some("s1".into()),
        ..Default::default()
    };
    let session = acme.mesh.sessions().open(&open).await.unwrap();
    assert_eq!(session.session_id, "s1");
    let ws = acme.mesh.workspace();
    ws.write("s1", "data/secret.txt", b"acme's secret")
        .await
        .unwrap();
    let ran = acme.mesh.exec().exec(&req("e1", "print(1)")).await.unwrap();
    assert_eq!(ran.execution_id, "e1");

    // Every id acme used names nothing for beta.
    not_found(beta.mesh.exec().result("e1").await);
    not_found(beta.mesh.sessions().get("s1").await);
    not_found(beta.mesh.sessions().close("s1").await);
    let read = beta.mesh.workspace().read("s1", "data/secret.txt").await;
    // The error names the session as beta named it, never the stored (scoped) id.
    let message = read.as_ref().map_err(|e| e.to_string()).unwrap_err();
    assert!(!message.contains("beta-s1"), "{message}");
    not_found(read);
    // A listing is a 404 like every other call, not an empty list.
    not_found(beta.mesh.workspace().list("s1", None, true).await);
    let listed = beta.mesh.sessions().list(None).await.unwrap();
    assert!(listed.is_empty(), "{listed:?}");
    // A write by beta to "s1" lands in beta's own workspace of that name.
    beta.mesh
        .workspace()
        .write("s1", "data/secret.txt", b"beta's")
        .await
        .unwrap();
    assert_eq!(
        ws.read("s1", "data/secret.txt").await.unwrap(),
        b"acme's secret"
    );
    // The same execution id is beta's own execution, not acme's stored result.
    let theirs = beta.mesh.exec().exec(&req("e1", "print(2)")).await.unwrap();
    assert_eq!(theirs.execution_id, "e1");
    let acme_again = acme.mesh.exec().result("e1").await.unwrap().unwrap();
    assert_eq!(acme_again.stdout, ran.stdout);
    // Sweeping every workspace is for services only.
    let sweep = beta.mesh.workspace().cleanup(None).await;
    assert_eq!(sweep.unwrap_err().kind(), ErrorKind::Denied);
    // acme's session is untouched.
    assert_eq!(
        acme.mesh.sessions().get("s1").await.unwrap().session_id,
        "s1"
    );
    mesh.shutdown().await;
}

#[tokio::test]
async fn events_and_replies_reach_only_their_tenant() {
    let mesh = mesh().await;
    let acme = Client::connect(&mesh.nats.agent_url("acme")).await;
    let beta = Client::connect(&mesh.nats.agent_url("beta")).await;
    let s = Subjects::default();

    // Beta subscribes to acme's subjects by name and to everything it may: its account
    // imports only beta's events, so none of these can carry acme's.
    let mut beta_sees = futures::stream::select_all([
        beta.nats()
            .subscribe(s.pattern("output.acme.>"))
            .await
            .unwrap(),
        beta.nats()
            .subscribe(s.pattern("audit.acme.>"))
            .await
            .unwrap(),
        beta.nats().subscribe(s.output_all()).await.unwrap(),
        beta.nats().subscribe(s.audit_all()).await.unwrap(),
        beta.nats().subscribe(s.confirm_events_all()).await.unwrap(),
        beta.nats().subscribe("_INBOX.>").await.unwrap(),
    ]);
    let mut acme_audit = acme
        .nats()
        .subscribe(s.pattern("audit.acme.>"))
        .await
        .unwrap();
    let mut acme_output = acme.mesh.exec().output("e-out").await.unwrap();
    beta.nats().flush().await.unwrap();

    // acme runs code (audited) and output is published for it, as an executor does.
    acme.mesh
        .exec()
        .exec(&req("e-out", "print(1)"))
        .await
        .unwrap();
    let admin = test_support::connect(&mesh.nats.url()).await;
    let chunk = messages::exec::OutputChunk {
        seq: 0,
        stream: messages::exec::OutputStream::Stdout,
        data: "acme's output".into(),
        eof: true,
    };
    admin
        .publish(
            s.output(
                Some(&messages::tenancy::Tenant::new("acme").unwrap()),
                "e-out",
            ),
            serde_json::to_vec(&chunk).unwrap().into(),
        )
        .await
        .unwrap();
    admin.flush().await.unwrap();

    let chunk = tokio::time::timeout(WAIT, acme_output.next())
        .await
        .expect("acme's output in time")
        .unwrap()
        .unwrap();
    assert_eq!(chunk.data, "acme's output");
    let event = tokio::time::timeout(WAIT, acme_audit.next())
        .await
        .expect("an audit event for acme")
        .unwrap();
    let event: AuditEvent = serde_json::from_slice(&event.payload).unwrap();
    assert_eq!(event.tenant.as_ref().map(|t| t.as_str()), Some("acme"));
    assert_eq!(event.account.as_deref(), Some("acme"));
    assert_eq!(event.user.as_deref(), Some("acme-agent"));
    // Beta saw none of it.
    let seen = tokio::time::timeout(Duration::from_secs(1), beta_sees.next()).await;
    assert!(
        seen.is_err(),
        "beta saw {:?}",
        seen.unwrap().map(|m| m.subject)
    );
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_forged_request_info_header_changes_nothing() {
    let mesh = mesh().await;
    let acme = Client::connect(&mesh.nats.agent_url("acme")).await;
    let beta = Client::connect(&mesh.nats.agent_url("beta")).await;

    // Beta claims to be acme, then to be an operator.
    for (id, claim) in [
        ("forged-1", r#"{"acc":"acme","user":"acme-agent"}"#),
        ("forged-2", r#"{"acc":"OPERATORS","user":"operator"}"#),
    ] {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(messages::tenancy::REQUEST_INFO_HEADER, claim);
        headers.insert(messages::codec::CONTENT_TYPE, messages::codec::JSON);
        let reply = beta
            .nats()
            .request_with_headers(
                Subjects::default().exec(),
                headers,
                serde_json::to_vec(&req(id, "print(1)")).unwrap().into(),
            )
            .await
            .unwrap();
        let result: messages::exec::ExecResult = serde_json::from_slice(&reply.payload).unwrap();
        assert_eq!(result.execution_id, id);
        // Stored as beta's: beta finds it, acme does not.
        assert!(beta.mesh.exec().result(id).await.unwrap().is_some());
        not_found(acme.mesh.exec().result(id).await);
    }
    // And the store holds it under beta's scope, by the server's word alone.
    let js = jetstream::new(test_support::connect(&mesh.nats.url()).await);
    let results = js
        .get_stream(Subjects::default().results_stream())
        .await
        .unwrap();
    results
        .get_last_raw_message_by_subject(&Subjects::default().result("beta-forged-1"))
        .await
        .expect("stored as beta's");
    mesh.shutdown().await;
}

#[tokio::test]
async fn service_users_cannot_delete_other_services_assets() {
    let mesh = mesh().await;
    let admin = jetstream::new(test_support::connect(&mesh.nats.url()).await);
    let s = Subjects::default();
    let attempts = [
        (
            ServiceName::Scheduler,
            format!("KV_{}", s.confirmations_bucket()),
        ),
        (ServiceName::WorkspaceStore, s.results_stream()),
        (ServiceName::Confirmation, s.jobs_stream()),
        (
            ServiceName::DockerExecutor,
            format!("KV_{}", s.sessions_bucket()),
        ),
        (ServiceName::RiskAssessor, s.audit_stream()),
    ];
    for (service, stream) in attempts {
        let js = jetstream::ContextBuilder::new()
            .timeout(Duration::from_secs(2))
            .build(test_support::connect(&mesh.nats.service_url(service)).await);
        assert!(
            js.delete_stream(&stream).await.is_err(),
            "{service} deleted {stream}"
        );
        admin
            .get_stream(&stream)
            .await
            .unwrap_or_else(|e| panic!("{stream} is gone after {service} tried: {e}"));
    }
    // A service cannot delete its own either: nobody but the admin deletes streams.
    let own = jetstream::ContextBuilder::new()
        .timeout(Duration::from_secs(2))
        .build(test_support::connect(&mesh.nats.service_url(ServiceName::Scheduler)).await);
    assert!(own.delete_stream(s.jobs_stream()).await.is_err());
    mesh.shutdown().await;
}

/// Operators share one account, and an operator scoped to `acme` that
/// subscribed to `_INBOX.>` received the all-tenant operator's `confirm.list` replies (beta's
/// pending code). As an eavesdropper would, with a raw client and no sandmesh helper: every
/// inbox but its own is refused by the server, and nothing of the other's replies arrives.
#[tokio::test]
async fn an_operator_cannot_read_another_operators_replies() {
    let mesh = mesh().await;
    let beta = Client::connect(&mesh.nats.agent_url("beta")).await;
    let operator = Client::connect(&mesh.nats.operator_url("operator")).await;
    beta.mesh.exec().submit(&req("b-2", RISKY)).await.unwrap();
    pending_confirmation(&operator, "beta", "b-2").await;

    let (options, plain) = test_support::connect_options(&mesh.nats.operator_url("bob"));
    let (errors_tx, mut errors) = tokio::sync::mpsc::unbounded_channel();
    let raw = options
        // The attacker's own choice of inbox, not the one sandmesh gives bob.
        .custom_inbox_prefix("_INBOX")
        .event_callback(move |event| {
            let errors = errors_tx.clone();
            async move {
                if let async_nats::Event::ServerError(e) = event {
                    let _ = errors.send(e.to_string());
                }
            }
        })
        .connect(plain)
        .await
        .unwrap();
    let mut all = raw.subscribe("_INBOX.>").await.unwrap();
    let mut others = raw.subscribe("_INBOX_operator.>").await.unwrap();
    raw.flush().await.unwrap();
    let refused = tokio::time::timeout(Duration::from_secs(10), async {
        let mut seen = Vec::new();
        while seen.len() < 2 {
            seen.push(errors.recv().await.expect("the error channel is open"));
        }
        seen
    })
    .await
    .expect("the server refuses both subscriptions");
    assert!(
        refused.iter().all(|e| e.contains("Permissions Violation")),
        "{refused:?}"
    );

    // The all-tenant operator's listings (beta's pending code among them) reach only it.
    for _ in 0..3 {
        let listed = operator
            .mesh
            .confirm()
            .list(&ConfirmList::default())
            .await
            .unwrap();
        assert!(
            listed
                .iter()
                .any(|c| c.execution_id.as_deref() == Some("b-2")
                    && c.tenant.as_ref().is_some_and(|t| t.as_str() == "beta")),
            "{listed:?}"
        );
    }
    let overheard = tokio::time::timeout(Duration::from_millis(500), async {
        tokio::select! {
            m = all.next() => m,
            m = others.next() => m,
        }
    })
    .await;
    assert!(
        matches!(overheard, Err(_) | Ok(None)),
        "bob overheard: {overheard:?}"
    );
    mesh.shutdown().await;
}
