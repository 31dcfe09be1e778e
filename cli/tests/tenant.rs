//! `sandmesh tenant init` writes a deployment's server config and credentials, and `sandmesh
//! tenant add` gives a running server a new tenant without a restart (the accounts file is
//! rewritten and the server reloads it). Real nats-server, the real `sandmesh` binary.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{run_bounded, SANDMESH};
use test_support::{eventually, free_port, nats_server_binary};

const LIMIT: Duration = Duration::from_secs(60);

/// `sandmesh <args>` with its data directory in `dir`.
async fn tenant(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(SANDMESH);
    cmd.args(args).env("SANDMESH_DATA_DIR", dir);
    let out = run_bounded(cmd, LIMIT).await;
    assert!(
        out.status.success(),
        "sandmesh {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

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
