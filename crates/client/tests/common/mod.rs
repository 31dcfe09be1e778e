//! The real services, run in this process over a real nats-server, and a client of them.

use std::future::Future;
use std::process::Command;
use std::time::Duration;

use kit::config::env_map;
use kit::CancellationToken;
use messages::Subjects;
use sandmesh_client::MeshClient;
use test_support::NatsServer;

/// Every wait in these tests is bounded by this.
pub const BOUND: Duration = Duration::from_secs(30);

/// A nats-server and the services started on it; [`Mesh::stop`] ends them gracefully (the
/// executor removes its containers), a drop only cancels them.
pub struct Mesh {
    pub nats: NatsServer,
    pub client: MeshClient,
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<Result<(), String>>>,
    /// Executor nodes started: a test that failed before [`Mesh::stop`] leaves their
    /// containers behind, which the drop removes.
    nodes: Vec<String>,
}

impl Drop for Mesh {
    fn drop(&mut self) {
        self.stop.cancel();
        for node in &self.nodes {
            remove_containers(node);
        }
    }
}

/// `docker rm -f` of every container labelled with this executor node.
fn remove_containers(node: &str) {
    let filter = format!("label={}={node}", docker_executor::docker::LABEL_NODE);
    let Ok(out) = Command::new("docker")
        .args(["ps", "-aq", "--filter", &filter])
        .output()
    else {
        return;
    };
    let ids = String::from_utf8_lossy(&out.stdout).into_owned();
    if !ids.trim().is_empty() {
        let _ = Command::new("docker")
            .args(["rm", "-f"])
            .args(ids.split_whitespace())
            .output();
    }
}

impl Mesh {
    pub async fn new() -> Self {
        let nats = NatsServer::start();
        let connection = test_support::connect(&nats.url()).await;
        Self {
            client: MeshClient::new(connection, Subjects::default()).with_timeout(BOUND),
            nats,
            stop: CancellationToken::new(),
            tasks: Vec::new(),
            nodes: Vec::new(),
        }
    }

    /// Stops every service and waits (bounded) until each has ended cleanly.
    pub async fn stop(mut self) {
        self.stop.cancel();
        for task in std::mem::take(&mut self.tasks) {
            let ended = tokio::time::timeout(BOUND, task).await;
            let outcome = ended.expect("a service stops in time").expect("its task");
            outcome.expect("a service ends cleanly");
        }
    }

    fn env(&self) -> std::collections::HashMap<String, String> {
        env_map(&[
            ("SANDMESH_NATS_URL", self.nats.url().as_str()),
            ("SANDMESH_HEARTBEAT_MS", "500"),
        ])
    }

    fn spawn<E: std::fmt::Display>(
        &mut self,
        run: impl Future<Output = Result<(), E>> + Send + 'static,
    ) {
        let task = tokio::spawn(async move { run.await.map_err(|e| e.to_string()) });
        self.tasks.push(task);
    }

    pub fn risk_assessor(mut self) -> Self {
        let config = risk_assessor::RiskAssessorConfig::from_env(&self.env()).unwrap();
        self.spawn(risk_assessor::run(config, self.stop.clone()));
        self
    }

    pub fn confirmation(mut self) -> Self {
        let config = confirmation::ConfirmationConfig::from_env(&self.env()).unwrap();
        self.spawn(confirmation::run(config, self.stop.clone()));
        self
    }

    pub fn workspace_store(mut self) -> Self {
        let config = workspace_store::WorkspaceConfig::for_url(&self.nats.url());
        self.spawn(workspace_store::run(config, self.stop.clone()));
        self
    }

    pub fn scheduler(mut self) -> Self {
        let config = scheduler::SchedulerConfig::from_env(&self.env()).unwrap();
        self.spawn(scheduler::run(config, self.stop.clone()));
        self
    }

    /// A docker-executor node with one warm container, running the sandbox image (built
    /// when missing).
    pub async fn docker_executor(mut self) -> Self {
        test_support::require_docker();
        let image = docker_executor::image::ensure()
            .await
            .unwrap_or_else(|e| panic!("building the sandbox image: {e}"));
        let node = format!("client-{}", messages::new_id().to_ascii_lowercase());
        let env = env_map(&[
            ("SANDMESH_NATS_URL", self.nats.url().as_str()),
            ("SANDMESH_INSTANCE_ID", node.as_str()),
            ("SANDMESH_HEARTBEAT_MS", "500"),
            ("SANDMESH_EXEC_IMAGE", image.as_str()),
            ("SANDMESH_EXEC_WARM_POOL", "1"),
        ]);
        let config = docker_executor::ExecutorConfig::from_env(&env).unwrap();
        self.spawn(docker_executor::run(config, self.stop.clone()));
        self.nodes.push(node);
        self
    }

    /// Returns once `service` answers `$SRV.PING` (its endpoints are served by then); a
    /// service that ended meanwhile fails the test with its error.
    pub async fn ready(mut self, service: messages::ServiceName) -> Self {
        let status = self.client.status();
        let what = format!("{service} to answer");
        test_support::until_up(&what, BOUND, &mut self.tasks, || {
            let status = status.clone();
            async move {
                let found = status.ping(Some(service), Duration::from_millis(200)).await;
                found.is_ok_and(|i| !i.is_empty())
            }
        })
        .await;
        self
    }
}
