//! The instance's Chromium: started on first use, one per agent, with its own
//! `--user-data-dir`, remote debugging on 127.0.0.1 only; reached from outside through the
//! agent (`/json/version`, `/devtools/*` relayed), which checks the API key.
//!
//! Flags and why: `--headless` (no display); `--no-sandbox`, because Chromium's own sandbox
//! needs user namespaces or a setuid helper, which `CapDrop ALL`, `no-new-privileges` and
//! Docker's default seccomp profile all refuse — the container is the boundary instead, and
//! that default seccomp profile stays on (unlike upstream AIO's `seccomp=unconfined`);
//! `--disable-dev-shm-usage`, because Docker's default 64 MiB `/dev/shm` crashes renderers
//! (shared memory goes to `/tmp` instead); a fresh `--user-data-dir` so no profile state is
//! shared or locked (`SingletonLock`).

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::sync::Mutex;

/// How long Chromium may take to open its debugging port.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound of one request to its debugging port's HTTP endpoints.
const HTTP_LIMIT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub struct BrowserConfig {
    pub bin: PathBuf,
    /// Chromium's remote-debugging port on 127.0.0.1.
    pub port: u16,
    /// Where fresh user-data dirs are made.
    pub data_root: PathBuf,
    /// `BROWSER_EXTRA_ARGS` (upstream's name), e.g. `--proxy-server=...`.
    pub extra_args: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum BrowserError {
    #[error("starting {bin}")]
    Spawn {
        bin: String,
        #[source]
        source: std::io::Error,
    },
    #[error("making the user-data dir {dir}")]
    DataDir {
        dir: String,
        #[source]
        source: std::io::Error,
    },
    #[error("chromium exited before opening its debugging port ({status})")]
    Exited { status: String },
    #[error("chromium did not open its debugging port within {0:?}")]
    StartTimeout(Duration),
    #[error("talking to chromium's debugging port")]
    Http(#[source] cdp::CdpError),
    #[error("chromium's /json/version is not JSON")]
    Json(#[source] serde_json::Error),
}

struct Running {
    child: tokio::process::Child,
    data_dir: PathBuf,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(id) = self.child.id() {
            // Chromium's zygote and renderers share its process group.
            killpg(Pid::from_raw(id as i32), Signal::SIGKILL).ok();
        }
        std::fs::remove_dir_all(&self.data_dir).ok();
    }
}

/// The agent's one Chromium.
pub struct Browser {
    config: BrowserConfig,
    running: Mutex<Option<Running>>,
    started: AtomicU64,
}

impl Browser {
    pub fn new(config: BrowserConfig) -> Self {
        Self {
            config,
            running: Mutex::new(None),
            started: AtomicU64::new(0),
        }
    }

    pub fn port(&self) -> u16 {
        self.config.port
    }

    /// Chromium's `/json/version`, starting (or restarting, if it died) Chromium first.
    pub async fn version(&self) -> Result<serde_json::Value, BrowserError> {
        let mut running = self.running.lock().await;
        if let Some(r) = running.as_mut() {
            if r.child.try_wait().ok().flatten().is_none() {
                if let Ok(v) = self.fetch_version().await {
                    return Ok(v);
                }
            }
            *running = None;
        }
        let mut started = self.start().await?;
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(v) = self.fetch_version().await {
                *running = Some(started);
                return Ok(v);
            }
            if let Ok(Some(status)) = started.child.try_wait() {
                return Err(BrowserError::Exited {
                    status: status.to_string(),
                });
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(BrowserError::StartTimeout(START_TIMEOUT));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn start(&self) -> Result<Running, BrowserError> {
        let n = self.started.fetch_add(1, Ordering::Relaxed);
        let data_dir = self
            .config
            .data_root
            .join(format!("chromium-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&data_dir).map_err(|source| BrowserError::DataDir {
            dir: data_dir.display().to_string(),
            source,
        })?;
        let child = tokio::process::Command::new(&self.config.bin)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-dev-shm-usage",
                "--disable-gpu",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-background-networking",
                "--disable-extensions",
                "--disable-sync",
                "--window-size=1280,720",
                "--remote-debugging-address=127.0.0.1",
            ])
            .arg(format!("--remote-debugging-port={}", self.config.port))
            .arg(format!("--user-data-dir={}", data_dir.display()))
            .args(&self.config.extra_args)
            .arg("about:blank")
            .env_remove(crate::exec::API_KEY_VAR)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| BrowserError::Spawn {
                bin: self.config.bin.display().to_string(),
                source,
            })?;
        Ok(Running { child, data_dir })
    }

    async fn fetch_version(&self) -> Result<serde_json::Value, BrowserError> {
        let body = local_get(self.config.port, "/json/version").await?;
        serde_json::from_slice(&body).map_err(BrowserError::Json)
    }

    /// Stops Chromium (the agent is shutting down).
    pub async fn stop(&self) {
        self.running.lock().await.take();
    }
}

/// `GET path` from Chromium's debugging port on 127.0.0.1.
pub async fn local_get(port: u16, path: &str) -> Result<Bytes, BrowserError> {
    cdp::request(&format!("127.0.0.1:{port}"), "GET", path, HTTP_LIMIT)
        .await
        .map_err(BrowserError::Http)
}
