//! The embedded NATS server of `sandmesh up`: when no `SANDMESH_NATS_URL` is configured, a
//! current nats-server with JetStream is started with its data in a project-local directory.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use sandmesh_auth::Tenancy;

const HINT: &str = "run scripts/install-tools.sh (installs nats-server into .tools/bin), \
    or set SANDMESH_NATS_SERVER to a nats-server >= 2.11, or SANDMESH_NATS_URL to a running one";

/// A nats-server child process, stopped (SIGTERM, then SIGKILL) when dropped.
pub struct LocalNats {
    child: Child,
    pub url: String,
}

impl Drop for LocalNats {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn version_ok(bin: &Path) -> Option<bool> {
    let out = Command::new(bin).arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let v = text.split_whitespace().find_map(|w| w.strip_prefix('v'))?;
    let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next()?, parts.next()?);
    Some((major, minor) >= (2, 11))
}

/// `SANDMESH_NATS_SERVER`, then `.tools/bin/nats-server` here or beside the executable's
/// checkout, then PATH.
pub fn find_binary() -> anyhow::Result<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os("SANDMESH_NATS_SERVER") {
        candidates.push(p.into());
    }
    candidates.push(PathBuf::from(".tools/bin/nats-server"));
    if let Ok(exe) = std::env::current_exe() {
        // target/<profile>/sandmesh → the checkout's .tools.
        if let Some(root) = exe.ancestors().nth(3) {
            candidates.push(root.join(".tools/bin/nats-server"));
        }
    }
    candidates.push(PathBuf::from("nats-server"));
    for bin in candidates {
        match version_ok(&bin) {
            Some(true) => return Ok(bin),
            Some(false) => bail!("{} is older than 2.11 (no KV TTLs); {HINT}", bin.display()),
            None => continue,
        }
    }
    bail!("no nats-server found; {HINT}")
}

fn listening(port: u16) -> bool {
    TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200)).is_ok()
}

/// The accounts file the server config includes; `sandmesh tenant add` rewrites it and has
/// the running server reload it.
const ACCOUNTS_FILE: &str = "accounts.conf";
const PID_FILE: &str = "nats.pid";

/// Writes the server's accounts file (0600: it holds every password).
pub fn write_accounts(data_dir: &Path, tenancy: &Tenancy) -> anyhow::Result<()> {
    let path = data_dir.join(ACCOUNTS_FILE);
    sandmesh_auth::write_private(&path, &tenancy.accounts_config())?;
    Ok(())
}

/// Writes `nats.conf` (and the accounts file it includes) into `dir`: a server listening on
/// `listen` with JetStream in `store` (fsync on every write: acked jobs survive a crash).
pub fn write_config(
    dir: &Path,
    listen: &str,
    store: &Path,
    tenancy: Option<&Tenancy>,
) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut config = format!(
        "listen: {listen}\nmax_payload: 1MB\njetstream {{\n  store_dir: {store:?}\n  sync_interval: always\n}}\npid_file: {:?}\n",
        dir.join(PID_FILE),
    );
    if let Some(tenancy) = tenancy {
        write_accounts(dir, tenancy)?;
        config.push_str(&format!("include {ACCOUNTS_FILE:?}\n"));
    }
    let conf = dir.join("nats.conf");
    std::fs::write(&conf, config).with_context(|| format!("writing {}", conf.display()))?;
    Ok(conf)
}

/// Has the running server re-read its configuration (new tenants, changed scopes).
///
/// Twice: nats-server (2.15) applies a reload that introduces a new account without wiring
/// that account's service imports to the exporting account — the new tenant connects, and
/// every request it sends gets "no responders". A second reload, with the account now
/// known, wires them (measured with a bare server and two accounts: one reload, no
/// responders; two, answered, every time). The reload is idempotent, so the second costs
/// nothing when the first was enough.
pub fn reload(data_dir: &Path) -> anyhow::Result<()> {
    let pid_file = data_dir.join(PID_FILE);
    let pid = std::fs::read_to_string(&pid_file)
        .with_context(|| format!("reading {} (is `sandmesh up` running?)", pid_file.display()))?;
    let bin = find_binary()?;
    for round in 0..2 {
        if round > 0 {
            // The signal only queues the reload; the second must find the first applied.
            std::thread::sleep(RELOAD_SETTLE);
        }
        let status = Command::new(&bin)
            .arg("--signal")
            .arg(format!("reload={}", pid.trim()))
            .status()
            .context("signalling nats-server")?;
        if !status.success() {
            bail!("nats-server did not take the reload signal ({status})");
        }
    }
    Ok(())
}

/// How long a configuration reload is given before the next one (it takes a few ms).
const RELOAD_SETTLE: std::time::Duration = std::time::Duration::from_millis(500);

/// Starts nats-server on 127.0.0.1:`port` with JetStream storage in `data_dir`, with the
/// accounts, users and permissions of `tenancy` (none: no authentication at all).
pub fn start(data_dir: &Path, port: u16, tenancy: Option<&Tenancy>) -> anyhow::Result<LocalNats> {
    if listening(port) {
        bail!(
            "port {port} is taken; set SANDMESH_NATS_URL to use that server, or pick --nats-port"
        );
    }
    let bin = find_binary()?;
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("creating {}", data_dir.display()))?;
    let data_dir = data_dir.canonicalize()?;
    let log = data_dir.join("nats.log");
    let conf = write_config(
        &data_dir,
        &format!("127.0.0.1:{port}"),
        &data_dir.join("jetstream"),
        tenancy,
    )?;
    let child = Command::new(&bin)
        .arg("-c")
        .arg(&conf)
        .arg("-l")
        .arg(&log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let mut server = LocalNats {
        child,
        url: format!("nats://127.0.0.1:{port}"),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("Server is ready")
        {
            return Ok(server);
        }
        if let Ok(Some(status)) = server.child.try_wait() {
            bail!("nats-server exited with {status}; see {}", log.display());
        }
        if Instant::now() > deadline {
            bail!(
                "nats-server did not get ready within 20 s; see {}",
                log.display()
            );
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}
