//! The whole mesh for end-to-end tests: a real nats-server, the real Docker daemon, and every
//! service through its library's `run(config, shutdown)`. Each docker-executor runs on a tokio
//! runtime of its own, so a test can kill one like a crashed process: the runtime is dropped
//! with everything on it (endpoints, heartbeat, NATS connection), its containers stay behind
//! and its heartbeat key expires.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::process::Command;
use std::time::Duration;

use kit::{Caller, CancellationToken};
use messages::executor::ExecutorClose;
use messages::subjects::{ExecutorOp, SessionOp};
use messages::{Encoding, Subjects};
use test_support::NatsServer;

pub const WAIT: Duration = Duration::from_secs(60);

/// The sandbox image with the supervisor, built once per test binary (idempotent).
pub async fn image() -> String {
    static IMAGE: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
    IMAGE
        .get_or_init(|| async {
            test_support::require_docker();
            docker_executor::image::ensure()
                .await
                .unwrap_or_else(|e| panic!("building the sandbox image: {e}"))
        })
        .await
        .clone()
}

/// Polls `f` every 100 ms until it returns `Some`, at most `WAIT`.
pub async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

type Task = tokio::task::JoinHandle<Result<(), String>>;

struct Service {
    stop: CancellationToken,
    task: Task,
}

/// One executor node on its own runtime.
struct Node {
    runtime: Option<tokio::runtime::Runtime>,
    stop: CancellationToken,
    done: Option<tokio::sync::oneshot::Receiver<Result<(), String>>>,
}

pub struct Mesh {
    pub nats: NatsServer,
    pub url: String,
    pub image: String,
    /// A JSON client, as a user's program would be.
    pub client: Caller,
    services: BTreeMap<&'static str, Service>,
    nodes: BTreeMap<String, Node>,
    /// Every node ever started, for the container clean-up.
    started: Vec<String>,
}

fn env_of(pairs: &[(&str, String)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

fn spawn<E: std::fmt::Display>(
    f: impl std::future::Future<Output = Result<(), E>> + Send + 'static,
) -> Task {
    tokio::spawn(async move { f.await.map_err(|e| e.to_string()) })
}

impl Mesh {
    /// NATS, risk-assessor, confirmation (`confirm_env` sets its policy), workspace-store,
    /// `executors` docker-executor nodes, then the scheduler (`sched_env` adds settings).
    pub async fn start(
        executors: usize,
        confirm_env: &[(&str, &str)],
        sched_env: &[(&str, &str)],
    ) -> Self {
        let mut mesh = Self::start_services(executors, confirm_env).await;
        mesh.start_scheduler(sched_env).await;
        mesh
    }

    /// Everything but the scheduler.
    pub async fn start_services(executors: usize, confirm_env: &[(&str, &str)]) -> Self {
        let image = image().await;
        let nats = NatsServer::start();
        let url = nats.url();
        let nc = async_nats::connect(&url).await.expect("connect");
        let client = Caller::new(nc, Duration::from_secs(120)).with_encoding(Encoding::Json);
        let mut mesh = Self {
            nats,
            url,
            image,
            client,
            services: BTreeMap::new(),
            nodes: BTreeMap::new(),
            started: Vec::new(),
        };
        let base = [("SANDMESH_NATS_URL", mesh.url.clone())];
        let c = risk_assessor::RiskAssessorConfig::from_env(&env_of(&base)).unwrap();
        mesh.add("risk-assessor", |stop| spawn(risk_assessor::run(c, stop)));
        mesh.start_confirmation(confirm_env);
        let c = workspace_store::WorkspaceConfig::for_url(&mesh.url);
        mesh.add("workspace-store", |stop| {
            spawn(workspace_store::run(c, stop))
        });
        for i in 0..executors {
            mesh.start_executor(&format!("n{i}")).await;
        }
        mesh
    }

    /// Starts the scheduler in-process and waits until the mesh answers.
    pub async fn start_scheduler(&mut self, sched_env: &[(&str, &str)]) {
        let mut env = vec![
            ("SANDMESH_NATS_URL", self.url.clone()),
            ("SANDMESH_HEARTBEAT_MS", "500".into()),
        ];
        env.extend(sched_env.iter().map(|(k, v)| (*k, v.to_string())));
        let c = scheduler::SchedulerConfig::from_env(&env_of(&env)).unwrap();
        self.add("scheduler", |stop| spawn(scheduler::run(c, stop)));
        self.wait_ready().await;
    }

    fn add(&mut self, name: &'static str, start: impl FnOnce(CancellationToken) -> Task) {
        let stop = CancellationToken::new();
        let task = start(stop.clone());
        self.services.insert(name, Service { stop, task });
    }

    /// (Re)starts the confirmation service with these `SANDMESH_CONFIRM_*` settings.
    pub fn start_confirmation(&mut self, confirm_env: &[(&str, &str)]) {
        let mut env = vec![("SANDMESH_NATS_URL", self.url.clone())];
        env.extend(confirm_env.iter().map(|(k, v)| (*k, v.to_string())));
        let c = confirmation::ConfirmationConfig::from_env(&env_of(&env)).unwrap();
        self.add("confirmation", |stop| spawn(confirmation::run(c, stop)));
    }

    pub async fn stop_service(&mut self, name: &str) {
        let s = self.services.remove(name).expect("running service");
        s.stop.cancel();
        let r = tokio::time::timeout(WAIT, s.task)
            .await
            .expect("stops in time");
        r.expect("task")
            .unwrap_or_else(|e| panic!("{name} failed: {e}"));
    }

    /// Starts a docker-executor node `<tag>-<unique>` and waits until it answers; returns its id.
    pub async fn start_executor(&mut self, tag: &str) -> String {
        let node = format!("e2e-{tag}-{}", messages::new_id().to_ascii_lowercase());
        let env = env_of(&[
            ("SANDMESH_NATS_URL", self.url.clone()),
            ("SANDMESH_INSTANCE_ID", node.clone()),
            ("SANDMESH_HEARTBEAT_MS", "500".into()),
            ("SANDMESH_EXEC_IMAGE", self.image.clone()),
            ("SANDMESH_EXEC_WARM_POOL", "1".into()),
            ("SANDMESH_EXEC_WORKSPACE", "on".into()),
        ]);
        let config = docker_executor::ExecutorConfig::from_env(&env).unwrap();
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
        self.nodes.insert(
            node.clone(),
            Node {
                runtime: Some(runtime),
                stop,
                done: Some(done),
            },
        );
        let subject = Subjects::default().executor_node(&node, ExecutorOp::Close);
        let client = self.client.clone();
        eventually(&format!("executor {node}"), || {
            let (client, subject) = (client.clone(), subject.clone());
            async move {
                let probe = ExecutorClose {
                    session_id: "readiness".into(),
                };
                client
                    .call::<_, serde_json::Value>(subject, &probe)
                    .await
                    .ok()
            }
        })
        .await;
        node
    }

    pub fn nodes(&self) -> Vec<String> {
        self.nodes.keys().cloned().collect()
    }

    /// Kills a node like a crashed process: no clean-up, no goodbye.
    pub fn crash_executor(&mut self, node: &str) {
        let mut n = self.nodes.remove(node).expect("running node");
        if let Some(rt) = n.runtime.take() {
            rt.shutdown_background();
        }
    }

    /// Stops a node gracefully (its containers removed, its heartbeat deleted).
    pub async fn stop_executor(&mut self, node: &str) {
        let mut n = self.nodes.remove(node).expect("running node");
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

    pub async fn wait_ready(&self) {
        let subject = Subjects::default().sessions(SessionOp::List);
        let client = self.client.clone();
        eventually("the scheduler", || {
            let (client, subject) = (client.clone(), subject.clone());
            async move {
                client
                    .call::<_, serde_json::Value>(subject, &serde_json::json!({}))
                    .await
                    .ok()
            }
        })
        .await;
        let client = self.client.clone();
        eventually("the risk-assessor", || {
            let client = client.clone();
            async move {
                let ask = messages::risk::AssessRequest {
                    content: "print(1)".into(),
                    content_type: messages::risk::ContentType::Python,
                    params: None,
                    mode: None,
                };
                client
                    .call::<_, serde_json::Value>(Subjects::default().risk_assess(), &ask)
                    .await
                    .ok()
            }
        })
        .await;
    }

    /// Stops everything gracefully, in reverse order of dependence.
    pub async fn shutdown(mut self) {
        self.stop_service("scheduler").await;
        for node in self.nodes() {
            self.stop_executor(&node).await;
        }
        for name in ["workspace-store", "confirmation", "risk-assessor"] {
            if self.services.contains_key(name) {
                self.stop_service(name).await;
            }
        }
    }
}

impl Drop for Mesh {
    fn drop(&mut self) {
        for (_, s) in std::mem::take(&mut self.services) {
            s.stop.cancel();
        }
        for (_, mut n) in std::mem::take(&mut self.nodes) {
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

/// `docker rm -f` of every container labelled with this node.
pub fn remove_containers(node: &str) {
    let filter = format!("label={}={node}", docker_executor::docker::LABEL_NODE);
    let Ok(out) = Command::new("docker")
        .args(["ps", "-aq", "--filter", &filter])
        .output()
    else {
        return;
    };
    let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect();
    if !ids.is_empty() {
        let _ = Command::new("docker")
            .arg("rm")
            .arg("-f")
            .args(&ids)
            .output();
    }
}
