//! E2B's control plane (camelCase JSON): a sandbox is a session of the caller's tenant.
//!
//! | E2B | sandmesh |
//! |---|---|
//! | `templateID` `base`, `code-interpreter-v1` | the default sandbox image; any other id names a template |
//! | `timeout` (s) | the session's TTL; `POST /sandboxes/{id}/timeout` moves it live |
//! | `envVars` | the session's env |
//! | `allow_internet_access: true`, `network.allowOut/denyOut` | the session's network policy, admitted under the deployment's ceiling (403 beyond it); absent: no network |
//! | kill | the session closed and its workspace removed |

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{FromRequestParts, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use messages::network::NetworkPolicy;
use messages::session::{SessionOpen, SessionRecord, SessionState};
use serde::{Deserialize, Serialize};

use super::{E2bError, E2bReply, ENVD_VERSION};
use crate::api::{Agent, App, Body, Params};
use crate::problem::Problem;

/// The control plane's key header.
const API_KEY: &str = "x-api-key";
/// What `clientID` says: E2B names the cluster node; the mesh has none to name.
const CLIENT_ID: &str = "sandmesh";
/// The templates E2B's SDKs ask for by default: the mesh's default sandbox.
const DEFAULT_TEMPLATES: [&str; 3] = ["base", "code-interpreter-v1", "code-interpreter"];
/// A page of `GET /v2/sandboxes` when the caller names no limit.
const PAGE: usize = 100;

// === the caller ===

/// The control plane's caller: `X-API-KEY`, in either spelling of a sandmesh key.
pub struct ApiCaller(pub Agent);

impl FromRequestParts<Arc<App>> for ApiCaller {
    type Rejection = E2bError;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Self, E2bError> {
        let presented = parts
            .headers
            .get(API_KEY)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| {
                E2bError::unauthenticated(
                    "send X-API-KEY (E2B_API_KEY): a sandmesh key, `sandmesh tenant key create \
                     --e2b` spells it as E2B's SDKs expect",
                )
            })?;
        let caller = crate::keys::canonical(presented.trim())
            .and_then(|key| app.keys.verify(&key))
            .ok_or_else(|| E2bError::unauthenticated("unknown or revoked API key"))?;
        Ok(Self(Agent::acting_as(app, caller).await?))
    }
}

// === bodies ===

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    #[serde(rename = "templateID")]
    pub template_id: Option<String>,
    /// Seconds.
    pub timeout: Option<u64>,
    #[serde(default)]
    pub env_vars: BTreeMap<String, String>,
    #[serde(rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
    pub network: Option<NetworkConfig>,
    pub auto_pause: Option<bool>,
    pub auto_resume: Option<serde_json::Value>,
    pub mcp: Option<serde_json::Value>,
    pub volume_mounts: Option<serde_json::Value>,
    // `metadata` is accepted (unknown fields are) and not kept: a session has none.
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkConfig {
    #[serde(default)]
    pub allow_out: Vec<String>,
    #[serde(default)]
    pub deny_out: Vec<String>,
    pub rules: Option<serde_json::Value>,
    pub egress_proxy: Option<serde_json::Value>,
}

/// E2B's `Sandbox`: what create and connect answer.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Created {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "sandboxID")]
    sandbox_id: String,
    #[serde(rename = "clientID")]
    client_id: &'static str,
    envd_version: &'static str,
    envd_access_token: String,
    domain: Option<String>,
}

/// E2B's `ListedSandbox`, and with the token its `SandboxDetail`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Listed {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "sandboxID")]
    sandbox_id: String,
    #[serde(rename = "clientID")]
    client_id: &'static str,
    started_at: String,
    end_at: String,
    /// The mesh does not say a session's size before it runs: 0 means unknown.
    cpu_count: u32,
    #[serde(rename = "memoryMB")]
    memory_mb: u32,
    #[serde(rename = "diskSizeMB")]
    disk_size_mb: u32,
    state: &'static str,
    envd_version: &'static str,
    metadata: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    envd_access_token: Option<String>,
}

fn rfc3339(ms: u64) -> String {
    chrono::DateTime::<chrono::Utc>::from_timestamp_millis(ms as i64)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn template_of(record: &SessionRecord) -> String {
    record.template.clone().unwrap_or_else(|| "base".into())
}

impl Listed {
    fn of(record: &SessionRecord, token: Option<String>) -> Self {
        Self {
            template_id: template_of(record),
            sandbox_id: record.session_id.clone(),
            client_id: CLIENT_ID,
            started_at: rfc3339(record.created_at),
            end_at: rfc3339(record.expires_at.unwrap_or(record.last_used_at)),
            cpu_count: 0,
            memory_mb: 0,
            disk_size_mb: 0,
            state: "running",
            envd_version: ENVD_VERSION,
            metadata: BTreeMap::new(),
            envd_access_token: token,
        }
    }
}

fn token(app: &App, agent: &Agent, sandbox: &str) -> Result<String, E2bError> {
    app.keys
        .sandbox_token(&agent.caller, sandbox)
        .ok_or_else(|| E2bError::unauthenticated("the API key was revoked"))
}

fn created(app: &App, agent: &Agent, record: &SessionRecord) -> Result<Created, E2bError> {
    Ok(Created {
        template_id: template_of(record),
        sandbox_id: record.session_id.clone(),
        client_id: CLIENT_ID,
        envd_version: ENVD_VERSION,
        envd_access_token: token(app, agent, &record.session_id)?,
        domain: None,
    })
}

/// The session of a sandbox the caller may see: another tenant's, a killed one and an unknown
/// one are all not found.
async fn live_session(agent: &Agent, id: &str) -> Result<SessionRecord, E2bError> {
    let record = agent.mesh.sessions().get(id).await?;
    if record.state == SessionState::Closed {
        return Err(E2bError::not_found(format!("sandbox {id} not found")));
    }
    Ok(record)
}

// === routes ===

/// The egress policy E2B's options ask for (`None`: no network, sandmesh's default).
fn network_of(new: &NewSandbox) -> Result<Option<NetworkPolicy>, E2bError> {
    let mut policy = NetworkPolicy::default();
    if new.allow_internet_access == Some(true) {
        policy.allow_all = true;
    }
    if let Some(network) = &new.network {
        if network.rules.is_some() || network.egress_proxy.is_some() {
            return Err(E2bError::unsupported(
                "network.rules and network.egressProxy (header transforms, proxies)",
            ));
        }
        for entry in &network.allow_out {
            match entry.as_str() {
                "0.0.0.0/0" | "::/0" => policy.allow_all = true,
                e if e.parse::<std::net::IpAddr>().is_ok() || e.contains('/') => {
                    policy.allow_cidrs.push(e.to_string())
                }
                e => policy.allow_domains.push(e.to_string()),
            }
        }
        policy.deny_domains = network.deny_out.clone();
    }
    if new.allow_internet_access == Some(false) || policy == NetworkPolicy::default() {
        return Ok(None);
    }
    policy
        .validate()
        .map_err(|e| E2bError::invalid(format!("network: {e}")))?;
    Ok(Some(policy))
}

pub async fn create(
    State(app): State<Arc<App>>,
    ApiCaller(agent): ApiCaller,
    body: Result<Body<NewSandbox>, Problem>,
) -> E2bReply {
    let Body(new) = body?;
    if new.auto_pause == Some(true) || new.auto_resume.is_some() {
        return Err(E2bError::unsupported("pausing and resuming sandboxes"));
    }
    if new.mcp.is_some() {
        return Err(E2bError::unsupported("MCP gateways in sandboxes"));
    }
    if new.volume_mounts.is_some() {
        return Err(E2bError::unsupported("volume mounts"));
    }
    let template = new
        .template_id
        .as_deref()
        .filter(|t| !DEFAULT_TEMPLATES.contains(t) && !t.is_empty())
        .map(str::to_string);
    let open = SessionOpen {
        template,
        env: new.env_vars.clone(),
        ttl_ms: new.timeout.map(|s| s.saturating_mul(1000)),
        network: network_of(&new)?,
        requested_by: Some(format!("e2b key {}", agent.caller.key_id)),
        ..Default::default()
    };
    let record = agent.mesh.sessions().open(&open).await?;
    let body = created(&app, &agent, &record)?;
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// The caller's running sandboxes, by id, a page at a time (`limit`, `nextToken`; the next
/// page's token in `x-next-token`). None is paused, and none has metadata, so a filter on
/// either finds nothing. The query is read as pairs: SDKs repeat `state`.
pub async fn list(
    ApiCaller(agent): ApiCaller,
    query: Result<Query<Vec<(String, String)>>, axum::extract::rejection::QueryRejection>,
) -> E2bReply {
    let Query(query) = query.map_err(|e| E2bError::invalid(e.body_text()))?;
    let values = |name: &'static str| {
        query
            .iter()
            .filter(move |(k, _)| k == name)
            .flat_map(|(_, v)| v.split(','))
            .map(str::trim)
    };
    let states: Vec<&str> = values("state").collect();
    let wants_running = states.is_empty() || states.contains(&"running");
    let filtered = values("metadata").any(|m| !m.is_empty());
    let limit = match values("limit").next() {
        Some(l) => l
            .parse::<usize>()
            .map_err(|_| E2bError::invalid(format!("limit={l:?}: expected a count")))?,
        None => PAGE,
    }
    .clamp(1, PAGE);
    let after = values("nextToken").next().map(str::to_string);
    let mut sessions = match wants_running && !filtered {
        true => agent.mesh.sessions().list(None).await?,
        false => Vec::new(),
    };
    sessions.retain(|s| s.state != SessionState::Closed);
    if let Some(after) = &after {
        sessions.retain(|s| s.session_id > *after);
    }
    let more = sessions.len() > limit;
    sessions.truncate(limit);
    let page: Vec<Listed> = sessions.iter().map(|s| Listed::of(s, None)).collect();
    let mut response = Json(page).into_response();
    if let (true, Some(last)) = (more, sessions.last()) {
        if let Ok(value) = HeaderValue::from_str(&last.session_id) {
            response.headers_mut().insert("x-next-token", value);
        }
    }
    Ok(response)
}

pub async fn detail(
    State(app): State<Arc<App>>,
    ApiCaller(agent): ApiCaller,
    Params(id): Params<String>,
) -> E2bReply {
    let record = live_session(&agent, &id).await?;
    let token = token(&app, &agent, &id)?;
    Ok(Json(Listed::of(&record, Some(token))).into_response())
}

/// Kill: the session and its workspace go (as `DELETE /api/v1/sessions/{id}`); a killed or
/// unknown sandbox is 404, which the SDKs read as "already gone".
pub async fn kill(ApiCaller(agent): ApiCaller, Params(id): Params<String>) -> E2bReply {
    live_session(&agent, &id).await?;
    crate::api::terminate(&agent.mesh, &id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Debug, Deserialize)]
pub struct Timeout {
    /// Seconds from now.
    pub timeout: u64,
}

/// The sandbox closes `timeout` seconds from now (its session's TTL, moved live).
pub async fn set_timeout(
    ApiCaller(agent): ApiCaller,
    Params(id): Params<String>,
    body: Result<Body<Timeout>, Problem>,
) -> E2bReply {
    let Body(body) = body?;
    live_session(&agent, &id).await?;
    agent
        .mesh
        .sessions()
        .set_ttl(&id, body.timeout.saturating_mul(1000))
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Debug, Default, Deserialize)]
pub struct ConnectBody {
    /// Seconds from now; absent: the sandbox keeps its time.
    pub timeout: Option<u64>,
}

/// `Sandbox.connect(id)`: the sandbox as create answered it, with a token for this key.
pub async fn connect(
    State(app): State<Arc<App>>,
    ApiCaller(agent): ApiCaller,
    Params(id): Params<String>,
    body: Result<Body<Option<ConnectBody>>, Problem>,
) -> E2bReply {
    let Body(body) = body?;
    let record = live_session(&agent, &id).await?;
    if let Some(timeout) = body.and_then(|b| b.timeout) {
        let sessions = agent.mesh.sessions();
        sessions.set_ttl(&id, timeout.saturating_mul(1000)).await?;
    }
    Ok(Json(created(&app, &agent, &record)?).into_response())
}

/// What the mesh has no counterpart for, named; anything else is not a route.
pub async fn unsupported(uri: Uri) -> Response {
    let path = uri.path();
    let named = [
        ("/pause", "pausing sandboxes"),
        ("/resume", "resuming sandboxes"),
        ("/fork", "forking sandboxes"),
        ("/snapshots", "snapshots"),
        ("/templates", "the templates API"),
        ("/network", "changing a running sandbox's network"),
        ("/metrics", "sandbox metrics"),
        ("/logs", "sandbox logs"),
        ("/volumes", "volumes"),
        ("/secrets", "secrets"),
        (
            "/contexts",
            "code interpreter contexts other than the default",
        ),
    ];
    let found = named.iter().find(|(part, _)| path.contains(part));
    match found {
        Some((_, what)) => E2bError::unsupported(what).into_response(),
        None => E2bError::not_found(format!("no route {path}")).into_response(),
    }
}
