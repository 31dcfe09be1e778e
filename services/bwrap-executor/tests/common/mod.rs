//! The test harness: a real nats-server, real bubblewrap, real cgroups, and the bwrap-executor
//! running in-process on the sandbox image built from this checkout's supervisor (its rootfs
//! exported through the real Docker daemon) — [`test_support::executor_node::Node`], the node
//! every backend's tests share; what is bwrap's own (cgroups, processes) is [`BwrapRuns`].

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use bwrap_executor::{BwrapConfig, BwrapError};
use kit::CancellationToken;
use messages::exec::{ExecRequest, ExecResult, ExecStatus, Language};
use messages::executor::{ExecutorRun, RunKind};
use messages::{ServiceName, Subjects};
use test_support::executor_node::{self, Node, NodeBackend};
use test_support::{eventually_true, NatsServer};

/// A bwrap-executor node under test.
pub type Harness = Node<BwrapNode>;

/// Where the node's sandbox cgroups live.
pub struct BwrapNode {
    pub cgroup_root: PathBuf,
}

impl NodeBackend for BwrapNode {
    type Config = BwrapConfig;
    type Error = BwrapError;
    const SERVICE: ServiceName = ServiceName::BwrapExecutor;
    const KIND: messages::executor::Backend = messages::executor::Backend::Bwrap;
    // A fast janitor.
    const ENV: &'static [(&'static str, &'static str)] = &[("SANDMESH_EXEC_JANITOR_MS", "500")];
    const NODE_PREFIX: &'static str = "b";

    fn config(env: &HashMap<String, String>) -> BwrapConfig {
        BwrapConfig::from_env(env).expect("valid test config")
    }

    fn subjects(config: &BwrapConfig) -> Subjects {
        config.node.kit.subjects.clone()
    }

    fn serve(
        config: BwrapConfig,
        shutdown: CancellationToken,
    ) -> impl std::future::Future<Output = Result<(), BwrapError>> + Send + 'static {
        bwrap_executor::run(config, shutdown)
    }

    async fn open(config: &BwrapConfig) -> Self {
        assert!(
            bwrap_executor::bwrap_available(std::path::Path::new("bwrap")),
            "bubblewrap is missing: run scripts/install-tools.sh (apt-get install bubblewrap)"
        );
        Self {
            cgroup_root: config.cgroup_root.clone(),
        }
    }

    /// No sandbox cgroup and no process of the node is left.
    async fn assert_clean(node: &Harness) {
        eventually_true(
            "no sandbox cgroup or process of this node left",
            Duration::from_secs(20),
            || async { node.cgroups().is_empty() && node.processes().is_empty() },
        )
        .await;
    }

    async fn assert_stopped(node: &Harness) {
        assert!(node.cgroups().is_empty(), "no cgroup left after stop");
    }
}

pub fn base_env(nats: &NatsServer, node: &str) -> HashMap<String, String> {
    executor_node::base_env::<BwrapNode>(nats, node)
}

pub fn unique_node(tag: &str) -> String {
    executor_node::unique_node::<BwrapNode>(tag)
}

/// What the bwrap backend's tests do and look at beyond every backend's node.
#[allow(async_fn_in_trait)]
pub trait BwrapRuns {
    /// Runs `code` with the node's defaults and returns the result (any error is a failure).
    async fn exec(&self, language: Language, code: &str) -> ExecResult;
    async fn exec_with(&self, request: ExecRequest) -> ExecResult;
    /// This node's sandbox cgroups that exist now (memory hierarchy on v1, the tree on v2).
    fn cgroups(&self) -> Vec<PathBuf>;
    /// Processes on this host in one of this node's sandbox cgroups.
    fn processes(&self) -> Vec<(i32, String)>;
    /// The invariant after every run: no cgroup and no process of this node is left.
    async fn assert_clean(&self);
    /// The next execution works after whatever happened before, and nothing is left.
    async fn assert_recovered(&self);
}

impl BwrapRuns for Harness {
    async fn exec(&self, language: Language, code: &str) -> ExecResult {
        let id = messages::new_id();
        self.call_node(&run(language, code, &id))
            .await
            .unwrap_or_else(|e| panic!("run of {code:?} failed: {e}"))
    }

    async fn exec_with(&self, request: ExecRequest) -> ExecResult {
        self.call_node(&pooled(messages::new_id(), request))
            .await
            .expect("run")
    }

    fn cgroups(&self) -> Vec<PathBuf> {
        let base = if self
            .backend
            .cgroup_root
            .join("cgroup.controllers")
            .is_file()
        {
            self.backend.cgroup_root.join("sandmesh-bwrap")
        } else {
            self.backend
                .cgroup_root
                .join("memory")
                .join("sandmesh-bwrap")
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

    fn processes(&self) -> Vec<(i32, String)> {
        processes_in(&format!("/{}/", self.node))
    }

    async fn assert_clean(&self) {
        BwrapNode::assert_clean(self).await;
    }

    async fn assert_recovered(&self) {
        let r = self.exec(Language::Python, "print(6 * 7)").await;
        assert_eq!(
            (r.status, r.stdout.as_str()),
            (ExecStatus::Ok, "42\n"),
            "{r:?}"
        );
        BwrapNode::assert_clean(self).await;
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
    let request = ExecRequest {
        language,
        code: code.to_string(),
        ..Default::default()
    };
    pooled(id.into(), request)
}

/// A sessionless run in a single-use sandbox.
pub fn pooled(execution_id: String, request: ExecRequest) -> ExecutorRun {
    ExecutorRun::new(execution_id, request, RunKind::Pooled).expect("a run without a session")
}

pub fn request(language: Language, code: &str) -> ExecRequest {
    ExecRequest {
        language,
        code: code.to_string(),
        ..Default::default()
    }
}
