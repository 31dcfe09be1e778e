//! The `sandmesh` program end to end, as a user runs it: `up` with its embedded NATS and the
//! sample execution (the README's first command), and a mesh serving a Python client
//! (nats-py, JSON), the `exec` and `status` commands, then stopping cleanly on SIGTERM.
//! Real nats-server, real Docker, the real binary.

use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use test_support::{
    free_port, nats_server_binary, python_client, repo_root, require_docker, NatsServer,
};

const SANDMESH: &str = env!("CARGO_BIN_EXE_sandmesh");

/// The tests run one at a time: each counts the sandbox containers before and after its mesh,
/// and another test's mesh would show up in that count.
static ONE_MESH_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_mesh_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_MESH_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn sandbox_containers() -> BTreeSet<String> {
    let out = Command::new("docker")
        .args(["ps", "-aq", "--no-trunc", "--filter", "label=sandmesh"])
        .output()
        .expect("docker ps");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// Runs a command to completion within `limit`, killing it past that.
fn run_bounded(cmd: &mut Command, limit: Duration) -> std::process::Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + limit;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{cmd:?} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("output")
}

#[test]
fn up_with_embedded_nats_runs_the_sample_and_stops() {
    require_docker();
    let _one = one_mesh_at_a_time();
    let before = sandbox_containers();
    let data = tempfile::tempdir().unwrap();
    let out = run_bounded(
        Command::new(SANDMESH)
            .args([
                "up",
                "--demo",
                "--once",
                "--nats-port",
                &free_port().to_string(),
            ])
            .arg("--data-dir")
            .arg(data.path())
            .env_remove("SANDMESH_NATS_URL")
            .env("SANDMESH_NATS_SERVER", nats_server_binary())
            .current_dir(repo_root()),
        Duration::from_secs(600),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "up failed: {stdout}\n{stderr}");
    assert!(stdout.contains("hello from python 3."), "{stdout}");
    assert!(stdout.contains("hello from node v"), "{stdout}");
    assert!(stdout.contains("hello from GNU bash"), "{stdout}");
    assert!(
        stdout.contains("status=rejected tier=reject risk=critical"),
        "{stdout}"
    );
    let leaked: Vec<_> = sandbox_containers().difference(&before).cloned().collect();
    assert!(
        leaked.is_empty(),
        "containers left after up stopped: {leaked:?}"
    );
}

/// `sandmesh up` against a given NATS, stopped with SIGTERM on drop.
struct Mesh(Child);

impl Mesh {
    fn start(url: &str) -> Self {
        let child = Command::new(SANDMESH)
            .arg("up")
            .env("SANDMESH_NATS_URL", url)
            .current_dir(repo_root())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn sandmesh up");
        Self(child)
    }

    /// SIGTERM, then the exit status within `limit`.
    fn stop(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.0.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

impl Drop for Mesh {
    fn drop(&mut self) {
        if self.stop(Duration::from_secs(30)).is_none() {
            let _ = self.0.kill();
        }
    }
}

fn wait_ready(url: &str) {
    let ok = run_bounded(
        Command::new(SANDMESH)
            .arg("status")
            .env("SANDMESH_NATS_URL", url),
        Duration::from_secs(30),
    );
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut last = String::from_utf8_lossy(&ok.stdout).to_string();
    while !(last.contains("scheduler") && last.contains("docker-executor")) {
        assert!(
            Instant::now() < deadline,
            "the mesh did not come up: {last}"
        );
        std::thread::sleep(Duration::from_millis(250));
        let out = run_bounded(
            Command::new(SANDMESH)
                .arg("status")
                .env("SANDMESH_NATS_URL", url),
            Duration::from_secs(30),
        );
        last = String::from_utf8_lossy(&out.stdout).to_string();
    }
}

#[test]
fn a_python_client_and_the_cli_use_a_running_mesh() {
    require_docker();
    let _one = one_mesh_at_a_time();
    let python = python_client();
    let nats = NatsServer::start();
    let mut mesh = Mesh::start(&nats.url());
    wait_ready(&nats.url());

    let out = run_bounded(
        Command::new(&python)
            .arg(repo_root().join("clients/python/exec.py"))
            .args(["--url", &nats.url()]),
        Duration::from_secs(300),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 4, "{stdout}");
    assert_eq!(
        (lines[0]["status"].as_str(), lines[0]["stdout"].as_str()),
        (Some("ok"), Some("42\n"))
    );
    assert_eq!(
        (lines[1]["status"].as_str(), lines[1]["stdout"].as_str()),
        (Some("ok"), Some("3\n"))
    );
    assert_eq!(lines[2]["error"], 400, "unknown language: {}", lines[2]);
    assert!(
        lines[2]["message"]
            .as_str()
            .unwrap_or("")
            .contains("python"),
        "{}",
        lines[2]
    );
    assert_eq!(lines[3]["mode"], "async");
    assert_eq!(
        (lines[3]["status"].as_str(), lines[3]["stdout"].as_str()),
        (Some("ok"), Some("async-42\n"))
    );
    assert_eq!(
        lines[3]["duplicate_publish_acked"], true,
        "the second publish was deduplicated"
    );

    // The CLI prints the program's output and exits with its exit code.
    let out = run_bounded(
        Command::new(SANDMESH)
            .args(["exec", "--lang", "shell", "echo from-cli; exit 3"])
            .env("SANDMESH_NATS_URL", nats.url()),
        Duration::from_secs(120),
    );
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "from-cli\n");

    let status = mesh
        .stop(Duration::from_secs(60))
        .expect("up stops within 60 s of SIGTERM");
    assert!(status.success(), "up exited with {status}");
}
