//! The E2B facade: E2B's own SDKs (`e2b`, `e2b-code-interpreter`, and the frameworks built on
//! them) run unchanged against the mesh once `E2B_API_URL` and `E2B_SANDBOX_URL` name this
//! listener (`SANDMESH_E2B_ADDR`). Everything goes to one origin over HTTP/1.1: the control
//! plane by path, a sandbox's envd (port 49983) and code interpreter (49999) by the headers
//! `E2b-Sandbox-Id` / `E2b-Sandbox-Port`, whose paths do not collide.
//!
//! A sandbox is a session; its files are the session's workspace (`/home/user` is its root);
//! a command is a shell execution in it, a `run_code` a cell of its kernel. Everything is done
//! as the caller's tenant over that tenant's own connection ([`crate::api::Agent`]), so
//! another tenant's sandbox is not found, exactly as on `/api/v1`.
//!
//! Identity: `X-API-KEY` on the control plane (a sandmesh key, or its `e2b_<hex>` spelling);
//! on a sandbox's own routes the SDKs send no key but the sandbox's `envdAccessToken`
//! (`X-Access-Token`), a MAC of the sandbox id under the key that made it
//! ([`crate::keys::KeyStore::sandbox_token`]).
//!
//! ```text
//! router ── control  /v2/sandboxes, /sandboxes/{id}[/timeout], /v2/sandboxes/{id}/connect
//!        ├─ rpc      /process.Process/* ─ `process` (a command as an execution), or a
//!        │           session process: `process_streams` (Start, Connect), `processes` (the
//!        │           rest); /filesystem.Filesystem/* ─ `files`
//!        │           (Connect with the JSON codec: framing in `connect`)
//!        ├─ files    GET|POST /files
//!        └─ interpreter  POST /execute (JSON lines)
//! every execution: crate::stream::events (notice, output, result) → E2B's shape
//! ```
//!
//! Unlike `/api/v1`'s, the facade's request bodies are read leniently: their types are E2B's
//! protocol, and an official SDK newer than this facade may send fields it does not model.
//! What the facade acts on it reads, and the rest it ignores.
//!
//! Errors are E2B's shapes: `{"code": <status>, "message"}` on the control plane, `/files` and
//! `/execute`; Connect's `{"code": "not_found", "message"}` on the RPCs. What sandmesh cannot
//! do (pause, snapshots, templates, …) answers 501 naming it.

pub mod connect;
pub mod control;
pub mod files;
pub mod interpreter;
pub mod process;
pub mod process_rpc;
pub mod process_streams;
pub mod processes;

use std::sync::Arc;

use axum::extract::{FromRequestParts, Path, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::{Json, Router};
use messages::session::SessionState;
use messages::validate::validate_relative_path;
use serde::Serialize;

use crate::api::{Agent, App};
use crate::problem::Problem;

pub use connect::Code;

/// The envd version the facade answers as. It selects the SDKs' behaviour: from 0.4.0 no
/// default user is sent; below 0.5.7 uploads are multipart and `close_stdin` is refused by the
/// SDK itself, which suits what the facade serves.
pub const ENVD_VERSION: &str = "0.4.0";

/// The sandbox user's home in E2B: the root of the session's workspace here.
pub const HOME: &str = "/home/user";

/// The header naming the sandbox of a sandbox route.
const SANDBOX_ID: &str = "e2b-sandbox-id";
/// The sandbox's token on its own routes.
const ACCESS_TOKEN: &str = "x-access-token";

pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v2/sandboxes", post(control::create).get(control::list))
        .route(
            "/sandboxes/{id}",
            get(control::detail).delete(control::kill),
        )
        .route("/sandboxes/{id}/timeout", post(control::set_timeout))
        .route("/v2/sandboxes/{id}/connect", post(control::connect))
        .route("/health", get(|| async { StatusCode::NO_CONTENT }))
        .route("/files", get(files::read).post(files::write))
        .route("/execute", post(interpreter::execute))
        .route("/process.Process/{method}", any(process_rpc))
        .route("/filesystem.Filesystem/{method}", any(filesystem_rpc))
        .fallback(control::unsupported)
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            crate::body::idle_timeout,
        ))
        .with_state(app)
}

/// `process.Process/*`, with errors in Connect's shape.
async fn process_rpc(
    State(app): State<Arc<App>>,
    Path(method): Path<String>,
    req: Request,
) -> Response {
    let served = process_rpc::serve(&app, &method, req).await;
    served.unwrap_or_else(connect::error_response)
}

/// `filesystem.Filesystem/*`, with errors in Connect's shape.
async fn filesystem_rpc(
    State(app): State<Arc<App>>,
    Path(method): Path<String>,
    req: Request,
) -> Response {
    let served = files::serve(&app, &method, req).await;
    served.unwrap_or_else(connect::error_response)
}

// === E2bError ===

/// An error in E2B's shapes: `status` and `message` for the REST routes, `code` (Connect's)
/// and `message` for the RPCs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct E2bError {
    pub status: StatusCode,
    pub code: Code,
    pub message: String,
}

/// E2B's REST error body.
#[derive(Debug, Serialize)]
struct ApiError<'a> {
    code: u16,
    message: &'a str,
}

impl E2bError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            status: code.http_status(),
            code,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(Code::NotFound, message)
    }

    pub fn unauthenticated(message: impl Into<String>) -> Self {
        Self::new(Code::Unauthenticated, message)
    }

    /// What sandmesh does not do, named.
    pub fn unsupported(what: &str) -> Self {
        Self::new(
            Code::Unimplemented,
            format!("{what} is not supported by sandmesh's E2B facade"),
        )
    }

    /// Over a size limit: 413, never 429 (the SDKs retry 429).
    pub fn too_large(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            code: Code::ResourceExhausted,
            message: message.into(),
        }
    }
}

impl From<Problem> for E2bError {
    fn from(p: Problem) -> Self {
        let status = StatusCode::from_u16(p.status).unwrap_or(StatusCode::BAD_GATEWAY);
        Self {
            status,
            code: Code::of_status(status),
            message: p.detail,
        }
    }
}

impl From<sandmesh_client::ClientError> for E2bError {
    fn from(e: sandmesh_client::ClientError) -> Self {
        Problem::from(e).into()
    }
}

impl IntoResponse for E2bError {
    fn into_response(self) -> Response {
        let body = ApiError {
            code: self.status.as_u16(),
            message: &self.message,
        };
        (self.status, Json(body)).into_response()
    }
}

pub type E2bReply = Result<Response, E2bError>;

// === Sandbox ===

/// The caller of a sandbox route: the sandbox named by `E2b-Sandbox-Id`, opened by the key
/// whose token `X-Access-Token` carries, as that key's tenant. A killed sandbox is not found.
pub struct Sandbox {
    pub agent: Agent,
    pub id: String,
}

impl Sandbox {
    pub async fn from_headers(app: &App, headers: &HeaderMap) -> Result<Self, E2bError> {
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let id = header(SANDBOX_ID)
            .ok_or_else(|| E2bError::invalid("send the sandbox id in E2b-Sandbox-Id"))?;
        let token = header(ACCESS_TOKEN).ok_or_else(|| {
            E2bError::unauthenticated("send the sandbox's envdAccessToken in X-Access-Token")
        })?;
        let caller = app
            .keys
            .verify_sandbox_token(token, id)
            .ok_or_else(|| E2bError::unauthenticated("the access token is not this sandbox's"))?;
        let agent = Agent::acting_as(app, caller).await?;
        let record = agent.mesh.sessions().get(id).await?;
        if record.state == SessionState::Closed {
            return Err(E2bError::not_found(format!("sandbox {id} was killed")));
        }
        Ok(Self {
            agent,
            id: id.to_string(),
        })
    }
}

impl FromRequestParts<Arc<App>> for Sandbox {
    type Rejection = E2bError;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Self, E2bError> {
        Self::from_headers(app, &parts.headers).await
    }
}

// === paths ===

/// The workspace path (`""`: its root) of an E2B path: `/home/user/<p>` or a relative `<p>`.
/// Other absolute paths are outside the workspace, where nothing of the session lives.
pub fn workspace_path(path: &str) -> Result<String, E2bError> {
    let relative = match path.strip_prefix(HOME) {
        Some("") => "",
        Some(rest) if rest.starts_with('/') => &rest[1..],
        _ if path.starts_with('/') => {
            return Err(E2bError::invalid(format!(
                "{path}: only paths under {HOME} (the sandbox's workspace) exist here"
            )))
        }
        _ => path,
    };
    let relative = relative.trim_start_matches("./").trim_end_matches('/');
    if !relative.is_empty() && relative != "." {
        validate_relative_path("path", relative).map_err(|e| E2bError::invalid(e.to_string()))?;
        return Ok(relative.to_string());
    }
    Ok(String::new())
}

/// The E2B path of a workspace path.
pub fn e2b_path(workspace: &str) -> String {
    match workspace {
        "" => HOME.to_string(),
        p => format!("{HOME}/{p}"),
    }
}

/// The line the caller's `on_stderr` hears while an execution waits for a person.
pub fn awaiting_line(confirmation_id: &str) -> String {
    format!("awaiting approval {confirmation_id} (sandmesh confirm approve {confirmation_id})\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn home_and_relative_paths_map_into_the_workspace() {
        for (e2b, ws) in [
            ("/home/user", ""),
            ("/home/user/", ""),
            ("/home/user/a.txt", "a.txt"),
            ("/home/user/d/e/", "d/e"),
            ("a.txt", "a.txt"),
            ("./a.txt", "a.txt"),
            (".", ""),
        ] {
            assert_eq!(workspace_path(e2b).unwrap(), ws, "{e2b}");
        }
        for outside in [
            "/etc/passwd",
            "/home/username",
            "/home/user/../x",
            "../x",
            "a/../../b",
        ] {
            let e = workspace_path(outside).unwrap_err();
            assert_eq!(e.code, Code::InvalidArgument, "{outside}");
        }
        assert_eq!(e2b_path(""), HOME);
        assert_eq!(e2b_path("d/a.txt"), "/home/user/d/a.txt");
    }
}
