//! `sandmesh tenant init` writes a deployment's server config and credentials, and `sandmesh
//! tenant add` gives a running server a new tenant without a restart (the accounts file is
//! rewritten and the server reloads it). Real nats-server, the real `sandmesh` binary.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::{run_bounded, until_logged, SANDMESH};
use test_support::{eventually, free_port, nats_server_binary};

const LIMIT: Duration = Duration::from_secs(60);

use crate::common::sandmesh_in_dir as tenant;

/// The URL with credentials `sandmesh creds` prints for `args`.
async fn creds_url(dir: &std::path::Path, args: &[&str]) -> String {
    let mut all = vec!["creds", "--url-only"];
    all.extend_from_slice(args);
    let out = tenant(dir, &all).await;
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

async fn connects(url: &str) -> bool {
    let (options, plain) = test_support::connect_options(url);
    options
        .connection_timeout(Duration::from_secs(2))
        .connect(plain)
        .await
        .is_ok()
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn a_tenant_added_to_a_running_server_can_connect_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let url = format!("nats://127.0.0.1:{port}");
    let store = dir.path().join("js");
    tenant(
        dir.path(),
        &[
            "tenant",
            "init",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--store",
            store.to_str().unwrap(),
            "--url",
            &url,
        ],
    )
    .await;
    let conf = dir.path().join("nats/nats.conf");
    let _server = Server(
        Command::new(nats_server_binary())
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let agent = creds_url(dir.path(), &[]).await;
    eventually("the server to accept the default agent", LIMIT, || async {
        connects(&agent).await.then_some(())
    })
    .await;
    // No such tenant yet.
    let mut cmd = Command::new(SANDMESH);
    cmd.args(["creds", "--tenant", "acme"])
        .env("SANDMESH_DATA_DIR", dir.path());
    let missing = run_bounded(cmd, LIMIT).await;
    assert!(!missing.status.success(), "{missing:?}");

    let added = tenant(dir.path(), &["tenant", "add", "acme"]).await;
    assert!(
        String::from_utf8_lossy(&added.stderr).contains("reloaded"),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );
    let acme = creds_url(dir.path(), &["--tenant", "acme"]).await;
    assert!(acme.contains("acme-agent:"), "{acme}");
    eventually("the new tenant's agent to connect", LIMIT, || async {
        connects(&acme).await.then_some(())
    })
    .await;
    // A wrong password is still refused.
    assert!(!connects(&acme.replace("acme-agent:", "acme-agent:x")).await);
    let listed = tenant(dir.path(), &["tenant", "list"]).await;
    let listed = String::from_utf8_lossy(&listed.stdout).to_string();
    assert!(
        listed.contains("acme") && listed.contains("default"),
        "{listed}"
    );
}

/// `sandmesh up` with its embedded NATS in `dir`, killed on drop.
struct Mesh {
    up: tokio::process::Child,
    log: std::path::PathBuf,
}

impl Mesh {
    fn start(dir: &std::path::Path, port: u16) -> Self {
        let log_path = dir.join("up.log");
        let log = std::fs::File::create(&log_path).unwrap();
        let child = tokio::process::Command::new(SANDMESH)
            .args(["up", "--nats-port", &port.to_string()])
            .arg("--data-dir")
            .arg(dir)
            .env_remove("SANDMESH_NATS_URL")
            .env_remove("SANDMESH_CREDS")
            .env("SANDMESH_NATS_SERVER", nats_server_binary())
            .current_dir(test_support::repo_root())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("spawn sandmesh up");
        Self {
            up: child,
            log: log_path,
        }
    }

    /// Until `up` says the mesh is up: it does once every service answers a real request (a
    /// service is listed by `status` a moment before its endpoints are served).
    async fn until_up(&mut self) {
        until_logged(&mut self.up, &self.log, "sandmesh: mesh is up").await;
    }

    /// SIGTERM and its exit (bounded), so `up` removes its containers: a kill on drop (a
    /// panicking test) cannot.
    async fn stop(mut self) {
        let pid = self.up.id().expect("running").to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let _ = tokio::time::timeout(Duration::from_secs(60), self.up.wait()).await;
    }
}

/// `sandmesh <args>` as the agent whose credentials file is `creds`, bounded.
async fn as_agent(creds: &std::path::Path, args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(SANDMESH);
    cmd.args(args)
        .env_remove("SANDMESH_NATS_URL")
        .env("SANDMESH_CREDS", creds);
    run_bounded(cmd, Duration::from_secs(120)).await
}

/// A tenant added to a running mesh once connected but every request got "no
/// responders" until a restart. Its agent must be *served*: an execution, a raw request through
/// the imports, and its own events.
#[tokio::test]
async fn a_tenant_added_to_a_running_mesh_is_served_without_a_restart() {
    test_support::require_docker();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut mesh = Mesh::start(dir.path(), port);
    mesh.until_up().await;
    let before = as_agent(
        &dir.path().join("creds/agent.json"),
        &["exec", "print(6*7)"],
    )
    .await;
    assert!(
        String::from_utf8_lossy(&before.stdout).contains("42"),
        "the default tenant is served: {before:?}"
    );

    tenant(
        dir.path(),
        &["tenant", "add", "acme", "--max-sessions", "1"],
    )
    .await;
    let acme = dir.path().join("creds/acme-agent.json");
    let ran = as_agent(&acme, &["exec", "print(6*7)"]).await;
    assert!(
        ran.status.success() && String::from_utf8_lossy(&ran.stdout).contains("42"),
        "the new tenant's execution: {ran:?}\n{}",
        std::fs::read_to_string(dir.path().join("up.log")).unwrap_or_default()
    );
    // A raw request through another import, as a client that skips the CLI would send it.
    let url = creds_url(dir.path(), &["--tenant", "acme"]).await;
    let client = test_support::connect(&url).await;
    let subjects = messages::Subjects::default();
    let reply = client
        .request(
            subjects.sessions(messages::subjects::SessionOp::List),
            "{}".into(),
        )
        .await
        .expect("sessions.list is answered for the new tenant");
    let list: serde_json::Value = serde_json::from_slice(&reply.payload).unwrap();
    assert!(list["sessions"].is_array(), "{list}");

    // Its quota, given with `tenant add`, holds in the running services; one raised with
    // `tenant quota` applies at once.
    let sessions = sandmesh_client::MeshClient::new(client, subjects).sessions();
    let open = |id: &str| messages::session::SessionOpen {
        session_id: Some(id.into()),
        ..Default::default()
    };
    sessions.open(&open("q1")).await.expect("the first session");
    let e = sessions.open(&open("q2")).await.unwrap_err();
    let body = e.service_error().expect("refused by the mesh");
    assert_eq!(body.kind, messages::ErrorKind::Overloaded, "{body:?}");
    assert_eq!(
        body.details.as_ref().unwrap()["quota"],
        "sessions",
        "{body:?}"
    );
    let set = tenant(
        dir.path(),
        &["tenant", "quota", "acme", "--max-sessions", "2"],
    )
    .await;
    let said = String::from_utf8_lossy(&set.stdout);
    assert!(said.contains("sessions=2"), "{set:?}");
    sessions.open(&open("q2")).await.expect("the raised quota");
    mesh.stop().await;
}

/// The URL with credentials of a credentials file `sandmesh` wrote.
fn url_of(creds: &std::path::Path) -> String {
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(creds).unwrap()).unwrap();
    let (user, password) = (
        file["user"].as_str().unwrap(),
        file["password"].as_str().unwrap(),
    );
    let server = file["url"].as_str().unwrap();
    server.replacen("nats://", &format!("nats://{user}:{password}@"), 1)
}

/// An operator added to a running mesh decides at once (the confirmation
/// service follows the tenancy file), sees only its tenants, and a removed one is refused.
#[tokio::test]
async fn an_operator_added_to_a_running_mesh_decides_at_once_and_a_removed_one_is_refused() {
    test_support::require_docker();
    let dir = tempfile::tempdir().unwrap();
    let mut mesh = Mesh::start(dir.path(), free_port());
    mesh.until_up().await;
    tenant(dir.path(), &["tenant", "add", "acme"]).await;
    let added = tenant(
        dir.path(),
        &["operator", "add", "carol", "--tenants", "acme"],
    )
    .await;
    assert!(
        String::from_utf8_lossy(&added.stdout).contains("carol-operator.json"),
        "{added:?}"
    );
    let listed = tenant(dir.path(), &["operator", "list"]).await;
    assert!(
        String::from_utf8_lossy(&listed.stdout).contains("carol\tacme"),
        "{listed:?}"
    );

    // acme's risky job waits for a person.
    let subjects = messages::Subjects::default();
    let acme = sandmesh_client::MeshClient::new(
        test_support::connect(&url_of(&dir.path().join("creds/acme-agent.json"))).await,
        subjects.clone(),
    );
    let risky = messages::exec::ExecRequest {
        execution_id: Some("risky-1".into()),
        language: messages::exec::Language::Shell,
        code: "rm -rf ~/x".into(),
        ..Default::default()
    };
    acme.exec().submit(&risky).await.unwrap();
    let carol_creds = dir.path().join("creds/carol-operator.json");
    let carol_url = url_of(&carol_creds);
    let carol =
        sandmesh_client::MeshClient::new(test_support::connect(&carol_url).await, subjects.clone());
    let pending = eventually(
        "carol to see acme's pending confirmation",
        LIMIT,
        || async {
            let listed = carol.confirm().list(&Default::default()).await.ok()?;
            listed.into_iter().find(|c| {
                // The agent's own id, beside its tenant.
                c.execution_id.as_deref() == Some("risky-1")
                    && c.tenant.as_ref().is_some_and(|t| t.as_str() == "acme")
            })
        },
    )
    .await;
    carol
        .confirm()
        .decide(&messages::confirm::ConfirmDecide {
            id: pending.id,
            approve: true,
            by: "carol".into(),
            reason: None,
            scope: Default::default(),
            by_account: None,
        })
        .await
        .expect("a new operator decides without a restart");
    let result = acme
        .exec()
        .wait_result("risky-1", Duration::from_secs(120))
        .await
        .unwrap();
    assert_eq!(result.status, messages::exec::ExecStatus::Ok, "{result:?}");
    assert_eq!(result.confirmation.by.as_deref(), Some("carol"));

    tenant(dir.path(), &["operator", "remove", "carol"]).await;
    assert!(!carol_creds.exists());
    eventually("carol's credentials to stop working", LIMIT, || async {
        (!connects(&carol_url).await).then_some(())
    })
    .await;
    mesh.stop().await;
}
