//! A headless Chromium of its own on this host, for tests: its own profile directory, its
//! debugging port picked by Chromium (`--remote-debugging-port=0`) and read back from the
//! `DevToolsActivePort` file it writes there. The AIO agent starts its Chromium differently
//! (a fixed port the agent relays, its own process group, restarts), so it does not use this.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::{CdpError, Connection};

/// Debian's `chromium`: `SANDMESH_CHROMIUM`, else `chromium` on the `PATH`.
pub fn chromium_binary() -> Result<PathBuf, CdpError> {
    if let Some(path) = std::env::var_os("SANDMESH_CHROMIUM") {
        return Ok(PathBuf::from(path));
    }
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join("chromium"))
                .find(|p| p.is_file())
        })
        .ok_or(CdpError::NoChromium)
}

/// A running headless Chromium; dropping it kills it and removes its profile.
pub struct LocalChromium {
    child: tokio::process::Child,
    ws_url: String,
    profile: PathBuf,
}

impl Drop for LocalChromium {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// Launches by this process so far (each gets a profile directory of its own).
static LAUNCHED: AtomicU64 = AtomicU64::new(0);

impl LocalChromium {
    /// Starts `bin` headless with `args` added (a window size, say), waiting at most
    /// `within` for its debugging port.
    pub async fn launch(bin: &Path, args: &[&str], within: Duration) -> Result<Self, CdpError> {
        let spawn_failed = |source| CdpError::Spawn {
            bin: bin.display().to_string(),
            source,
        };
        let n = LAUNCHED.fetch_add(1, Ordering::Relaxed);
        let profile =
            std::env::temp_dir().join(format!("sandmesh-chromium-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&profile).map_err(spawn_failed)?;
        let mut child = tokio::process::Command::new(bin)
            .args([
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .args(args)
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                let _ = std::fs::remove_dir_all(&profile);
                spawn_failed(e)
            })?;
        let active = profile.join("DevToolsActivePort");
        let deadline = tokio::time::Instant::now() + within;
        loop {
            // The port, then the browser's socket path ending in a 36-character id: a file
            // read while Chromium still writes it has no whole id yet.
            let written = std::fs::read_to_string(&active).unwrap_or_default();
            let mut lines = written.lines();
            let port = lines.next().filter(|p| p.parse::<u16>().is_ok());
            let path = lines.next().filter(|p| {
                p.strip_prefix("/devtools/browser/")
                    .is_some_and(|id| id.len() == 36)
            });
            if let (Some(port), Some(path)) = (port, path) {
                return Ok(Self {
                    child,
                    ws_url: format!("ws://127.0.0.1:{port}{path}"),
                    profile,
                });
            }
            if let Ok(Some(status)) = child.try_wait() {
                let _ = std::fs::remove_dir_all(&profile);
                return Err(spawn_failed(std::io::Error::other(format!(
                    "exited before opening its debugging port ({status})"
                ))));
            }
            if tokio::time::Instant::now() >= deadline {
                let _ = child.start_kill();
                let _ = std::fs::remove_dir_all(&profile);
                return Err(CdpError::StartTimeout(within));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The browser's own CDP socket.
    pub fn ws_url(&self) -> &str {
        &self.ws_url
    }

    /// A new connection to the browser, each command bounded by `limit`.
    pub async fn connect(&self, limit: Duration) -> Result<Connection, CdpError> {
        Connection::open(&self.ws_url, limit).await
    }

    /// Kills Chromium and waits for it (then the drop removes its profile).
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}
