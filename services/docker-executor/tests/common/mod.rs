//! The test harness: a real nats-server, the real Docker daemon, and the docker-executor
//! running in-process with the sandbox image built from this checkout's supervisor
//! ([`test_support::executor_node::Node`], the node every backend's tests share); what is
//! Docker's own — its containers, warm pool, sessions — is [`DockerRuns`].

use std::collections::HashMap;
use std::time::Duration;

use docker_executor::docker::{summary_name, Sandboxes, LABEL_NODE, LABEL_SESSION};
use docker_executor::{ExecutorConfig, ExecutorError};
use kit::CancellationToken;
use messages::exec::{ExecRequest, ExecResult, Language};
use messages::executor::{ExecutorRun, RunKind};
use messages::subjects::ExecutorOp;
use messages::{ServiceName, Subjects};
use test_support::executor_node::{self, Node, NodeBackend};
use test_support::{eventually_true, NatsServer};

pub use test_support::executor_node::image;

const WARM_POOL: &str = "SANDMESH_EXEC_WARM_POOL";
pub const WARM_POOL_MAX: &str = "SANDMESH_EXEC_WARM_POOL_MAX";

/// A docker-executor node under test.
pub type Harness = Node<DockerNode>;

/// The Docker connection the tests inspect the node's containers through.
pub struct DockerNode {
    pub docker: bollard::Docker,
}

impl NodeBackend for DockerNode {
    type Config = ExecutorConfig;
    type Error = ExecutorError;
    const SERVICE: ServiceName = ServiceName::DockerExecutor;
    const KIND: messages::executor::Backend = messages::executor::Backend::Docker;
    // A small pool, no workspace-store.
    const ENV: &'static [(&'static str, &'static str)] =
        &[(WARM_POOL, "1"), ("SANDMESH_EXEC_WORKSPACE", "off")];
    const NODE_PREFIX: &'static str = "t";

    /// A pool of fixed size unless the test sizes it by demand: most tests count containers.
    fn config(env: &HashMap<String, String>) -> ExecutorConfig {
        let mut env = env.clone();
        if let Some(floor) = env.get(WARM_POOL).cloned() {
            env.entry(WARM_POOL_MAX.into()).or_insert(floor);
        }
        ExecutorConfig::from_env(&env).expect("valid test config")
    }

    fn subjects(config: &ExecutorConfig) -> Subjects {
        config.node.kit.subjects.clone()
    }

    fn serve(
        config: ExecutorConfig,
        shutdown: CancellationToken,
    ) -> impl std::future::Future<Output = Result<(), ExecutorError>> + Send + 'static {
        docker_executor::run(config, shutdown)
    }

    async fn open(_: &ExecutorConfig) -> Self {
        Self {
            docker: Sandboxes::connect().await.expect("docker"),
        }
    }

    /// Only the warm pool's one ready container is left (every run's container is gone).
    async fn assert_clean(node: &Harness) {
        node.wait_containers(1).await;
    }

    async fn assert_stopped(node: &Harness) {
        let left = node.containers().await;
        assert!(left.is_empty(), "containers left behind: {left:?}");
    }

    fn remove_leftovers(node: &str) {
        remove_node_containers(node);
    }
}

pub fn base_env(nats: &NatsServer, node: &str) -> HashMap<String, String> {
    executor_node::base_env::<DockerNode>(nats, node)
}

pub fn unique_node(tag: &str) -> String {
    executor_node::unique_node::<DockerNode>(tag)
}

/// What the Docker backend's tests do and look at beyond every backend's node.
#[allow(async_fn_in_trait)]
pub trait DockerRuns {
    async fn ephemeral(&self, language: Language, code: &str) -> ExecResult;
    async fn session(&self, session: &str, language: Language, code: &str) -> ExecResult;
    async fn close(&self, session: &str) -> bool;
    async fn containers(&self) -> Vec<String>;
    async fn session_container(&self, session: &str) -> String;
    async fn wait_containers(&self, n: usize);
    async fn wait_warm(&self, n: usize);
    async fn stray_processes(&self, container: &str) -> Vec<(u32, String)>;
    async fn hostile(
        &self,
        session: Option<&str>,
        language: Language,
        code: &str,
        limits: Option<messages::exec::Limits>,
    ) -> ExecResult;
    async fn hostile_until_timeout(
        &self,
        session: Option<&str>,
        language: Language,
        code: &str,
        limits: Option<messages::exec::Limits>,
    ) -> ExecResult;
    async fn assert_recovered(&self, session: Option<&str>, pool: usize);
}

impl DockerRuns for Harness {
    /// One ephemeral run; panics on a transport or service error.
    async fn ephemeral(&self, language: Language, code: &str) -> ExecResult {
        self.call(&run(None, language, code))
            .await
            .expect("ephemeral run")
    }

    async fn session(&self, session: &str, language: Language, code: &str) -> ExecResult {
        self.call_node(&run(Some(session), language, code))
            .await
            .expect("session run")
    }

    async fn close(&self, session: &str) -> bool {
        let req = messages::executor::ExecutorClose {
            session_id: session.into(),
        };
        let ack: messages::workspace::Ack = self
            .caller
            .request(self.node_subject(ExecutorOp::Close), &req)
            .await
            .expect("close");
        ack.ok
    }

    /// Names of this node's containers (any state).
    async fn containers(&self) -> Vec<String> {
        containers_with(&self.backend.docker, &format!("{LABEL_NODE}={}", self.node)).await
    }

    /// The container of a session (cold-started ones carry the session label).
    async fn session_container(&self, session: &str) -> String {
        let labels = [
            format!("{LABEL_SESSION}={session}"),
            format!("{LABEL_NODE}={}", self.node),
        ];
        let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
        let list = containers_with_all(&self.backend.docker, &labels).await;
        assert_eq!(list.len(), 1, "session {session} containers: {list:?}");
        list[0].clone()
    }

    /// Polls until this node has exactly `n` containers (the pool refilled, used ones gone).
    async fn wait_containers(&self, n: usize) {
        let what = format!("{n} containers on the node");
        eventually_true(&what, Duration::from_secs(20), || async {
            self.containers().await.len() == n
        })
        .await;
    }

    /// Polls the heartbeat until the warm pool reports `n` ready containers.
    async fn wait_warm(&self, n: usize) {
        let what = format!("a warm pool of {n}");
        eventually_true(&what, Duration::from_secs(20), || async {
            let hb = self.heartbeat().await;
            hb.and_then(|hb| hb.metrics.get("warm_pool_size").copied()) == Some(n as f64)
        })
        .await;
    }

    /// Processes in a container besides its init (`keep`, PID 1: an impostor started later is
    /// a stray), the resident supervisor and the probe.
    async fn stray_processes(&self, container: &str) -> Vec<(u32, String)> {
        let procs = docker_executor::probe::processes(&self.backend.docker, container)
            .await
            .expect("probe");
        // The container's resident supervisor: one at most, and nothing else by that name.
        let resident = |cmd: &str| cmd.contains("sandmesh-supervisor serve");
        let residents = procs.iter().filter(|(_, cmd)| resident(cmd)).count();
        assert!(
            residents <= 1,
            "{residents} resident supervisors: {procs:?}"
        );
        procs
            .into_iter()
            .filter(|(pid, cmd)| *pid != 1 && !resident(cmd))
            .collect()
    }

    /// A hostile run expected to end by itself (or by a limit other than time): a 10 s
    /// timeout, generous for a loaded machine; the session tier when `session` is given.
    async fn hostile(
        &self,
        session: Option<&str>,
        language: Language,
        code: &str,
        limits: Option<messages::exec::Limits>,
    ) -> ExecResult {
        hostile_for(self, 10_000, session, language, code, limits).await
    }

    /// A hostile run expected to hit its timeout: 2 s, so the suite stays fast.
    async fn hostile_until_timeout(
        &self,
        session: Option<&str>,
        language: Language,
        code: &str,
        limits: Option<messages::exec::Limits>,
    ) -> ExecResult {
        hostile_for(self, 2_000, session, language, code, limits).await
    }

    /// After hostile code: nothing of it is left running, and the next execution works —
    /// in the same session container, or (ephemeral) with the used container gone.
    async fn assert_recovered(&self, session: Option<&str>, pool: usize) {
        match session {
            Some(s) => {
                let container = self.session_container(s).await;
                let strays = self.stray_processes(&container).await;
                assert!(strays.is_empty(), "processes left behind: {strays:?}");
                let r = self.session(s, Language::Python, "print('next')").await;
                assert_eq!(r.stdout, "next\n", "the session still works: {r:?}");
                assert_eq!(self.session_container(s).await, container);
            }
            None => {
                let r = self.ephemeral(Language::Python, "print('next')").await;
                assert_eq!(r.stdout, "next\n", "the next run works: {r:?}");
                self.wait_containers(pool).await;
            }
        }
    }
}

async fn hostile_for(
    h: &Harness,
    timeout_ms: u64,
    session: Option<&str>,
    language: Language,
    code: &str,
    limits: Option<messages::exec::Limits>,
) -> ExecResult {
    let mut req = run(session, language, code);
    req.edit_request(|r| {
        r.timeout_ms = Some(timeout_ms);
        r.limits = limits;
    });
    h.call(&req).await.expect("hostile run answered")
}

pub fn remove_node_containers(node: &str) {
    let out = std::process::Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--filter",
            &format!("label={LABEL_NODE}={node}"),
        ])
        .output()
        .expect("docker ps");
    let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect();
    if !ids.is_empty() {
        let _ = std::process::Command::new("docker")
            .args(["rm", "-f"])
            .args(&ids)
            .output();
    }
}

pub async fn containers_with(docker: &bollard::Docker, label: &str) -> Vec<String> {
    containers_with_all(docker, &[label]).await
}

/// Containers carrying every one of `labels`.
pub async fn containers_with_all(docker: &bollard::Docker, labels: &[&str]) -> Vec<String> {
    let filters = HashMap::from([("label", labels.to_vec())]);
    let options = bollard::query_parameters::ListContainersOptionsBuilder::new()
        .all(true)
        .filters(&filters)
        .build();
    docker
        .list_containers(Some(options))
        .await
        .expect("list containers")
        .iter()
        .filter_map(summary_name)
        .collect()
}

/// A run as the scheduler sends it: pooled without a session, else in the session's container.
pub fn run(session: Option<&str>, language: Language, code: &str) -> ExecutorRun {
    let kind = match session {
        Some(s) => RunKind::Session {
            session_id: s.into(),
        },
        None => RunKind::Pooled,
    };
    run_of(kind, language, code)
}

pub fn run_of(kind: RunKind, language: Language, code: &str) -> ExecutorRun {
    let execution_id = messages::new_id();
    let request = ExecRequest {
        execution_id: Some(execution_id.clone()),
        session_id: kind.session_id().map(Into::into),
        language,
        code: code.into(),
        ..Default::default()
    };
    ExecutorRun::new(execution_id, request, kind).expect("the request's session is the kind's")
}
