//! Preview ports over HTTP: exposing a port of a session (`/api/v1/sessions/{id}/ports`), and
//! the proxy to it — `ANY /api/v1/sessions/{id}/ports/{port}/{*path}`, and any request whose
//! `Host` is `{port}-{session}.localhost[:gateway port]` — through a byte tunnel
//! (`sandmesh_client::ports`) to the node holding the session's container.
//!
//! Who may: an API key of the session's tenant (`Authorization: Bearer`), or the port's token
//! (from `ports.expose`) as the `sandmesh_token` query parameter or cookie, for a browser. A
//! token in the query is answered with the cookie, so the page's own later requests carry it.
//!
//! Each proxied request gets a tunnel of its own: the gateway speaks HTTP/1.1 to the sandbox's
//! server over it (hyper's client), and after a `101 Switching Protocols` (a WebSocket) copies
//! bytes both ways. What is rewritten, and only that: the path loses the
//! `/api/v1/sessions/{id}/ports/{port}` prefix (said in `X-Forwarded-Prefix`); the credential
//! the gateway consumed (the `Authorization` header with the gateway's key, the
//! `sandmesh_token` parameter and cookie) is removed, so the sandbox never sees it; hop-by-hop
//! headers (`Connection`, `Keep-Alive`, `TE`, `Trailer`, `Transfer-Encoding`, `Proxy-*`) are
//! not forwarded except an upgrade's `Connection: upgrade` and `Upgrade`. Bodies pass as they
//! are (hyper re-frames them; their bytes are unchanged).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{RawQuery, Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use hyper_util::rt::TokioIo;
use messages::ports::{token_tenant, ExposedPort, PortList, TOKEN_PARAM};
use messages::validate::validate_id;
use sandmesh_client::MeshClient;
use serde::Deserialize;

use crate::api::{Agent, App, Body as JsonBody, Params};
use crate::problem::{Errors, Problem, Reply};

/// `POST /api/v1/sessions/{id}/ports`'s body.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExposeBody {
    pub port: u32,
    /// How long the port stays exposed (default an hour, at most a day).
    #[serde(default)]
    pub ttl_ms: Option<u64>,
}

/// The absolute URL of `path` on this gateway, as the caller reached it.
fn absolute(headers: &HeaderMap, path: &str) -> String {
    match headers.get(header::HOST).and_then(|h| h.to_str().ok()) {
        Some(host) => format!("http://{host}{path}"),
        None => path.to_string(),
    }
}

/// Exposes a port of the session: the answer holds its URL and a token for a browser.
#[utoipa::path(
    post,
    path = "/api/v1/sessions/{id}/ports",
    operation_id = "expose_port",
    params(("id" = String, Path, description = "the session id", pattern = r"^[A-Za-z0-9_-]{1,64}$")),
    request_body = ExposeBody,
    responses((status = 201, description = "the exposed port and its token", body = ExposedPort), Errors)
)]
pub async fn expose(
    agent: Agent,
    headers: HeaderMap,
    Params(id): Params<String>,
    JsonBody(body): JsonBody<ExposeBody>,
) -> Reply {
    let port = messages::ports::validate_port(body.port)
        .map_err(|e| Problem::bad_request(e.to_string()))?;
    let mut exposed = agent.mesh.ports().expose(&id, port, body.ttl_ms).await?;
    exposed.url = absolute(&headers, &exposed.url);
    Ok((StatusCode::CREATED, Json(exposed)).into_response())
}

/// The session's exposed ports (their tokens are not kept, so not shown).
#[utoipa::path(
    get,
    path = "/api/v1/sessions/{id}/ports",
    operation_id = "list_ports",
    params(("id" = String, Path, description = "the session id", pattern = r"^[A-Za-z0-9_-]{1,64}$")),
    responses((status = 200, description = "the exposed ports", body = PortList), Errors)
)]
pub async fn list(agent: Agent, headers: HeaderMap, Params(id): Params<String>) -> Reply {
    let mut ports = agent.mesh.ports().list(&id).await?;
    for p in &mut ports {
        p.url = absolute(&headers, &p.url);
    }
    Ok(Json(PortList { ports }).into_response())
}

/// Stops exposing a port: its token stops working.
#[utoipa::path(
    delete,
    path = "/api/v1/sessions/{id}/ports/{port}",
    operation_id = "unexpose_port",
    params(
        ("id" = String, Path, description = "the session id", pattern = r"^[A-Za-z0-9_-]{1,64}$"),
        ("port" = u16, Path, description = "the port", minimum = 1, maximum = 65535),
    ),
    responses((status = 204, description = "no longer exposed"), Errors)
)]
pub async fn unexpose(agent: Agent, Params((id, port)): Params<(String, u16)>) -> Reply {
    agent.mesh.ports().unexpose(&id, port).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// The port's root is `…/{port}/` (what the sandbox's server answers there and below is
/// proxied, whatever the method), so relative links of its pages resolve under it.
#[utoipa::path(
    get,
    path = "/api/v1/sessions/{id}/ports/{port}",
    operation_id = "port_root",
    params(
        ("id" = String, Path, description = "the session id", pattern = r"^[A-Za-z0-9_-]{1,64}$"),
        ("port" = u16, Path, description = "the port", minimum = 1, maximum = 65535),
    ),
    responses((status = 308, description = "to the port's root, `…/{port}/`, with the same query",
        headers(("Location" = String, description = "the port's root"))), Errors),
    // Nothing is read or shown here: the port's root checks the key or token.
    security(())
)]
pub async fn to_root(
    Params((id, port)): Params<(String, u16)>,
    RawQuery(query): RawQuery,
) -> Response {
    // The query carries a browser's token: it must reach the root.
    let query = query.map(|q| format!("?{q}")).unwrap_or_default();
    let to = format!("/api/v1/sessions/{id}/ports/{port}/{query}");
    (StatusCode::PERMANENT_REDIRECT, [(header::LOCATION, to)]).into_response()
}

/// Where a proxied request goes, and the path its server sees.
struct Target {
    session: String,
    port: u16,
    /// The path prefix the gateway removed (path routing), for `X-Forwarded-Prefix` and the
    /// token cookie's path.
    prefix: Option<String>,
    /// The path and query the sandbox's server is sent.
    path: String,
}

/// `ANY /api/v1/sessions/{id}/ports/{port}/{*path}` (and `…/{port}/`).
pub async fn proxy_path(State(app): State<Arc<App>>, req: Request) -> Reply {
    let target = path_target(req.uri())?;
    proxy(app, target, req).await
}

fn path_target(uri: &Uri) -> Result<Target, Problem> {
    let rest = uri
        .path()
        .strip_prefix("/api/v1/sessions/")
        .ok_or_else(|| Problem::not_found("no such route"))?;
    let (session, rest) = rest.split_once('/').unwrap_or((rest, ""));
    let rest = rest.strip_prefix("ports/").unwrap_or("");
    let (port, path) = rest.split_once('/').unwrap_or((rest, ""));
    validate_id("session_id", session).map_err(|e| Problem::bad_request(e.to_string()))?;
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| Problem::bad_request("port: must be 1..=65535"))?;
    let prefix = format!("/api/v1/sessions/{session}/ports/{port}");
    let query = uri.query().map(|q| format!("?{q}")).unwrap_or_default();
    Ok(Target {
        session: session.to_string(),
        port,
        prefix: Some(prefix),
        path: format!("/{path}{query}"),
    })
}

/// The port and session a `Host` of the form `{port}-{session}.localhost[:n]` names.
fn host_target(headers: &HeaderMap, uri: &Uri) -> Option<Target> {
    let host = headers.get(header::HOST)?.to_str().ok()?;
    let name = host.rsplit_once(':').map_or(host, |(name, _)| name);
    let label = name.strip_suffix(".localhost")?;
    let (port, session) = label.split_once('-')?;
    let port: u16 = port.parse().ok().filter(|p| *p != 0)?;
    validate_id("session_id", session).ok()?;
    Some(Target {
        session: session.to_string(),
        port,
        prefix: None,
        path: uri
            .path_and_query()
            .map_or_else(|| "/".to_string(), |p| p.as_str().to_string()),
    })
}

/// Sends requests for `{port}-{session}.localhost` to the port, whatever their path.
pub async fn host_routing(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    match host_target(req.headers(), req.uri()) {
        Some(target) => proxy(app, target, req).await.into_response(),
        None => next.run(req).await,
    }
}

/// The caller's right to the port: its tenant's connection, and the token it showed (with
/// whether the cookie must be set).
struct Access {
    mesh: MeshClient,
    token: Option<String>,
    set_cookie: bool,
}

fn cookie_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, _)| *name == TOKEN_PARAM)
        .map(|(_, value)| value.to_string())
}

/// The path's query without the token parameter, and the token when it was there.
fn take_query_token(path: &str) -> (String, Option<String>) {
    let Some((path_only, query)) = path.split_once('?') else {
        return (path.to_string(), None);
    };
    let mut token = None;
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| match pair.split_once('=') {
            Some((TOKEN_PARAM, value)) => {
                token = Some(value.to_string());
                false
            }
            _ => true,
        })
        .collect();
    let path = match kept.is_empty() {
        true => path_only.to_string(),
        false => format!("{path_only}?{}", kept.join("&")),
    };
    (path, token)
}

async fn access(
    app: &Arc<App>,
    target: &mut Target,
    parts: &mut axum::http::request::Parts,
) -> Result<Access, Problem> {
    let (path, query_token) = take_query_token(&target.path);
    target.path = path;
    let bearer = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("Bearer "));
    if bearer && query_token.is_none() {
        use axum::extract::FromRequestParts;
        let agent = Agent::from_request_parts(parts, app).await?;
        // The gateway's key is the gateway's: the sandbox never sees it.
        parts.headers.remove(header::AUTHORIZATION);
        return Ok(Access {
            mesh: agent.mesh,
            token: None,
            set_cookie: false,
        });
    }
    let (token, set_cookie) = match (query_token, cookie_token(&parts.headers)) {
        (Some(t), _) => (t, true),
        (None, Some(t)) => (t, false),
        (None, None) => {
            return Err(Problem::unauthorized(format!(
                "send `Authorization: Bearer <key>`, or the port's token (ports expose) as the \
                 {TOKEN_PARAM} query parameter or cookie"
            )))
        }
    };
    let tenant = token_tenant(&token)
        .ok()
        .flatten()
        .ok_or_else(|| Problem::unauthorized("the token is not valid for this port"))?;
    if let Err(wait) = app.rate.take(&format!("port-token:{tenant}")) {
        return Err(Problem::rate_limited(
            wait.as_secs_f64().ceil().max(1.0) as u64
        ));
    }
    let mesh = app.tenants.client(&tenant).await.map_err(|e| {
        tracing::warn!(%tenant, error = %kit::error_chain(&e), "no connection for a tenant");
        Problem::unauthorized("the token is not valid for this port")
    })?;
    Ok(Access {
        mesh,
        token: Some(token),
        set_cookie,
    })
}

/// Headers that belong to one connection, not to the request.
const HOP_BY_HOP: [HeaderName; 6] = [
    header::CONNECTION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::PROXY_AUTHORIZATION,
    header::PROXY_AUTHENTICATE,
];

fn strip_hop_by_hop(headers: &mut HeaderMap, upgrade: bool) {
    for name in HOP_BY_HOP {
        if !(upgrade && name == header::CONNECTION) {
            headers.remove(name);
        }
    }
    headers.remove("keep-alive");
    if !upgrade {
        headers.remove(header::UPGRADE);
    }
}

/// The Cookie header without the token's cookie (removed when nothing else is left).
fn strip_token_cookie(headers: &mut HeaderMap) {
    let kept: Vec<String> = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .map(str::trim)
        .filter(|c| !c.is_empty() && c.split_once('=').map(|(n, _)| n) != Some(TOKEN_PARAM))
        .map(str::to_string)
        .collect();
    headers.remove(header::COOKIE);
    if let Ok(v) = HeaderValue::from_str(&kept.join("; ")) {
        if !kept.is_empty() {
            headers.insert(header::COOKIE, v);
        }
    }
}

fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| {
                v.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
            })
}

/// Why the sandbox's server could not be asked.
fn bad_gateway(what: &str, e: impl std::error::Error) -> Problem {
    Problem::new(
        StatusCode::BAD_GATEWAY,
        "bad_gateway",
        format!("{what}: {}", kit::error_chain(&e)),
    )
}

async fn proxy(app: Arc<App>, mut target: Target, req: Request) -> Reply {
    let (mut parts, body) = req.into_parts();
    let access = access(&app, &mut target, &mut parts).await?;
    let upgrade = is_upgrade(&parts.headers);
    let client_upgrade = upgrade
        .then(|| parts.extensions.remove::<hyper::upgrade::OnUpgrade>())
        .flatten();
    let tunnel = access
        .mesh
        .ports()
        .connect(&target.session, target.port, access.token.as_deref())
        .await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tunnel.stream))
        .await
        .map_err(|e| bad_gateway("the tunnel", e))?;
    tokio::spawn(conn.with_upgrades());

    strip_hop_by_hop(&mut parts.headers, upgrade);
    strip_token_cookie(&mut parts.headers);
    if let Some(prefix) = &target.prefix {
        if let Ok(v) = HeaderValue::from_str(prefix) {
            parts.headers.insert("x-forwarded-prefix", v);
        }
    }
    parts.uri = target
        .path
        .parse()
        .map_err(|_| Problem::bad_request("the path is not a valid request target"))?;
    parts.version = axum::http::Version::HTTP_11;
    let upstream = axum::http::Request::from_parts(parts, body);
    let mut response = sender
        .send_request(upstream)
        .await
        .map_err(|e| bad_gateway(&format!("port {}", target.port), e))?;

    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        let server_upgrade = hyper::upgrade::on(&mut response);
        if let Some(client_upgrade) = client_upgrade {
            tokio::spawn(async move {
                let (Ok(client), Ok(server)) = tokio::join!(client_upgrade, server_upgrade) else {
                    return;
                };
                let (mut client, mut server) = (TokioIo::new(client), TokioIo::new(server));
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            });
        }
        let (parts, _) = response.into_parts();
        return Ok(Response::from_parts(parts, Body::empty()));
    }
    let (mut parts, incoming) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers, false);
    if access.set_cookie {
        let path = target
            .prefix
            .as_deref()
            .map_or("/".to_string(), |p| format!("{p}/"));
        let token = access.token.unwrap_or_default();
        let cookie = format!("{TOKEN_PARAM}={token}; Path={path}; HttpOnly; SameSite=Lax");
        if let Ok(v) = HeaderValue::from_str(&cookie) {
            parts.headers.append(header::SET_COOKIE, v);
        }
    }
    Ok(Response::from_parts(parts, Body::new(incoming)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefix_goes_and_the_rest_of_the_target_stays() {
        let uri: Uri = "/api/v1/sessions/s1/ports/8000/a/b?x=1".parse().unwrap();
        let t = path_target(&uri).unwrap();
        assert_eq!(
            (t.session.as_str(), t.port, t.path.as_str()),
            ("s1", 8000, "/a/b?x=1")
        );
        let root: Uri = "/api/v1/sessions/s1/ports/8000/".parse().unwrap();
        assert_eq!(path_target(&root).unwrap().path, "/");
        for bad in [
            "/api/v1/sessions/s.1/ports/8000/",
            "/api/v1/sessions/s1/ports/0/",
            "/api/v1/sessions/s1/ports/70000/",
            "/api/v1/sessions/s1/ports/x/",
        ] {
            assert!(path_target(&bad.parse().unwrap()).is_err(), "{bad}");
        }
    }

    #[test]
    fn hosts_name_a_port_and_a_session_or_nothing() {
        let uri: Uri = "/x".parse().unwrap();
        let host = |h: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::HOST, HeaderValue::from_str(h).unwrap());
            host_target(&headers, &uri).map(|t| (t.port, t.session))
        };
        assert_eq!(host("8000-s1.localhost:4281"), Some((8000, "s1".into())));
        assert_eq!(host("3000-my-app.localhost"), Some((3000, "my-app".into())));
        for other in [
            "127.0.0.1:4281",
            "localhost:4281",
            "x-s1.localhost",
            "0-s1.localhost",
            "8000-s1.example.org",
        ] {
            assert_eq!(host(other), None, "{other}");
        }
    }

    #[test]
    fn the_token_leaves_the_query_and_the_cookies() {
        let (path, token) = take_query_token("/a?x=1&sandmesh_token=t.00&y=2");
        assert_eq!(
            (path.as_str(), token.as_deref()),
            ("/a?x=1&y=2", Some("t.00"))
        );
        assert_eq!(take_query_token("/a?sandmesh_token=t").0, "/a");
        assert_eq!(take_query_token("/a?b=c"), ("/a?b=c".into(), None));
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; sandmesh_token=t.00; b=2"),
        );
        assert_eq!(cookie_token(&headers).as_deref(), Some("t.00"));
        strip_token_cookie(&mut headers);
        assert_eq!(headers[header::COOKIE], "a=1; b=2");
    }
}
