//! What the CLI's end-to-end tests share: the real `sandmesh` binary run as a user runs it,
//! bounded waits for it, and the sandbox containers Docker holds.

use std::path::Path;
use std::process::{Command, ExitStatus, Output, Stdio};
use std::time::Duration;

use test_support::repo_root;

pub const SANDMESH: &str = env!("CARGO_BIN_EXE_sandmesh");

/// Ids of the containers carrying every one of `labels` (`key` or `key=value`), running or not.
pub fn containers(labels: &[String]) -> Vec<String> {
    let mut cmd = Command::new("docker");
    cmd.args(["ps", "-aq", "--no-trunc"]);
    for label in labels {
        cmd.args(["--filter", &format!("label={label}")]);
    }
    let out = cmd.output().expect("docker ps");
    assert!(out.status.success(), "docker ps: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// Runs a command to completion, its output captured; past `limit` it is killed and the test
/// fails.
pub async fn run_bounded(cmd: Command, limit: Duration) -> Output {
    let what = format!("{cmd:?}");
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.kill_on_drop(true);
    match tokio::time::timeout(limit, cmd.output()).await {
        Ok(out) => out.unwrap_or_else(|e| panic!("{what}: {e}")),
        Err(_) => panic!("{what} did not finish within {limit:?}"),
    }
}

/// `sandmesh <args>` against the NATS at `url`, as a user runs it, bounded by `limit`.
pub async fn sandmesh(url: &str, args: &[&str], limit: Duration) -> Output {
    let mut cmd = Command::new(SANDMESH);
    cmd.args(args).env("SANDMESH_NATS_URL", url);
    run_bounded(cmd, limit).await
}

/// `sandmesh <args>` with its data directory in `dir`, bounded; fails the test unless it
/// succeeds.
pub async fn sandmesh_in_dir(dir: &Path, args: &[&str]) -> Output {
    let mut cmd = Command::new(SANDMESH);
    cmd.args(args).env("SANDMESH_DATA_DIR", dir);
    let out = run_bounded(cmd, Duration::from_secs(60)).await;
    assert!(
        out.status.success(),
        "sandmesh {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `sandmesh up` against a given NATS, its stderr in `log`; killed on drop if still running.
pub struct Up {
    child: tokio::process::Child,
    log: std::path::PathBuf,
}

impl Up {
    pub fn start(nats_url: &str, env: &[(&str, &str)], log: &Path) -> Self {
        let path = log.to_path_buf();
        let log = std::fs::File::create(log).expect("log file");
        let child = tokio::process::Command::new(SANDMESH)
            .arg("up")
            .env("SANDMESH_NATS_URL", nats_url)
            .envs(env.iter().copied())
            .current_dir(repo_root())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("spawn sandmesh up");
        Self { child, log: path }
    }

    /// What `up` has written to its log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Until `up` says the mesh is up (once every service answers a real request); fails the
    /// test at once with the end of the log when `up` exits first, or after 300 s.
    pub async fn until_up(&mut self) {
        until_logged(&mut self.child, &self.log, "sandmesh: mesh is up").await;
    }

    /// Until `up` says the mesh is up and the scheduler answers on `exec` at `url` (the probe
    /// is malformed: it is refused before anything runs).
    pub async fn wait_ready(&mut self, url: &str) {
        self.until_up().await;
        let client = test_support::connect(url).await;
        let exec = messages::Subjects::default().exec();
        test_support::eventually(
            "the scheduler to serve exec",
            Duration::from_secs(60),
            || {
                let (client, exec) = (client.clone(), exec.clone());
                async move { client.request(exec, "not json".into()).await.ok() }
            },
        )
        .await;
    }

    /// SIGTERM, then its exit status within `limit` (the test fails past it).
    pub async fn stop(&mut self, limit: Duration) -> ExitStatus {
        let pid = self.child.id().expect("running").to_string();
        let term = Command::new("kill").args(["-TERM", &pid]).status();
        assert!(term.is_ok_and(|s| s.success()), "kill -TERM {pid}");
        match tokio::time::timeout(limit, self.child.wait()).await {
            Ok(status) => status.expect("wait"),
            Err(_) => panic!("`sandmesh up` did not exit within {limit:?} of SIGTERM"),
        }
    }
}

/// Until the log of the `up` running as `child` holds `needle`. Fails the test with the log's
/// end when `up` exits first or after 300 s: a mesh that cannot start says why at once.
pub async fn until_logged(child: &mut tokio::process::Child, log: &Path, needle: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains(needle) {
            return;
        }
        let exited = child.try_wait().expect("sandmesh up's status");
        if exited.is_some() || tokio::time::Instant::now() > deadline {
            let tail: Vec<&str> = text.lines().rev().take(60).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            panic!(
                "`up` did not log {needle:?} ({}); its log ends:\n{}",
                exited.map_or("300 s passed".to_string(), |s| format!("it exited: {s}")),
                tail.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
