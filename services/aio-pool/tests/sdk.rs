//! The official `agent-sandbox` Python SDK (PyPI; the upstream AIO sandbox's own client,
//! pinned in `aio-sdk-requirements.txt`) drives a real instance of the `sandmesh/aio` image:
//! jupyter state across calls, file replace/search/find/editor, code, Node.js, shell.
//!
//! A Rust test rather than a pytest suite run from scripts/test.sh: the instance is started
//! by the same Rust harness as the API tests (image build, hardened container, bridge, key),
//! so nextest runs it with the rest and no second harness exists in Python. The SDK lives in a
//! cached venv under the target dir; when it cannot be installed the test fails saying so.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::instance::{Instance, KEY};

/// The venv's python with the pinned SDK (installed on first use, again when the pin changes).
fn sdk_python() -> PathBuf {
    fn run(cmd: &mut Command) {
        let out = cmd
            .output()
            .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
        assert!(
            out.status.success(),
            "{cmd:?} failed: the official AIO SDK (PyPI `agent-sandbox`, pinned in \
             services/aio-pool/tests/aio-sdk-requirements.txt) could not be installed; this \
             test needs python3 with venv and pip, and the package index reachable:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let requirements =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/aio-sdk-requirements.txt");
    let wanted = std::fs::read_to_string(&requirements).expect("aio-sdk-requirements.txt");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| test_support::repo_root().join("target"));
    let venv = target.join("tmp/aio-sdk-venv");
    let marker = venv.join("requirements.installed");
    if std::fs::read_to_string(&marker).ok().as_deref() != Some(wanted.as_str()) {
        std::fs::create_dir_all(target.join("tmp")).expect("target/tmp");
        if !venv.join("bin/python").exists() {
            run(Command::new("python3").args(["-m", "venv"]).arg(&venv));
        }
        run(Command::new(venv.join("bin/python"))
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "-r",
            ])
            .arg(&requirements));
        std::fs::write(&marker, &wanted).expect("write the marker");
    }
    venv.join("bin/python")
}

#[tokio::test]
async fn the_official_python_sdk_drives_an_instance() {
    let python = sdk_python();
    let aio = Instance::start("sdk").await;
    let probe = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/aio_sdk_probe.py");
    let out = tokio::process::Command::new(&python)
        .arg(&probe)
        .env("AIO_URL", format!("http://{}", aio.addr))
        .env("AIO_KEY", KEY)
        .output()
        .await
        .expect("run the SDK probe");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the SDK probe failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON line");
    assert_eq!(seen["jupyter"], "42");
    assert_eq!(seen["files"], serde_json::json!(["/home/gem/pkg/mod.py"]));
    assert_eq!(seen["code"], "42");
    aio.stop().await;
}
