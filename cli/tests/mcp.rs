//! `sandmesh mcp` driven the way an MCP client drives it: the real binary, over stdio
//! (JSON-RPC, one message a line) and over Streamable HTTP, acting as the default tenant's
//! agent with the credentials in `SANDMESH_CREDS`. Behind it: a real nats-server with
//! tenancy and the real services in this process — risk-assessor, confirmation,
//! workspace-store, scheduler, docker-executor over the real Docker daemon and, for the
//! browser tools, the browser-router with real Chromium. An operator approves through the
//! real `sandmesh confirm approve`.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use base64::Engine;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use kit::config::env_map;
use kit::CancellationToken;
use messages::{ServiceName, Subjects};
use sandmesh_client::MeshClient;
use serde_json::{json, Value};
use test_support::{eventually, free_port, NatsServer};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

use crate::common::SANDMESH;

/// Every wait on the mesh or the server is bounded by this (a session's first run starts its
/// container; a browser's first action starts Chromium).
const BOUND: Duration = Duration::from_secs(120);

/// Every tool the server must list.
const TOOLS: &[&str] = &[
    "run_code",
    "run_tests",
    "get_result",
    "read_file",
    "write_file",
    "list_files",
    "browser_navigate",
    "browser_elements",
    "browser_click",
    "browser_fill",
    "browser_screenshot",
    "browser_content",
    "start_process",
    "process_output",
    "kill_process",
    "expose_port",
];

/// One mesh at a time: each warms containers, and two cores are shared by the whole suite.
static ONE_MESH_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const PNG_SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";

// === The mesh ===

/// A nats-server with the shipped tenancy and the services, run in this process.
struct Mesh {
    nats: NatsServer,
    dir: tempfile::TempDir,
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<Result<(), String>>>,
    /// Docker labels of the containers this mesh made, removed on drop (a test that failed
    /// before [`Mesh::stop`] leaves them running otherwise).
    labels: Vec<String>,
}

impl Drop for Mesh {
    fn drop(&mut self) {
        self.stop.cancel();
        for label in &self.labels {
            for id in crate::common::containers(std::slice::from_ref(label)) {
                let _ = Command::new("docker").args(["rm", "-f", &id]).output();
            }
        }
    }
}

impl Mesh {
    /// Every service an agent's code and files need; the browser-router too when `site`
    /// is given, allowed to reach that site only.
    async fn start(site: Option<&Site>) -> Self {
        test_support::require_docker();
        let image = docker_executor::image::ensure()
            .await
            .unwrap_or_else(|e| panic!("building the sandbox image (deploy/images/build.sh): {e}"));
        let nats = NatsServer::start();
        let mut mesh = Self {
            dir: tempfile::tempdir().expect("temp dir"),
            stop: CancellationToken::new(),
            tasks: Vec::new(),
            labels: Vec::new(),
            nats,
        };
        let url = mesh.nats.url();
        let base = env_map(&[
            ("SANDMESH_NATS_URL", url.as_str()),
            ("SANDMESH_HEARTBEAT_MS", "500"),
        ]);
        let risk = risk_assessor::RiskAssessorConfig::from_env(&base).unwrap();
        mesh.spawn(risk_assessor::run(risk, mesh.stop.clone()));
        // The operators' scopes, as `sandmesh up` sets them: `sandmesh confirm approve` acts
        // as the operator user, not as an insider.
        let mut confirm_env = base.clone();
        confirm_env.insert(
            "SANDMESH_OPERATOR_SCOPES".into(),
            mesh.nats.tenancy().operator_scopes(),
        );
        let confirm = confirmation::ConfirmationConfig::from_env(&confirm_env).unwrap();
        mesh.spawn(confirmation::run(confirm, mesh.stop.clone()));
        let ws = workspace_store::WorkspaceConfig::for_url(&url);
        mesh.spawn(workspace_store::run(ws, mesh.stop.clone()));
        // The scheduler asks it about a run's template (an unknown one is refused).
        let catalog = templates::TemplatesConfig::from_env(&base).unwrap();
        mesh.spawn(templates::run(catalog, mesh.stop.clone()));
        let scheduler = scheduler::SchedulerConfig::from_env(&base).unwrap();
        mesh.spawn(scheduler::run(scheduler, mesh.stop.clone()));
        let node = format!("mcp-{}", messages::new_id().to_ascii_lowercase());
        let mut executor_env = base.clone();
        for (k, v) in [
            ("SANDMESH_INSTANCE_ID", node.as_str()),
            ("SANDMESH_EXEC_IMAGE", image.as_str()),
            ("SANDMESH_EXEC_WARM_POOL", "1"),
        ] {
            executor_env.insert(k.into(), v.into());
        }
        let executor = docker_executor::ExecutorConfig::from_env(&executor_env).unwrap();
        mesh.spawn(docker_executor::run(executor, mesh.stop.clone()));
        mesh.labels
            .push(format!("{}={node}", docker_executor::docker::LABEL_NODE));
        let mut services = vec![
            ServiceName::RiskAssessor,
            ServiceName::Confirmation,
            ServiceName::WorkspaceStore,
            ServiceName::Templates,
            ServiceName::Scheduler,
            ServiceName::DockerExecutor,
        ];
        if let Some(site) = site {
            mesh.start_browser_router(&base, site);
            services.push(ServiceName::BrowserRouter);
        }
        let admin = MeshClient::new(test_support::connect(&url).await, Subjects::default());
        for service in services {
            let status = admin.status();
            let what = format!("{service} to answer");
            test_support::until_up(&what, BOUND, &mut mesh.tasks, || {
                let status = status.clone();
                async move {
                    let found = status.ping(Some(service), Duration::from_millis(200)).await;
                    found.is_ok_and(|i| !i.is_empty())
                }
            })
            .await;
        }
        mesh
    }

    fn start_browser_router(
        &mut self,
        base: &std::collections::HashMap<String, String>,
        site: &Site,
    ) {
        let image = browser_router::image::ensure_image().unwrap_or_else(|e| {
            panic!(
                "the browser image is missing and could not be built ({e}); build it with \
                 deploy/images/build-browser.sh (root, debootstrap and a Debian mirror are \
                 needed the first time)"
            )
        });
        let router = format!("mcp{}", messages::new_id().to_ascii_lowercase());
        // The browser's only way out is the router's egress proxy on this host: the policy
        // lets it reach the test's site and nothing else.
        let policy = format!(
            r#"{{"allow_cidrs":["{}/32"],"ports":[{}]}}"#,
            Site::HOST,
            site.port
        );
        let egress = self.dir.path().join("egress");
        std::fs::create_dir_all(&egress).unwrap();
        let egress = egress.display().to_string();
        let mut env = base.clone();
        for (k, v) in [
            ("SANDMESH_INSTANCE_ID", router.as_str()),
            ("SANDMESH_BROWSER_IMAGE", image.as_str()),
            ("SANDMESH_BROWSER_NETWORK_POLICY", policy.as_str()),
            ("SANDMESH_BROWSER_EGRESS_DIR", egress.as_str()),
            ("SANDMESH_BROWSER_WARM_POOL", "0"),
        ] {
            env.insert(k.into(), v.into());
        }
        let config = browser_router::BrowserConfig::from_env(&env).expect("router config");
        self.spawn(browser_router::run(config, self.stop.clone()));
        self.labels.push(format!(
            "{}={router}",
            browser_router::container::LABEL_ROUTER
        ));
    }

    fn spawn<E: std::fmt::Display>(
        &mut self,
        run: impl Future<Output = Result<(), E>> + Send + 'static,
    ) {
        self.tasks.push(tokio::spawn(
            async move { run.await.map_err(|e| e.to_string()) },
        ));
    }

    /// A credentials file of the default tenant's agent, as `sandmesh up` writes them.
    fn agent_creds(&self) -> PathBuf {
        let (url, creds) = sandmesh_auth::split_url(&self.nats.agent_url("default"));
        let creds = creds.expect("the agent URL carries credentials");
        let file = json!({
            "url": url,
            "user": creds.user,
            "password": creds.password,
            "role": "agent",
            "tenant": "default",
        });
        let path = self.dir.path().join("agent.json");
        std::fs::write(&path, file.to_string()).unwrap();
        path
    }

    /// Stops every service; each must end cleanly (the executor removes its containers).
    async fn stop(mut self) {
        self.stop.cancel();
        for task in std::mem::take(&mut self.tasks) {
            let ended = tokio::time::timeout(BOUND, task).await;
            ended
                .expect("a service stops in time")
                .expect("its task")
                .expect("a service ends cleanly");
        }
    }
}

/// A page on 127.0.0.2 for the browser to open: all of 127/8 is loopback on Linux, and an
/// address other than 127.0.0.1 keeps Chromium from taking it for its container's own.
struct Site {
    port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Site {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Site {
    const HOST: &'static str = "127.0.0.2";
    const PAGE: &'static str = r#"<!doctype html><html><head><title>MCP fixture</title></head>
<body><h1>Hello from the fixture</h1>
<label for="name">Your name</label> <input id="name" type="text">
<button id="greet" onclick="document.getElementById('out').textContent =
  'Hello, ' + document.getElementById('name').value">Greet</button>
<p id="out">nobody greeted yet</p></body></html>"#;

    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind((Self::HOST, 0))
            .await
            .expect("bind 127.0.0.2 (all of 127/8 is loopback on Linux)");
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                tokio::spawn(async move {
                    // One request per connection: read the head, answer the page, close.
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match conn.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let response = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\n\
                         Connection: close\r\n\r\n{}",
                        Self::PAGE.len(),
                        Self::PAGE
                    );
                    let _ = conn.write_all(response.as_bytes()).await;
                    let _ = conn.shutdown().await;
                });
            }
        });
        Self { port, task }
    }

    fn url(&self) -> String {
        format!("http://{}:{}/", Self::HOST, self.port)
    }
}

// === MCP clients ===

/// `sandmesh mcp` as the agent of `creds`, with `args`; its log goes to `log`.
fn spawn_server(creds: &Path, args: &[&str], stdio: bool, log: &Path) -> Child {
    let log = std::fs::File::create(log).expect("log file");
    let mut cmd = tokio::process::Command::new(SANDMESH);
    cmd.arg("mcp")
        .args(args)
        .env_remove("SANDMESH_NATS_URL")
        .env("SANDMESH_CREDS", creds)
        .stderr(log)
        .kill_on_drop(true);
    if stdio {
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
    } else {
        cmd.stdin(Stdio::null()).stdout(Stdio::null());
    }
    cmd.spawn().expect("spawn sandmesh mcp")
}

fn initialize_params() -> Value {
    json!({
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "sandmesh-tests", "version": "0"},
    })
}

/// An MCP client over the server's stdin and stdout.
struct StdioClient {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Lines<BufReader<ChildStdout>>,
    next_id: u64,
    log: PathBuf,
}

impl StdioClient {
    fn start(creds: &Path, log: PathBuf) -> Self {
        let mut child = spawn_server(creds, &[], true, &log);
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        Self {
            child,
            stdin,
            stdout,
            next_id: 0,
            log,
        }
    }

    async fn send(&mut self, message: Value) {
        let mut line = message.to_string();
        line.push('\n');
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin
            .write_all(line.as_bytes())
            .await
            .expect("write to sandmesh mcp");
        stdin.flush().await.unwrap();
    }

    /// Sends a request and returns its `result`; a JSON-RPC error fails the test. Every line
    /// the server prints must be a JSON-RPC message: stdout carries MCP frames only.
    async fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        loop {
            let line = match tokio::time::timeout(BOUND, self.stdout.next_line()).await {
                Ok(Ok(Some(line))) => line,
                other => panic!(
                    "no answer to {method} within {BOUND:?} ({other:?}); server log:\n{}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                ),
            };
            let message: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("stdout carried a line that is not JSON ({e}): {line}"));
            assert_eq!(message["jsonrpc"], "2.0", "{line}");
            if message["id"] != json!(id) {
                // A notification (logging, progress): not ours to check.
                continue;
            }
            assert!(message.get("error").is_none(), "{method} failed: {line}");
            return message["result"].clone();
        }
    }

    async fn initialize(&mut self) -> Value {
        let result = self.request("initialize", initialize_params()).await;
        self.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        result
    }

    async fn call(&mut self, tool: &str, arguments: Value) -> Value {
        self.request("tools/call", json!({"name": tool, "arguments": arguments}))
            .await
    }

    /// Closes stdin, as a client that is done does: the server must exit cleanly.
    async fn close(mut self) {
        drop(self.stdin.take());
        let status = tokio::time::timeout(BOUND, self.child.wait())
            .await
            .expect("sandmesh mcp exits when stdin closes")
            .unwrap();
        assert!(
            status.success(),
            "sandmesh mcp exited with {status}:\n{}",
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
    }
}

/// An MCP client over Streamable HTTP (HTTP/1.1, one connection per request).
struct HttpClient {
    addr: SocketAddr,
    session: Option<String>,
    next_id: u64,
}

impl HttpClient {
    /// POSTs one JSON-RPC message; returns the status and the JSON-RPC answer with `id`
    /// (from a JSON body or from the `data:` lines of an event stream), if any.
    async fn post(
        &mut self,
        message: Value,
        id: Option<u64>,
    ) -> (hyper::StatusCode, Option<Value>) {
        let stream = tokio::net::TcpStream::connect(self.addr)
            .await
            .expect("connect");
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .expect("HTTP handshake");
        tokio::spawn(conn);
        let mut request = hyper::Request::post("/mcp")
            .header("host", self.addr.to_string())
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if let Some(session) = &self.session {
            request = request
                .header("mcp-session-id", session)
                .header("mcp-protocol-version", "2025-06-18");
        }
        let request = request
            .body(Full::new(Bytes::from(message.to_string())))
            .unwrap();
        let response = tokio::time::timeout(BOUND, sender.send_request(request))
            .await
            .expect("an HTTP answer in time")
            .expect("an HTTP answer");
        let status = response.status();
        if let Some(session) = response.headers().get("mcp-session-id") {
            self.session = Some(session.to_str().unwrap().to_string());
        }
        let Some(id) = id else {
            return (status, None);
        };
        // Read until the answer arrives: an event stream may stay open after it.
        let mut body = response.into_body();
        let mut text = String::new();
        loop {
            let frame = tokio::time::timeout(BOUND, body.frame())
                .await
                .expect("the answer in time");
            let Some(frame) = frame else { break };
            if let Ok(data) = frame.expect("body frame").into_data() {
                text.push_str(&String::from_utf8_lossy(&data));
            }
            if let Some(answer) = answer_in(&text, id) {
                return (status, Some(answer));
            }
        }
        (status, answer_in(&text, id))
    }

    async fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let (status, answer) = self.post(message, Some(id)).await;
        assert!(status.is_success(), "{method}: HTTP {status}");
        let answer = answer.unwrap_or_else(|| panic!("{method}: no JSON-RPC answer"));
        assert!(answer.get("error").is_none(), "{method} failed: {answer}");
        answer["result"].clone()
    }
}

/// The JSON-RPC message with `id` in a JSON body or in an event stream's `data:` lines.
fn answer_in(body: &str, id: u64) -> Option<Value> {
    let candidates = std::iter::once(body.trim()).chain(
        body.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::trim),
    );
    candidates
        .filter_map(|c| serde_json::from_str::<Value>(c).ok())
        .find(|m| m["id"] == json!(id))
}

// === Reading tool results ===

/// The text blocks of a tool result, joined.
fn text(result: &Value) -> String {
    result["content"]
        .as_array()
        .expect("content")
        .iter()
        .filter(|c| c["type"] == "text")
        .map(|c| c["text"].as_str().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The result must be a success; returns it.
fn ok(tool: &str, result: Value) -> Value {
    assert_eq!(result["isError"], false, "{tool}: {result}");
    result
}

/// The result must be a tool error of `kind`; returns its text.
fn failed(tool: &str, result: &Value, kind: &str) -> String {
    assert_eq!(result["isError"], true, "{tool}: {result}");
    assert_eq!(
        result["structuredContent"]["error"]["kind"], kind,
        "{tool}: {result}"
    );
    let shown = text(result);
    assert!(shown.starts_with(&format!("{kind}: ")), "{tool}: {shown}");
    shown
}

// === Tests ===

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn over_stdio_an_agent_runs_code_moves_files_and_hears_at_once_of_an_approval() {
    let _one = ONE_MESH_AT_A_TIME.lock().await;
    let mesh = Mesh::start(None).await;
    let mut mcp = StdioClient::start(&mesh.agent_creds(), mesh.dir.path().join("mcp.log"));

    let init = mcp.initialize().await;
    assert_eq!(init["serverInfo"]["name"], "sandmesh", "{init}");
    assert!(init["capabilities"]["tools"].is_object(), "{init}");
    assert!(
        init["instructions"]
            .as_str()
            .is_some_and(|i| i.contains("get_result")),
        "{init}"
    );

    // Every tool, each with a description and an object schema.
    let listed = mcp.request("tools/list", json!({})).await;
    let tools: BTreeMap<String, Value> = listed["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| (t["name"].as_str().unwrap().to_string(), t.clone()))
        .collect();
    let names: BTreeSet<&str> = tools.keys().map(String::as_str).collect();
    assert_eq!(names, TOOLS.iter().copied().collect(), "{listed}");
    for (name, tool) in &tools {
        assert!(
            tool["description"].as_str().is_some_and(|d| d.len() > 20),
            "{name} has a description: {tool}"
        );
        assert_eq!(tool["inputSchema"]["type"], "object", "{name}: {tool}");
        if name.starts_with("browser_") || name.ends_with("_file") || name == "list_files" {
            let required = tool["inputSchema"]["required"]
                .as_array()
                .expect("required");
            assert!(required.contains(&json!("session_id")), "{name}: {tool}");
        }
    }
    let run = &tools["run_code"]["inputSchema"];
    assert_eq!(run["required"], json!(["code"]), "{run}");
    for field in ["code", "language", "session_id", "template", "timeout_ms"] {
        assert!(
            run["properties"][field]["description"].is_string(),
            "run_code.{field} is described: {run}"
        );
    }
    assert_eq!(
        run["properties"]["language"]["enum"],
        json!(["python", "javascript", "shell"]),
        "{run}"
    );

    // Code runs; its output comes back as text and as structured content.
    let ran = ok(
        "run_code",
        mcp.call("run_code", json!({"code": "print(6*7)"})).await,
    );
    assert!(text(&ran).contains("stdout:\n42\n"), "{ran}");
    assert_eq!(ran["structuredContent"]["stdout"], "42\n", "{ran}");
    assert_eq!(ran["structuredContent"]["exit_code"], 0, "{ran}");
    let js = json!({"code": "console.log(6*7)", "language": "javascript"});
    let ran = ok("run_code", mcp.call("run_code", js).await);
    assert_eq!(ran["structuredContent"]["stdout"], "42\n", "{ran}");
    // Tests against code: each test's status and the totals.
    let tests = json!({
        "language": "javascript",
        "code": "exports.twice = (x) => 2 * x;",
        "tests": "const test = require('node:test');\nconst assert = require('node:assert');\n\
                  const { twice } = require('./solution.js');\n\
                  test('doubles', () => assert.strictEqual(twice(21), 42));\n\
                  test('triples', () => assert.strictEqual(twice(2), 6));\n",
    });
    let tested = ok("run_tests", mcp.call("run_tests", tests).await);
    assert_eq!(tested["structuredContent"]["status"], "failed", "{tested}");
    assert_eq!(
        tested["structuredContent"]["totals"]["passed"], 1,
        "{tested}"
    );
    assert!(text(&tested).contains("FAILED  triples"), "{tested}");

    // Files: written, seen by code in the session, read back, listed; an image as an image.
    let s = "mcp-files";
    let wrote = mcp
        .call(
            "write_file",
            json!({"session_id": s, "path": "in/data.txt", "content": "hello from mcp"}),
        )
        .await;
    assert!(text(&ok("write_file", wrote)).contains("in/data.txt"));
    let upper = json!({"session_id": s, "code": "print(open('in/data.txt').read().upper())"});
    let ran = ok("run_code", mcp.call("run_code", upper).await);
    assert_eq!(
        ran["structuredContent"]["stdout"], "HELLO FROM MCP\n",
        "{ran}"
    );
    let read = ok(
        "read_file",
        mcp.call("read_file", json!({"session_id": s, "path": "in/data.txt"}))
            .await,
    );
    assert_eq!(text(&read), "hello from mcp");
    let pixel = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==";
    let png = json!({"session_id": s, "path": "pixel.png", "content": pixel, "encoding": "base64"});
    ok("write_file", mcp.call("write_file", png).await);
    let image = ok(
        "read_file",
        mcp.call("read_file", json!({"session_id": s, "path": "pixel.png"}))
            .await,
    );
    assert_eq!(image["content"][0]["type"], "image", "{image}");
    assert_eq!(image["content"][0]["mimeType"], "image/png", "{image}");
    assert_eq!(image["content"][0]["data"], pixel, "{image}");
    let listing = ok(
        "list_files",
        mcp.call("list_files", json!({"session_id": s})).await,
    );
    let shown = text(&listing);
    assert!(shown.contains("in/data.txt (14 bytes)"), "{shown}");
    assert!(shown.contains("pixel.png"), "{shown}");

    // The mesh's errors and this server's refusals are tool errors naming their kind.
    let missing = mcp
        .call("read_file", json!({"session_id": s, "path": "no/such.txt"}))
        .await;
    failed("read_file", &missing, "not_found");
    // A template is passed to the mesh, which refuses one it does not know.
    let templated = json!({"code": "print(1)", "template": "no-such"});
    let shown = failed(
        "run_code",
        &mcp.call("run_code", templated).await,
        "bad_request",
    );
    assert!(shown.contains("unknown template"), "{shown}");
    let cobol = json!({"code": "DISPLAY 1", "language": "cobol"});
    let shown = failed(
        "run_code",
        &mcp.call("run_code", cobol).await,
        "bad_request",
    );
    assert!(shown.contains("python"), "the choices are named: {shown}");

    // Risky code: the call answers with the pending approval instead of waiting for it (it
    // could not wait: the approval below comes only after this answer).
    let risky = json!({
        "session_id": s,
        "code": "import os\nos.system('echo approved > approved.txt; echo ran')",
    });
    let parked = ok("run_code", mcp.call("run_code", risky).await);
    let state = &parked["structuredContent"];
    assert_eq!(state["state"], "awaiting_confirmation", "{parked}");
    let confirmation = state["confirmation_id"]
        .as_str()
        .expect("a confirmation id");
    let execution = state["execution_id"].as_str().expect("an execution id");
    let shown = text(&parked);
    assert!(
        shown.contains(&format!("sandmesh confirm approve {confirmation}")),
        "{shown}"
    );
    let pending = ok(
        "get_result",
        mcp.call(
            "get_result",
            json!({"execution_id": execution, "wait_ms": 0}),
        )
        .await,
    );
    assert_eq!(
        pending["structuredContent"]["confirmation_id"], confirmation,
        "{pending}"
    );

    let approve = ["confirm", "approve", confirmation, "--by", "test-operator"];
    let approved =
        crate::common::sandmesh(&mesh.nats.operator_url("operator"), &approve, BOUND).await;
    assert!(
        approved.status.success(),
        "{}",
        String::from_utf8_lossy(&approved.stderr)
    );
    // Each look-up waits up to 5 s for the result (a long poll), so this loop does not spin.
    let asking = async {
        loop {
            let wait = json!({"execution_id": execution, "wait_ms": 5000});
            let r = mcp.call("get_result", wait).await;
            if r["structuredContent"].get("status").is_some() {
                break r;
            }
        }
    };
    let done = tokio::time::timeout(BOUND, asking)
        .await
        .expect("the approved run's result in time");
    let done = ok("get_result", done);
    let result = &done["structuredContent"];
    assert_eq!(result["stdout"], "ran\n", "{done}");
    assert_eq!(result["confirmation"]["decision"], "approved", "{done}");
    assert!(
        result["files_created"]
            .as_array()
            .is_some_and(|f| f.contains(&json!("approved.txt"))),
        "{done}"
    );
    let made = ok(
        "read_file",
        mcp.call(
            "read_file",
            json!({"session_id": s, "path": "approved.txt"}),
        )
        .await,
    );
    assert_eq!(text(&made), "approved\n");

    mcp.close().await;
    mesh.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn over_stdio_the_browser_tools_drive_a_page_and_return_a_png() {
    let _one = ONE_MESH_AT_A_TIME.lock().await;
    let site = Site::start().await;
    let mesh = Mesh::start(Some(&site)).await;
    let mut mcp = StdioClient::start(&mesh.agent_creds(), mesh.dir.path().join("mcp.log"));
    mcp.initialize().await;
    let s = "mcp-browser";

    let opened = mcp
        .call(
            "browser_navigate",
            json!({"session_id": s, "url": site.url()}),
        )
        .await;
    assert!(text(&ok("browser_navigate", opened)).contains("title: MCP fixture"));

    let listed = ok(
        "browser_elements",
        mcp.call("browser_elements", json!({"session_id": s})).await,
    );
    let shown = text(&listed);
    assert!(shown.contains("\"Your name\""), "{shown}");
    assert!(shown.contains("\"Greet\""), "{shown}");
    let field = listed["structuredContent"]["elements"]
        .as_array()
        .expect("elements")
        .iter()
        .find(|e| e["name"] == "Your name")
        .expect("the name field")["index"]
        .clone();

    let filled = json!({"session_id": s, "index": field, "text": "Ada"});
    ok("browser_fill", mcp.call("browser_fill", filled).await);
    let click = json!({"session_id": s, "selector": "#greet"});
    ok("browser_click", mcp.call("browser_click", click).await);
    let page = ok(
        "browser_content",
        mcp.call("browser_content", json!({"session_id": s})).await,
    );
    assert!(text(&page).contains("Hello, Ada"), "{page}");
    let html = json!({"session_id": s, "format": "html"});
    let page = ok("browser_content", mcp.call("browser_content", html).await);
    assert!(text(&page).contains("<button id=\"greet\""), "{page}");

    let shot = ok(
        "browser_screenshot",
        mcp.call("browser_screenshot", json!({"session_id": s}))
            .await,
    );
    let image = shot["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "image")
        .unwrap_or_else(|| panic!("image content: {shot}"));
    assert_eq!(image["mimeType"], "image/png");
    let png = base64::engine::general_purpose::STANDARD
        .decode(image["data"].as_str().unwrap())
        .expect("base64 image data");
    assert!(png.starts_with(PNG_SIGNATURE), "a PNG");

    let neither = mcp.call("browser_click", json!({"session_id": s})).await;
    failed("browser_click", &neither, "bad_request");

    mcp.close().await;
    mesh.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn over_streamable_http_a_client_initializes_lists_and_calls() {
    let _one = ONE_MESH_AT_A_TIME.lock().await;
    let mesh = Mesh::start(None).await;
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let log = mesh.dir.path().join("mcp-http.log");
    let listen = addr.to_string();
    let mut server = spawn_server(&mesh.agent_creds(), &["--listen", &listen], false, &log);
    eventually(
        "sandmesh mcp --listen to accept connections",
        BOUND,
        || async { tokio::net::TcpStream::connect(addr).await.ok() },
    )
    .await;

    let mut http = HttpClient {
        addr,
        session: None,
        next_id: 0,
    };
    let init = http.request("initialize", initialize_params()).await;
    assert_eq!(init["serverInfo"]["name"], "sandmesh", "{init}");
    assert!(http.session.is_some(), "the server names an MCP session");
    let (status, _) = http
        .post(
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            None,
        )
        .await;
    assert_eq!(status, hyper::StatusCode::ACCEPTED);
    let listed = http.request("tools/list", json!({})).await;
    let names: BTreeSet<&str> = listed["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(names, TOOLS.iter().copied().collect(), "{listed}");
    let call = json!({"name": "run_code", "arguments": {"code": "print(6*7)"}});
    let ran = ok("run_code", http.request("tools/call", call).await);
    assert_eq!(ran["structuredContent"]["stdout"], "42\n", "{ran}");

    // SIGTERM ends it cleanly.
    let pid = server.id().expect("running").to_string();
    let term = Command::new("kill").args(["-TERM", &pid]).status();
    assert!(term.is_ok_and(|s| s.success()), "kill -TERM {pid}");
    let status = tokio::time::timeout(BOUND, server.wait())
        .await
        .expect("sandmesh mcp stops on SIGTERM")
        .unwrap();
    assert!(
        status.success(),
        "exited with {status}:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    mesh.stop().await;
}
