//! The routes and what every one of them shares: the caller's identity
//! ([`Agent`]: key → rate limit → the tenant's connection) and bodies read under a cap with
//! errors in the problem shape. Bodies are the NATS messages themselves (`messages` types), so
//! one schema serves both faces of the mesh.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{FromRef, FromRequest, FromRequestParts, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use messages::exec::{ExecRequest, ExecResult, ResultGet, ResultLookup, MAX_RESULT_WAIT_MS};
use messages::heartbeat::Heartbeat;
use messages::session::{SessionListReply, SessionOpen, SessionRecord, SessionState};
use messages::testrun::{TestReport, TestRequest};
use sandmesh_client::MeshClient;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::body::BodyError;
use crate::config::Limits;
use crate::keys::{Caller, KeyStore};
use crate::problem::{Errors, Problem, Reply};
use crate::rate::RateLimiter;
use crate::stream;
use crate::tenants::Tenants;

/// What every request handler reaches.
pub struct App {
    pub keys: KeyStore,
    pub rate: RateLimiter,
    pub tenants: Tenants,
    /// The gateway's own service connection: heartbeats for `/runtimes`, health.
    pub own: MeshClient,
    pub limits: Limits,
}

/// The limits, for middleware that needs nothing else of the app (`body::idle_timeout`).
impl FromRef<Arc<App>> for Limits {
    fn from_ref(app: &Arc<App>) -> Self {
        app.limits
    }
}

// === impl Agent ===

/// The caller, authenticated by its key, within its rate, with its tenant's connection.
pub struct Agent {
    pub caller: Caller,
    pub mesh: MeshClient,
}

impl FromRequestParts<Arc<App>> for Agent {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Self, Problem> {
        let presented = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or_else(|| {
                Problem::unauthorized(
                    "send `Authorization: Bearer <key>` (`sandmesh tenant key create`)",
                )
            })?;
        let caller = app
            .keys
            .verify(presented.trim())
            .ok_or_else(|| Problem::unauthorized("unknown or revoked API key"))?;
        Self::acting_as(app, caller).await
    }
}

impl Agent {
    /// `caller`, within its key's rate, with its tenant's connection (the E2B facade
    /// authenticates its own ways, then comes here).
    pub async fn acting_as(app: &App, caller: Caller) -> Result<Self, Problem> {
        if let Err(wait) = app.rate.take(&caller.key_id) {
            return Err(Problem::rate_limited(
                wait.as_secs_f64().ceil().max(1.0) as u64
            ));
        }
        let mesh = app.tenants.client(&caller.tenant).await.map_err(|e| {
            tracing::warn!(tenant = %caller.tenant, error = %kit::error_chain(&e), "no connection for a tenant");
            Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                sandmesh_client::ErrorKind::Unavailable.as_str(),
                format!("cannot act as tenant {}", caller.tenant),
            )
        })?;
        Ok(Self { caller, mesh })
    }
}

// === extractors with problem-shaped rejections ===

/// A JSON body of at most the configured size. No body at all reads as JSON `null`: an
/// `Option` is `None`, anything else is refused. Decoded as the mesh decodes a NATS payload
/// (`messages::codec`): a body with a field its type refuses (every `messages` request type
/// and the gateway's own bodies do) is refused as over NATS, naming the field.
pub struct Body<T>(pub T);

impl<T: DeserializeOwned> FromRequest<Arc<App>> for Body<T> {
    type Rejection = Problem;

    async fn from_request(req: Request, app: &Arc<App>) -> Result<Self, Problem> {
        let cap = app.limits.json_max_bytes;
        let bytes = axum::body::to_bytes(req.into_body(), cap)
            .await
            .map_err(|e| match BodyError::find(&e) {
                Some(e) => Problem::from(e),
                None if is_over_limit(&e) => {
                    Problem::too_large(format!("a JSON body may have at most {cap} bytes"))
                }
                None => Problem::bad_request(kit::error_chain(&e)),
            })?;
        let json: &[u8] = match bytes.iter().all(u8::is_ascii_whitespace) {
            true => b"null",
            false => &bytes,
        };
        messages::Encoding::Json
            .decode(json)
            .map(Self)
            .map_err(|e| Problem::of_body(&e))
    }
}

fn is_over_limit(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(e);
    while let Some(c) = cause {
        if c.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        cause = c.source();
    }
    false
}

/// A path parameter (or several) with a problem-shaped rejection.
pub struct Params<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for Params<T> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(t)| Self(t))
            .map_err(|e| Problem::bad_request(e.body_text()))
    }
}

/// The query string with a problem-shaped rejection.
pub struct QueryOf<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for QueryOf<T> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(t)| Self(t))
            .map_err(|e| Problem::bad_request(e.body_text()))
    }
}

// === health and runtimes ===

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Health {
    /// `ok`: the gateway is connected to NATS.
    pub status: String,
}

/// No key needed: load balancers and `curl` ask it.
#[utoipa::path(
    get,
    path = "/api/v1/health",
    security(()),
    responses((status = 200, description = "connected to NATS", body = Health), Errors)
)]
pub async fn health(State(app): State<Arc<App>>) -> Reply {
    match app.own.nats().connection_state() {
        async_nats::connection::State::Connected => Ok(Json(Health {
            status: "ok".into(),
        })
        .into_response()),
        state => Err(Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            sandmesh_client::ErrorKind::Unavailable.as_str(),
            format!("NATS is {state}"),
        )),
    }
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Runtimes {
    /// Every live instance's last heartbeat (executors carry their backends and resources).
    pub nodes: Vec<Heartbeat>,
}

/// The live instances of the mesh (executor nodes with their backends and resources).
#[utoipa::path(
    get,
    path = "/api/v1/runtimes",
    responses((status = 200, description = "every live instance", body = Runtimes), Errors)
)]
pub async fn runtimes(State(app): State<Arc<App>>, _agent: Agent) -> Reply {
    let nodes = app.own.status().heartbeats().await?;
    Ok(Json(Runtimes { nodes }).into_response())
}

// === sessions ===

/// Opens a session (idempotent when the body names its id).
#[utoipa::path(
    post,
    path = "/api/v1/sessions",
    request_body = Option<SessionOpen>,
    responses((status = 201, description = "the session", body = SessionRecord), Errors)
)]
pub async fn open_session(agent: Agent, Body(req): Body<Option<SessionOpen>>) -> Reply {
    let record = agent.mesh.sessions().open(&req.unwrap_or_default()).await?;
    Ok((StatusCode::CREATED, Json(record)).into_response())
}

/// The tenant's sessions that are not deleted.
#[utoipa::path(
    get,
    path = "/api/v1/sessions",
    responses((status = 200, description = "the tenant's live sessions", body = SessionListReply), Errors)
)]
pub async fn list_sessions(agent: Agent) -> Reply {
    let mut sessions = agent.mesh.sessions().list(None).await?;
    sessions.retain(|s| s.state != SessionState::Closed);
    Ok(Json(SessionListReply { sessions }).into_response())
}

/// A session; a deleted one is not found.
#[utoipa::path(
    get,
    path = "/api/v1/sessions/{id}",
    params(("id" = String, Path, description = "the session id", pattern = r"^[A-Za-z0-9_-]{1,64}$")),
    responses((status = 200, description = "the session", body = SessionRecord), Errors)
)]
pub async fn get_session(agent: Agent, Params(id): Params<String>) -> Reply {
    let record = agent.mesh.sessions().get(&id).await?;
    if record.state == SessionState::Closed {
        return Err(Problem::not_found(format!(
            "session {id} was deleted; open a session with a new id"
        )));
    }
    Ok(Json(record).into_response())
}

/// Deletes a session ("terminate"): its container and its workspace files go;
/// afterwards the session and its files are not found (404), and its id is not reused (a new
/// session of the same id is a 409). Deleting a deleted session deletes nothing more (204).
///
/// On NATS, `sessions.close` keeps a `closed` record and leaves the files to the workspace's
/// TTL; over HTTP a DELETE means the resource is gone, so the gateway also removes the
/// workspace, as the tenant's agent (`workspace.cleanup` of that one session).
#[utoipa::path(
    delete,
    path = "/api/v1/sessions/{id}",
    params(("id" = String, Path, description = "the session id", pattern = r"^[A-Za-z0-9_-]{1,64}$")),
    responses((status = 204, description = "deleted"), Errors)
)]
pub async fn close_session(agent: Agent, Params(id): Params<String>) -> Reply {
    terminate(&agent.mesh, &id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// What deleting a session over HTTP means: closed, and its workspace removed.
pub async fn terminate(mesh: &MeshClient, id: &str) -> Result<(), sandmesh_client::ClientError> {
    mesh.sessions().close(id).await?;
    mesh.workspace().cleanup(Some(id)).await?;
    Ok(())
}

// === executions ===

#[derive(Debug, Default, Deserialize)]
pub struct ExecQuery {
    /// Queue it as a job: 202 with the execution id at once.
    #[serde(default, rename = "async")]
    pub queue: bool,
}

/// The answer to an async execute (the client crate's `Submitted`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Accepted {
    pub execution_id: String,
    /// The id was submitted before: nothing new runs.
    pub duplicate: bool,
}

/// Runs code without a session. `?async=true` queues it (202); `Accept: text/event-stream`
/// streams `output` events (an `OutputChunk` each, in `seq` order), an
/// `awaiting_confirmation` event when a person must decide, then `result` (or `error`).
#[utoipa::path(
    post,
    path = "/api/v1/execute",
    request_body = ExecRequest,
    params(("async" = Option<bool>, Query, description = "queue it and answer 202 at once")),
    responses(
        (status = 200, description = "the result, or the events", content(
            (ExecResult = "application/json"),
            (String = "text/event-stream"),
        )),
        (status = 202, description = "queued", body = Accepted),
        Errors,
    )
)]
pub async fn execute(
    State(app): State<Arc<App>>,
    agent: Agent,
    headers: HeaderMap,
    QueryOf(query): QueryOf<ExecQuery>,
    Body(req): Body<ExecRequest>,
) -> Reply {
    run(&app, agent, &headers, query, req).await
}

/// Runs code in a session (see `/api/v1/execute`).
#[utoipa::path(
    post,
    path = "/api/v1/sessions/{id}/execute",
    request_body = ExecRequest,
    params(
        ("id" = String, Path, description = "the session id", pattern = r"^[A-Za-z0-9_-]{1,64}$"),
        ("async" = Option<bool>, Query, description = "queue it and answer 202 at once"),
    ),
    responses(
        (status = 200, description = "the result, or the events", content(
            (ExecResult = "application/json"),
            (String = "text/event-stream"),
        )),
        (status = 202, description = "queued", body = Accepted),
        Errors,
    )
)]
pub async fn execute_in_session(
    State(app): State<Arc<App>>,
    agent: Agent,
    headers: HeaderMap,
    Params(id): Params<String>,
    QueryOf(query): QueryOf<ExecQuery>,
    Body(mut req): Body<ExecRequest>,
) -> Reply {
    if req.session_id.as_ref().is_some_and(|s| *s != id) {
        return Err(Problem::bad_request(format!(
            "the body names session {:?}, the path {id:?}",
            req.session_id.unwrap_or_default()
        )));
    }
    req.session_id = Some(id);
    run(&app, agent, &headers, query, req).await
}

/// Sync (the result), async (202 and the id) or streamed (Server-Sent Events).
async fn run(
    app: &App,
    agent: Agent,
    headers: &HeaderMap,
    query: ExecQuery,
    req: ExecRequest,
) -> Reply {
    let exec = agent.mesh.exec();
    if query.queue {
        let submitted = exec.submit(&req).await?;
        let location = format!("/api/v1/executions/{}", submitted.execution_id);
        let mut response = (
            StatusCode::ACCEPTED,
            Json(Accepted {
                execution_id: submitted.execution_id,
                duplicate: submitted.duplicate,
            }),
        )
            .into_response();
        if let Ok(value) = HeaderValue::from_str(&location) {
            response.headers_mut().insert(header::LOCATION, value);
        }
        return Ok(response);
    }
    if wants_events(headers) {
        return stream::execute(agent.mesh, req, app.limits.exec_timeout).await;
    }
    let result = exec.exec_timeout(&req, app.limits.exec_timeout).await?;
    Ok(Json(result).into_response())
}

/// Runs tests against code in the sandbox (pytest for Python, `node --test` for JavaScript) and
/// answers each test's status with the totals. A test run is an execution: risky code or tests
/// wait for a person's approval before the answer comes.
#[utoipa::path(
    post,
    path = "/api/v1/test",
    request_body = TestRequest,
    responses((status = 200, description = "the per-test report", body = TestReport), Errors)
)]
pub async fn run_tests(
    State(app): State<Arc<App>>,
    agent: Agent,
    Body(req): Body<TestRequest>,
) -> Reply {
    let report = agent
        .mesh
        .exec()
        .run_tests_notified(&req, app.limits.exec_timeout, |_| {})
        .await?;
    Ok(Json(report).into_response())
}

fn wants_events(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("text/event-stream"))
}

#[derive(Debug, Default, Deserialize)]
pub struct ResultQuery {
    /// Hold the answer until the result is stored, at most this long (≤ 30 000).
    pub wait_ms: Option<u64>,
}

/// The status (`pending`, with a waiting approval if any) or the result (`done`).
#[utoipa::path(
    get,
    path = "/api/v1/executions/{id}",
    params(
        ("id" = String, Path, description = "the execution id", pattern = r"^[A-Za-z0-9_-]{1,64}$"),
        ("wait_ms" = Option<u64>, Query, description = "hold the answer until the result is stored, at most this long (≤ 30000)"),
    ),
    responses((status = 200, description = "pending or done", body = ResultLookup), Errors)
)]
pub async fn execution(
    agent: Agent,
    Params(id): Params<String>,
    QueryOf(query): QueryOf<ResultQuery>,
) -> Reply {
    let wait_ms = query.wait_ms.map(|w| w.min(MAX_RESULT_WAIT_MS));
    let req = ResultGet {
        execution_id: id,
        wait_ms,
    };
    let timeout = agent.mesh.timeout() + Duration::from_millis(wait_ms.unwrap_or(0));
    let subject = agent.mesh.subjects().results_get();
    let lookup: ResultLookup = agent.mesh.request_timeout(subject, &req, timeout).await?;
    Ok(Json(lookup).into_response())
}
