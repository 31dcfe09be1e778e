//! envd's files: plain HTTP `GET|POST /files` (read, multipart write) and the
//! `filesystem.Filesystem` RPCs, on the session's workspace (`/home/user` is its root).
//!
//! Reads, writes, listings, stats, removals and moves (of files) are the workspace store's;
//! `MakeDir` has no store operation, so it runs `mkdir -p` in the sandbox, whose files the
//! workspace takes back when the command ends.

use std::sync::Arc;

use axum::extract::{Query, Request, State};
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use axum::Json;
use messages::exec::{ExecRequest, ExecStatus, Language};
use messages::workspace::WsEntry;
use serde::{Deserialize, Serialize};

use super::connect::{self, Shape};
use super::process::shell_quote;
use super::{e2b_path, workspace_path, E2bError, E2bReply, Sandbox};
use crate::api::App;
use crate::problem::Problem;

#[derive(Debug, Default, Deserialize)]
pub struct PathQuery {
    pub path: Option<String>,
}

/// `GET /files?path=`: the file's bytes, streamed (as `/api/v1`'s download).
pub async fn read(
    sandbox: Sandbox,
    query: Result<Query<PathQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> E2bReply {
    let Query(query) = query.map_err(|e| E2bError::invalid(e.body_text()))?;
    let path = query
        .path
        .ok_or_else(|| E2bError::invalid("name the file: /files?path=…"))?;
    let path = workspace_path(&path)?;
    let params = crate::api::Params((sandbox.id, path));
    Ok(crate::files::download(sandbox.agent, params, headers).await?)
}

/// What envd answers for each file written.
#[derive(Debug, Serialize)]
struct Written {
    name: String,
    r#type: &'static str,
    path: String,
}

/// `POST /files[?path=]`: each part named `file`, its filename the target path (`?path=`
/// names the target of a single part instead).
pub async fn write(
    State(app): State<Arc<App>>,
    sandbox: Sandbox,
    query: Result<Query<PathQuery>, axum::extract::rejection::QueryRejection>,
    req: Request,
) -> E2bReply {
    let Query(query) = query.map_err(|e| E2bError::invalid(e.body_text()))?;
    let target = query.path.as_deref().map(workspace_path).transpose()?;
    let path_of = |filename: &str| match &target {
        Some(target) => Ok(target.clone()),
        None => workspace_path(filename).map_err(|e| Problem::bad_request(e.message)),
    };
    let entries =
        crate::files::upload_parts(&app, &sandbox.agent, &sandbox.id, req, path_of).await?;
    let written: Vec<Written> = entries
        .iter()
        .map(|e| Written {
            name: name_of(&e.path).to_string(),
            r#type: "file",
            path: e2b_path(&e.path),
        })
        .collect();
    Ok(Json(written).into_response())
}

fn name_of(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

// === filesystem.Filesystem ===

/// envd's `EntryInfo` (proto3 JSON: camelCase, enums by name).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct EntryInfo {
    name: String,
    r#type: &'static str,
    path: String,
    size: u64,
    mode: u32,
    permissions: String,
    owner: &'static str,
    group: &'static str,
    modified_time: String,
}

impl EntryInfo {
    fn of(entry: &WsEntry) -> Self {
        let kind = if entry.is_dir { 'd' } else { '-' };
        let mut permissions = String::from(kind);
        for shift in [6, 3, 0] {
            let bits = (entry.mode >> shift) & 7;
            permissions.push(if bits & 4 != 0 { 'r' } else { '-' });
            permissions.push(if bits & 2 != 0 { 'w' } else { '-' });
            permissions.push(if bits & 1 != 0 { 'x' } else { '-' });
        }
        Self {
            name: name_of(&entry.path).to_string(),
            r#type: if entry.is_dir {
                "FILE_TYPE_DIRECTORY"
            } else {
                "FILE_TYPE_FILE"
            },
            path: e2b_path(&entry.path),
            size: entry.size,
            mode: entry.mode,
            permissions,
            owner: "user",
            group: "user",
            modified_time: chrono::DateTime::<chrono::Utc>::from_timestamp_millis(
                entry.modified as i64,
            )
            .unwrap_or_default()
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        }
    }

    /// The workspace's root, which the store has no entry for.
    fn root() -> Self {
        Self::of(&WsEntry {
            path: String::new(),
            size: 0,
            is_dir: true,
            modified: 0,
            mode: 0o755,
            sha256: None,
        })
    }
}

#[derive(Debug, Deserialize)]
struct PathRequest {
    #[serde(default)]
    path: String,
}

#[derive(Debug, Deserialize)]
struct ListDirRequest {
    #[serde(default)]
    path: String,
    /// 0 or 1: the directory's own entries; more: that many levels.
    #[serde(default)]
    depth: u32,
}

#[derive(Debug, Deserialize)]
struct MoveRequest {
    source: String,
    destination: String,
}

/// One `filesystem.Filesystem` call.
pub async fn serve(app: &App, method: &str, req: Request) -> E2bReply {
    let sandbox = Sandbox::from_headers(app, req.headers()).await?;
    let ws = sandbox.agent.mesh.workspace();
    let session = sandbox.id.as_str();
    match method {
        "Stat" => {
            let PathRequest { path } = connect::request(req, Shape::Unary).await?;
            let path = workspace_path(&path)?;
            let entry = match path.as_str() {
                "" => EntryInfo::root(),
                p => EntryInfo::of(&ws.stat(session, p).await?),
            };
            Ok(connect::unary(&serde_json::json!({ "entry": entry })))
        }
        "ListDir" => {
            let ListDirRequest { path, depth } = connect::request(req, Shape::Unary).await?;
            let path = workspace_path(&path)?;
            let prefix = (!path.is_empty()).then_some(path.as_str());
            let listing = ws.list(session, prefix, depth > 1).await?;
            let base = path.split('/').filter(|p| !p.is_empty()).count();
            let deepest = base + depth.max(1) as usize;
            let entries: Vec<EntryInfo> = listing
                .entries
                .iter()
                .filter(|e| e.path.split('/').count() <= deepest)
                .map(EntryInfo::of)
                .collect();
            Ok(connect::unary(&serde_json::json!({ "entries": entries })))
        }
        "Remove" => {
            let PathRequest { path } = connect::request(req, Shape::Unary).await?;
            let path = workspace_path(&path)?;
            if path.is_empty() {
                return Err(E2bError::invalid("the workspace's root cannot be removed"));
            }
            ws.delete(session, &path, true).await?;
            Ok(connect::unary(&serde_json::json!({})))
        }
        "MakeDir" => {
            let PathRequest { path } = connect::request(req, Shape::Unary).await?;
            let path = workspace_path(&path)?;
            if path.is_empty() || ws.exists(session, &path).await? {
                return Err(E2bError::new(
                    super::Code::AlreadyExists,
                    format!("{} exists", e2b_path(&path)),
                ));
            }
            let mkdir = format!("mkdir -p -- {}", shell_quote(&path));
            run_in(&sandbox, mkdir).await?;
            let entry = EntryInfo::of(&WsEntry {
                path,
                size: 0,
                is_dir: true,
                modified: messages::now_ms(),
                mode: 0o755,
                sha256: None,
            });
            Ok(connect::unary(&serde_json::json!({ "entry": entry })))
        }
        "Move" => {
            let MoveRequest {
                source,
                destination,
            } = connect::request(req, Shape::Unary).await?;
            let (from, to) = (workspace_path(&source)?, workspace_path(&destination)?);
            if ws.stat(session, &from).await?.is_dir {
                return Err(E2bError::unsupported("moving directories"));
            }
            // Store operations, not `mv` in the sandbox: a move must not wait for a person.
            let bytes = ws.read(session, &from).await?;
            let entry = ws.write(session, &to, &bytes).await?;
            ws.delete(session, &from, false).await?;
            Ok(connect::unary(
                &serde_json::json!({ "entry": EntryInfo::of(&entry) }),
            ))
        }
        other => Err(E2bError::unsupported(&format!(
            "filesystem.Filesystem/{other} (watching directories)"
        ))),
    }
}

/// Runs a shell command in the sandbox for a filesystem call; its failure is the call's.
async fn run_in(sandbox: &Sandbox, code: String) -> Result<(), E2bError> {
    let req = ExecRequest {
        session_id: Some(sandbox.id.clone()),
        language: Language::Shell,
        code,
        requested_by: Some(format!("e2b key {}", sandbox.agent.caller.key_id)),
        ..Default::default()
    };
    let result = sandbox.agent.mesh.exec().exec(&req).await?;
    match result.status {
        ExecStatus::Ok => Ok(()),
        _ => Err(E2bError::new(
            super::Code::FailedPrecondition,
            format!("{}: {}", result.status.as_str(), result.stderr.trim()),
        )),
    }
}
