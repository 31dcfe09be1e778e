//! Request routing, authentication and body limits; the handlers answer through
//! [`crate::reply`].

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::net::TcpStream;

use crate::api::{self, Envelope};
use crate::exec::{Command, Interpreter};
use crate::files::{error_chain, FileError};
use crate::kernel::Language;
use crate::reply::{error, file_status, json, Reply};
use crate::{code, console, edit, page};
use crate::{trusted_peer, Agent, Peer};

/// Upstream's header for the key.
pub const API_KEY_HEADER: &str = "x-aio-api-key";
/// `/v1/shell/exec` cuts output at this many characters when `truncate` is on (upstream's
/// figure).
const SHELL_TRUNCATE_CHARS: usize = 30_000;

pub async fn handle(agent: Arc<Agent>, peer: Peer, req: Request<Incoming>) -> Reply {
    if !trusted_peer(&agent.config, peer) && !authorized(&agent.config.api_key, &req) {
        return error(StatusCode::UNAUTHORIZED, "missing or wrong API key".into());
    }
    let path = req.uri().path().to_string();
    if let Some(action) = path.strip_prefix("/v1/browser/page/") {
        let action = action.to_string();
        return page_route(&agent, &action, req).await;
    }
    match (req.method().clone(), path.as_str()) {
        (Method::GET, "/v1/sandbox") => json(StatusCode::OK, &sandbox_info(&agent)),
        (Method::POST, "/v1/shell/exec") => match body_json(&agent, req).await {
            Ok(r) => shell_exec(&agent, r).await,
            Err(reply) => reply,
        },
        (Method::POST, "/v1/bash/exec") => match body_json(&agent, req).await {
            Ok(r) => bash_exec(&agent, r).await,
            Err(reply) => reply,
        },
        (Method::POST, "/v1/file/read") => {
            match body_json::<api::FileReadRequest>(&agent, req).await {
                Ok(r) => file_reply(&r.file.clone(), "read", agent.workspace.read(&r)),
                Err(reply) => reply,
            }
        }
        (Method::POST, "/v1/file/write") => {
            match body_json::<api::FileWriteRequest>(&agent, req).await {
                Ok(r) => file_reply(&r.file.clone(), "write", agent.workspace.write(&r)),
                Err(reply) => reply,
            }
        }
        (Method::POST, "/v1/file/list") => {
            match body_json::<api::FileListRequest>(&agent, req).await {
                Ok(r) => file_reply(&r.path.clone(), "list", agent.workspace.list(&r)),
                Err(reply) => reply,
            }
        }
        (Method::POST, "/v1/file/replace") => {
            match body_json::<edit::FileReplaceRequest>(&agent, req).await {
                Ok(r) => file_reply(&r.file, "replace", agent.editor.replace(&r)),
                Err(reply) => reply,
            }
        }
        (Method::POST, "/v1/file/search") => {
            match body_json::<edit::FileSearchRequest>(&agent, req).await {
                Ok(r) => file_reply(&r.file, "search", agent.editor.search(&r)),
                Err(reply) => reply,
            }
        }
        (Method::POST, "/v1/file/find") => {
            match body_json::<edit::FileFindRequest>(&agent, req).await {
                Ok(r) => file_reply(&r.path, "find", agent.editor.find(&r)),
                Err(reply) => reply,
            }
        }
        (Method::POST, "/v1/file/str_replace_editor") => {
            match body_json::<edit::StrReplaceEditorRequest>(&agent, req).await {
                Ok(r) => editor_reply(&agent, &r),
                Err(reply) => reply,
            }
        }
        (Method::POST, "/v1/file/upload") => upload(&agent, req).await,
        (Method::GET, "/v1/file/download") => download(&agent, &req),
        (Method::POST, "/v1/jupyter/execute") => match body_json(&agent, req).await {
            Ok(r) => code::jupyter_execute(&agent, r).await,
            Err(reply) => reply,
        },
        (Method::POST, "/v1/jupyter/sessions/create") => match body_json(&agent, req).await {
            Ok(r) => code::jupyter_create(&agent, r).await,
            Err(reply) => reply,
        },
        (Method::GET, "/v1/jupyter/info") => code::jupyter_info(&agent),
        (Method::GET, "/v1/jupyter/sessions") => code::sessions(&agent, Language::Python),
        (Method::DELETE, "/v1/jupyter/sessions") => code::close_sessions(&agent, Language::Python),
        (Method::DELETE, p) if p.starts_with("/v1/jupyter/sessions/") => {
            let id = percent_decode(&p["/v1/jupyter/sessions/".len()..]);
            code::close_session(&agent, Language::Python, &id)
        }
        (Method::POST, "/v1/code/execute") => match body_json(&agent, req).await {
            Ok(r) => code::code_execute(&agent, r).await,
            Err(reply) => reply,
        },
        (Method::GET, "/v1/code/info") => code::code_info(&agent),
        (Method::POST, "/v1/nodejs/execute") => match body_json(&agent, req).await {
            Ok(r) => code::nodejs_execute(&agent, r).await,
            Err(reply) => reply,
        },
        (Method::GET, "/v1/browser/info") => browser_info(&agent, &req).await,
        (Method::GET, "/v1/browser/screenshot") => screenshot(&agent, &req, false).await,
        // `/json/version/`: Playwright's `connect_over_cdp(http_url)` asks with the slash.
        (
            Method::GET,
            "/json/version" | "/json/version/" | "/json/list" | "/json" | "/cdp/json/version",
        ) => devtools_json(&agent, &req).await,
        (Method::GET, p) if p.starts_with("/devtools/") => relay(&agent, req).await,
        _ => error(
            StatusCode::NOT_FOUND,
            format!("no route {} {path}", req.method()),
        ),
    }
}

/// `?format=png|jpg|jpeg&quality=0..100` (and `full_page=true` where the page route
/// takes it).
async fn screenshot(agent: &Agent, req: &Request<Incoming>, page_route: bool) -> Reply {
    let format = query_param(req, "format").unwrap_or_else(|| "png".into());
    let full_page = page_route && query_param(req, "full_page").is_some_and(|v| v == "true");
    let quality = match query_param(req, "quality").map(|q| q.parse::<u8>()) {
        None => None,
        Some(Ok(q)) if q <= 100 => Some(q),
        Some(_) => {
            return error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "quality must be 0 to 100".into(),
            )
        }
    };
    page::screenshot(agent, &format, quality, full_page).await
}

/// `/v1/browser/page/<action>`.
async fn page_route(agent: &Agent, action: &str, req: Request<Incoming>) -> Reply {
    use page::Action;
    async fn body<T: DeserializeOwned>(
        agent: &Agent,
        req: Request<Incoming>,
        wrap: impl FnOnce(T) -> Action,
    ) -> Result<Action, Reply> {
        body_json(agent, req).await.map(wrap)
    }
    let method = req.method().clone();
    let action = match (method, action) {
        (Method::GET, "screenshot") => return screenshot(agent, &req, true).await,
        (Method::GET, "html") => Ok(Action::Html),
        (Method::GET, "text") => Ok(Action::Text),
        (Method::GET, "elements") => Ok(Action::Elements),
        (Method::POST, "back") => Ok(Action::Back),
        (Method::POST, "forward") => Ok(Action::Forward),
        (Method::POST, "reload") => Ok(Action::Reload),
        (Method::POST, "navigate") => body(agent, req, Action::Navigate).await,
        (Method::POST, "click") => body(agent, req, Action::Click).await,
        (Method::POST, "fill") => body(agent, req, Action::Fill).await,
        (Method::POST, "type") => body(agent, req, Action::Type).await,
        (Method::POST, "press_key") => body(agent, req, Action::PressKey).await,
        (Method::POST, "hot_key") => body(agent, req, Action::HotKey).await,
        (Method::POST, "hover") => body(agent, req, Action::Hover).await,
        (Method::POST, "select_option") => body(agent, req, Action::SelectOption).await,
        (Method::POST, "check") => body(agent, req, |r| Action::Check(r, true)).await,
        (Method::POST, "uncheck") => body(agent, req, |r| Action::Check(r, false)).await,
        (Method::POST, "scroll") => body(agent, req, Action::Scroll).await,
        (Method::POST, "scroll_to") => body(agent, req, Action::ScrollTo).await,
        (Method::POST, "scroll_to_element") => body(agent, req, Action::ScrollToElement).await,
        (Method::POST, "evaluate") => body(agent, req, Action::Evaluate).await,
        (Method::POST, "find_text") => body(agent, req, Action::FindText).await,
        (Method::POST, "wait") => body(agent, req, Action::Wait).await,
        (Method::GET, "markdown") => Ok(Action::Markdown),
        (Method::POST, "fill_form") => body(agent, req, Action::FillForm).await,
        (Method::POST, "upload_file") => body(agent, req, Action::UploadFile).await,
        (Method::POST, "record") => {
            return match body_json(agent, req).await {
                Ok(r) => crate::record::handle(agent, r).await,
                Err(reply) => reply,
            }
        }
        (Method::GET, "console") => {
            return match query_param(&req, "clear").as_deref() {
                None | Some("false") | Some("0") => console::get(agent, false).await,
                Some("true") | Some("1") => console::get(agent, true).await,
                Some(v) => error(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    format!("clear must be true or false, not {v:?}"),
                ),
            }
        }
        (Method::POST, "console/export") => {
            return match body_json(agent, req).await {
                Ok(r) => console::export(agent, r).await,
                Err(reply) => reply,
            }
        }
        (m, _) => {
            return error(
                StatusCode::NOT_FOUND,
                format!("no route {m} /v1/browser/page/{action}"),
            )
        }
    };
    match action {
        Ok(action) => page::act(agent, action).await,
        Err(reply) => reply,
    }
}

// === auth ===

fn authorized(key: &str, req: &Request<Incoming>) -> bool {
    let headers = req.headers();
    let given = headers
        .get(API_KEY_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| {
            headers
                .get(AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::to_string)
        })
        .or_else(|| query_param(req, "api_key"));
    given.is_some_and(|g| constant_time_eq(g.as_bytes(), key.as_bytes()))
}

/// No early exit on the first differing byte, so the time does not tell how much matched.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn query_param(req: &Request<Incoming>, name: &str) -> Option<String> {
    req.uri().query()?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == name).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let decoded = match bytes[i] {
            b'%' if i + 2 < bytes.len() => hex(bytes[i + 1]).zip(hex(bytes[i + 2])),
            _ => None,
        };
        match (decoded, bytes[i]) {
            (Some((hi, lo)), _) => {
                out.push(hi << 4 | lo);
                i += 3;
                continue;
            }
            (None, b'+') => out.push(b' '),
            (None, b) => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

// === bodies and answers ===

/// The whole body, at most `max_body_bytes` (413 beyond, before reading it when the length
/// is declared).
async fn body_bytes(agent: &Agent, req: Request<Incoming>) -> Result<Bytes, Reply> {
    let limit = agent.config.max_body_bytes;
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let too_large = || {
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body is larger than {limit} bytes"),
        )
    };
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    match Limited::new(req.into_body(), limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Err(e) => Err(error(
            StatusCode::BAD_REQUEST,
            format!("reading the request body: {e}"),
        )),
    }
}

/// A JSON body; 422 when it does not match the schema (upstream's validation status).
async fn body_json<T: DeserializeOwned>(agent: &Agent, req: Request<Incoming>) -> Result<T, Reply> {
    let bytes = body_bytes(agent, req).await?;
    serde_json::from_slice(&bytes).map_err(|e| {
        error(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("invalid request body: {e}"),
        )
    })
}

/// A file call's answer: the result, or `FileOperationError` in `data` with
/// `success: false` (upstream answers those with HTTP 200).
fn file_reply<T: Serialize>(path: &str, op: &'static str, result: Result<T, FileError>) -> Reply {
    match result {
        Ok(v) => json(StatusCode::OK, &Envelope::ok(v)),
        Err(e) => {
            let data = e.to_operation_error(path, op);
            json(
                StatusCode::OK,
                &Envelope {
                    success: false,
                    message: data.message.clone(),
                    data: Some(data),
                    hint: None,
                },
            )
        }
    }
}

/// `/v1/file/str_replace_editor`'s answer: a failure is a `StrReplaceEditorResult` with
/// `error` set (the SDK parses no other type here).
fn editor_reply(agent: &Agent, req: &edit::StrReplaceEditorRequest) -> Reply {
    match agent.editor.str_replace_editor(req) {
        Ok(v) => json(StatusCode::OK, &Envelope::ok(v)),
        Err(e) => {
            let failure = e.to_operation_error(&req.path, "str_replace_editor");
            let prev_exist = agent
                .workspace
                .resolve(&req.path)
                .is_ok_and(|p| p.symlink_metadata().is_ok());
            let data = edit::StrReplaceEditorResult {
                output: failure.message.clone(),
                error: Some(failure.message.clone()),
                path: req.path.clone(),
                prev_exist,
                old_content: None,
                new_content: None,
                error_type: Some(failure.error_type),
            };
            json(
                StatusCode::OK,
                &Envelope {
                    success: false,
                    message: failure.message,
                    data: Some(data),
                    hint: None,
                },
            )
        }
    }
}

// === sandbox ===

fn sandbox_info(agent: &Agent) -> api::SandboxResponse {
    let home = agent.workspace.root().display().to_string();
    let os_release = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    let field = |key: &str| {
        os_release
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .map(|v| v.trim_matches('"').to_string())
            .unwrap_or_default()
    };
    let tool = |name: &str, path: &str| {
        std::path::Path::new(path).exists().then(|| api::ToolSpec {
            name: name.into(),
            path: path.into(),
        })
    };
    api::SandboxResponse {
        success: true,
        message: "Operation successful".into(),
        data: None,
        hint: None,
        home_dir: home.clone(),
        workspace: home.clone(),
        version: env!("CARGO_PKG_VERSION").into(),
        detail: api::SandboxDetail {
            system: api::SystemEnv {
                os: field("ID"),
                os_version: field("VERSION_ID"),
                arch: std::env::consts::ARCH.into(),
                user: std::env::var("USER").unwrap_or_else(|_| "gem".into()),
                home_dir: home.clone(),
                workspace: home,
                timezone: "UTC".into(),
                occupied_ports: Vec::new(),
            },
            runtime: api::RuntimeEnv {
                python: tool("python3", "/usr/bin/python3").into_iter().collect(),
                nodejs: tool("node", "/usr/bin/node").into_iter().collect(),
            },
            utils: Vec::new(),
        },
    }
}

// === exec ===

/// The command's bound: `hard_timeout`, else `timeout`, else the default; at most the
/// maximum. `None` for a negative or non-finite value.
fn timeout_of(agent: &Agent, hard: Option<f64>, soft: Option<f64>) -> Option<Duration> {
    match hard.or(soft) {
        None => Some(agent.config.default_timeout),
        Some(s) if s.is_finite() && s > 0.0 => {
            Some(Duration::from_secs_f64(s).min(agent.config.max_timeout))
        }
        Some(_) => None,
    }
}

fn text(bytes: &[u8], max_chars: usize) -> String {
    let s = String::from_utf8_lossy(bytes);
    match s.char_indices().nth(max_chars) {
        Some((i, _)) => s[..i].to_string(),
        None => s.into_owned(),
    }
}

/// The command's bound and working directory, or why they are refused (a 422).
fn bounds(
    agent: &Agent,
    hard: Option<f64>,
    soft: Option<f64>,
    exec_dir: Option<&str>,
) -> Result<(Duration, std::path::PathBuf), String> {
    let timeout = timeout_of(agent, hard, soft)
        .ok_or_else(|| "timeout must be a positive number of seconds".to_string())?;
    let cwd = agent
        .workspace
        .exec_dir(exec_dir)
        .map_err(|e| error_chain(&e))?;
    Ok((timeout, cwd))
}

async fn shell_exec(agent: &Agent, req: api::ShellExecRequest) -> Reply {
    let (timeout, cwd) = match bounds(
        agent,
        req.hard_timeout,
        req.timeout,
        req.exec_dir.as_deref(),
    ) {
        Ok(b) => b,
        Err(message) => return error(StatusCode::UNPROCESSABLE_ENTITY, message),
    };
    let cmd = Command {
        interpreter: Interpreter::Bash,
        script: req.command.clone(),
        cwd: cwd.clone(),
        env: Default::default(),
        timeout,
        cap: agent.config.max_output_bytes,
        merge_stderr: true,
        stdin: None,
    };
    let out = match agent.run(cmd).await {
        Ok(o) => o,
        Err(reply) => return reply,
    };
    let max_chars = if req.truncate {
        SHELL_TRUNCATE_CHARS
    } else {
        usize::MAX
    };
    let output = text(&out.stdout, max_chars);
    let result = api::ShellCommandResult {
        session_id: req.id.unwrap_or_else(|| api::next_id("shell")),
        console: vec![api::ConsoleRecord {
            ps1: format!("{}$ ", cwd.display()),
            command: req.command.clone(),
            output: output.clone(),
        }],
        command: req.command,
        status: if out.timed_out {
            "hard_timeout"
        } else {
            "completed"
        },
        output,
        exit_code: out.exit_code,
    };
    json(StatusCode::OK, &Envelope::ok(result))
}

async fn bash_exec(agent: &Agent, req: api::BashExecRequest) -> Reply {
    let (timeout, cwd) = match bounds(
        agent,
        req.hard_timeout,
        req.timeout,
        req.exec_dir.as_deref(),
    ) {
        Ok(b) => b,
        Err(message) => return error(StatusCode::UNPROCESSABLE_ENTITY, message),
    };
    let cmd = Command {
        interpreter: Interpreter::Bash,
        script: req.command.clone(),
        cwd,
        env: req.env.unwrap_or_default(),
        timeout,
        cap: agent.config.max_output_bytes,
        merge_stderr: false,
        stdin: None,
    };
    let out = match agent.run(cmd).await {
        Ok(o) => o,
        Err(reply) => return reply,
    };
    let stdout = text(&out.stdout, req.max_output_length);
    let stderr = text(&out.stderr, req.max_output_length);
    let result = api::BashExecResult {
        session_id: req.session_id.unwrap_or_else(|| api::next_id("bash")),
        command_id: api::next_id("cmd"),
        command: req.command,
        status: if out.timed_out {
            "timed_out"
        } else {
            "completed"
        },
        offset: stdout.len(),
        stderr_offset: stderr.len(),
        stdout,
        stderr,
        exit_code: out.exit_code,
    };
    json(StatusCode::OK, &Envelope::ok(result))
}

// === files ===

async fn upload(agent: &Agent, req: Request<Incoming>) -> Reply {
    let content_type = req
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = match body_bytes(agent, req).await {
        Ok(b) => b,
        Err(reply) => return reply,
    };
    match crate::files::parse_upload(&content_type, &body) {
        Ok(upload) => {
            let path = upload.path.clone().unwrap_or_default();
            file_reply(&path, "upload", agent.workspace.upload(&upload))
        }
        Err(e) => error(StatusCode::UNPROCESSABLE_ENTITY, e.to_string()),
    }
}

fn download(agent: &Agent, req: &Request<Incoming>) -> Reply {
    let Some(path) = query_param(req, "path") else {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "query parameter `path` is required".into(),
        );
    };
    let bytes = agent
        .workspace
        .resolve(&path)
        .and_then(|p| agent.workspace.read_bytes(&p));
    match bytes {
        Ok(bytes) => {
            let mut res = Response::new(Full::new(Bytes::from(bytes)));
            res.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            res
        }
        Err(e) => error(file_status(&e), error_chain(&e)),
    }
}

// === browser ===

/// The host:port the client used to reach the agent, for URLs handed back to it.
fn public_host(req: &Request<Incoming>) -> String {
    req.headers()
        .get(HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("127.0.0.1")
        .to_string()
}

/// Chromium's `ws://127.0.0.1:<port>/...` URLs pointed at this agent instead.
fn rewrite_ws_urls(text: &str, chromium_port: u16, host: &str) -> String {
    text.replace(
        &format!("ws://127.0.0.1:{chromium_port}/"),
        &format!("ws://{host}/"),
    )
    .replace(
        &format!("ws://localhost:{chromium_port}/"),
        &format!("ws://{host}/"),
    )
}

fn browser_error(e: crate::browser::BrowserError) -> Reply {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("browser unavailable: {}", error_chain(&e)),
    )
}

async fn browser_info(agent: &Agent, req: &Request<Incoming>) -> Reply {
    let version = match agent.browser.version().await {
        Ok(v) => v,
        Err(e) => return browser_error(e),
    };
    let field = |k: &str| version.get(k).and_then(|v| v.as_str()).unwrap_or("");
    let cdp_url = rewrite_ws_urls(
        field("webSocketDebuggerUrl"),
        agent.browser.port(),
        &public_host(req),
    );
    let info = api::BrowserInfoResult {
        user_agent: field("User-Agent").to_string(),
        cdp_url,
        vnc_url: String::new(),
        cdp_ui_url: None,
        viewport: api::BrowserViewport {
            width: 1280,
            height: 720,
        },
    };
    json(StatusCode::OK, &Envelope::ok(info))
}

async fn devtools_json(agent: &Agent, req: &Request<Incoming>) -> Reply {
    if let Err(e) = agent.browser.version().await {
        return browser_error(e);
    }
    let path = match req.uri().path() {
        "/cdp/json/version" | "/json/version/" => "/json/version",
        p => p,
    };
    match crate::browser::local_get(agent.browser.port(), path).await {
        Ok(body) => {
            let text = String::from_utf8_lossy(&body);
            let rewritten = rewrite_ws_urls(&text, agent.browser.port(), &public_host(req));
            let mut res = Response::new(Full::new(Bytes::from(rewritten)));
            res.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            res
        }
        Err(e) => browser_error(e),
    }
}

/// A CDP WebSocket: the upgrade request goes to Chromium (query dropped, `Host` made
/// local); after its 101, bytes are copied both ways until either side closes.
async fn relay(agent: &Agent, mut req: Request<Incoming>) -> Reply {
    if let Err(e) = agent.browser.version().await {
        return browser_error(e);
    }
    let port = agent.browser.port();
    let relay_failed = |what: &str, e: &dyn std::fmt::Display| {
        error(StatusCode::BAD_GATEWAY, format!("CDP relay: {what}: {e}"))
    };
    let stream = match TcpStream::connect(("127.0.0.1", port)).await {
        Ok(s) => s,
        Err(e) => return relay_failed("connecting to chromium", &e),
    };
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    {
        Ok(pair) => pair,
        Err(e) => return relay_failed("handshake with chromium", &e),
    };
    tokio::spawn(conn.with_upgrades());
    let mut upstream = Request::get(req.uri().path());
    for (name, value) in req.headers() {
        let skip = name == HOST || name == AUTHORIZATION || name.as_str() == API_KEY_HEADER;
        if !skip {
            upstream = upstream.header(name, value);
        }
    }
    let upstream = match upstream
        .header(HOST, format!("127.0.0.1:{port}"))
        .body(Full::new(Bytes::new()))
    {
        Ok(r) => r,
        Err(e) => return relay_failed("building the request", &e),
    };
    let mut upstream_res = match sender.send_request(upstream).await {
        Ok(r) => r,
        Err(e) => return relay_failed("request to chromium", &e),
    };
    let mut res = Response::new(Full::new(Bytes::new()));
    *res.status_mut() = upstream_res.status();
    *res.headers_mut() = upstream_res.headers().clone();
    if upstream_res.status() != StatusCode::SWITCHING_PROTOCOLS {
        return res;
    }
    let client_side = hyper::upgrade::on(&mut req);
    let chromium_side = hyper::upgrade::on(&mut upstream_res);
    tokio::spawn(async move {
        let (Ok(client), Ok(chromium)) = tokio::join!(client_side, chromium_side) else {
            return;
        };
        tokio::io::copy_bidirectional(&mut TokioIo::new(client), &mut TokioIo::new(chromium))
            .await
            .ok();
    });
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_query_values() {
        assert_eq!(percent_decode("a%20b+c%2Fd"), "a b c/d");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz"), "%zz");
    }

    #[test]
    fn compares_keys_fully() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
    }

    #[test]
    fn rewrites_debugger_urls_to_the_agent() {
        let text = r#"{"webSocketDebuggerUrl":"ws://127.0.0.1:9222/devtools/browser/abc"}"#;
        assert_eq!(
            rewrite_ws_urls(text, 9222, "172.18.0.5:8080"),
            r#"{"webSocketDebuggerUrl":"ws://172.18.0.5:8080/devtools/browser/abc"}"#
        );
    }
}
