//! Real docker-executor nodes for the end-to-end tests. Each runs on a tokio runtime of its
//! own, so a test can kill one like a crashed process: the runtime is dropped with everything
//! on it (endpoints, heartbeat, NATS connection), its containers stay behind and its heartbeat
//! key expires.

use sandmesh_client::MeshClient;
use std::collections::{BTreeMap, HashMap};
use std::process::Command;

use kit::CancellationToken;
use messages::executor::ExecutorClose;
use messages::subjects::ExecutorOp;
use messages::Subjects;

use super::WAIT;

/// The sandbox image with the supervisor, built once per test binary (idempotent).
pub async fn image() -> String {
    static IMAGE: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
    IMAGE
        .get_or_init(|| async {
            crate::require_docker();
            docker_executor::image::ensure()
                .await
                .unwrap_or_else(|e| panic!("building the sandbox image: {e}"))
        })
        .await
        .clone()
}

/// One executor node on its own runtime.
struct Node {
    runtime: Option<tokio::runtime::Runtime>,
    stop: CancellationToken,
    done: Option<tokio::sync::oneshot::Receiver<Result<(), String>>>,
}

/// The docker-executor nodes of one mesh.
#[derive(Default)]
pub struct Nodes {
    running: BTreeMap<String, Node>,
    /// Every node ever started, for the container clean-up.
    started: Vec<String>,
    /// `SANDMESH_METRICS_ADDR` of the nodes.
    metrics: Option<std::net::SocketAddr>,
}

impl Nodes {
    pub fn with_metrics(metrics: Option<std::net::SocketAddr>) -> Self {
        Self {
            running: BTreeMap::new(),
            started: Vec::new(),
            metrics,
        }
    }

    /// Starts a node `e2e-<tag>-<unique>` and waits until it answers; returns its id.
    pub async fn start(&mut self, url: &str, client: &MeshClient, tag: &str) -> String {
        let image = image().await;
        let node = format!("e2e-{tag}-{}", messages::new_id().to_ascii_lowercase());
        let env: HashMap<String, String> = [
            ("SANDMESH_NATS_URL", url.to_string()),
            ("SANDMESH_INSTANCE_ID", node.clone()),
            ("SANDMESH_HEARTBEAT_MS", "500".into()),
            ("SANDMESH_EXEC_IMAGE", image),
            ("SANDMESH_EXEC_WARM_POOL", "1".into()),
            // Fixed: a pool grown by the tests' own bursts would only add container starts
            // competing with the tests on a small CI host.
            ("SANDMESH_EXEC_WARM_POOL_MAX", "1".into()),
            ("SANDMESH_EXEC_WORKSPACE", "on".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let mut config = docker_executor::ExecutorConfig::from_env(&env).unwrap();
        config.node.kit.metrics_addr = self.metrics;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let stop = CancellationToken::new();
        let (tx, done) = tokio::sync::oneshot::channel();
        let token = stop.clone();
        runtime.spawn(async move {
            let r = docker_executor::run(config, token).await;
            let _ = tx.send(r.map_err(|e| e.to_string()));
        });
        self.started.push(node.clone());
        self.running.insert(
            node.clone(),
            Node {
                runtime: Some(runtime),
                stop,
                done: Some(done),
            },
        );
        let subject = Subjects::default().executor_node(&node, ExecutorOp::Close);
        crate::eventually(&format!("executor {node}"), WAIT, || {
            let (client, subject) = (client.clone(), subject.clone());
            async move {
                let probe = ExecutorClose {
                    session_id: "readiness".into(),
                };
                client
                    .request::<_, serde_json::Value>(subject, &probe)
                    .await
                    .ok()
            }
        })
        .await;
        node
    }

    pub fn ids(&self) -> Vec<String> {
        self.running.keys().cloned().collect()
    }

    /// Kills a node like a crashed process: no clean-up, no goodbye. Returns once its runtime
    /// is torn down: `shutdown_background` alone returns before the workers drop their tasks,
    /// and a request sent in between reached a connection that was about to vanish — lost,
    /// where a killed process's would have had no responders.
    pub async fn crash(&mut self, node: &str) {
        let mut n = self.running.remove(node).expect("running node");
        if let Some(rt) = n.runtime.take() {
            tokio::task::spawn_blocking(move || rt.shutdown_timeout(WAIT))
                .await
                .expect("the node's runtime shuts down");
        }
    }

    /// Stops a node gracefully (its containers removed, its heartbeat deleted).
    pub async fn stop(&mut self, node: &str) {
        let mut n = self.running.remove(node).expect("running node");
        n.stop.cancel();
        if let Some(done) = n.done.take() {
            let r = tokio::time::timeout(WAIT, done)
                .await
                .expect("executor stops in time");
            r.expect("result")
                .unwrap_or_else(|e| panic!("executor {node} failed: {e}"));
        }
        if let Some(rt) = n.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for (_, mut n) in std::mem::take(&mut self.running) {
            if let Some(rt) = n.runtime.take() {
                rt.shutdown_background();
            }
        }
        // Crashed nodes leave containers behind, as a real crash would; remove them.
        for node in &self.started {
            remove_containers(node);
        }
    }
}

/// Every container (any state) labelled with this node.
pub fn containers_of(node: &str) -> std::io::Result<Vec<String>> {
    labelled(docker_executor::docker::LABEL_NODE, node)
}

/// Every container (any state) of this session (its id as the executor knows it: scoped by
/// its tenant).
pub fn session_containers(session_id: &str) -> std::io::Result<Vec<String>> {
    labelled(docker_executor::docker::LABEL_SESSION, session_id)
}

fn labelled(label: &str, value: &str) -> std::io::Result<Vec<String>> {
    let filter = format!("label={label}={value}");
    let out = Command::new("docker")
        .args(["ps", "-aq", "--filter", &filter])
        .output()?;
    if !out.status.success() {
        let why = String::from_utf8_lossy(&out.stderr).into_owned();
        return Err(std::io::Error::other(why));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect())
}

/// `docker rm -f` of every container labelled with this node (best effort: it cleans up).
pub fn remove_containers(node: &str) {
    let ids = containers_of(node).unwrap_or_default();
    if !ids.is_empty() {
        let _ = Command::new("docker")
            .arg("rm")
            .arg("-f")
            .args(&ids)
            .output();
    }
}
