//! The one mesh harness of sandmesh's tests (feature `mesh`): a real nats-server and the
//! services a test needs, each either a small stand-in served over NATS ([`fakes`]) or the real
//! service through its library's `run(config, shutdown)` (and real docker-executor nodes on the
//! real Docker daemon, [`docker`]). The scheduler's, gateway's, console's and browser-router's
//! tests all start their mesh here. A test says what it needs:
//!
//! ```text
//! let mesh = Mesh::builder().risk().confirm(&[]).executor("a", 4).scheduler(|_| {}).start().await;
//! ```
//!
//! The meshes many tests share are named presets ([`Mesh::one_executor`], [`Mesh::sessions`],
//! [`Mesh::docker_sessions`]), each a builder to adjust further.

pub mod docker;
pub mod fakes;
pub mod node_standin;

use sandmesh_client::{ClientError, MeshClient};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::NatsServer;
use async_nats::jetstream;
use kit::serve::ServiceHost;
use kit::CancellationToken;
use messages::confirm::ConfirmRequest;
use messages::exec::{ExecRequest, ExecResult};
use messages::tenancy::Tenant;
use messages::{Encoding, ServiceName, Subjects};
use sandmesh_auth::{Scope, Tenancy};
use scheduler::SchedulerConfig;

#[allow(unused_imports)]
pub use fakes::{audit_events, audit_kinds, FakeExecutor, Runs};
pub use node_standin::NodeStandin;

/// The bound of every wait in these tests.
pub const WAIT: Duration = Duration::from_secs(60);

pub async fn connect(url: &str) -> async_nats::Client {
    crate::connect(url).await
}

/// Polls `check` until it returns `Some`, at most [`WAIT`].
pub async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    crate::eventually(what, WAIT, check).await
}

type Task = tokio::task::JoinHandle<Result<(), String>>;
type Tune = Box<dyn FnOnce(&mut SchedulerConfig) + Send>;

/// A service running in-process through its library's `run`.
struct Service {
    stop: CancellationToken,
    task: Task,
}

fn spawn<E: std::fmt::Display>(
    f: impl std::future::Future<Output = Result<(), E>> + Send + 'static,
) -> Task {
    tokio::spawn(async move { f.await.map_err(|e| e.to_string()) })
}

fn env_of(url: &str, pairs: &[(&str, &str)]) -> HashMap<String, String> {
    let mut env: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    env.insert("SANDMESH_NATS_URL".into(), url.into());
    env
}

enum Part {
    Fake,
    Real,
}

/// What a test's mesh is made of; [`MeshBuilder::start`] starts it in dependency order.
#[derive(Default)]
pub struct MeshBuilder {
    risk: Option<Part>,
    workspace: Option<Part>,
    /// The real templates service.
    templates: bool,
    /// The real confirmation service with these `SANDMESH_CONFIRM_*` settings.
    confirm: Option<Vec<(String, String)>>,
    /// A stand-in that decides at once: approve or deny.
    confirm_standin: Option<bool>,
    executors: Vec<(String, u32)>,
    docker_executors: usize,
    scheduler: Option<Tune>,
    /// Accounts and users beyond the default ones (tenants, scoped operators).
    tenancy: Option<Tenancy>,
    /// `SANDMESH_METRICS_ADDR` of every real service.
    metrics: Option<std::net::SocketAddr>,
}

impl MeshBuilder {
    /// The risk-assessor stand-in ([`fakes::assess`]).
    pub fn risk(mut self) -> Self {
        self.risk = Some(Part::Fake);
        self
    }
    /// The real risk-assessor.
    pub fn real_risk(mut self) -> Self {
        self.risk = Some(Part::Real);
        self
    }
    /// The real confirmation service with this policy (`SANDMESH_CONFIRM_*`).
    pub fn confirm(mut self, policy: &[(&str, &str)]) -> Self {
        let policy = policy.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        self.confirm = Some(policy.collect());
        self
    }
    /// A confirmation stand-in that approves (or denies) every request at once.
    pub fn confirm_standin(mut self, approve: bool) -> Self {
        self.confirm_standin = Some(approve);
        self
    }
    /// The real templates service (with its built-ins).
    pub fn templates(mut self) -> Self {
        self.templates = true;
        self
    }
    /// The workspace-store stand-in (`workspace.init` only).
    pub fn workspace(mut self) -> Self {
        self.workspace = Some(Part::Fake);
        self
    }
    pub fn real_workspace(mut self) -> Self {
        self.workspace = Some(Part::Real);
        self
    }
    /// An executor stand-in `node` with `capacity` slots.
    pub fn executor(mut self, node: &str, capacity: u32) -> Self {
        self.executors.push((node.to_string(), capacity));
        self
    }
    /// `n` real docker-executor nodes (needs Docker).
    pub fn docker_executors(mut self, n: usize) -> Self {
        self.docker_executors = n;
        self
    }
    /// These tenants besides `default`, and operators with a scope of named tenants.
    pub fn tenants(mut self, tenants: &[&str], operators: &[(&str, &[&str])]) -> Self {
        let mut t = Tenancy::generate(&Subjects::default());
        for name in tenants {
            t.add_tenant(&Tenant::new(*name).unwrap());
        }
        for (user, scope) in operators {
            let set = scope.iter().map(|n| Tenant::new(*n).unwrap()).collect();
            t.add_operator(user, Scope::Tenants(set));
        }
        self.tenancy = Some(t);
        self
    }
    /// Every real service serves its metrics on `addr` (one shared endpoint: one process).
    pub fn metrics(mut self, addr: std::net::SocketAddr) -> Self {
        self.metrics = Some(addr);
        self
    }
    /// A scheduler with the test defaults, changed by `tune`.
    pub fn scheduler(mut self, tune: impl FnOnce(&mut SchedulerConfig) + Send + 'static) -> Self {
        self.scheduler = Some(Box::new(tune));
        self
    }

    pub async fn start(self) -> Mesh {
        let nats = match self.tenancy {
            Some(t) => NatsServer::start_with_tenancy(t),
            None => NatsServer::start(),
        };
        let url = nats.url();
        let nc = connect(&url).await;
        let mut mesh = Mesh {
            client: kit::mesh_client(nc.clone(), Default::default())
                .with_timeout(Duration::from_secs(120))
                .with_encoding(Encoding::Json),
            js: jetstream::new(nc),
            nats,
            url,
            runs: Runs::default(),
            asked: Arc::default(),
            executors: BTreeMap::new(),
            hosts: BTreeMap::new(),
            services: BTreeMap::new(),
            docker: docker::Nodes::with_metrics(self.metrics),
            metrics: self.metrics,
        };
        match self.risk {
            Some(Part::Fake) => mesh.serve_risk_standin().await,
            Some(Part::Real) => {
                let mut c = risk_assessor::RiskAssessorConfig::from_env(&env_of(
                    &mesh.nats.service_url(ServiceName::RiskAssessor),
                    &[],
                ))
                .unwrap();
                c.kit.metrics_addr = mesh.metrics;
                mesh.add("risk-assessor", |stop| spawn(risk_assessor::run(c, stop)));
                mesh.wait_for_risk().await;
            }
            None => {}
        }
        if let Some(policy) = &self.confirm {
            let policy: Vec<(&str, &str)> = policy
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            mesh.start_confirmation(&policy);
        }
        if let Some(approve) = self.confirm_standin {
            mesh.serve_confirm_standin(approve).await;
        }
        if self.templates {
            let mut c =
                templates::TemplatesConfig::for_url(&mesh.nats.service_url(ServiceName::Templates));
            c.kit.metrics_addr = mesh.metrics;
            mesh.add("templates", |stop| spawn(templates::run(c, stop)));
        }
        match self.workspace {
            Some(Part::Fake) => {
                let host = fakes::serve_workspace(&mesh.url).await;
                mesh.hosts.insert("workspace", host);
            }
            Some(Part::Real) => {
                let c = workspace_store::WorkspaceConfig::for_url(
                    &mesh.nats.service_url(ServiceName::WorkspaceStore),
                );
                mesh.add("workspace-store", |stop| {
                    spawn(workspace_store::run(c, stop))
                });
            }
            None => {}
        }
        for (node, capacity) in &self.executors {
            mesh.add_executor(node, *capacity).await;
        }
        for i in 0..self.docker_executors {
            mesh.start_docker_executor(&format!("n{i}")).await;
        }
        if let Some(tune) = self.scheduler {
            let mut config = mesh.config();
            tune(&mut config);
            mesh.start_scheduler(config).await;
        }
        mesh
    }
}

pub struct Mesh {
    pub nats: NatsServer,
    pub url: String,
    /// A JSON client, as a user's program would be.
    pub client: MeshClient,
    pub js: jetstream::Context,
    /// Every run the executor stand-ins took.
    pub runs: Runs,
    /// What the confirmation stand-in was asked.
    pub asked: Arc<Mutex<Vec<ConfirmRequest>>>,
    executors: BTreeMap<String, FakeExecutor>,
    /// Stand-ins by name ("risk", "confirm", "workspace").
    hosts: BTreeMap<&'static str, ServiceHost>,
    services: BTreeMap<&'static str, Service>,
    docker: docker::Nodes,
    metrics: Option<std::net::SocketAddr>,
}

impl Mesh {
    pub fn builder() -> MeshBuilder {
        MeshBuilder::default()
    }

    /// The mesh most execution tests start: the risk stand-in, one executor stand-in
    /// `node-a` with `capacity` slots and the scheduler (adjust it with another
    /// [`MeshBuilder::scheduler`]).
    pub fn one_executor(capacity: u32) -> MeshBuilder {
        Self::builder()
            .risk()
            .executor("node-a", capacity)
            .scheduler(|_| {})
    }

    /// [`Mesh::one_executor`] with the workspace stand-in, which opening a session needs.
    pub fn sessions(capacity: u32) -> MeshBuilder {
        Self::one_executor(capacity).workspace()
    }

    /// Sessions on one real docker-executor node: the real workspace-store and templates
    /// service beside the risk stand-in and the scheduler.
    pub fn docker_sessions() -> MeshBuilder {
        Self::builder()
            .risk()
            .real_workspace()
            .templates()
            .docker_executors(1)
            .scheduler(|_| {})
    }

    /// The scheduler settings of these tests: quick heartbeats, short waits.
    pub fn config(&self) -> SchedulerConfig {
        let mut c = SchedulerConfig::for_url(&self.nats.service_url(ServiceName::Scheduler));
        c.kit.heartbeat_interval = Duration::from_millis(300);
        c.kit.metrics_addr = self.metrics;
        c.confirm_timeout = Duration::from_secs(5);
        c.parked_sweep = Duration::from_millis(500);
        if self.docker.ids().is_empty() {
            // Stand-ins answer at once; real containers need the default.
            c.exec_grace = Duration::from_secs(5);
        }
        c
    }

    fn add(&mut self, name: &'static str, start: impl FnOnce(CancellationToken) -> Task) {
        let stop = CancellationToken::new();
        let task = start(stop.clone());
        self.services.insert(name, Service { stop, task });
    }

    /// Starts a scheduler in-process and waits until it answers.
    pub async fn start_scheduler(&mut self, config: SchedulerConfig) {
        self.add("scheduler", |stop| spawn(scheduler::run(config, stop)));
        self.wait_ready().await;
    }

    /// Stops the scheduler gracefully; panics when its `run` failed.
    pub async fn stop_scheduler(&mut self) {
        self.stop_service("scheduler").await;
    }

    /// The scheduler's `run`, ended (by a failure) or still running.
    pub fn scheduler_finished(&self) -> bool {
        self.services
            .get("scheduler")
            .is_none_or(|s| s.task.is_finished())
    }

    /// (Re)starts the real confirmation service with this policy.
    pub fn start_confirmation(&mut self, policy: &[(&str, &str)]) {
        let mut env = env_of(&self.nats.service_url(ServiceName::Confirmation), policy);
        let scopes = self.nats.tenancy().operator_scopes();
        env.insert("SANDMESH_OPERATOR_SCOPES".into(), scopes);
        let mut c = confirmation::ConfirmationConfig::from_env(&env).unwrap();
        c.kit.metrics_addr = self.metrics;
        self.add("confirmation", |stop| spawn(confirmation::run(c, stop)));
    }

    pub async fn serve_confirm_standin(&mut self, approve: bool) {
        let host = fakes::serve_confirm(&self.url, approve, self.asked.clone()).await;
        self.hosts.insert("confirm", host);
    }

    pub async fn serve_risk_standin(&mut self) {
        let host = fakes::serve_risk(&self.url).await;
        self.hosts.insert("risk", host);
    }

    /// Stops the stand-in `name` ("risk", "confirm", "workspace").
    pub async fn stop_standin(&mut self, name: &str) {
        let host = self.hosts.remove(name).expect("running stand-in");
        host.shutdown(Duration::from_secs(1)).await;
    }

    /// Stops a service and returns how its `run` ended.
    pub async fn stop_service_result(&mut self, name: &str) -> Result<(), String> {
        let s = self.services.remove(name).expect("running service");
        s.stop.cancel();
        let r = tokio::time::timeout(WAIT, s.task)
            .await
            .expect("stops in time");
        r.expect("task")
    }

    pub async fn stop_service(&mut self, name: &str) {
        if let Err(e) = self.stop_service_result(name).await {
            panic!("{name} failed: {e}");
        }
    }

    pub async fn add_executor(&mut self, node: &str, capacity: u32) {
        let e = FakeExecutor::start(&self.url, node, capacity, self.runs.clone()).await;
        self.executors.insert(node.to_string(), e);
    }

    /// The stand-in dies like a killed process (its heartbeat key is left to expire).
    pub async fn crash_executor(&mut self, node: &str) {
        self.executors.remove(node).expect("stand-in").crash().await;
    }

    /// The stand-in stops cleanly (its heartbeat key deleted).
    pub async fn stop_executor(&mut self, node: &str) {
        self.executors.remove(node).expect("stand-in").stop().await;
    }

    pub async fn start_docker_executor(&mut self, tag: &str) -> String {
        self.docker
            .start(
                &self.nats.service_url(ServiceName::DockerExecutor),
                &self.client,
                tag,
            )
            .await
    }

    pub fn docker_nodes(&self) -> Vec<String> {
        self.docker.ids()
    }

    pub async fn crash_docker_executor(&mut self, node: &str) {
        self.docker.crash(node).await;
    }

    pub async fn exec(&self, r: &ExecRequest) -> Result<ExecResult, ClientError> {
        self.client.request(Subjects::default().exec(), r).await
    }

    /// Waits until the scheduler answers.
    pub async fn wait_ready(&self) {
        let subject = Subjects::default().sessions(messages::subjects::SessionOp::List);
        let client = self.client.clone();
        eventually("the scheduler to answer", || {
            let (client, subject) = (client.clone(), subject.clone());
            async move {
                client
                    .request::<_, serde_json::Value>(subject, &serde_json::json!({}))
                    .await
                    .ok()
            }
        })
        .await;
    }

    async fn wait_for_risk(&self) {
        let client = self.client.clone();
        eventually("the risk-assessor", || {
            let client = client.clone();
            async move {
                let ask = messages::risk::AssessRequest {
                    content: "print(1)".into(),
                    content_type: messages::risk::ContentType::Python,
                    params: None,
                    mode: None,
                    files: Vec::new(),
                };
                client
                    .request::<_, serde_json::Value>(Subjects::default().risk_assess(), &ask)
                    .await
                    .ok()
            }
        })
        .await;
    }

    /// Stops everything gracefully, the scheduler first; panics when a service failed.
    pub async fn shutdown(mut self) {
        if self.services.contains_key("scheduler") {
            self.stop_scheduler().await;
        }
        for node in self.docker.ids() {
            self.docker.stop(&node).await;
        }
        let names: Vec<&'static str> = self.services.keys().copied().collect();
        for name in names {
            self.stop_service(name).await;
        }
        for (_, host) in std::mem::take(&mut self.hosts) {
            host.shutdown(Duration::from_secs(1)).await;
        }
    }
}

impl Drop for Mesh {
    fn drop(&mut self) {
        for (_, s) in std::mem::take(&mut self.services) {
            s.stop.cancel();
        }
    }
}

/// The result stored for execution `id`, if any yet.
/// Publishes `req` on `jobs.exec` as a client does — its execution id as the message id, so a
/// repeat is deduplicated — and waits for JetStream's ack; panics unless it is a new job.
pub async fn publish_job(js: &jetstream::Context, req: &ExecRequest) {
    let id = req
        .execution_id
        .clone()
        .expect("a job names its execution id");
    let message = jetstream::message::PublishMessage::build()
        .payload(serde_json::to_vec(req).unwrap().into())
        .message_id(&id);
    let ack = js
        .send_publish(Subjects::default().jobs_exec(), message)
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(!ack.duplicate, "{id} was published before");
}

pub async fn stored_result(js: &jetstream::Context, id: &str) -> Option<ExecResult> {
    let stream = js
        .get_stream(Subjects::default().results_stream())
        .await
        .ok()?;
    let m = stream
        .direct_get_last_for_subject(Subjects::default().result(id))
        .await
        .ok()?;
    Some(serde_json::from_slice(&m.payload).unwrap())
}
