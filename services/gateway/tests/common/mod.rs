//! The gateway's tests run on the shared mesh harness (`test_support::mesh`: a real nats-server with
//! the shipped accounts and tenant `acme` besides `default`, the real risk-assessor,
//! confirmation, workspace-store and scheduler, a real docker-executor node) plus the gateway
//! itself, started in-process through its library, and a small HTTP/1.1 client.

pub use test_support::mesh;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use gateway::GatewayConfig;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use kit::CancellationToken;
use messages::tenancy::Tenant;
use messages::ServiceName;

pub use mesh::Mesh;

/// Every wait in these tests is bounded by this.
pub const BOUND: Duration = Duration::from_secs(120);

/// Two tenants, real services, one real Docker node.
pub async fn start_mesh() -> Mesh {
    Mesh::builder()
        .tenants(&["acme"], &[])
        .real_risk()
        .confirm(&[])
        .real_workspace()
        // Test runs name a template.
        .templates()
        .docker_executors(1)
        .scheduler(|_| {})
        .start()
        .await
}

/// Tenants and NATS only, and a workspace-store of this quota started here (file tests need
/// no executor; a small quota makes "over the quota" cheap to reach).
pub async fn start_store_mesh(quota_mb: u64) -> (Mesh, Store) {
    let mesh = Mesh::builder().tenants(&["acme"], &[]).start().await;
    let mut config = workspace_store::WorkspaceConfig::for_url(
        &mesh.nats.service_url(ServiceName::WorkspaceStore),
    );
    config.max_size_mb = quota_mb;
    let stop = CancellationToken::new();
    let token = stop.clone();
    let task = tokio::spawn(async move {
        workspace_store::run(config, token)
            .await
            .map_err(|e| kit::error_chain(&e))
    });
    // Serving, not only started: a test's first request must not find "no responders".
    let client = test_support::connect(&mesh.nats.url()).await;
    let stat = messages::Subjects::default().workspace(messages::subjects::WorkspaceOp::Stat);
    test_support::eventually("the workspace-store to serve", BOUND, || {
        let (client, stat) = (client.clone(), stat.clone());
        async move { client.request(stat, "{}".into()).await.ok().map(|_| ()) }
    })
    .await;
    (mesh, Store { stop, task })
}

/// A workspace-store started by [`start_store_mesh`].
pub struct Store {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), String>>,
}

impl Store {
    pub async fn stop(self) {
        self.stop.cancel();
        let ended = tokio::time::timeout(BOUND, self.task)
            .await
            .expect("the store stops in time");
        ended.expect("task").expect("the store ends cleanly");
    }
}

/// A gateway started in-process, with the mesh's tenancy in a file beside its keys, and its
/// E2B facade on a second port.
pub struct Gateway {
    pub addr: SocketAddr,
    pub e2b: SocketAddr,
    pub keys_file: PathBuf,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), String>>,
    _dir: tempfile::TempDir,
}

impl Gateway {
    pub async fn start(mesh: &Mesh, tune: impl FnOnce(&mut GatewayConfig)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let tenancy = dir.path().join("tenancy.json");
        mesh.nats.tenancy().save(&tenancy).unwrap();
        let keys_file = dir.path().join(gateway::keys::KEYS_FILE);
        let mut config = GatewayConfig::for_url(
            &mesh.nats.service_url(ServiceName::Gateway),
            keys_file.clone(),
        );
        config.kit.tenancy_file = Some(tenancy);
        tune(&mut config);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let facade = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let e2b = facade.local_addr().unwrap();
        let stop = CancellationToken::new();
        let token = stop.clone();
        let task = tokio::spawn(async move {
            gateway::serve_with(listener, Some(facade), config, token)
                .await
                .map_err(|e| kit::error_chain(&e))
        });
        let gw = Self {
            addr,
            e2b,
            keys_file,
            stop,
            task,
            _dir: dir,
        };
        test_support::eventually("the gateway to answer", BOUND, || async {
            let reply = gw
                .send("GET", "/api/v1/health", None, &[], Bytes::new())
                .await;
            (reply.status == 200).then_some(())
        })
        .await;
        gw
    }

    /// A new key of `tenant`.
    pub fn key(&self, tenant: &str) -> String {
        let tenant = Tenant::new(tenant).unwrap();
        gateway::keys::create(&self.keys_file, &tenant).unwrap().0
    }

    /// Stops it gracefully; panics when its `run` failed.
    pub async fn stop(self) {
        self.stop.cancel();
        let ended = tokio::time::timeout(BOUND, self.task)
            .await
            .expect("the gateway stops in time");
        ended.expect("task").expect("the gateway ends cleanly");
    }

    /// Sends one request and reads the whole answer.
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Reply {
        let response = self.open(method, path, key, headers, body).await;
        read_reply(method, path, response).await
    }

    /// `send` with a JSON body.
    pub async fn json(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: &serde_json::Value,
    ) -> Reply {
        let headers = [("content-type", "application/json")];
        self.send(method, path, key, &headers, body.to_string())
            .await
    }

    /// Sends one request whose body is `body`, sent as the server reads it, and reads the
    /// whole answer.
    pub async fn send_stream(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        headers: &[(&str, &str)],
        body: impl futures::Stream<Item = Bytes> + Send + 'static,
    ) -> Reply {
        use futures::StreamExt;
        let frames = body.map(|b| Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(b)));
        let response = self
            .open_with(
                method,
                path,
                key,
                headers,
                http_body_util::StreamBody::new(frames),
            )
            .await;
        read_reply(method, path, response).await
    }

    /// Sends one request and returns the answer as it starts (its body streams).
    pub async fn open(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> hyper::Response<Incoming> {
        self.open_with(method, path, key, headers, Full::new(body.into()))
            .await
    }

    /// `open` with any request body.
    pub async fn open_with<B>(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        headers: &[(&str, &str)],
        body: B,
    ) -> hyper::Response<Incoming>
    where
        B: hyper::body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let mut all: Vec<(&str, String)> =
            headers.iter().map(|(n, v)| (*n, v.to_string())).collect();
        if let Some(key) = key {
            all.push(("authorization", format!("Bearer {key}")));
        }
        open_at(self.addr, method, path, &all, body).await
    }

    /// Sends one request to the E2B facade and reads the whole answer.
    pub async fn e2b_send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, String)],
        body: impl Into<Bytes>,
    ) -> Reply {
        let response = self.e2b_open(method, path, headers, body).await;
        read_reply(method, path, response).await
    }

    /// Sends one request to the E2B facade and returns the answer as it starts.
    pub async fn e2b_open(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, String)],
        body: impl Into<Bytes>,
    ) -> hyper::Response<Incoming> {
        open_at(self.e2b, method, path, headers, Full::new(body.into())).await
    }
}

/// Sends one request to `addr` over a connection of its own; the answer's head within
/// [`BOUND`].
pub async fn open_at<B>(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: B,
) -> hyper::Response<Incoming>
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let io = hyper_util::rt::TokioIo::new(stream);
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await.unwrap();
    tokio::spawn(connection);
    let mut request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string());
    for (name, value) in headers {
        request = request.header(*name, value.as_str());
    }
    let request = request.body(body).unwrap();
    tokio::time::timeout(BOUND, sender.send_request(request))
        .await
        .unwrap_or_else(|_| panic!("{method} {path}: no answer within {BOUND:?}"))
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> T {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "{e}: not the expected JSON: {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The problem body of an error, checked for its shape.
    pub fn problem(&self) -> gateway::problem::Problem {
        assert_eq!(
            self.header("content-type"),
            Some(gateway::problem::PROBLEM_JSON),
            "{self:?}"
        );
        let p: gateway::problem::Problem = self.json();
        assert_eq!(p.status, self.status);
        p
    }
}

/// One Server-Sent Event: its name and JSON data.
#[derive(Debug, Clone)]
pub struct SseEvent {
    pub event: String,
    pub data: serde_json::Value,
}

/// Parses a whole `text/event-stream` body (comments and keep-alives skipped).
pub fn parse_events(body: &str) -> Vec<SseEvent> {
    body.split("\n\n")
        .filter_map(|block| {
            let mut event = None;
            let mut data = String::new();
            for line in block.lines() {
                if let Some(name) = line.strip_prefix("event:") {
                    event = Some(name.trim().to_string());
                } else if let Some(d) = line.strip_prefix("data:") {
                    data.push_str(d.trim_start());
                }
            }
            Some(SseEvent {
                event: event?,
                data: serde_json::from_str(&data).ok()?,
            })
        })
        .collect()
}

/// The whole answer to `method path`, read within [`BOUND`].
async fn read_reply(method: &str, path: &str, response: hyper::Response<Incoming>) -> Reply {
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = tokio::time::timeout(BOUND, response.into_body().collect())
        .await
        .unwrap_or_else(|_| panic!("{method} {path}: no whole body within {BOUND:?}"))
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
        .to_bytes();
    Reply {
        status,
        headers,
        body,
    }
}
