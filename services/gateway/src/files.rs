//! A session's workspace files over HTTP: list, upload (the raw body, or the file parts of a
//! form; either streamed to the store by chunks), download (streamed by ranges,
//! `Range: bytes=…` answered with 206), delete.

use std::sync::Arc;

use axum::body::Body as HttpBody;
use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::{stream, StreamExt};
use messages::validate::validate_relative_path;
use messages::workspace::{INLINE_MAX_BYTES, READ_RANGE_BYTES};
use sandmesh_client::{Staged, StreamError, WorkspaceClient};
use serde::{Deserialize, Serialize};

use crate::api::{Agent, App, Params, QueryOf};
use crate::body::{self, BodyError};
use crate::problem::{Errors, Problem, Reply};
use messages::workspace::{Ack, WsEntry, WsListing};

#[derive(Debug, Default, Deserialize)]
pub struct ListQuery {
    /// A directory to list instead of the workspace's top.
    pub prefix: Option<String>,
    /// Everything below, not only the directory's own entries.
    #[serde(default)]
    pub recursive: bool,
}

#[utoipa::path(
    get,
    path = "/api/v1/sessions/{id}/files",
    params(
        ("id" = String, Path, description = "the session id", pattern = r"^[A-Za-z0-9_-]{1,64}$"),
        ("prefix" = Option<String>, Query, description = "a directory to list"),
        ("recursive" = Option<bool>, Query, description = "everything below it"),
    ),
    responses((status = 200, description = "the entries", body = WsListing), Errors)
)]
pub async fn list(
    agent: Agent,
    Params(session): Params<String>,
    QueryOf(query): QueryOf<ListQuery>,
) -> Reply {
    let listing = agent
        .mesh
        .workspace()
        .list(&session, query.prefix.as_deref(), query.recursive)
        .await?;
    Ok(Json(listing).into_response())
}

/// The raw body becomes the file (replacing it). It streams to the store by chunks as it
/// arrives (a window of chunks in memory, whatever the size) and becomes visible only once
/// whole: a body that stalls, breaks off or runs over the cap leaves nothing.
#[utoipa::path(
    put,
    path = "/api/v1/sessions/{id}/files/{path}",
    params(
        ("id" = String, Path, description = "the session id", pattern = r"^[A-Za-z0-9_-]{1,64}$"),
        ("path" = String, Path, description = "the file's path in the workspace"),
    ),
    request_body(content = String, content_type = "application/octet-stream", description = "the file's bytes"),
    responses((status = 200, description = "the file as stored", body = WsEntry), Errors)
)]
pub async fn upload(
    State(app): State<Arc<App>>,
    agent: Agent,
    Params((session, path)): Params<(String, String)>,
    req: Request,
) -> Reply {
    validate_relative_path("path", &path).map_err(|e| Problem::bad_request(e.to_string()))?;
    let length = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let cap = upload_cap(&app, &agent, &session, length).await;
    if let (Some(cap), Some(length)) = (cap, length) {
        if length > cap {
            return Err(Problem::from(&BodyError::TooLarge(cap)));
        }
    }
    let content = body::raw(req.into_body(), cap);
    let entry = writer(&agent)
        .write_stream(&session, &path, content)
        .await
        .map_err(problem_of)?;
    Ok(Json(entry).into_response())
}

/// The most one file may have: the gateway's cap and the workspace quota (which the store
/// checks again when the file is committed; asked here, for uploads that may be large, so an
/// oversize one stops as soon as it passes the quota instead of after its last byte).
async fn upload_cap(app: &App, agent: &Agent, session: &str, length: Option<u64>) -> Option<u64> {
    let cap = app.limits.upload_max_bytes;
    if length.is_some_and(|l| l <= INLINE_MAX_BYTES) {
        return cap;
    }
    // No workspace yet, or no answer: the store decides at commit.
    let quota = agent.mesh.workspace().usage(session).await.ok();
    match (cap, quota.map(|u| u.quota_bytes)) {
        (Some(cap), Some(quota)) => Some(cap.min(quota)),
        (cap, quota) => cap.or(quota),
    }
}

fn writer(agent: &Agent) -> WorkspaceClient {
    agent
        .mesh
        .workspace()
        .requested_by(format!("gateway key {}", agent.caller.key_id))
}

fn problem_of(e: StreamError<BodyError>) -> Problem {
    match e {
        StreamError::Content(e) => Problem::from(&e),
        StreamError::Mesh(e) => Problem::from(e),
    }
}

#[derive(Debug, Default, Deserialize)]
pub struct FormQuery {
    /// The directory the files go in (default: the workspace's top).
    pub dir: Option<String>,
}

/// Parts one form may carry: each small one is held until the form is whole, each large one
/// is an open upload of the session until then (the store allows 8 at once).
pub const MAX_FORM_PARTS: usize = 16;

/// The files of a form upload, in the order of their parts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FormUpload {
    pub files: Vec<WsEntry>,
}

/// A form's file parts (`multipart/form-data`; `curl -F file=@a.csv -F file=@b.png`): the
/// request body as the OpenAPI document describes it. The handler reads the parts as they
/// stream in ([`multer::Multipart`]), so nothing builds this type.
#[derive(utoipa::ToSchema)]
pub struct FormFiles {
    /// Any number of parts (field names are free), each with a `filename`: the file's path
    /// under `dir`, checked like every workspace path.
    #[schema(value_type = Vec<String>, content_media_type = "application/octet-stream")]
    pub file: Vec<Vec<u8>>,
}

/// Uploads the file parts of a form. Each part streams to the store as it arrives, like a raw
/// upload; the files appear only once the whole form was read, so a form that stalls, breaks
/// off or carries a bad part leaves none of them.
#[utoipa::path(
    post,
    path = "/api/v1/sessions/{id}/files",
    params(
        ("id" = String, Path, description = "the session id", pattern = r"^[A-Za-z0-9_-]{1,64}$"),
        ("dir" = Option<String>, Query, description = "the directory the files go in"),
    ),
    request_body(content = FormFiles, content_type = "multipart/form-data", description = "one part per file, each with a filename"),
    responses((status = 200, description = "the files as stored", body = FormUpload), Errors)
)]
pub async fn upload_form(
    State(app): State<Arc<App>>,
    agent: Agent,
    Params(session): Params<String>,
    QueryOf(query): QueryOf<FormQuery>,
    req: Request,
) -> Reply {
    form_upload(&app, &agent, &session, query, req).await
}

/// The last segment of the dedicated form-upload path,
/// `POST /api/v1/sessions/{id}/files/upload`.
pub const SEED_UPLOAD: &str = "upload";

/// The dedicated form-upload path: the form upload of `POST /api/v1/sessions/{id}/files` under the
/// name clients of the REST API know. A POST there is always a form; a file named `upload` at the
/// workspace's top is written with `PUT`. Described in the document as a case of `POST
/// …/files/{path}`, not as a path of its own: the path serves GET, PUT and DELETE of that file too,
/// and a path whose `Allow` differs from its documented methods would be wrong.
async fn upload_seed_form(app: &App, agent: &Agent, session: &str, req: Request) -> Reply {
    let Query(query) = Query::<FormQuery>::try_from_uri(req.uri())
        .map_err(|e| Problem::bad_request(e.body_text()))?;
    form_upload(app, agent, session, query, req).await
}

async fn form_upload(
    app: &App,
    agent: &Agent,
    session: &str,
    query: FormQuery,
    req: Request,
) -> Reply {
    let dir = match query.dir.as_deref().map(|d| d.trim_end_matches('/')) {
        None | Some("") => None,
        Some(dir) => {
            validate_relative_path("dir", dir).map_err(|e| Problem::bad_request(e.to_string()))?;
            Some(dir.to_string())
        }
    };
    let path_of = |file: &str| {
        let path = match &dir {
            Some(dir) => format!("{dir}/{file}"),
            None => file.to_string(),
        };
        validate_relative_path("filename", &path)
            .map(|_| path)
            .map_err(|e| Problem::bad_request(e.to_string()))
    };
    let files = upload_parts(app, agent, session, req, path_of).await?;
    Ok(Json(FormUpload { files }).into_response())
}

/// Uploads the file parts of a multipart form, each part's filename turned into its workspace
/// path by `path_of`: each part streams to the store as it arrives, like a raw upload, and the
/// files appear only once the whole form was read, so a form that stalls, breaks off or
/// carries a bad part leaves none of them. The E2B facade's `/files` is this too.
pub async fn upload_parts(
    app: &App,
    agent: &Agent,
    session: &str,
    req: Request,
    path_of: impl Fn(&str) -> Result<String, Problem>,
) -> Result<Vec<WsEntry>, Problem> {
    let boundary = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| Problem::bad_request("send Content-Type: multipart/form-data; boundary=…"))
        .and_then(|ct| {
            multer::parse_boundary(ct).map_err(|e| Problem::bad_request(format!("{ct}: {e}")))
        })?;
    let cap = upload_cap(app, agent, session, None).await;
    let form = multer::Multipart::new(
        body::Paced::new(req.into_body().into_data_stream()),
        boundary,
    );
    let ws = writer(agent);
    let mut staged = Vec::new();
    let read = read_form(form, &ws, session, &path_of, cap, &mut staged).await;
    if let Err(problem) = read {
        for (_, part) in staged {
            ws.abandon(session, part).await;
        }
        return Err(problem);
    }
    let mut files = Vec::with_capacity(staged.len());
    let mut parts = staged.into_iter();
    while let Some((path, part)) = parts.next() {
        match ws.commit(session, &path, part).await {
            Ok(entry) => files.push(entry),
            Err(e) => {
                for (_, rest) in parts {
                    ws.abandon(session, rest).await;
                }
                return Err(e.into());
            }
        }
    }
    Ok(files)
}

/// Stages every file part of `form` into `staged` (path, content), stopping at the first
/// problem (what was staged stays in `staged` for the caller to drop).
async fn read_form(
    mut form: multer::Multipart<'_>,
    ws: &WorkspaceClient,
    session: &str,
    path_of: &impl Fn(&str) -> Result<String, Problem>,
    cap: Option<u64>,
    staged: &mut Vec<(String, Staged)>,
) -> Result<(), Problem> {
    while let Some(field) = form
        .next_field()
        .await
        .map_err(|e| Problem::from(&BodyError::of_form(e)))?
    {
        let name = field.name().unwrap_or("").to_string();
        let Some(file) = field.file_name().map(str::to_string) else {
            return Err(Problem::bad_request(format!(
                "part {name:?} has no filename: give each file's path as its filename"
            )));
        };
        let path = path_of(&file).map_err(|mut p| {
            p.detail = format!("part {name:?}: {}", p.detail);
            p
        })?;
        if staged.len() == MAX_FORM_PARTS {
            return Err(Problem::too_large(format!(
                "a form may carry at most {MAX_FORM_PARTS} files"
            )));
        }
        let content = body::capped(field.map(|item| item.map_err(BodyError::of_form)), cap);
        let part = ws.stage(session, content).await.map_err(problem_of)?;
        staged.push((path, part));
    }
    if staged.is_empty() {
        return Err(Problem::bad_request(
            "the form has no file parts (each needs a filename)",
        ));
    }
    Ok(())
}

/// What `POST …/files/{path}` answers: the file, or for the dedicated `…/files/upload` the
/// form's files. A type of the OpenAPI document only (each handler answers its own variant's
/// type); `Serialize` carries the `untagged` the schema derive reads.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum Posted {
    File(WsEntry),
    Form(FormUpload),
}

/// `upload` for clients that only POST; `POST …/files/upload` is the dedicated form upload
/// (`multipart/form-data`, `?dir=`, answered with the form's files).
#[utoipa::path(
    post,
    path = "/api/v1/sessions/{id}/files/{path}",
    params(
        ("id" = String, Path, description = "the session id", pattern = r"^[A-Za-z0-9_-]{1,64}$"),
        ("path" = String, Path, description = "the file's path in the workspace; `upload`: a form upload"),
        ("dir" = Option<String>, Query, description = "`…/files/upload` only: the directory the files go in"),
    ),
    request_body(
        description = "the file's bytes; for `…/files/upload`, one form part per file",
        content(
            (String = "application/octet-stream"),
            (FormFiles = "multipart/form-data"),
        ),
    ),
    responses((status = 200, description = "the file as stored (for `…/files/upload`: the form's files)", body = Posted), Errors)
)]
pub async fn upload_by_post(
    app: State<Arc<App>>,
    agent: Agent,
    Params((session, path)): Params<(String, String)>,
    req: Request,
) -> Reply {
    if path == SEED_UPLOAD {
        return upload_seed_form(&app, &agent, &session, req).await;
    }
    upload(app, agent, Params((session, path)), req).await
}

#[derive(Debug, Default, Deserialize)]
pub struct DeleteQuery {
    /// A directory with everything in it.
    #[serde(default)]
    pub recursive: bool,
}

#[utoipa::path(
    delete,
    path = "/api/v1/sessions/{id}/files/{path}",
    params(
        ("id" = String, Path, description = "the session id", pattern = r"^[A-Za-z0-9_-]{1,64}$"),
        ("path" = String, Path, description = "the file's path in the workspace"),
        ("recursive" = Option<bool>, Query, description = "a directory with everything in it"),
    ),
    responses((status = 200, description = "removed", body = Ack), Errors)
)]
pub async fn delete(
    agent: Agent,
    Params((session, path)): Params<(String, String)>,
    QueryOf(query): QueryOf<DeleteQuery>,
) -> Reply {
    let ack = agent
        .mesh
        .workspace()
        .requested_by(format!("gateway key {}", agent.caller.key_id))
        .delete(&session, &path, query.recursive)
        .await?;
    Ok(Json(ack).into_response())
}

/// What a `Range` header asks of a file of `size` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wanted {
    Whole,
    /// Bytes `start..=end`.
    Range {
        start: u64,
        end: u64,
    },
    Unsatisfiable,
}

/// One range of `bytes=a-b`, `bytes=a-` or `bytes=-n`. Anything else (several ranges, other
/// units, nonsense) is ignored and the whole file sent, as RFC 9110 allows.
fn wanted(range: Option<&str>, size: u64) -> Wanted {
    let Some(spec) = range.and_then(|r| r.trim().strip_prefix("bytes=")) else {
        return Wanted::Whole;
    };
    if spec.contains(',') {
        return Wanted::Whole;
    }
    let Some((a, b)) = spec.split_once('-') else {
        return Wanted::Whole;
    };
    let (a, b) = (a.trim(), b.trim());
    let (start, end) = match (a.parse::<u64>(), b.parse::<u64>()) {
        (Ok(start), Ok(end)) if start <= end => (start, end.min(size.saturating_sub(1))),
        (Ok(start), Err(_)) if b.is_empty() => (start, size.saturating_sub(1)),
        (Err(_), Ok(suffix)) if a.is_empty() => {
            if suffix == 0 {
                return Wanted::Unsatisfiable;
            }
            (size.saturating_sub(suffix), size.saturating_sub(1))
        }
        _ => return Wanted::Whole,
    };
    if start >= size {
        return Wanted::Unsatisfiable;
    }
    Wanted::Range { start, end }
}

/// Streams the file range by range; a file replaced while it streams ends the body early
/// (its digest changed), so the client sees a short read, never a mix of two versions.
#[utoipa::path(
    get,
    path = "/api/v1/sessions/{id}/files/{path}",
    params(
        ("id" = String, Path, description = "the session id", pattern = r"^[A-Za-z0-9_-]{1,64}$"),
        ("path" = String, Path, description = "the file's path in the workspace"),
        ("Range" = Option<String>, Header, description = "one range: `bytes=a-b`, `bytes=a-`, `bytes=-n`"),
    ),
    responses(
        (status = 200, description = "the whole file", content_type = "application/octet-stream"),
        (status = 206, description = "the range asked for", content_type = "application/octet-stream"),
        (status = 416, description = "the range starts past the end", content_type = "application/problem+json", body = Problem),
        Errors,
    )
)]
pub async fn download(
    agent: Agent,
    Params((session, path)): Params<(String, String)>,
    headers: HeaderMap,
) -> Reply {
    let workspace = agent.mesh.workspace();
    let entry = workspace.stat(&session, &path).await?;
    if entry.is_dir {
        return Err(Problem::bad_request(format!(
            "{path} is a directory: list it with /files?prefix="
        )));
    }
    let size = entry.size;
    let range = headers.get(header::RANGE).and_then(|v| v.to_str().ok());
    let (status, start, end) = match wanted(range, size) {
        Wanted::Whole => (StatusCode::OK, 0, size),
        Wanted::Range { start, end } => (StatusCode::PARTIAL_CONTENT, start, end + 1),
        Wanted::Unsatisfiable => {
            let mut p = Problem::new(
                StatusCode::RANGE_NOT_SATISFIABLE,
                sandmesh_client::ErrorKind::BadRequest.as_str(),
                format!("{path} has {size} bytes"),
            )
            .into_response();
            p.headers_mut().insert(
                header::CONTENT_RANGE,
                HeaderValue::from_str(&format!("bytes */{size}")).expect("ascii"),
            );
            return Ok(p);
        }
    };
    let digest = entry.sha256.clone();
    let ranges = stream::unfold(start, move |offset| {
        let (workspace, session, path, digest) = (
            workspace.clone(),
            session.clone(),
            path.clone(),
            digest.clone(),
        );
        async move {
            if offset >= end {
                return None;
            }
            let length = (end - offset).min(READ_RANGE_BYTES);
            let read = workspace.read_range(&session, &path, offset, length).await;
            let part = match read {
                Ok((bytes, file)) if file.sha256 == digest && !bytes.is_empty() => Ok(bytes),
                Ok(_) => Err(std::io::Error::other(format!(
                    "{path} changed while it was read"
                ))),
                Err(e) => Err(std::io::Error::other(e)),
            };
            let next = if part.is_ok() { offset + length } else { end };
            Some((part, next))
        }
    });
    let mut response = Response::new(HttpBody::from_stream(ranges));
    *response.status_mut() = status;
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(end - start));
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    if status == StatusCode::PARTIAL_CONTENT {
        let value = format!("bytes {start}-{}/{size}", end - 1);
        h.insert(
            header::CONTENT_RANGE,
            HeaderValue::from_str(&value).expect("ascii"),
        );
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_of_a_ten_byte_file() {
        let w = |r| wanted(Some(r), 10);
        assert_eq!(w("bytes=2-4"), Wanted::Range { start: 2, end: 4 });
        assert_eq!(w("bytes=7-"), Wanted::Range { start: 7, end: 9 });
        assert_eq!(w("bytes=-3"), Wanted::Range { start: 7, end: 9 });
        assert_eq!(w("bytes=-30"), Wanted::Range { start: 0, end: 9 });
        assert_eq!(w("bytes=5-100"), Wanted::Range { start: 5, end: 9 });
        assert_eq!(w("bytes=10-"), Wanted::Unsatisfiable);
        assert_eq!(w("bytes=-0"), Wanted::Unsatisfiable);
        for ignored in ["bytes=4-2", "bytes=0-1,3-4", "items=1-2", "bytes=x"] {
            assert_eq!(w(ignored), Wanted::Whole, "{ignored}");
        }
        assert_eq!(wanted(None, 10), Wanted::Whole);
        assert_eq!(wanted(Some("bytes=0-"), 0), Wanted::Unsatisfiable);
    }
}
