//! The browser-router's mesh (feature `browser`): the shared [`crate::mesh`] harness with the
//! real risk-assessor, confirmation, workspace-store and scheduler, plus a browser-router in
//! this process on real Docker with real Chromium in the browser image, and a fixture web site.
//! Its tests and its bench (`benches/browser.rs`) start it the same way.
//!
//! Where the fixture lives: the browser containers have no route out; Chromium's only way
//! out is the egress proxy, which runs in this process on the host. So the fixture is served
//! on the host's loopback, on 127.0.0.2 (all of 127/8 is loopback on Linux), and the test
//! router's policy allows exactly `127.0.0.2/32` on the fixture's port. It also allows the
//! name `localhost`, so that the refusal tests show the check after resolution: the name
//! passes, its address 127.0.0.1 does not.

pub mod fixture;

use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use browser_router::container::LABEL_ROUTER;
use browser_router::BrowserConfig;
use kit::config::env_map;
use kit::CancellationToken;
use messages::browser::{
    BrowserAction, BrowserCommand, BrowserPayload, BrowserRequest, BrowserResult,
};
use messages::Subjects;
use sandmesh_client::{ClientError, MeshClient};

use crate::mesh::Mesh;

pub const BOUND: Duration = Duration::from_secs(60);

/// The browser image (deploy/images/build-browser.sh: a no-op when nothing changed).
pub fn image() -> &'static str {
    static IMAGE: OnceLock<String> = OnceLock::new();
    IMAGE.get_or_init(|| {
        crate::require_docker();
        browser_router::image::ensure_image().unwrap_or_else(|e| {
            panic!("building the browser image (root, debootstrap and a Debian mirror are needed the first time): {e}")
        })
    })
}

pub struct BrowserMesh {
    /// NATS and the services around the router.
    pub mesh: Mesh,
    /// A client of the services' account (it may decide confirmations).
    pub client: MeshClient,
    pub fixture: fixture::Fixture,
    /// The router's instance id: its containers carry it in `sandmesh.browser.router`.
    pub router: String,
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<Result<(), String>>>,
    _browsers: Browsers,
    _egress: tempfile::TempDir,
    _tenancy: tempfile::TempDir,
}

/// A test that failed before `stop` leaves its router running and its browsers: stops the
/// router and removes them (this router's only).
struct Browsers {
    router: String,
    stop: CancellationToken,
}

impl Drop for Browsers {
    fn drop(&mut self) {
        self.stop.cancel();
        for name in containers_of(&self.router) {
            let _ = Command::new("docker").args(["rm", "-f", &name]).output();
        }
    }
}

/// Names of the containers labelled with this router instance (running or not).
pub fn containers_of(router: &str) -> Vec<String> {
    let filter = format!("label={LABEL_ROUTER}={router}");
    let out = Command::new("docker")
        .args(["ps", "-a", "--filter", &filter, "--format", "{{.Names}}"])
        .output()
        .expect("docker ps");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

impl BrowserMesh {
    /// Every service, a fixture site, and a router with `extra` `SANDMESH_*` settings.
    pub async fn start(extra: &[(&str, &str)]) -> Self {
        Self::start_with_tenants(&[], extra).await
    }

    /// The same with these tenants besides `default`.
    pub async fn start_with_tenants(tenants: &[&str], extra: &[(&str, &str)]) -> Self {
        Self::start_with_quotas(tenants, &[], extra).await
    }

    /// The same, the router following a tenancy file that gives these tenants these quotas.
    pub async fn start_with_quotas(
        tenants: &[&str],
        quotas: &[(&str, messages::quota::Quotas)],
        extra: &[(&str, &str)],
    ) -> Self {
        crate::trace_to_test_output();
        let image = image();
        let fixture = fixture::Fixture::start().await;
        let mesh = Mesh::builder()
            .tenants(tenants, &[])
            .real_risk()
            .confirm(&[])
            .real_workspace()
            .scheduler(|_| {})
            .start()
            .await;
        let url = mesh.nats.service_url(messages::ServiceName::BrowserRouter);
        let connection = crate::connect(&mesh.nats.url()).await;
        let router = format!("tb{}", messages::new_id().to_ascii_lowercase());
        let egress = tempfile::tempdir().expect("tempdir");
        let policy = format!(
            r#"{{"allow_domains":["localhost"],"allow_cidrs":["127.0.0.2/32"],"ports":[{}]}}"#,
            fixture.port
        );
        let egress_dir = egress.path().display().to_string();
        let tenancy_dir = tempfile::tempdir().expect("tempdir");
        let tenancy_file = tenancy_dir.path().join("tenancy.json");
        if !quotas.is_empty() {
            let mut tenancy = mesh.nats.tenancy().clone();
            for (tenant, q) in quotas {
                let tenant = messages::tenancy::Tenant::new(*tenant).expect("a tenant name");
                tenancy.set_quotas(&tenant, *q);
            }
            tenancy
                .save(&tenancy_file)
                .expect("the tenancy file is written");
        }
        let mut env = env_map(&[
            ("SANDMESH_NATS_URL", url.as_str()),
            ("SANDMESH_HEARTBEAT_MS", "500"),
            ("SANDMESH_INSTANCE_ID", router.as_str()),
            ("SANDMESH_BROWSER_IMAGE", image),
            ("SANDMESH_BROWSER_NETWORK_POLICY", policy.as_str()),
            ("SANDMESH_BROWSER_EGRESS_DIR", egress_dir.as_str()),
            ("SANDMESH_BROWSER_WARM_POOL", "1"),
            ("SANDMESH_BROWSER_CONFIRM_TIMEOUT_MS", "20000"),
        ]);
        if !quotas.is_empty() {
            let file = tenancy_file.display().to_string();
            env.insert("SANDMESH_TENANCY_FILE".into(), file);
        }
        for (k, v) in extra {
            env.insert(k.to_string(), v.to_string());
        }
        let config = BrowserConfig::from_env(&env).expect("valid router config");
        let stop = CancellationToken::new();
        let mut browser = Self {
            mesh,
            client: MeshClient::new(connection, Subjects::default()).with_timeout(BOUND),
            fixture,
            _browsers: Browsers {
                router: router.clone(),
                stop: stop.clone(),
            },
            router,
            stop,
            tasks: Vec::new(),
            _egress: egress,
            _tenancy: tenancy_dir,
        };
        let run = browser_router::run(config, browser.stop.clone());
        browser.tasks.push(tokio::spawn(
            async move { run.await.map_err(|e| e.to_string()) },
        ));
        // The harness waits for the risk-assessor and the scheduler; these answer too.
        for service in [
            messages::ServiceName::Confirmation,
            messages::ServiceName::WorkspaceStore,
            messages::ServiceName::BrowserRouter,
        ] {
            browser.ready(service).await;
        }
        browser
    }

    async fn ready(&mut self, service: messages::ServiceName) {
        let status = self.client.status();
        let what = format!("{service} to answer");
        crate::until_up(&what, BOUND, &mut self.tasks, || {
            let status = status.clone();
            async move {
                let found = status.ping(Some(service), Duration::from_millis(200)).await;
                found.is_ok_and(|i| !i.is_empty())
            }
        })
        .await;
    }

    /// Stops the router, then every other service; each must end cleanly.
    pub async fn stop(self) {
        self.stop.cancel();
        for task in self.tasks {
            let ended = tokio::time::timeout(BOUND, task).await;
            ended
                .expect("the router stops in time")
                .expect("its task")
                .expect("the router ends cleanly");
        }
        self.mesh.shutdown().await;
    }

    /// A client connected as `tenant`'s agent (through the server's service imports).
    pub async fn agent(&self, tenant: &str) -> MeshClient {
        let connection = crate::connect(&self.mesh.nats.agent_url(tenant)).await;
        MeshClient::new(connection, Subjects::default()).with_timeout(BOUND)
    }

    pub fn containers(&self) -> Vec<String> {
        containers_of(&self.router)
    }

    /// `action` with `payload` as any client sends it (so a hostile payload reaches the
    /// router as it is).
    pub async fn act(
        &self,
        session: &str,
        action: BrowserAction,
        payload: BrowserPayload,
    ) -> Result<BrowserResult, ClientError> {
        let payload = BrowserPayload {
            session_id: session.to_string(),
            ..payload
        };
        let subject = self.client.subjects().browser(action.as_str());
        let timeout = sandmesh_client::browser::BROWSER_TIMEOUT;
        self.client
            .request_timeout(subject, &payload, timeout)
            .await
    }

    /// The action must succeed.
    pub async fn ok(
        &self,
        session: &str,
        action: BrowserAction,
        payload: BrowserPayload,
    ) -> BrowserResult {
        self.act(session, action, payload)
            .await
            .unwrap_or_else(|e| panic!("{} failed: {e}", action.as_str()))
    }

    /// A typed request through the client, as the CLI and the MCP server send one.
    pub async fn command(&self, session: &str, command: BrowserCommand) -> BrowserResult {
        let action = command.action();
        let req = BrowserRequest::new(session, command);
        self.client
            .browser()
            .act(&req)
            .await
            .unwrap_or_else(|e| panic!("{} failed: {e}", action.as_str()))
    }

    pub async fn navigate(&self, session: &str, path: &str) -> BrowserResult {
        let url = self.fixture.url(path);
        self.command(session, BrowserCommand::Navigate { url })
            .await
    }

    pub async fn text(&self, session: &str) -> String {
        let text = BrowserCommand::Content {
            format: Default::default(),
        };
        self.command(session, text)
            .await
            .content
            .unwrap_or_default()
    }

    /// The index of the first element whose name or input type matches.
    pub async fn index_of(
        &self,
        session: &str,
        matches: impl Fn(&messages::browser::BrowserElement) -> bool,
    ) -> u32 {
        let listed = self.command(session, BrowserCommand::Elements).await;
        listed
            .elements
            .iter()
            .find(|e| matches(e))
            .unwrap_or_else(|| panic!("no such element in {:?}", listed.elements))
            .index
    }

    /// Decides every confirmation asked from now on with `approve`, until the returned task
    /// is aborted. Returns the decided ids through the task's channel.
    pub async fn decide_all(
        &self,
        approve: bool,
    ) -> (
        tokio::task::JoinHandle<()>,
        tokio::sync::mpsc::UnboundedReceiver<String>,
    ) {
        use futures::StreamExt;
        let confirm = self.client.confirm();
        let mut events = confirm.watch().await.expect("watch confirmations");
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            while let Some(Ok(c)) = events.next().await {
                if c.state == messages::confirm::ConfirmState::Pending {
                    let decide = messages::confirm::ConfirmDecide {
                        id: c.id.clone(),
                        approve,
                        by: "test".into(),
                        reason: Some(format!(
                            "the test {}",
                            if approve { "approves" } else { "denies" }
                        )),
                        scope: Default::default(),
                        by_account: None,
                    };
                    confirm.decide(&decide).await.expect("decide");
                    let _ = tx.send(c.id);
                }
            }
        });
        (task, rx)
    }
}

/// `with` filled into a default payload.
pub fn req(f: impl FnOnce(&mut BrowserPayload)) -> BrowserPayload {
    let mut r = BrowserPayload::default();
    f(&mut r);
    r
}

/// The typed request `payload` makes for `action` (which must be valid).
pub fn typed(action: BrowserAction, payload: BrowserPayload) -> BrowserRequest {
    BrowserRequest::parse(action, payload).expect("a valid request")
}
