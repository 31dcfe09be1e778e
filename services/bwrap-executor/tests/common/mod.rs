//! The test harness: a real nats-server, real bubblewrap, real cgroups, and the bwrap-executor
//! running in-process on the sandbox image built from this checkout's supervisor (its rootfs
//! exported through the real Docker daemon).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use bwrap_executor::{BwrapConfig, BwrapError};
use kit::{Caller, CancellationToken};
use messages::exec::{ExecRequest, ExecResult, ExecStatus, Language, Tier};
use messages::executor::{Backend, ExecutorRun};
use messages::subjects::ExecutorOp;
use messages::Subjects;
use test_support::{eventually_true, NatsServer};

/// The sandbox image with this build's supervisor (build.sh is idempotent and locked, so
/// parallel test binaries share one build).
pub fn image() -> &'static str {
    static IMAGE: OnceLock<String> = OnceLock::new();
    IMAGE.get_or_init(|| {
        test_support::require_docker();
        assert!(
            bwrap_executor::bwrap_available(std::path::Path::new("bwrap")),
            "bubblewrap is missing: run scripts/install-tools.sh (apt-get install bubblewrap)"
        );
        let supervisor = executor_node::image::build_supervisor()
            .unwrap_or_else(|e| panic!("building the supervisor: {e}"));
        executor_node::image::build_image(&supervisor)
            .unwrap_or_else(|e| panic!("building the sandbox image: {e}"))
    })
}

pub fn unique_node(tag: &str) -> String {
    format!("b{tag}-{}", messages::new_id().to_ascii_lowercase())
}

/// Settings every test starts from: fast heartbeats and janitor, short default timeout.
pub fn base_env(nats: &NatsServer, node: &str) -> HashMap<String, String> {
    [
        ("SANDMESH_NATS_URL", nats.url()),
        ("SANDMESH_INSTANCE_ID", node.to_string()),
        ("SANDMESH_HEARTBEAT_MS", "500".into()),
        ("SANDMESH_EXEC_IMAGE", image().to_string()),
        ("SANDMESH_EXEC_KILL_GRACE_MS", "3000".into()),
        ("SANDMESH_EXEC_DEFAULT_TIMEOUT_MS", "5000".into()),
        ("SANDMESH_EXEC_JANITOR_MS", "500".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

pub struct Harness {
    /// Up for as long as the harness is.
    _nats: NatsServer,
    pub client: async_nats::Client,
    pub caller: Caller,
    pub subjects: Subjects,
    pub node: String,
    pub cgroup_root: PathBuf,
    shutdown: CancellationToken,
    task: Option<tokio::task::JoinHandle<Result<(), BwrapError>>>,
}

impl Harness {
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    pub async fn start_with(extra: &[(&str, &str)]) -> Self {
        Self::start_on(NatsServer::start(), extra).await
    }

    pub async fn start_on(nats: NatsServer, extra: &[(&str, &str)]) -> Self {
        test_support::trace_to_test_output();
        let node = unique_node("n");
        let mut env = base_env(&nats, &node);
        for (k, v) in extra {
            env.insert(k.to_string(), v.to_string());
        }
        let node = env["SANDMESH_INSTANCE_ID"].clone();
        let config = BwrapConfig::from_env(&env).expect("valid test config");
        let subjects = config.node.kit.subjects.clone();
        let cgroup_root = config.cgroup_root.clone();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(bwrap_executor::run(config, shutdown.clone()));
        let client = test_support::connect(&nats.url()).await;
        let caller = Caller::new(client.clone(), Duration::from_secs(60));
        let mut h = Self {
            _nats: nats,
            client,
            caller,
            subjects,
            node,
            cgroup_root,
            shutdown,
            task: Some(task),
        };
        h.wait_ready().await;
        h
    }

    /// Until the node's own run endpoint answers (a run without an id gets a 400); an
    /// executor that fails to start fails the test with its error at once.
    async fn wait_ready(&mut self) {
        let subject = self.run_subject();
        let bad = run(Language::Shell, "true", "");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            if let Err(kit::CallError::Service(_)) = self
                .caller
                .call::<_, ExecResult>(subject.clone(), &bad)
                .await
            {
                return;
            }
            if self.task.as_ref().is_some_and(|t| t.is_finished()) {
                let ended = self.task.take().expect("checked").await;
                panic!("the bwrap executor did not start: {ended:?}");
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the bwrap executor did not serve within 120 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn run_subject(&self) -> String {
        self.subjects
            .executor_node_on(Backend::Bwrap, &self.node, ExecutorOp::Run)
    }

    pub async fn call(&self, run: &ExecutorRun) -> Result<ExecResult, kit::CallError> {
        self.caller.call(self.run_subject(), run).await
    }

    /// Runs `code` with the node's defaults and returns the result (any error is a failure).
    pub async fn exec(&self, language: Language, code: &str) -> ExecResult {
        let id = messages::new_id();
        self.call(&run(language, code, &id))
            .await
            .unwrap_or_else(|e| panic!("run of {code:?} failed: {e}"))
    }

    pub async fn exec_with(&self, request: ExecRequest) -> ExecResult {
        let run = ExecutorRun {
            network: None,
            tenant: None,
            template: None,
            filesystem: None,
            execution_id: messages::new_id(),
            tier: Tier::Ephemeral,
            request,
            session_restored: false,
            kind: Default::default(),
        };
        self.call(&run).await.expect("run")
    }

    /// This node's sandbox cgroups that exist now (memory hierarchy on v1, the tree on v2).
    pub fn cgroups(&self) -> Vec<PathBuf> {
        let base = if self.cgroup_root.join("cgroup.controllers").is_file() {
            self.cgroup_root.join("sandmesh-bwrap")
        } else {
            self.cgroup_root.join("memory").join("sandmesh-bwrap")
        };
        let mut found = Vec::new();
        for mesh in std::fs::read_dir(&base).into_iter().flatten().flatten() {
            let dir = mesh.path().join(&self.node);
            for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                if e.path().is_dir() {
                    found.push(e.path());
                }
            }
        }
        found
    }

    /// Processes on this host in one of this node's sandbox cgroups.
    pub fn processes(&self) -> Vec<(i32, String)> {
        processes_in(&format!("/{}/", self.node))
    }

    /// The invariant after every run: no cgroup and no process of this node is left.
    pub async fn assert_clean(&self) {
        eventually_true(
            "no sandbox cgroup or process of this node left",
            Duration::from_secs(20),
            || async { self.cgroups().is_empty() && self.processes().is_empty() },
        )
        .await;
    }

    /// The next execution works after whatever happened before.
    pub async fn assert_recovered(&self) {
        let r = self.exec(Language::Python, "print(6 * 7)").await;
        assert_eq!(
            (r.status, r.stdout.as_str()),
            (ExecStatus::Ok, "42\n"),
            "{r:?}"
        );
        self.assert_clean().await;
    }

    pub async fn heartbeat(&self) -> Option<messages::heartbeat::Heartbeat> {
        let js = async_nats::jetstream::new(self.client.clone());
        let kv = js.get_key_value(self.subjects.nodes_bucket()).await.ok()?;
        let key = messages::ServiceName::BwrapExecutor.heartbeat_key(&self.node);
        let v = kv.get(key).await.ok()??;
        serde_json::from_slice(&v).ok()
    }

    /// Stops the executor the way a signal would and checks it ended cleanly.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        let task = self.task.take().expect("running");
        let ended = tokio::time::timeout(Duration::from_secs(90), task)
            .await
            .expect("the executor stops in time")
            .expect("no panic");
        ended.expect("a clean stop");
        assert!(self.cgroups().is_empty(), "no cgroup left after stop");
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Processes whose cgroup path contains `needle`.
pub fn processes_in(needle: &str) -> Vec<(i32, String)> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cg) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
            continue;
        };
        if cg.contains("sandmesh-bwrap/") && cg.contains(needle) {
            let cmd = std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                .unwrap_or_default()
                .replace('\0', " ");
            found.push((pid, cmd));
        }
    }
    found
}

pub fn run(language: Language, code: &str, id: &str) -> ExecutorRun {
    ExecutorRun {
        network: None,
        tenant: None,
        template: None,
        filesystem: None,
        execution_id: id.to_string(),
        tier: Tier::Ephemeral,
        request: ExecRequest {
            language,
            code: code.to_string(),
            ..Default::default()
        },
        session_restored: false,
        kind: Default::default(),
    }
}

pub fn request(language: Language, code: &str) -> ExecRequest {
    ExecRequest {
        language,
        code: code.to_string(),
        ..Default::default()
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

/// The conformance suite's view of a bwrap node: clean means no sandbox cgroup and no
/// process of the node is left.
impl test_support::executor_conformance::ExecutorHarness for Harness {
    async fn start() -> Self {
        Harness::start().await
    }

    async fn run(&self, run: &ExecutorRun) -> Result<ExecResult, messages::ErrorBody> {
        refusal(self.call(run).await)
    }

    async fn status(
        &self,
        query: &messages::executor::ExecutorStatusQuery,
    ) -> Result<messages::executor::ExecutorRunStatus, messages::ErrorBody> {
        let subject = self.subjects.executor_node_on(
            messages::executor::Backend::Bwrap,
            &self.node,
            ExecutorOp::Status,
        );
        refusal(self.caller.call(subject, query).await)
    }

    async fn assert_clean(&self) {
        Harness::assert_clean(self).await;
    }

    async fn stop(self) {
        Harness::stop(self).await;
    }

    fn root_actor_name(&self) -> String {
        executor_node::root_actor_name(messages::ServiceName::BwrapExecutor, &self.node)
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
