//! The Python example client (`clients/python/assess.py`, PyPI `nats-py` + `msgpack`) against
//! a real nats-server and this service, in JSON and MessagePack: the proof that any language
//! can use the mesh.
//!
//! Requirements are installed on first use, idempotently, into a venv in cargo's per-crate
//! test directory (`target/tmp/python-client-venv`, from `CARGO_TARGET_TMPDIR`):
//! `python3 -m venv <dir>` then `<dir>/bin/pip install -r clients/python/requirements.txt`.
//! A marker file holds the requirements it was built from; a changed requirements.txt
//! reinstalls. `SANDMESH_PYTHON` picks another interpreter than `python3`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn run(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The venv's python, with the client's requirements installed.
fn client_python() -> PathBuf {
    let requirements = repo_root().join("clients/python/requirements.txt");
    let wanted = std::fs::read_to_string(&requirements).expect("requirements.txt");
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("python-client-venv");
    let python = venv.join("bin/python");
    let marker = venv.join("requirements.installed");
    if std::fs::read_to_string(&marker).ok().as_deref() == Some(wanted.as_str()) {
        return python;
    }
    if !python.exists() {
        let base = std::env::var("SANDMESH_PYTHON").unwrap_or_else(|_| "python3".into());
        run(Command::new(base).args(["-m", "venv"]).arg(&venv));
    }
    run(Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet", "--disable-pip-version-check", "-r"])
        .arg(&requirements));
    std::fs::write(&marker, wanted).expect("write marker");
    python
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_assesses_in_json_and_msgpack() {
    let python = tokio::task::spawn_blocking(client_python).await.unwrap();
    let mut svc = common::start(&[]).await;
    let script = repo_root().join("clients/python/assess.py");
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new(&python)
            .arg(&script)
            .args(["--url", &svc.nats.url()])
            .output(),
    )
    .await
    .expect("client finishes")
    .expect("client runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "client failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    // (content type, level, tier) of the samples, in order, once per encoding.
    let expected = [
        ("python", "safe", "ephemeral"),
        ("python", "critical", "session"),
        ("shell", "safe", "ephemeral"),
        ("shell", "critical", "reject"),
        ("javascript", "critical", "session"),
        ("browser", "high", "aio"),
    ];
    assert_eq!(lines.len(), 2 * (expected.len() + 1), "{stdout}");
    for (block, encoding) in ["application/json", "application/msgpack"]
        .iter()
        .enumerate()
    {
        let block = &lines[block * (expected.len() + 1)..][..expected.len() + 1];
        for (line, (ct, level, tier)) in block.iter().zip(expected) {
            assert_eq!(line["encoding"], *encoding);
            assert_eq!(
                (
                    line["content_type"].as_str(),
                    line["level"].as_str(),
                    line["suggested_tier"].as_str()
                ),
                (Some(ct), Some(level), Some(tier)),
                "{line}"
            );
        }
        let error = &block[expected.len()];
        assert_eq!(error["error"], 400, "{error}");
        let message = error["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(messages::risk::ContentType::SUPPORTED),
            "{message}"
        );
    }
    svc.stop().await;
}
