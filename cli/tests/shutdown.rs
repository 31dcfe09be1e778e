//! `sandmesh up` stops on SIGTERM even when its NATS server is gone, and leaves no sandbox
//! container of its mesh behind. Real nats-server (owned by the test, so it can kill it), real
//! Docker, the real binary.

use std::process::Command;
use std::time::Duration;

use docker_executor::docker::{LABEL_KIND, LABEL_MESH};
use futures::TryStreamExt;
use messages::heartbeat::Heartbeat;
use test_support::{eventually, require_docker, NatsServer};

use crate::common::{containers, Up};

/// Short, so the bound below is tight: `up` must not wait for anything longer.
const GRACE_MS: u64 = 2000;
/// "The grace period plus a few seconds": the services' margin and the Docker removal.
const EXIT_BOUND: Duration = Duration::from_millis(GRACE_MS + 12_000);

/// Removes the mesh's containers if the test fails before `up` did.
struct MeshContainers(String);

impl Drop for MeshContainers {
    fn drop(&mut self) {
        let left = containers(std::slice::from_ref(&self.0));
        if !left.is_empty() {
            let _ = Command::new("docker")
                .args(["rm", "-f"])
                .args(&left)
                .output();
        }
    }
}

/// The mesh id the executor labels its containers with, from its heartbeat.
async fn executor_mesh(nats_url: &str) -> Option<String> {
    let (options, plain) = test_support::connect_options(nats_url);
    let client = options.connect(plain).await.ok()?;
    let js = async_nats::jetstream::new(client);
    let kv = js
        .get_key_value(messages::Subjects::default().nodes_bucket())
        .await
        .ok()?;
    let keys: Vec<String> = kv.keys().await.ok()?.try_collect().await.ok()?;
    let key = keys.iter().find(|k| k.starts_with("docker-executor."))?;
    let beat: Heartbeat = serde_json::from_slice(&kv.get(key).await.ok()??).ok()?;
    beat.labels.get("mesh").cloned()
}

#[tokio::test]
async fn up_ends_on_sigterm_with_nats_gone_and_removes_its_containers() {
    require_docker();
    let mut nats = NatsServer::start();
    let log = tempfile::NamedTempFile::new().unwrap();
    let grace = GRACE_MS.to_string();
    let mut up = Up::start(
        &nats.url(),
        &[("SANDMESH_SHUTDOWN_GRACE_MS", &grace)],
        log.path(),
    );

    let url = nats.url();
    let mesh = eventually("the executor's heartbeat", Duration::from_secs(300), || {
        executor_mesh(&url)
    })
    .await;
    let mesh_label = format!("{LABEL_MESH}={mesh}");
    let _cleanup = MeshContainers(mesh_label.clone());
    eventually("warm containers", Duration::from_secs(120), || async {
        let warm = containers(&[mesh_label.clone(), format!("{LABEL_KIND}=warm")]);
        (!warm.is_empty()).then_some(())
    })
    .await;
    up.until_up().await;

    nats.stop();
    let status = up.stop(EXIT_BOUND).await;

    let left = containers(std::slice::from_ref(&mesh_label));
    assert!(
        left.is_empty(),
        "containers of mesh {mesh} left after up exited ({status}): {left:?}\n{}",
        up.log_text()
    );
}
