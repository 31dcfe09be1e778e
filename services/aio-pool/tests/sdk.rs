//! The official `agent-sandbox` Python SDK (PyPI; the upstream AIO sandbox's own client,
//! pinned in `aio-sdk-requirements.txt`) drives a real instance of the `sandmesh/aio` image:
//! jupyter state across calls, file replace/search/find/editor, code, Node.js, shell.
//!
//! A Rust test rather than a pytest suite run from scripts/test.sh: the instance is started
//! by the same Rust harness as the API tests (image build, hardened container, key; its
//! control socket relayed to a loopback port, as the SDK speaks TCP only), so nextest runs
//! it with the rest and no second harness exists in Python. The SDK lives in a
//! cached venv under the target dir; when it cannot be installed the test fails saying so.

use std::path::PathBuf;

use crate::common::instance::{Instance, KEY};

/// The venv's python with the pinned SDK (installed on first use, again when the pin changes).
fn sdk_python() -> PathBuf {
    test_support::python_venv(
        "aio-sdk-venv",
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/aio-sdk-requirements.txt"),
    )
}

#[tokio::test]
async fn the_official_python_sdk_drives_an_instance() {
    let python = sdk_python();
    let aio = Instance::start("sdk").await;
    let probe = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/aio_sdk_probe.py");
    let out = tokio::process::Command::new(&python)
        .arg(&probe)
        .env("AIO_URL", format!("http://{}", aio.tcp_relay().await))
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
