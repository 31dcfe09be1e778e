//! The mesh under test: a NATS connection to it (loopback only), and, for `--spawn-mesh`, the
//! `sandmesh up` process itself, plus extra service processes (`sandmesh serve <name>`).

use std::net::{IpAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use async_nats::jetstream;
use messages::{ServiceName, Subjects};
use sandmesh_client::MeshClient;

/// The services `sandmesh up` runs; the mesh is ready when each answers `$SRV.PING.<name>`.
pub const SERVICES: &[ServiceName] = &[
    ServiceName::RiskAssessor,
    ServiceName::Confirmation,
    ServiceName::WorkspaceStore,
    ServiceName::DockerExecutor,
    ServiceName::Scheduler,
];

/// A client's view of the mesh.
#[derive(Clone)]
pub struct Mesh {
    /// As given, credentials included: scenarios open more connections and start services
    /// with it (without them, a spawned mesh refused every one).
    pub url: String,
    pub subjects: Subjects,
    pub js: jetstream::Context,
    /// The typed clients, on the same connection and JetStream context.
    pub api: MeshClient,
    /// Whether sync requests keep the execution id they were built with (`--sync-ids`).
    pub sync_ids: bool,
}

/// The host of a `nats://host:port` URL.
pub fn url_host(url: &str) -> Option<&str> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split('/').next()?;
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if let Some(v6) = host_port.strip_prefix('[') {
        return v6.split_once(']').map(|(h, _)| h);
    }
    Some(host_port.split(':').next().unwrap_or(host_port))
}

/// The loadtest sends traffic to this machine only: a load generator pointed at a shared
/// server by mistake would be an attack on it.
pub fn is_loopback_url(url: &str) -> bool {
    // A cluster's URL lists every server: each must be here.
    let servers = sandmesh_auth::servers(url);
    !servers.is_empty()
        && servers.iter().all(|server| match url_host(server) {
            Some("localhost") => true,
            Some(h) => h.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback()),
            None => false,
        })
}

impl Mesh {
    pub async fn connect(url: &str, subjects: Subjects, timeout: Duration) -> anyhow::Result<Self> {
        if !is_loopback_url(url) {
            bail!("{url} is not a loopback address; the loadtest only targets this machine");
        }
        let given = url;
        let (url, credentials) = sandmesh_auth::split_url(url);
        let mut options = async_nats::ConnectOptions::new();
        if let Some(c) = credentials {
            options = options.user_and_password(c.user, c.password);
        }
        let client = options
            .name("sandmesh-loadtest")
            .request_timeout(Some(timeout))
            // Burst and assess keep many thousands of requests in flight.
            .subscription_capacity(1 << 20)
            .connect(sandmesh_auth::servers(&url))
            .await
            .with_context(|| format!("cannot reach NATS at {url}; is the mesh up?"))?;
        let js = jetstream::ContextBuilder::new()
            .timeout(Duration::from_secs(30))
            .max_ack_inflight(4096)
            .backpressure_on_inflight(true)
            .build(client.clone());
        let api = MeshClient::new(client, subjects.clone())
            .with_timeout(timeout)
            .with_jetstream(js.clone());
        Ok(Self {
            url: given.to_string(),
            subjects,
            js,
            api,
            sync_ids: false,
        })
    }

    /// How many instances of `service` answer `$SRV.PING.<service>` within `wait`.
    pub async fn instances(&self, service: ServiceName, wait: Duration) -> usize {
        let pings = self.api.status().ping(Some(service), wait).await;
        pings.map_or(0, |p| p.len())
    }

    /// Bounded poll until every service answers (at least `at_least` instances of `service`).
    pub async fn wait_for(&self, service: ServiceName, at_least: usize, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if self.instances(service, Duration::from_millis(300)).await >= at_least {
                return true;
            }
        }
        false
    }
}

/// A free loopback TCP port (bound, read, released: a race with other programs is possible
/// but harmless, the server would fail loudly).
pub fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A child process of the mesh, stopped with SIGTERM (then SIGKILL) when dropped.
pub struct MeshProcess {
    pub label: String,
    child: Child,
    /// The HTTP gateway of a `sandmesh up` started by [`spawn_up`].
    pub gateway: Option<std::net::SocketAddr>,
}

impl MeshProcess {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Has it exited already (a crash at start)?
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// SIGTERM, a bounded wait for the graceful shutdown, then SIGKILL.
    pub fn stop(&mut self, grace: Duration) {
        if self.exited().is_some() {
            return;
        }
        // `kill` instead of libc: the workspace forbids unsafe code.
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if self.exited().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!(
            "loadtest: {} did not stop within {grace:?}; killing it",
            self.label
        );
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for MeshProcess {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(15));
    }
}

/// Starts `program args..` with `env` added, its output appended to `log`.
pub fn spawn(
    label: &str,
    program: &Path,
    args: &[&str],
    env: &[(&str, String)],
    log: &Path,
) -> anyhow::Result<MeshProcess> {
    if !program.exists() {
        bail!(
            "{} not found; build it first: cargo build --release -p sandmesh",
            program.display()
        );
    }
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    for (k, v) in env {
        // An empty value removes the variable (e.g. so `up` starts its own nats-server).
        if v.is_empty() {
            cmd.env_remove(k);
        } else {
            cmd.env(k, v);
        }
    }
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {}", program.display()))?;
    Ok(MeshProcess {
        label: label.to_string(),
        child,
        gateway: None,
    })
}

/// `sandmesh up` on its own nats-server (a free port, data in `data_dir`), ready when every
/// service answers. Returns the process and the NATS URL.
pub async fn spawn_up(
    sandmesh: &Path,
    data_dir: &Path,
    subjects: &Subjects,
    metrics_addr: Option<std::net::SocketAddr>,
    limit: Duration,
) -> anyhow::Result<(MeshProcess, String)> {
    let port = free_port()?;
    let url = format!("nats://127.0.0.1:{port}");
    let gateway: std::net::SocketAddr = ([127, 0, 0, 1], free_port()?).into();
    let log = data_dir.join("sandmesh-up.log");
    let data = data_dir.join("mesh");
    let mut process = spawn(
        "sandmesh up",
        sandmesh,
        &[
            "up",
            "--data-dir",
            &data.to_string_lossy(),
            "--nats-port",
            &port.to_string(),
        ],
        &[
            ("SANDMESH_NATS_URL", String::new()),
            (
                "SANDMESH_METRICS_ADDR",
                metrics_addr.map(|a| a.to_string()).unwrap_or_default(),
            ),
            ("SANDMESH_GATEWAY_ADDR", gateway.to_string()),
            // The `http` scenario's one key makes thousands of requests a second.
            ("SANDMESH_GATEWAY_RATE", "1000000".into()),
            ("SANDMESH_GATEWAY_BURST", "1000000".into()),
        ],
        &log,
    )?;
    process.gateway = Some(gateway);
    let deadline = Instant::now() + limit;
    let (mesh, url) = loop {
        if let Some(status) = process.exited() {
            bail!("sandmesh up exited ({status}); see {}", log.display());
        }
        // `up` runs NATS with authentication: the admin's credentials are in the tenancy
        // file it writes before starting the server.
        let tenancy = sandmesh_auth::Tenancy::load(&data.join("tenancy.json")).ok();
        let admin = tenancy
            .as_ref()
            .and_then(|t| t.credentials(sandmesh_auth::Role::Admin));
        if let Some(admin_url) = admin.map(|c| c.url(&url)) {
            let connected = Mesh::connect(&admin_url, subjects.clone(), Duration::from_secs(5));
            if let Ok(m) = connected.await {
                break (m, admin_url);
            }
        }
        if Instant::now() > deadline {
            bail!("NATS of sandmesh up did not come up; see {}", log.display());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for &service in SERVICES {
        let left = deadline.saturating_duration_since(Instant::now());
        if !mesh.wait_for(service, 1, left).await {
            bail!(
                "{service} did not answer within {limit:?}; see {}",
                log.display()
            );
        }
    }
    Ok((process, url))
}

/// `target/release/sandmesh` beside the loadtest binary, else in `./target/release`.
pub fn default_sandmesh_bin() -> PathBuf {
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        let beside = dir.join("sandmesh");
        if beside.exists() {
            return beside;
        }
    }
    PathBuf::from("target/release/sandmesh")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_extracted_from_urls() {
        assert_eq!(url_host("nats://127.0.0.1:4222"), Some("127.0.0.1"));
        assert_eq!(url_host("nats://u:p@localhost:4222"), Some("localhost"));
        assert_eq!(url_host("nats://[::1]:4222"), Some("::1"));
        assert_eq!(url_host("127.0.0.1"), Some("127.0.0.1"));
    }

    #[test]
    fn only_loopback_urls_are_accepted() {
        assert!(is_loopback_url("nats://127.0.0.1:4222"));
        assert!(is_loopback_url("nats://127.0.0.9:1"));
        assert!(is_loopback_url("nats://localhost:4222"));
        assert!(is_loopback_url("nats://[::1]:4222"));
        assert!(!is_loopback_url("nats://10.0.0.1:4222"));
        assert!(!is_loopback_url("nats://demo.nats.io:4222"));
        // A cluster's list: every server must be here.
        assert!(is_loopback_url("nats://u:p@127.0.0.1:1,nats://127.0.0.1:2"));
        assert!(!is_loopback_url("nats://127.0.0.1:1,nats://10.0.0.1:2"));
        assert!(!is_loopback_url(" , "));
        assert!(!is_loopback_url("nats://127.0.0.1.evil.example:4222"));
    }
}
