//! The HTTP edge: routes, the login cookie, the checks every request passes, and the pages
//! (the Server-Sent Events stream that keeps them live is [`crate::live`]).
//!
//! | route | who | what |
//! |---|---|---|
//! | `GET /login`, `POST /login` | anyone | the login form; NATS checks the credentials |
//! | `POST /logout` | logged in + CSRF | ends the login |
//! | `GET /` | logged in | the pending cards and the recently decided |
//! | `POST /decide` | logged in + CSRF | approve once / for the session / deny with a reason |
//! | `GET /events` | logged in | SSE: `card` (a confirmation as HTML), `sync`, `audit` |
//! | `GET /activity[?session=]` | logged in | recent executions, or a session's audit tail |
//! | `GET /api/whoami` | logged in | the user (the page asks after its stream fails) |
//!
//! Checks: a loopback console answers only to loopback `Host` names (no DNS rebinding); every
//! `POST` must come from the console's own origin (`Origin`, and `Sec-Fetch-Site` when sent)
//! and, once logged in, carry the login's CSRF token; nothing changes state on a `GET`. Pages
//! redirect an unknown visitor to the login, the API and the stream answer 401.

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use messages::confirm::{ConfirmDecide, ConfirmList, ConfirmScope, ConfirmState, Confirmation};
use serde::Deserialize;
use tower_http::set_header::SetResponseHeaderLayer;

use crate::app::{pending, refuse, App, COOKIE};
use crate::escape::esc;
use crate::logins::{same_secret, Login, LoginError};
use crate::render;

/// Bodies are small forms; anything larger is refused before it is read.
const MAX_BODY: usize = 16 * 1024;
/// Decided cards a page starts with.
const RECENTLY_DECIDED: usize = 20;

const SCRIPT: &str = include_str!("../assets/console.js");
const STYLE: &str = include_str!("../assets/console.css");

pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/login", get(login_page).post(login))
        .route("/logout", post(logout))
        .route("/decide", post(decide))
        .route("/events", get(crate::live::events))
        .route("/activity", get(activity))
        .route("/api/whoami", get(whoami))
        .route("/static/console.js", get(script))
        .route("/static/console.css", get(style))
        .layer(middleware::from_fn_with_state(app.clone(), guard))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(SetResponseHeaderLayer::overriding(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(
                "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                 connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
            ),
        ))
        .layer(SetResponseHeaderLayer::overriding(
            header::X_FRAME_OPTIONS,
            HeaderValue::from_static("DENY"),
        ))
        .layer(SetResponseHeaderLayer::overriding(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ))
        .layer(SetResponseHeaderLayer::overriding(
            header::REFERRER_POLICY,
            // Not `no-referrer`: under it a browser sends `Origin: null` with form posts, and
            // the origin check needs the real one.
            HeaderValue::from_static("same-origin"),
        ))
        .layer(SetResponseHeaderLayer::if_not_present(
            header::CACHE_CONTROL,
            HeaderValue::from_static("no-store"),
        ))
        .with_state(app)
}

// === checks ===

/// `Host` on every request, `Origin` on every state change.
async fn guard(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("")
        .to_string();
    if let Some(hosts) = &app.hosts {
        if !hosts.iter().any(|h| h.eq_ignore_ascii_case(&host)) {
            return refuse(StatusCode::MISDIRECTED_REQUEST, "unknown host");
        }
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let headers = request.headers();
        let origin = headers.get(header::ORIGIN).and_then(|o| o.to_str().ok());
        let own = format!("http://{host}");
        let allowed = origin.is_some_and(|o| {
            o.eq_ignore_ascii_case(&own) || app.extra_origins.iter().any(|e| e == o)
        });
        let site = headers
            .get("sec-fetch-site")
            .and_then(|s| s.to_str().ok())
            .unwrap_or("same-origin");
        if !allowed || !matches!(site, "same-origin" | "none") {
            return refuse(StatusCode::FORBIDDEN, "cross-site request refused");
        }
    }
    next.run(request).await
}

fn to_login() -> Response {
    Redirect::to("/login").into_response()
}

fn html(status: StatusCode, body: String) -> Response {
    (status, Html(body)).into_response()
}

// === login ===

async fn login_page(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if app.login_of(&headers).await.is_some() {
        return Redirect::to("/").into_response();
    }
    html(StatusCode::OK, render::login_form(None))
}

#[derive(Deserialize)]
struct LoginForm {
    user: String,
    password: String,
}

async fn login(State(app): State<Arc<App>>, Form(form): Form<LoginForm>) -> Response {
    if form.user.is_empty() || form.user.len() > 64 || form.password.len() > 256 {
        return html(
            StatusCode::BAD_REQUEST,
            render::login_form(Some("user and password, please")),
        );
    }
    match app.logins.login(&form.user, &form.password).await {
        Ok(token) => {
            tracing::info!(user = %form.user, "operator logged in");
            let cookie = format!(
                "{COOKIE}={}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}",
                token.to_hex(),
                app.session_ttl.as_secs()
            );
            let mut response = Redirect::to("/").into_response();
            response.headers_mut().insert(
                header::SET_COOKIE,
                HeaderValue::from_str(&cookie).expect("hex cookie"),
            );
            response
        }
        Err(e) => {
            tracing::warn!(user = %form.user, error = %kit::error_chain(&e), "login refused");
            let (status, shown) = match &e {
                // The same answer for both: which user names exist is nobody's business.
                LoginError::Refused | LoginError::NotOperator(_) => (
                    StatusCode::UNAUTHORIZED,
                    "wrong user or password, or not an operator".to_string(),
                ),
                other => (StatusCode::SERVICE_UNAVAILABLE, kit::error_chain(other)),
            };
            html(status, render::login_form(Some(&shown)))
        }
    }
}

#[derive(Deserialize)]
struct CsrfForm {
    #[serde(default)]
    csrf: String,
}

async fn logout(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Form(form): Form<CsrfForm>,
) -> Response {
    let Some((token, login)) = app.login_of(&headers).await else {
        return to_login();
    };
    if !same_secret(&form.csrf, &login.csrf) {
        return refuse(StatusCode::FORBIDDEN, "missing or wrong CSRF token");
    }
    app.logins.logout(&token);
    let mut response = to_login();
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("sandmesh_console=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"),
    );
    response
}

async fn whoami(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    match app.login_of(&headers).await {
        Some((_, login)) => login.user.clone().into_response(),
        None => refuse(StatusCode::UNAUTHORIZED, "not logged in"),
    }
}

// === pages ===

async fn index(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    let Some((_, login)) = app.login_of(&headers).await else {
        return to_login();
    };
    match pending(&login).await {
        Ok(mut list) => {
            // Newest on top, where the page puts the ones that arrive later.
            list.reverse();
            let decided = recently_decided(&login).await;
            html(
                StatusCode::OK,
                render::pending_page(&login.user, &login.csrf, &list, &decided),
            )
        }
        Err(e) => html(
            StatusCode::SERVICE_UNAVAILABLE,
            render::page(
                "Unavailable",
                Some(&login.user),
                Some(&login.csrf),
                &format!(
                    "<p class=\"error\">cannot list confirmations: {}</p>",
                    esc(&e.to_string())
                ),
            ),
        ),
    }
}

/// The last decisions this operator may see, newest first. Best effort: the page is about
/// what is pending, so a failed listing shows none.
async fn recently_decided(login: &Login) -> Vec<Confirmation> {
    let mut all = Vec::new();
    for state in [
        ConfirmState::Approved,
        ConfirmState::Denied,
        ConfirmState::Timeout,
    ] {
        let filter = ConfirmList {
            state: Some(state),
            limit: Some(RECENTLY_DECIDED as u32),
            ..Default::default()
        };
        all.extend(login.mesh.confirm().list(&filter).await.unwrap_or_default());
    }
    all.sort_by_key(|c| std::cmp::Reverse(c.decided_at.unwrap_or(c.created_at)));
    all.truncate(RECENTLY_DECIDED);
    all
}

#[derive(Deserialize)]
struct ActivityQuery {
    #[serde(default)]
    session: Option<String>,
}

async fn activity(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Query(query): Query<ActivityQuery>,
) -> Response {
    let Some((_, login)) = app.login_of(&headers).await else {
        return to_login();
    };
    let session = query
        .session
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty());
    if session.is_some_and(|s| messages::validate::validate_id("session", s).is_err()) {
        return refuse(StatusCode::BAD_REQUEST, "not a session id");
    }
    let events = match session {
        Some(s) => app.history.session(&login.scope, s).await,
        None => app.history.recent(&login.scope).await,
    };
    match events {
        Ok(events) => html(
            StatusCode::OK,
            render::activity_page(&login.user, &login.csrf, session, &events),
        ),
        Err(e) => html(
            StatusCode::SERVICE_UNAVAILABLE,
            render::page(
                "Unavailable",
                Some(&login.user),
                Some(&login.csrf),
                &format!(
                    "<p class=\"error\">cannot read the audit trail: {}</p>",
                    esc(&kit::error_chain(&e))
                ),
            ),
        ),
    }
}

async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        SCRIPT,
    )
        .into_response()
}

async fn style() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE).into_response()
}

// === decisions ===

#[derive(Deserialize)]
struct DecideForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    id: String,
    #[serde(default)]
    action: String,
    #[serde(default)]
    reason: Option<String>,
}

async fn decide(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Form(form): Form<DecideForm>,
) -> Response {
    let Some((_, login)) = app.login_of(&headers).await else {
        return refuse(StatusCode::UNAUTHORIZED, "not logged in");
    };
    if !same_secret(&form.csrf, &login.csrf) {
        return refuse(StatusCode::FORBIDDEN, "missing or wrong CSRF token");
    }
    if messages::validate::validate_id("id", &form.id).is_err() {
        return refuse(StatusCode::BAD_REQUEST, "not a confirmation id");
    }
    let reason = form
        .reason
        .as_deref()
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .map(str::to_string);
    if reason
        .as_ref()
        .is_some_and(|r| r.len() > render::MAX_REASON)
    {
        return refuse(StatusCode::PAYLOAD_TOO_LARGE, "the reason is too long");
    }
    let (approve, scope) = match form.action.as_str() {
        "approve" => (true, ConfirmScope::Once),
        "approve_session" => (true, ConfirmScope::Session),
        "deny" if reason.is_some() => (false, ConfirmScope::Once),
        "deny" => return refuse(StatusCode::BAD_REQUEST, "a denial needs a reason"),
        _ => return refuse(StatusCode::BAD_REQUEST, "unknown action"),
    };
    let decision = ConfirmDecide {
        id: form.id.clone(),
        approve,
        // The confirmation service records the authenticated user whatever this says.
        by: login.user.clone(),
        reason,
        scope,
        by_account: None,
    };
    let from_script = headers.contains_key("x-sandmesh-fetch");
    match login.mesh.confirm().decide(&decision).await {
        Ok(_) if from_script => StatusCode::NO_CONTENT.into_response(),
        Ok(_) => Redirect::to("/").into_response(),
        Err(e) => {
            use sandmesh_client::ErrorKind as K;
            let status = match e.kind() {
                K::BadRequest | K::TooLarge => StatusCode::BAD_REQUEST,
                K::Denied => StatusCode::FORBIDDEN,
                K::NotFound => StatusCode::NOT_FOUND,
                K::Conflict => StatusCode::CONFLICT,
                _ => StatusCode::SERVICE_UNAVAILABLE,
            };
            let message = match &e {
                sandmesh_client::ClientError::Service { body, .. } => body.message.clone(),
                other => kit::error_chain(other),
            };
            (status, message).into_response()
        }
    }
}
