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

    // The key is the last line of stdout, alone.
    let out = sandmesh(dir.path(), &["tenant", "key", "create", "default"]).await;
    let key = out.lines().last().unwrap().to_string();
    assert!(key.starts_with("smk_") && !key.contains(' '), "{out:?}");
    let id = key.split('_').nth(1).unwrap();
    let listed = sandmesh(dir.path(), &["tenant", "key", "list"]).await;
    assert!(listed.contains(id) && listed.contains("live"), "{listed}");
    assert!(!listed.contains(&key), "a key is shown only once");

    up.until_up().await;
    assert!(
        up.log_text()
            .contains(&format!("HTTP API at http://{addr}/api/v1")),
        "{}",
        up.log_text()
    );
    let body = r#"{"language":"python","code":"print(6 * 7)"}"#;
    let (status, answer) = eventually("an execution over HTTP", LIMIT, || async {
        let reply = http(addr, "POST", "/api/v1/execute", &key, body).await;
        (reply.0 != 0 && reply.0 != 503).then_some(reply)
    })
    .await;
    assert_eq!(status, 200, "{answer}\n{}", up.log_text());
    let result: serde_json::Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(result["stdout"], "42\n", "{answer}");

    sandmesh(dir.path(), &["tenant", "key", "revoke", id]).await;
    let (status, answer) = http(addr, "GET", "/api/v1/sessions", &key, "").await;
    assert_eq!(status, 401, "{answer}");

    let status = up.stop(Duration::from_secs(60)).await;
    assert!(status.success(), "{status}\n{}", up.log_text());
}

/// Two meshes started at once on one machine, both configured for the same HTTP addresses:
/// one serves them, the other runs without them and says so — neither fails to start. (The
/// faces' sockets are bound when `up` decides to run them, so the other mesh cannot take an
/// address between the check and the service's start.)
#[tokio::test]
async fn two_meshes_started_at_once_on_the_same_addresses_both_come_up() {
    require_docker();
    let faces = [
        (
            "SANDMESH_GATEWAY_ADDR",
            format!("127.0.0.1:{}", free_port()),
        ),
        (
            "SANDMESH_CONSOLE_ADDR",
            format!("127.0.0.1:{}", free_port()),
        ),
        ("SANDMESH_E2B_ADDR", format!("127.0.0.1:{}", free_port())),
    ];
    let env: Vec<(&str, &str)> = faces.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (nats_a, nats_b) = (NatsServer::start(), NatsServer::start());
    let (log_a, log_b) = (
        tempfile::NamedTempFile::new().unwrap(),
        tempfile::NamedTempFile::new().unwrap(),
    );
    let mut a = Up::start(&nats_a.url(), &env, log_a.path());
    let mut b = Up::start(&nats_b.url(), &env, log_b.path());
    tokio::join!(a.until_up(), b.until_up());

    let without = |up: &Up| up.log_text().contains("running without the HTTP gateway");
    let serving = |up: &Up| up.log_text().contains("HTTP API at http://");
    assert!(
        (serving(&a) && without(&b)) || (serving(&b) && without(&a)),
        "one mesh serves the API, the other says it runs without it:\n{}\n---\n{}",
        a.log_text(),
        b.log_text()
    );
    for up in [&mut a, &mut b] {
        let status = up.stop(Duration::from_secs(60)).await;
        assert!(status.success(), "{status}\n{}", up.log_text());
    }
}
