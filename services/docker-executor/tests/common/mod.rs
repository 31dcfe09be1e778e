//! The test harness: a real nats-server, the real Docker daemon, and the docker-executor
//! running in-process with the sandbox image built from this crate's supervisor.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use docker_executor::docker::{summary_name, Sandboxes, LABEL_NODE, LABEL_SESSION};
use docker_executor::{ExecutorConfig, ExecutorError};
use kit::{Caller, CancellationToken};
use messages::exec::{ExecRequest, ExecResult, Language, Tier};
use messages::executor::ExecutorRun;
use messages::subjects::ExecutorOp;
use messages::Subjects;
use test_support::{eventually, eventually_true, NatsServer};

/// The sandbox image with this build's supervisor (build.sh is idempotent and locked, so
/// parallel test binaries share one build).
pub fn image() -> &'static str {
    static IMAGE: OnceLock<String> = OnceLock::new();
    IMAGE.get_or_init(|| {
        test_support::require_docker();
        let supervisor = docker_executor::image::build_supervisor()
            .unwrap_or_else(|e| panic!("building the supervisor: {e}"));
        docker_executor::image::build_image(&supervisor)
            .unwrap_or_else(|e| panic!("building the sandbox image: {e}"))
    })
}

pub struct Harness {
    pub nats: NatsServer,
    pub client: async_nats::Client,
    pub caller: Caller,
    pub subjects: Subjects,
    pub node: String,
    pub docker: bollard::Docker,
    shutdown: CancellationToken,
    task: Option<tokio::task::JoinHandle<Result<(), ExecutorError>>>,
}

/// Settings every test starts from: small pool, no workspace-store, fast heartbeats.
pub fn base_env(nats: &NatsServer, node: &str) -> HashMap<String, String> {
    [
        ("SANDMESH_NATS_URL", nats.url()),
        ("SANDMESH_INSTANCE_ID", node.to_string()),
        ("SANDMESH_HEARTBEAT_MS", "500".into()),
        ("SANDMESH_EXEC_IMAGE", image().to_string()),
        ("SANDMESH_EXEC_WARM_POOL", "1".into()),
        ("SANDMESH_EXEC_WORKSPACE", "off".into()),
        ("SANDMESH_EXEC_KILL_GRACE_MS", "3000".into()),
        ("SANDMESH_EXEC_DEFAULT_TIMEOUT_MS", "5000".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

pub fn unique_node(tag: &str) -> String {
    format!("t{tag}-{}", messages::new_id().to_ascii_lowercase())
}

impl Harness {
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// Starts with extra `SANDMESH_*` settings.
    pub async fn start_with(extra: &[(&str, &str)]) -> Self {
        let nats = NatsServer::start();
        Self::start_on(nats, extra).await
    }

    pub async fn start_on(nats: NatsServer, extra: &[(&str, &str)]) -> Self {
        test_support::trace_to_test_output();
        let node = unique_node("n");
        let mut env = base_env(&nats, &node);
        for (k, v) in extra {
            env.insert(k.to_string(), v.to_string());
        }
        let node = env["SANDMESH_INSTANCE_ID"].clone();
        let config = ExecutorConfig::from_env(&env).expect("valid test config");
        let subjects = config.node.kit.subjects.clone();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(docker_executor::run(config, shutdown.clone()));
        let client = test_support::connect(&nats.url()).await;
        let caller = Caller::new(client.clone(), Duration::from_secs(60));
        let docker = Sandboxes::connect().await.expect("docker");
        let h = Self {
            nats,
            client,
            caller,
            subjects,
            node,
            docker,
            shutdown,
            task: Some(task),
        };
        h.wait_ready().await;
        h
    }

    /// Until the node's own endpoint answers (close of an unknown session is harmless).
    async fn wait_ready(&self) {
        let subject = self.subjects.executor_node(&self.node, ExecutorOp::Close);
        let req = messages::executor::ExecutorClose {
            session_id: "readiness".into(),
        };
        eventually("the executor to serve", Duration::from_secs(30), || {
            let (subject, req) = (&subject, &req);
            async move {
                let r: Result<messages::workspace::Ack, _> =
                    self.caller.call(subject.clone(), req).await;
                r.ok()
            }
        })
        .await;
    }

    pub async fn call(&self, run: &ExecutorRun) -> Result<ExecResult, kit::CallError> {
        self.caller.call(self.subjects.executor_run(), run).await
    }

    pub async fn call_node(&self, run: &ExecutorRun) -> Result<ExecResult, kit::CallError> {
        self.caller
            .call(
                self.subjects.executor_node(&self.node, ExecutorOp::Run),
                run,
            )
            .await
    }

    /// One ephemeral run; panics on a transport or service error.
    pub async fn ephemeral(&self, language: Language, code: &str) -> ExecResult {
        self.call(&run(Tier::Ephemeral, None, language, code))
            .await
            .expect("ephemeral run")
    }

    pub async fn session(&self, session: &str, language: Language, code: &str) -> ExecResult {
        self.call_node(&run(Tier::Session, Some(session), language, code))
            .await
            .expect("session run")
    }

    pub async fn close(&self, session: &str) -> bool {
        let req = messages::executor::ExecutorClose {
            session_id: session.into(),
        };
        let ack: messages::workspace::Ack = self
            .caller
            .call(
                self.subjects.executor_node(&self.node, ExecutorOp::Close),
                &req,
            )
            .await
            .expect("close");
        ack.ok
    }

    /// Names of this node's containers (any state).
    pub async fn containers(&self) -> Vec<String> {
        containers_with(&self.docker, &format!("{LABEL_NODE}={}", self.node)).await
    }

    /// The container of a session (cold-started ones carry the session label).
    pub async fn session_container(&self, session: &str) -> String {
        let list: Vec<String> =
            containers_with(&self.docker, &format!("{LABEL_SESSION}={session}"))
                .await
                .into_iter()
                .filter(|name| name.contains(&self.node))
                .collect();
        assert_eq!(list.len(), 1, "session {session} containers: {list:?}");
        list[0].clone()
    }

    /// Polls until this node has exactly `n` containers (the pool refilled, used ones gone).
    pub async fn wait_containers(&self, n: usize) {
        let what = format!("{n} containers on the node");
        eventually_true(&what, Duration::from_secs(20), || async {
            self.containers().await.len() == n
        })
        .await;
    }

    /// This node's last heartbeat.
    pub async fn heartbeat(&self) -> Option<messages::heartbeat::Heartbeat> {
        let js = async_nats::jetstream::new(self.client.clone());
        let kv = js.get_key_value(self.subjects.nodes_bucket()).await.ok()?;
        let key = messages::heartbeat::heartbeat_key("docker-executor", &self.node);
        let entry = kv.get(&key).await.ok()??;
        serde_json::from_slice(&entry).ok()
    }

    /// Polls the heartbeat until the warm pool reports `n` ready containers.
    pub async fn wait_warm(&self, n: usize) {
        let what = format!("a warm pool of {n}");
        eventually_true(&what, Duration::from_secs(20), || async {
            let hb = self.heartbeat().await;
            hb.and_then(|hb| hb.metrics.get("warm_pool_size").copied()) == Some(n as f64)
        })
        .await;
    }

    /// Processes in a container besides docker-init, the keeper (the first `keep`, started
    /// with the container: an impostor started later is a stray), the resident supervisor and
    /// the probe.
    pub async fn stray_processes(&self, container: &str) -> Vec<(u32, String)> {
        let procs = docker_executor::probe::processes(&self.docker, container)
            .await
            .expect("probe");
        let keeper = procs
            .iter()
            .filter(|(pid, cmd)| *pid != 1 && cmd.ends_with("sandmesh-supervisor keep"))
            .map(|(pid, _)| *pid)
            .min();
        // The container's resident supervisor: one at most, and nothing else by that name.
        let resident = |cmd: &str| cmd.contains("sandmesh-supervisor serve");
        let residents = procs.iter().filter(|(_, cmd)| resident(cmd)).count();
        assert!(
            residents <= 1,
            "{residents} resident supervisors: {procs:?}"
        );
        procs
            .into_iter()
            .filter(|(pid, cmd)| *pid != 1 && Some(*pid) != keeper && !resident(cmd))
            .collect()
    }

    /// A hostile run expected to end by itself (or by a limit other than time): a 10 s
    /// timeout, generous for a loaded machine; the session tier when `session` is given.
    pub async fn hostile(
        &self,
        session: Option<&str>,
        language: Language,
        code: &str,
        limits: Option<messages::exec::Limits>,
    ) -> ExecResult {
        self.hostile_for(10_000, session, language, code, limits)
            .await
    }

    /// A hostile run expected to hit its timeout: 2 s, so the suite stays fast.
    pub async fn hostile_until_timeout(
        &self,
        session: Option<&str>,
        language: Language,
        code: &str,
        limits: Option<messages::exec::Limits>,
    ) -> ExecResult {
        self.hostile_for(2_000, session, language, code, limits)
            .await
    }

    async fn hostile_for(
        &self,
        timeout_ms: u64,
        session: Option<&str>,
        language: Language,
        code: &str,
        limits: Option<messages::exec::Limits>,
    ) -> ExecResult {
        let tier = if session.is_some() {
            Tier::Session
        } else {
            Tier::Ephemeral
        };
        let mut req = run(tier, session, language, code);
        req.request.timeout_ms = Some(timeout_ms);
        req.request.limits = limits;
        self.call(&req).await.expect("hostile run answered")
    }

    /// After hostile code: nothing of it is left running, and the next execution works —
    /// in the same session container, or (ephemeral) with the used container gone.
    pub async fn assert_recovered(&self, session: Option<&str>, pool: usize) {
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

    /// Stops the executor and checks it left no container behind.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(90), task)
                .await
                .expect("executor stops in time")
                .expect("executor task")
                .expect("executor run");
        }
        let left = self.containers().await;
        assert!(left.is_empty(), "containers left behind: {left:?}");
    }
}

impl Drop for Harness {
    /// A test that failed before `stop` still leaves nothing behind: the runtime is going
    /// away with the executor's tasks, so remove the node's containers synchronously.
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            // Let the executor shut down properly (its starts in flight end and are removed);
            // the tests run on multi-thread runtimes, where blocking here is allowed.
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                tokio::task::block_in_place(|| {
                    let _ = handle.block_on(tokio::time::timeout(Duration::from_secs(60), task));
                });
            }
            remove_node_containers(&self.node);
        }
    }
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
    let filters = HashMap::from([("label", vec![label])]);
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

pub fn run(tier: Tier, session: Option<&str>, language: Language, code: &str) -> ExecutorRun {
    let execution_id = messages::new_id();
    ExecutorRun {
        tenant: None,
        template: None,
        filesystem: None,
        execution_id: execution_id.clone(),
        tier,
        request: ExecRequest {
            execution_id: Some(execution_id),
            session_id: session.map(str::to_string),
            language,
            code: code.into(),
            ..Default::default()
        },
        session_restored: false,
        kind: Default::default(),
        network: None,
    }
}

/// A service's refusal as the `Err`; a call that was not answered at all fails the test.
fn refusal<T>(answer: Result<T, kit::CallError>) -> Result<T, messages::ErrorBody> {
    match answer {
        Ok(answer) => Ok(answer),
        Err(kit::CallError::Service(e)) => Err(e),
        Err(e) => panic!("the request was not answered: {e}"),
    }
}

/// The conformance suite's view of a Docker node: runs on the node's own subject; clean means
/// only the warm pool's one ready container is left (every run's container is gone).
impl test_support::executor_conformance::ExecutorHarness for Harness {
    async fn start() -> Self {
        Harness::start().await
    }

    async fn run(&self, run: &ExecutorRun) -> Result<ExecResult, messages::ErrorBody> {
        refusal(self.call_node(run).await)
    }

    async fn status(
        &self,
        query: &messages::executor::ExecutorStatusQuery,
    ) -> Result<messages::executor::ExecutorRunStatus, messages::ErrorBody> {
        let subject = self.subjects.executor_node_on(
            messages::executor::Backend::Docker,
            &self.node,
            ExecutorOp::Status,
        );
        refusal(self.caller.call(subject, query).await)
    }

    async fn assert_clean(&self) {
        self.wait_containers(1).await;
    }

    async fn stop(self) {
        Harness::stop(self).await;
    }

    fn root_actor_name(&self) -> String {
        executor_node::root_actor_name(messages::ServiceName::DockerExecutor, &self.node)
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
