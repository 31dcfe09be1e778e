//! One AIO instance started straight from the image, hardened and networked exactly as the
//! pool starts one (`InstanceSpec::container_body` on the pool's internal bridge), but with a
//! key the test knows, so tests can speak the instance's HTTP API as an agent's SDK does.

use std::collections::HashMap;
use std::time::Duration;

use aio_pool::docker::{ensure_network, remove_network, InstanceSpec};
use aio_pool::AioPoolConfig;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;

use super::{image, unique};

pub const KEY: &str = "aio-api-test-key-0123456789abcdef";

/// A running instance; removed (with its bridge) by `stop`, or by `Drop` after a panic.
pub struct Instance {
    pub addr: String,
    name: String,
    network: String,
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
        ensure_network(&docker, &spec).await.expect("bridge");
        let name = format!("{owner}-0");
        let mut instance = Self {
            addr: String::new(),
            name: name.clone(),
            network: spec.network.clone(),
            docker: docker.clone(),
        };
        docker
            .create_container(
                Some(
                    bollard::query_parameters::CreateContainerOptionsBuilder::new()
                        .name(&name)
                        .build(),
                ),
                spec.container_body(&name, KEY),
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
        let inspect = docker
            .inspect_container(
                &name,
                None::<bollard::query_parameters::InspectContainerOptions>,
            )
            .await
            .expect("inspect the instance");
        let ip = inspect
            .network_settings
            .and_then(|n| n.networks)
            .and_then(|mut n| n.remove(&spec.network))
            .and_then(|e| e.ip_address)
            .expect("an address on the bridge");
        instance.addr = format!("{ip}:{}", spec.port);
        let probe = instance.addr.clone();
        test_support::eventually(
            "the instance answers GET /v1/sandbox",
            Duration::from_secs(30),
            || {
                let probe = probe.clone();
                async move {
                    let key = [("x-aio-api-key", KEY)];
                    let (status, _) = send(&probe, "GET", "/v1/sandbox", &key, vec![])
                        .await
                        .ok()?;
                    (status == StatusCode::OK).then_some(())
                }
            },
        )
        .await;
        instance
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
        let mut stream = tokio::net::TcpStream::connect(&self.addr)
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
        remove_network(&self.docker, &self.network).await;
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
        let _ = std::process::Command::new("docker")
            .args(["network", "rm", &self.network])
            .output();
    }
}

/// One HTTP/1.1 exchange, bounded to 60 s.
pub async fn send(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> Result<(StatusCode, Bytes), String> {
    let exchange = async {
        let stream = tokio::net::TcpStream::connect(addr)
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
