//! The Python example client (`clients/python/assess.py`, PyPI `nats-py` + `msgpack`) against
//! a real nats-server and this service, in JSON and MessagePack: the proof that any language
//! can use the mesh.
//!
//! Requirements are installed on first use, idempotently, by `test_support::python_client`.

use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_assesses_in_json_and_msgpack() {
    let python = tokio::task::spawn_blocking(test_support::python_client)
        .await
        .unwrap();
    let mut svc = crate::common::start(&[]).await;
    let script = test_support::repo_root().join("clients/python/assess.py");
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
