//! `sandmesh up` starts the HTTP gateway, and `sandmesh tenant key create|list|revoke` decide
//! who may call it: the real binary, a real nats-server with the shipped accounts, real Docker.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use crate::common::Up;
use test_support::{eventually, free_port, require_docker, NatsServer};

const LIMIT: Duration = Duration::from_secs(60);

/// `sandmesh <args>` on the data directory `dir`: its standard output (the test fails unless
/// it succeeds).
async fn sandmesh(dir: &Path, args: &[&str]) -> String {
    let out = crate::common::sandmesh_in_dir(dir, args).await;
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// One HTTP/1.1 exchange by hand: status and body.
async fn http(addr: SocketAddr, method: &str, path: &str, key: &str, body: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Authorization: Bearer {key}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream.write_all(request.as_bytes()).await?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await?;
        Ok::<_, std::io::Error>(raw)
    };
    let raw = match tokio::time::timeout(LIMIT, exchange).await {
        Ok(Ok(raw)) => raw,
        // Not listening yet (the mesh is starting): no answer.
        _ => return (0, String::new()),
    };
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, body.to_string())
}

#[tokio::test]
async fn up_serves_the_api_to_keys_until_they_are_revoked() {
    require_docker();
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let tenancy = dir.path().join("tenancy.json");
    nats.tenancy().save(&tenancy).unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let console = format!("127.0.0.1:{}", free_port());
    let log = dir.path().join("up.log");
    let mut up = Up::start(
        &nats.plain_url(),
        &[
            ("SANDMESH_TENANCY_FILE", tenancy.to_str().unwrap()),
            ("SANDMESH_DATA_DIR", dir.path().to_str().unwrap()),
            ("SANDMESH_GATEWAY_ADDR", &addr.to_string()),
            ("SANDMESH_CONSOLE_ADDR", &console),
        ],
        &log,
    );
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();

    // The key is the last line of stdout, alone.
    let out = sandmesh(dir.path(), &["tenant", "key", "create", "default"]).await;
    let key = out.lines().last().unwrap().to_string();
    assert!(key.starts_with("smk_") && !key.contains(' '), "{out:?}");
    let id = key.split('_').nth(1).unwrap();
    let listed = sandmesh(dir.path(), &["tenant", "key", "list"]).await;
    assert!(listed.contains(id) && listed.contains("live"), "{listed}");
    assert!(!listed.contains(&key), "a key is shown only once");

    eventually("the mesh to serve", Duration::from_secs(300), || async {
        log_text().contains("mesh is up").then_some(())
    })
    .await;
    assert!(
        log_text().contains(&format!("HTTP API at http://{addr}/api/v1")),
        "{}",
        log_text()
    );
    let body = r#"{"language":"python","code":"print(6 * 7)"}"#;
    let (status, answer) = eventually("an execution over HTTP", LIMIT, || async {
        let reply = http(addr, "POST", "/api/v1/execute", &key, body).await;
        (reply.0 != 0 && reply.0 != 503).then_some(reply)
    })
    .await;
    assert_eq!(status, 200, "{answer}\n{}", log_text());
    let result: serde_json::Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(result["stdout"], "42\n", "{answer}");

    sandmesh(dir.path(), &["tenant", "key", "revoke", id]).await;
    let (status, answer) = http(addr, "GET", "/api/v1/sessions", &key, "").await;
    assert_eq!(status, 401, "{answer}");

    let status = up.stop(Duration::from_secs(60)).await;
    assert!(status.success(), "{status}\n{}", log_text());
}
