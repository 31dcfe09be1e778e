//! The `sandmesh` program end to end, as a user runs it: `up` with its embedded NATS and the
//! sample execution (the README's first command), and a mesh serving a Python client
//! (nats-py, JSON), the `exec` and `status` commands, then stopping cleanly on SIGTERM.
//! Real nats-server, real Docker, the real binary.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use test_support::{
    free_port, nats_server_binary, python_client, repo_root, require_docker, NatsServer,
};

use crate::common::{containers, run_bounded, sandmesh, Up, SANDMESH};

/// A test-run mark of this test's own (`SANDMESH_TEST_RUN`'s form: a live pid and its start,
/// so `scripts/test.sh` sweeps what is left once this process is gone). Every container the
/// mesh it is given to makes carries it, so a leak check counts this mesh's containers and no
/// one else's: other tests' meshes run beside it.
fn own_test_run() -> String {
    format!("{}-{}", std::process::id(), unix_now())
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// The containers made since `since` (Unix seconds) with the test-run mark `run`, gone or not:
/// the daemon's own record of them.
fn created_with_run(run: &str, since: u64) -> BTreeSet<String> {
    let out = Command::new("docker")
        .args(["events", "--since", &since.to_string(), "--until"])
        .arg(unix_now().to_string())
        .args(["--filter", "type=container", "--filter", "event=create"])
        .args([
            "--filter",
            &format!("label={}={run}", ::containers::LABEL_TEST_RUN),
        ])
        .args(["--format", "{{.Actor.ID}}"])
        .output()
        .expect("docker events");
    assert!(out.status.success(), "docker events: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

fn containers_of_run(run: &str) -> BTreeSet<String> {
    containers(&[format!("{}={run}", ::containers::LABEL_TEST_RUN)])
        .into_iter()
        .collect()
}

#[tokio::test]
async fn up_with_embedded_nats_runs_the_sample_and_stops() {
    require_docker();
    let run = own_test_run();
    let started = unix_now();
    let data = tempfile::tempdir().unwrap();
    let mut up = Command::new(SANDMESH);
    up.args([
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
    .env("SANDMESH_TEST_RUN", &run)
    .current_dir(repo_root());
    let out = run_bounded(up, Duration::from_secs(600)).await;
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
    // The mark reached the mesh's containers (so the leak check below counts them) ...
    let made = created_with_run(&run, started);
    assert!(!made.is_empty(), "no container was made with {run}");
    // ... and none of them is left.
    let leaked = containers_of_run(&run);
    assert!(
        leaked.is_empty(),
        "containers left after up stopped: {leaked:?} (of {made:?})"
    );
}

#[tokio::test]
async fn a_python_client_and_the_cli_use_a_running_mesh() {
    require_docker();
    let python = python_client();
    let nats = NatsServer::start();
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut mesh = Up::start(&nats.url(), &[], log.path());
    mesh.wait_ready(&nats.url()).await;

    let mut client = Command::new(&python);
    client
        .arg(repo_root().join("clients/python/exec.py"))
        .args(["--url", &nats.agent_url("default")]);
    let out = run_bounded(client, Duration::from_secs(300)).await;
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
    let mut exec = Command::new(SANDMESH);
    exec.args(["exec", "--lang", "shell", "echo from-cli; exit 3"])
        .env("SANDMESH_NATS_URL", nats.url());
    let out = run_bounded(exec, Duration::from_secs(120)).await;
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "from-cli\n");

    // A session opened by the CLI gives its executions its env and its default timeout.
    let limit = Duration::from_secs(120);
    let open = [
        "sessions",
        "open",
        "cli-s",
        "--env",
        "GREETING=hi",
        "--timeout-ms",
        "1500",
        "--ttl",
        "1h",
    ];
    let out = sandmesh(&nats.url(), &open, limit).await;
    assert!(out.status.success(), "{out:?}");
    let record: serde_json::Value = serde_json::from_slice(&out.stdout).expect("the record");
    assert_eq!(record["env"]["GREETING"], "hi", "{record}");
    assert!(record["expires_at"].as_u64().is_some(), "{record}");
    let run = [
        "exec",
        "--session",
        "cli-s",
        "--lang",
        "shell",
        "echo $GREETING; sleep 30",
    ];
    let out = sandmesh(&nats.url(), &run, limit).await;
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hi\n", "{out:?}");
    assert_ne!(out.status.code(), Some(0), "timed out: {out:?}");
    let hostile = [
        "sessions",
        "open",
        "cli-bad",
        "--env",
        "LD_PRELOAD=/tmp/x.so",
    ];
    let out = sandmesh(&nats.url(), &hostile, limit).await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("env.LD_PRELOAD"),
        "{out:?}"
    );

    let status = mesh.stop(Duration::from_secs(60)).await;
    assert!(
        status.success(),
        "up exited with {status}: {}",
        std::fs::read_to_string(log.path()).unwrap_or_default()
    );
}
