//! The agent as a process on 127.0.0.1: auth, shell and bash exec, files, path escapes,
//! oversized bodies. (Chromium is exercised in the image, by aio-pool's tests.)

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

const KEY: &str = "test-key-0123456789";

struct AgentProcess {
    child: Child,
    addr: String,
    workspace: tempfile::TempDir,
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
    }
}

fn start(extra_env: &[(&str, &str)]) -> AgentProcess {
    let workspace = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sandmesh-aio-agent"))
        .env("SANDBOX_API_KEY", KEY)
        .env("SANDBOX_SRV_PORT", "0")
        .env("AIO_BIND_ADDR", "127.0.0.1")
        .env("WORKSPACE", workspace.path())
        .env("AIO_MAX_BODY_BYTES", "65536")
        .env("AIO_MAX_OUTPUT_BYTES", "4096")
        .env("CHROMIUM_BIN", "/nonexistent/chromium")
        .envs(extra_env.iter().copied())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start sandmesh-aio-agent");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    AgentProcess {
        child,
        addr,
        workspace,
    }
}

async fn send(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> (StatusCode, Bytes) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let res = tokio::time::timeout(
        Duration::from_secs(20),
        sender.send_request(req.body(Full::new(Bytes::from(body))).unwrap()),
    )
    .await
    .expect("answer within 20 s")
    .unwrap();
    let status = res.status();
    (status, res.into_body().collect().await.unwrap().to_bytes())
}

async fn call(addr: &str, path: &str, body: Value) -> (StatusCode, Value) {
    let (status, bytes) = send(
        addr,
        "POST",
        path,
        &[
            ("authorization", &format!("Bearer {KEY}")),
            ("content-type", "application/json"),
        ],
        serde_json::to_vec(&body).unwrap(),
    )
    .await;
    (status, serde_json::from_slice(&bytes).unwrap())
}

#[tokio::test]
async fn every_route_needs_the_key_in_one_of_the_documented_forms() {
    let agent = start(&[]);
    let a = &agent.addr;
    let (status, _) = send(a, "GET", "/v1/sandbox", &[], vec![]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = send(
        a,
        "GET",
        "/v1/sandbox",
        &[("x-aio-api-key", "wrong")],
        vec![],
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = send(
        a,
        "POST",
        "/v1/bash/exec",
        &[],
        br#"{"command":"touch x"}"#.to_vec(),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(
        !agent.workspace.path().join("x").exists(),
        "an unauthorised command ran"
    );
    // Loopback is not trusted unless configured.
    let (status, _) = send(a, "GET", "/json/version", &[], vec![]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    for headers in [
        vec![("x-aio-api-key", KEY)],
        vec![("authorization", &*format!("Bearer {KEY}"))],
    ] {
        let (status, body) = send(a, "GET", "/v1/sandbox", &headers, vec![]).await;
        assert_eq!(status, StatusCode::OK);
        let info: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(info["success"], true);
        assert_eq!(
            info["home_dir"],
            agent
                .workspace
                .path()
                .canonicalize()
                .unwrap()
                .to_str()
                .unwrap()
        );
        assert!(info["detail"]["system"]["arch"].is_string());
    }
    let (status, _) = send(a, "GET", &format!("/v1/sandbox?api_key={KEY}"), &[], vec![]).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn trusted_loopback_needs_no_key() {
    let agent = start(&[("AIO_TRUST_LOOPBACK", "1")]);
    let (status, _) = send(&agent.addr, "GET", "/v1/sandbox", &[], vec![]).await;
    assert_eq!(status, StatusCode::OK);
}

/// The control socket serves the same API, and it is never the trusted loopback: code in the
/// instance can open the socket's path too, so it needs the key there.
#[tokio::test]
async fn the_control_socket_serves_the_api_and_always_needs_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("agent.sock");
    let agent = start(&[
        ("AIO_TRUST_LOOPBACK", "1"),
        ("AIO_CONTROL_SOCKET", socket.to_str().unwrap()),
    ]);
    let over_socket = |headers: &'static [(&'static str, &'static str)]| {
        let socket = socket.clone();
        async move {
            let stream = tokio::net::UnixStream::connect(&socket).await.unwrap();
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .unwrap();
            tokio::spawn(conn);
            let mut req = Request::builder()
                .uri("/v1/sandbox")
                .header("host", "127.0.0.1:8080");
            for (k, v) in headers {
                req = req.header(*k, *v);
            }
            let res = tokio::time::timeout(
                Duration::from_secs(20),
                sender.send_request(req.body(Full::new(Bytes::new())).unwrap()),
            )
            .await
            .expect("answer within 20 s")
            .unwrap();
            res.status()
        }
    };
    assert_eq!(over_socket(&[]).await, StatusCode::UNAUTHORIZED);
    assert_eq!(over_socket(&[("x-aio-api-key", KEY)]).await, StatusCode::OK);
    // Loopback TCP keeps its trust beside it.
    let (status, _) = send(&agent.addr, "GET", "/v1/sandbox", &[], vec![]).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn bash_exec_runs_commands_in_the_workspace_with_separate_streams() {
    let agent = start(&[]);
    let (status, v) = call(
        &agent.addr,
        "/v1/bash/exec",
        json!({"command": "pwd; echo err >&2; echo \"key=[${SANDBOX_API_KEY:-}] v=$V\"; exit 4", "env": {"V": "1"}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let data = &v["data"];
    let pwd = agent.workspace.path().canonicalize().unwrap();
    // The agent's own key is not in the command's environment.
    assert_eq!(data["stdout"], format!("{}\nkey=[] v=1\n", pwd.display()));
    assert_eq!(data["stderr"], "err\n");
    assert_eq!(data["exit_code"], 4);
    assert_eq!(data["status"], "completed");
    assert!(data["session_id"].is_string() && data["command_id"].is_string());
}

#[tokio::test]
async fn shell_exec_merges_output_times_out_and_caps() {
    let agent = start(&[]);
    let (_, v) = call(
        &agent.addr,
        "/v1/shell/exec",
        json!({"command": "echo a; echo b >&2"}),
    )
    .await;
    assert_eq!(v["data"]["output"], "a\nb\n");
    assert_eq!(v["data"]["exit_code"], 0);
    assert_eq!(v["data"]["status"], "completed");

    let (_, v) = call(
        &agent.addr,
        "/v1/shell/exec",
        json!({"command": "sleep 30", "hard_timeout": 0.3}),
    )
    .await;
    assert_eq!(v["data"]["status"], "hard_timeout");
    assert_eq!(v["data"]["exit_code"], Value::Null);

    // 4096 bytes kept (AIO_MAX_OUTPUT_BYTES), the rest counted away.
    let (_, v) = call(
        &agent.addr,
        "/v1/bash/exec",
        json!({"command": "head -c 100000 /dev/zero | tr '\\0' x"}),
    )
    .await;
    assert_eq!(v["data"]["stdout"].as_str().unwrap().len(), 4096);

    let (status, v) = call(
        &agent.addr,
        "/v1/bash/exec",
        json!({"command": "true", "timeout": -1}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
}

#[tokio::test]
async fn commands_of_one_agent_run_one_at_a_time() {
    let agent = start(&[]);
    // Each command appends start and end marks; interleaving would show as s s e e.
    let cmd = json!({"command": "echo s >> log; sleep 0.3; echo e >> log"});
    let (a, b) = tokio::join!(
        call(&agent.addr, "/v1/bash/exec", cmd.clone()),
        call(&agent.addr, "/v1/bash/exec", cmd.clone()),
    );
    assert_eq!((a.0, b.0), (StatusCode::OK, StatusCode::OK));
    let log = std::fs::read_to_string(agent.workspace.path().join("log")).unwrap();
    assert_eq!(log, "s\ne\ns\ne\n");
}

#[tokio::test]
async fn files_write_read_list_upload_download() {
    let agent = start(&[]);
    let a = &agent.addr;
    let (_, v) = call(
        a,
        "/v1/file/write",
        json!({"file": "out/a.txt", "content": "one\ntwo\n"}),
    )
    .await;
    assert_eq!(v["success"], true, "{v}");
    assert_eq!(v["data"]["bytes_written"], 8);
    let (_, v) = call(a, "/v1/file/read", json!({"file": "out/a.txt"})).await;
    assert_eq!(v["data"]["content"], "one\ntwo\n");
    let (_, v) = call(a, "/v1/file/list", json!({"path": "out"})).await;
    assert_eq!(v["data"]["file_count"], 1);
    assert_eq!(v["data"]["files"][0]["name"], "a.txt");

    let body = b"--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"u.bin\"\r\n\r\n\x00\xff\r\n--B--\r\n".to_vec();
    let (status, bytes) = send(
        a,
        "POST",
        "/v1/file/upload",
        &[
            ("x-aio-api-key", KEY),
            ("content-type", "multipart/form-data; boundary=B"),
        ],
        body,
    )
    .await;
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["data"]["file_size"], 2);
    let (status, bytes) = send(
        a,
        "GET",
        "/v1/file/download?path=u.bin",
        &[("x-aio-api-key", KEY)],
        vec![],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(&bytes[..], b"\x00\xff");
}

#[tokio::test]
async fn paths_outside_the_workspace_are_refused() {
    let agent = start(&[]);
    let a = &agent.addr;
    std::os::unix::fs::symlink("/etc", agent.workspace.path().join("etc")).unwrap();
    for file in ["/etc/passwd", "../escape.txt", "etc/passwd"] {
        let (status, v) = call(a, "/v1/file/read", json!({"file": file})).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(v["success"], false, "{file}: {v}");
        assert!(
            matches!(
                v["data"]["error_type"].as_str(),
                Some("permission_denied" | "invalid_argument")
            ),
            "{file}: {v}"
        );
        let (_, v) = call(a, "/v1/file/write", json!({"file": file, "content": "x"})).await;
        assert_eq!(v["success"], false, "{file}: {v}");
    }
    assert!(!agent
        .workspace
        .path()
        .parent()
        .unwrap()
        .join("escape.txt")
        .exists());
    let (status, _) = send(
        a,
        "GET",
        "/v1/file/download?path=/etc/passwd",
        &[("x-aio-api-key", KEY)],
        vec![],
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // A command's working directory may be any existing absolute directory (as upstream);
    // a relative one still may not climb out.
    let (status, v) = call(
        a,
        "/v1/bash/exec",
        json!({"command": "pwd", "exec_dir": "/etc"}),
    )
    .await;
    assert_eq!(
        (status, &v["data"]["stdout"]),
        (StatusCode::OK, &json!("/etc\n"))
    );
    for dir in ["../..", "/nonexistent"] {
        let (status, _) = call(
            a,
            "/v1/bash/exec",
            json!({"command": "true", "exec_dir": dir}),
        )
        .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{dir}");
    }
}

#[tokio::test]
async fn oversized_and_malformed_bodies_get_clear_errors() {
    let agent = start(&[]);
    let a = &agent.addr;
    let big = json!({"file": "big", "content": "x".repeat(70_000)});
    let (status, v) = call(a, "/v1/file/write", big).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{v}");
    assert!(v["message"].as_str().unwrap().contains("65536"));
    assert!(!agent.workspace.path().join("big").exists());

    let (status, bytes) = send(
        a,
        "POST",
        "/v1/bash/exec",
        &[("x-aio-api-key", KEY)],
        b"{not json".to_vec(),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["success"], false);
    let (status, _) = call(a, "/v1/bash/exec", json!({"no_command": 1})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let (status, _) = send(a, "GET", "/v1/nope", &[("x-aio-api-key", KEY)], vec![]).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // No Chromium here: the browser routes say so instead of hanging.
    let (status, bytes) = send(
        a,
        "GET",
        "/v1/browser/info",
        &[("x-aio-api-key", KEY)],
        vec![],
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(String::from_utf8_lossy(&bytes).contains("browser unavailable"));
    for (method, path) in [
        ("GET", "/v1/browser/screenshot"),
        ("GET", "/json/version/"),
        ("GET", "/v1/browser/page/text"),
    ] {
        let (status, _) = send(a, method, path, &[("x-aio-api-key", KEY)], vec![]).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{path}");
    }
}

#[test]
fn refuses_to_start_without_a_key() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sandmesh-aio-agent"))
        .env_remove("SANDBOX_API_KEY")
        .env("SANDBOX_SRV_PORT", "nope")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("SANDBOX_API_KEY is required"), "{stderr}");
    assert!(stderr.contains("SANDBOX_SRV_PORT=nope"), "{stderr}");
}
