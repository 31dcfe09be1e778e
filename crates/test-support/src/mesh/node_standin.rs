//! [`NodeStandin`]: the real executor node — `executor_node::serve` with its admission, one run
//! per execution id, kept answers and `status`, its heartbeat and janitor — over
//! [`StandinBackend`], a backend that starts no sandbox: a run follows [`FakeExecutor`]'s code
//! conventions (`sleep:<ms>`, `fail:<code>`) and is logged in the same [`Runs`].
//!
//! For tests whose claim is about the product's node across the mesh (the cluster failover
//! test's exactly-once): `FakeExecutor` answers with hand-written replies, which would prove
//! nothing about what a node does with a repeated request or a "what happened?" question.
//! `FakeExecutor` stays for tests that steer the scheduler's branches (429s, crashes).
//!
//! [`FakeExecutor`]: super::fakes::FakeExecutor

use std::collections::BTreeMap;
use std::sync::Arc;

use executor_node::{
    Admitted, Backend, BackendError, ExecutorError, Gauges, NodeConfig, NodeError, NodeParts,
    NodeState, Sweep,
};
use futures::future::BoxFuture;
use kit::config::{env_map, ConfigReader};
use kit::{CancellationToken, Runtime, ServiceInfo};
use messages::executor::ExecutorRun;
use messages::{ErrorBody, ErrorKind, ServiceName, Subjects};
use ractor::{ActorCell, ActorProcessingErr};

use super::fakes::{fake_run, Runs};
use super::WAIT;

/// A docker-executor as far as the scheduler can tell (its subjects, its heartbeat key), whose
/// runs are [`fake_run`]s.
pub struct StandinBackend {
    node: String,
    runs: Runs,
}

/// Nothing to sweep: the backend makes no sandboxes.
#[derive(Clone)]
pub struct NoSandboxes;

impl Sweep for NoSandboxes {
    async fn sweep(&self) -> usize {
        0
    }
    async fn reap_node(&self, _node: &str) -> usize {
        0
    }
    async fn remove_all(&self) -> usize {
        0
    }
}

/// A refusal [`fake_run`] scripts (a 429 for `busy:`, ...), carried by the node as a backend's
/// own error and answered as written.
#[derive(Debug)]
struct Scripted(ErrorBody);

impl std::fmt::Display for Scripted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.message)
    }
}

impl std::error::Error for Scripted {}

impl BackendError for Scripted {
    fn kind(&self) -> ErrorKind {
        self.0.kind
    }

    fn body(&self) -> ErrorBody {
        self.0.clone()
    }
}

impl Backend for StandinBackend {
    type Sweeper = NoSandboxes;
    const KIND: messages::executor::Backend = messages::executor::Backend::Docker;
    const SERVICE: ServiceName = ServiceName::DockerExecutor;
    const SESSIONS: bool = true;

    fn accepts(&self, _run: &ExecutorRun) -> Result<(), ExecutorError> {
        Ok(())
    }

    async fn start(&mut self, _node: ActorCell) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    fn execute(&mut self, run: Admitted) -> Result<(), ActorProcessingErr> {
        let (node, runs) = (self.node.clone(), self.runs.clone());
        tokio::spawn(async move {
            let answer = fake_run(node, runs, run.job.run.clone()).await;
            run.answer(answer.map_err(|e| Scripted(e).into()));
        });
        Ok(())
    }

    fn close(&self, _session_id: String) -> BoxFuture<'static, bool> {
        Box::pin(async { true })
    }

    fn close_all(&self) -> BoxFuture<'static, ()> {
        Box::pin(async {})
    }

    async fn stop(&mut self) {}

    fn gauges(&self) -> Gauges {
        Arc::new(|_| {})
    }
}

/// A real node of [`StandinBackend`], stopped (cleanly) on drop.
pub struct NodeStandin {
    pub node: String,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), NodeError>>,
}

impl NodeStandin {
    /// Node `node` on `url` (a docker-executor's credentials), running `capacity` at once,
    /// its nodes bucket at `replicas` copies. Returns once its heartbeat is in the bucket and
    /// it answers `probe` (a client allowed to call executors) on its node subjects.
    pub async fn start(
        url: &str,
        probe: &async_nats::Client,
        node: &str,
        capacity: usize,
        runs: Runs,
        replicas: usize,
    ) -> Self {
        let replicas = replicas.to_string();
        let env = env_map(&[
            ("SANDMESH_NATS_URL", url),
            ("SANDMESH_INSTANCE_ID", node),
            ("SANDMESH_JS_REPLICAS", &replicas),
        ]);
        let mut reader = ConfigReader::new(&env);
        let config = NodeConfig::from_reader(&mut reader);
        reader.finish().expect("the stand-in node's settings");
        let info = ServiceInfo {
            name: ServiceName::DockerExecutor.as_str().into(),
            version: "0.0.1".into(),
            description: "test stand-in: the real executor node over a backend that runs nothing"
                .into(),
        };
        let runtime = Runtime::start(config.kit.clone(), info)
            .await
            .expect("the stand-in node's runtime");
        let (nodes_kv, _mesh) = runtime.nodes_and_mesh().await.expect("nodes bucket");
        let parts = NodeParts {
            node: Arc::new(NodeState::new(runtime.metrics.clone())),
            runtime,
            config: Arc::new(config),
            capacity,
            nodes_kv: nodes_kv.clone(),
            labels: BTreeMap::new(),
        };
        let backend = StandinBackend {
            node: node.to_string(),
            runs,
        };
        let stop = CancellationToken::new();
        let task = tokio::spawn(executor_node::serve(
            parts,
            backend,
            NoSandboxes,
            stop.clone(),
        ));
        // Visible in KV, and answering, before anyone places work.
        let key = ServiceName::DockerExecutor.heartbeat_key(node);
        crate::eventually("the stand-in node's first heartbeat", WAIT, || {
            let (kv, key) = (nodes_kv.clone(), key.clone());
            async move { kv.get(key).await.ok().flatten() }
        })
        .await;
        let status =
            Subjects::default().executor_node(node, messages::subjects::ExecutorOp::Status);
        crate::eventually("the stand-in node's endpoints", WAIT, || {
            let (client, status) = (probe.clone(), status.clone());
            async move { client.request(status, "{}".into()).await.ok() }
        })
        .await;
        Self {
            node: node.to_string(),
            stop,
            task,
        }
    }

    /// Whether the node's `serve` is still running.
    pub fn is_running(&self) -> bool {
        !self.task.is_finished()
    }
}

impl Drop for NodeStandin {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
