//! One AIO instance started straight from the image, hardened exactly as the pool starts one
//! (`InstanceSpec::container_body`: no network, the API on a control socket), but with a key
//! the test knows, so tests can speak the instance's HTTP API as an agent's SDK does.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use aio_pool::docker::{
    lock_control_dir, open_control_dir, remove_control_dir, InstanceSpec, CONTROL_SOCKET,
};
use aio_pool::AioPoolConfig;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;

use super::{image, unique};

pub const KEY: &str = "aio-api-test-key-0123456789abcdef";

/// A running instance; removed (with its control directory) by `stop`, or by `Drop` after a
/// panic.
pub struct Instance {
    /// The agent's address inside the instance: the `Host` the test's requests carry, as the
    /// pool's do.
    pub addr: String,
    /// The control socket on the host.
    pub socket: PathBuf,
    name: String,
    control_dir: PathBuf,
    docker: bollard::Docker,
}

impl Instance {
    pub async fn start(tag: &str) -> Self {
        let owner = unique(tag);
        let env: HashMap<String, String> = [
            ("SANDMESH_INSTANCE_ID", owner.clone()),
            ("SANDMESH_AIO_IMAGE", image().to_string()),
            // Chromium and a few kernels side by side.
            ("SANDMESH_AIO_MEMORY_MB", "1024".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let config = AioPoolConfig::from_env(&env).expect("test config");
        let spec = InstanceSpec::from_config(&config, &owner);
        let docker = containers::connect().await.expect("docker");
        let name = format!("{owner}-0");
        let control_dir = spec.control_root.join("0");
        open_control_dir(&control_dir).expect("the control directory");
        let instance = Self {
            addr: format!("127.0.0.1:{}", spec.port),
            socket: control_dir.join(CONTROL_SOCKET),
            name: name.clone(),
            control_dir: control_dir.clone(),
            docker: docker.clone(),
        };
        docker
            .create_container(
                Some(
                    bollard::query_parameters::CreateContainerOptionsBuilder::new()
                        .name(&name)
                        .build(),
                ),
                spec.container_body(&name, KEY, &control_dir),
            )
            .await
            .expect("create the instance");
        docker
            .start_container(
                &name,
                None::<bollard::query_parameters::StartContainerOptions>,
            )
            .await
            .expect("start the instance");
        let (probe, host) = (instance.socket.clone(), instance.addr.clone());
        test_support::eventually(
            "the instance answers GET /v1/sandbox",
            Duration::from_secs(30),
            || {
                let (probe, host) = (probe.clone(), host.clone());
                async move {
                    let key = [("x-aio-api-key", KEY)];
                    let (status, _) = send(&probe, &host, "GET", "/v1/sandbox", &key, vec![])
                        .await
                        .ok()?;
                    (status == StatusCode::OK).then_some(())
                }
            },
        )
        .await;
        lock_control_dir(&control_dir).expect("lock the control directory");
        instance
    }

    /// A TCP port on the host's loopback relayed to the control socket, for clients that
    /// speak HTTP over TCP only (the official SDK); it lives as long as the test's runtime.
    pub async fn tcp_relay(&self) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the relay");
        let addr = listener.local_addr().unwrap().to_string();
        let socket = self.socket.clone();
        tokio::spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                let socket = socket.clone();
                tokio::spawn(async move {
                    if let Ok(mut unix) = tokio::net::UnixStream::connect(&socket).await {
                        let _ = tokio::io::copy_bidirectional(&mut tcp, &mut unix).await;
                    }
                });
            }
        });
        addr
    }

    /// `POST path` with a JSON body; the answer's status and JSON.
    pub async fn call(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.call_raw("POST", path, serde_json::to_vec(&body).unwrap())
            .await
    }

    pub async fn call_raw(&self, method: &str, path: &str, body: Vec<u8>) -> (StatusCode, Value) {
        let (status, bytes) = self.send(method, path, body).await;
        let value = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            panic!(
                "{method} {path}: answer is not JSON ({e}): {}",
                String::from_utf8_lossy(&bytes)
            )
        });
        (status, value)
    }

    /// Any request with the key; the raw answer.
    pub async fn send(&self, method: &str, path: &str, body: Vec<u8>) -> (StatusCode, Bytes) {
        send(
            &self.socket,
            &self.addr,
            method,
            path,
            &[("x-aio-api-key", KEY), ("content-type", "application/json")],
            body,
        )
        .await
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    /// A request declaring a body of `declared` bytes that sends only its first bytes: the
    /// agent must refuse it from the header alone. The status the agent answers.
    pub async fn send_oversized(&self, path: &str, declared: usize) -> StatusCode {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::UnixStream::connect(&self.socket)
            .await
            .expect("connect");
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nX-AIO-API-Key: {KEY}\r\n\
             Content-Type: application/json\r\nContent-Length: {declared}\r\n\r\n{{\"code\": \"",
            self.addr
        );
        stream.write_all(head.as_bytes()).await.expect("send");
        let mut answer = vec![0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(30), stream.read(&mut answer))
            .await
            .expect("an answer within 30 s")
            .expect("read");
        let line = String::from_utf8_lossy(&answer[..n]);
        let code = line
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse::<u16>().ok())
            .unwrap_or_else(|| panic!("not an HTTP answer: {line:?}"));
        StatusCode::from_u16(code).expect("a status")
    }

    /// The instance's directory, then its pool's (this test's own).
    fn remove_control_dirs(&self) {
        remove_control_dir(&self.control_dir);
        if let Some(root) = self.control_dir.parent() {
            remove_control_dir(root);
        }
    }

    pub async fn stop(mut self) {
        let _ = self
            .docker
            .remove_container(
                &self.name,
                Some(
                    bollard::query_parameters::RemoveContainerOptionsBuilder::new()
                        .force(true)
                        .build(),
                ),
            )
            .await;
        self.remove_control_dirs();
        self.name.clear();
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        if self.name.is_empty() {
            return;
        }
        // A test that panicked: no runtime to await on here, so the CLI removes what it made.
        let _ = std::process::Command::new("docker")
            .args(["rm", "-f", &self.name])
            .output();
        self.remove_control_dirs();
    }
}

/// One HTTP/1.1 exchange over the control socket, with `Host: addr`, bounded to 60 s.
pub async fn send(
    socket: &std::path::Path,
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> Result<(StatusCode, Bytes), String> {
    let exchange = async {
        let stream = tokio::net::UnixStream::connect(socket)
            .await
            .map_err(|e| e.to_string())?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", addr);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let res = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let status = res.status();
        let bytes = res
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((status, bytes))
    };
    tokio::time::timeout(Duration::from_secs(60), exchange)
        .await
        .map_err(|_| "no answer within 60 s".to_string())?
}
