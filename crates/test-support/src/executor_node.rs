//! One executor node under test, whatever its backend: a real nats-server and the backend's
//! `run()` in-process on the sandbox image built from this checkout's supervisor. What every
//! backend's tests share (start, readiness, calls on the node's subjects, heartbeat, a clean
//! stop, the conformance suite's view) lives here once; a backend's test crate implements
//! [`NodeBackend`] — its config, its `run()`, and what "nothing left" means for it — and adds
//! its own inspections (containers, cgroups) as an extension trait of [`Node`].

use std::collections::HashMap;
use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use kit::CancellationToken;
use messages::exec::{ExecResult, Language};
use messages::executor::{self, ExecutorRun, ExecutorRunStatus, ExecutorStatusQuery};
use messages::subjects::ExecutorOp;
use messages::{ErrorBody, ServiceName, Subjects};
use sandmesh_client::{ClientError, MeshClient};

use crate::executor_conformance::{ephemeral, ExecutorHarness};
use crate::NatsServer;

/// A backend as its tests drive it.
pub trait NodeBackend: Sized + Send + Sync + 'static {
    type Config: Send + 'static;
    type Error: std::error::Error + Send + Sync + 'static;
    const SERVICE: ServiceName;
    const KIND: executor::Backend;
    /// Settings beside [`base_env`]'s that every test of this backend starts from.
    const ENV: &'static [(&'static str, &'static str)];
    /// Prefix of the node names its tests make (tells the backends' leftovers apart).
    const NODE_PREFIX: &'static str;

    fn config(env: &HashMap<String, String>) -> Self::Config;
    fn subjects(config: &Self::Config) -> Subjects;
    fn serve(
        config: Self::Config,
        shutdown: CancellationToken,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static;
    /// What the backend's own inspections need (a Docker connection, the cgroup root), made
    /// from the node's config before it starts.
    fn open(config: &Self::Config) -> impl Future<Output = Self> + Send;
    /// Bounded poll: no process and no sandbox of the node's runs is left (a warm pool,
    /// ready and unused, may remain).
    fn assert_clean(node: &Node<Self>) -> impl Future<Output = ()>;
    /// After a clean stop: nothing of the node is left at all.
    fn assert_stopped(node: &Node<Self>) -> impl Future<Output = ()>;
    /// A test that failed before `stop` still leaves nothing behind (called from `Drop`,
    /// after the node had up to 60 s to stop by itself).
    fn remove_leftovers(_node: &str) {}
}

/// The sandbox image with this build's supervisor (build.sh is idempotent and locked, so
/// parallel test binaries share one build).
pub fn image() -> &'static str {
    static IMAGE: OnceLock<String> = OnceLock::new();
    IMAGE.get_or_init(|| {
        crate::require_docker();
        let supervisor = executor_node::image::build_supervisor()
            .unwrap_or_else(|e| panic!("building the supervisor: {e}"));
        executor_node::image::build_image(&supervisor)
            .unwrap_or_else(|e| panic!("building the sandbox image: {e}"))
    })
}

pub fn unique_node<B: NodeBackend>(tag: &str) -> String {
    format!(
        "{}{tag}-{}",
        B::NODE_PREFIX,
        messages::new_id().to_ascii_lowercase()
    )
}

/// Settings every test of `B` starts from: fast heartbeats, a short default timeout, a short
/// kill grace, and the backend's own.
pub fn base_env<B: NodeBackend>(nats: &NatsServer, node: &str) -> HashMap<String, String> {
    [
        ("SANDMESH_NATS_URL", nats.url()),
        ("SANDMESH_INSTANCE_ID", node.to_string()),
        ("SANDMESH_HEARTBEAT_MS", "500".into()),
        ("SANDMESH_EXEC_IMAGE", image().to_string()),
        ("SANDMESH_EXEC_KILL_GRACE_MS", "3000".into()),
        ("SANDMESH_EXEC_DEFAULT_TIMEOUT_MS", "5000".into()),
    ]
    .into_iter()
    .chain(B::ENV.iter().map(|(k, v)| (*k, v.to_string())))
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// One node of backend `B` on a nats-server of its own.
pub struct Node<B: NodeBackend> {
    pub nats: NatsServer,
    pub client: async_nats::Client,
    pub caller: MeshClient,
    pub subjects: Subjects,
    pub node: String,
    /// The backend's own handles for inspecting what the node made.
    pub backend: B,
    shutdown: CancellationToken,
    task: Option<tokio::task::JoinHandle<Result<(), B::Error>>>,
}

impl<B: NodeBackend> Node<B> {
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// Starts with extra `SANDMESH_*` settings.
    pub async fn start_with(extra: &[(&str, &str)]) -> Self {
        Self::start_on(NatsServer::start(), extra).await
    }

    pub async fn start_on(nats: NatsServer, extra: &[(&str, &str)]) -> Self {
        crate::trace_to_test_output();
        let mut env = base_env::<B>(&nats, &unique_node::<B>("n"));
        for (k, v) in extra {
            env.insert(k.to_string(), v.to_string());
        }
        let node = env["SANDMESH_INSTANCE_ID"].clone();
        let config = B::config(&env);
        let subjects = B::subjects(&config);
        let backend = B::open(&config).await;
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(B::serve(config, shutdown.clone()));
        let client = crate::connect(&nats.url()).await;
        let caller = kit::mesh_client(client.clone(), subjects.clone())
            .with_timeout(Duration::from_secs(60));
        let mut node = Self {
            nats,
            client,
            caller,
            subjects,
            node,
            backend,
            shutdown,
            task: Some(task),
        };
        node.wait_ready().await;
        node
    }

    /// Until the node's own run endpoint answers (a run without an id is refused); a node
    /// that fails to start fails the test with its error at once.
    async fn wait_ready(&mut self) {
        let mut bad = ephemeral(Language::Shell, "true");
        bad.execution_id.clear();
        bad.edit_request(|r| r.execution_id = None);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            if let Err(ClientError::Service { .. }) = self.call_node(&bad).await {
                return;
            }
            if self.task.as_ref().is_some_and(|t| t.is_finished()) {
                let ended = self.task.take().expect("checked").await;
                panic!("the {} did not start: {ended:?}", B::SERVICE);
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the {} did not serve within 120 s",
                B::SERVICE
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The node's own subject for `op`.
    pub fn node_subject(&self, op: ExecutorOp) -> String {
        self.subjects.executor_node_on(B::KIND, &self.node, op)
    }

    /// A run through the backend's queue group (what the scheduler sends), or any payload in
    /// its place (a hostile one).
    pub async fn call(&self, run: &impl serde::Serialize) -> Result<ExecResult, ClientError> {
        self.caller
            .request(self.subjects.executor_run_on(B::KIND), run)
            .await
    }

    /// A run, or any payload in its place, on this node's own subject.
    pub async fn call_node(&self, run: &impl serde::Serialize) -> Result<ExecResult, ClientError> {
        self.caller
            .request(self.node_subject(ExecutorOp::Run), run)
            .await
    }

    /// This node's last heartbeat.
    pub async fn heartbeat(&self) -> Option<messages::heartbeat::Heartbeat> {
        let js = async_nats::jetstream::new(self.client.clone());
        let kv = js.get_key_value(self.subjects.nodes_bucket()).await.ok()?;
        let entry = kv.get(B::SERVICE.heartbeat_key(&self.node)).await.ok()??;
        serde_json::from_slice(&entry).ok()
    }

    /// Stops the node the way a signal would and checks it ended cleanly and left nothing.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        let task = self.task.take().expect("running");
        tokio::time::timeout(Duration::from_secs(90), task)
            .await
            .expect("the node stops in time")
            .expect("no panic")
            .expect("a clean stop");
        B::assert_stopped(&self).await;
    }
}

impl<B: NodeBackend> Drop for Node<B> {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            // Let the node shut down properly (its starts in flight end and are removed).
            // Blocking is allowed on a multi-thread runtime only: on a current-thread one
            // `block_in_place` panics, and a panic while a failed test unwinds aborts the whole
            // test binary — so there the node just gets the cancel.
            if let Some(handle) = tokio::runtime::Handle::try_current()
                .ok()
                .filter(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
            {
                tokio::task::block_in_place(|| {
                    let _ = handle.block_on(tokio::time::timeout(Duration::from_secs(60), task));
                });
            }
            B::remove_leftovers(&self.node);
        }
    }
}

/// A service's refusal as the `Err`; a call that was not answered at all fails the test.
fn refusal<T>(answer: Result<T, ClientError>) -> Result<T, ErrorBody> {
    match answer {
        Ok(answer) => Ok(answer),
        Err(ClientError::Service { body: e, .. }) => Err(e),
        Err(e) => panic!("the request was not answered: {e}"),
    }
}

/// The conformance suite's view of any backend's node: runs and status queries on the node's
/// own subjects.
impl<B: NodeBackend> ExecutorHarness for Node<B> {
    async fn start() -> Self {
        Node::start().await
    }

    async fn run(&self, run: &ExecutorRun) -> Result<ExecResult, ErrorBody> {
        refusal(self.call_node(run).await)
    }

    async fn status(&self, query: &ExecutorStatusQuery) -> Result<ExecutorRunStatus, ErrorBody> {
        refusal(
            self.caller
                .request(self.node_subject(ExecutorOp::Status), query)
                .await,
        )
    }

    async fn assert_clean(&self) {
        B::assert_clean(self).await;
    }

    async fn stop(self) {
        Node::stop(self).await;
    }

    fn root_actor_name(&self) -> String {
        executor_node::root_actor_name(B::SERVICE, &self.node)
    }

    async fn beating(&self) -> bool {
        self.heartbeat().await.is_some()
    }

    async fn ended(&mut self) -> Result<(), String> {
        let task = self.task.take().expect("running");
        tokio::time::timeout(Duration::from_secs(90), task)
            .await
            .expect("run() returns in time")
            .expect("no panic")
            .map_err(|e| kit::error_chain(&e))
    }
}
