//! `BrowserSession`: one session's browser. It owns the browser container, the egress proxy
//! that is the browser's only way out, and the CDP connection, and it runs the session's
//! actions one at a time, in order (a page is one thing; two clicks at once have no meaning).
//!
//! The browser is taken on the first action (warm from the router, else started cold),
//! replaced when it died (the reply says the page state was lost), and dropped when the
//! actor stops: on `close`, when the session closes, after the idle timeout, at shutdown.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use chromiumoxide::error::CdpError;
use egress::{EgressProxy, EgressRules, SystemResolver};
use kit::{AuditScope, Auditor, RequestContext};
use messages::audit::AuditKind;
use messages::browser::{
    BrowserAction, BrowserBackend, BrowserRequest, BrowserResult, ContentFormat,
};
use messages::network::NetworkPolicy;
use messages::{ErrorBody, ErrorKind};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use sandmesh_client::WorkspaceClient;
use serde_json::json;

use crate::cdp::{ActionError, Chromium};
use crate::config::BrowserConfig;
use crate::container::{BrowserContainer, Containers};
use crate::gate::{sensitive_field, Gate};
use crate::router::RouterMsg;

/// Replies and pages larger than this are cut (text) or refused (script values).
pub const MAX_CONTENT_BYTES: usize = 256 * 1024;
/// How long a cold browser may take to answer.
pub const START_WITHIN: Duration = Duration::from_secs(30);

/// What every session of this instance shares.
pub struct Shared {
    pub config: BrowserConfig,
    pub containers: Containers,
    pub gate: Gate,
    pub workspace: WorkspaceClient,
    pub auditor: Auditor,
    pub rules: EgressRules,
    pub policy: NetworkPolicy,
    /// Each tenant's `browsers` quota.
    pub quotas: Arc<kit::QuotaBook>,
}

pub struct Act {
    pub action: BrowserAction,
    pub req: BrowserRequest,
    pub ctx: RequestContext,
    pub reply: RpcReplyPort<Result<BrowserResult, ErrorBody>>,
}

pub enum SessionMsg {
    Act(Box<Act>),
    /// Timer: stop when unused for the idle timeout.
    IdleCheck,
}

pub struct SessionArgs {
    pub session_id: String,
    pub shared: Arc<Shared>,
    pub router: ActorRef<RouterMsg>,
}

/// A started browser container with its CDP connection and page, not yet any session's.
/// Field order is drop order: the connection first, then the container.
pub struct Started {
    pub chromium: Chromium,
    pub container: BrowserContainer,
}

/// Starts a browser container and connects to it (the warm pool's and a cold start's way).
pub async fn open(containers: &Containers) -> Result<Started, ErrorBody> {
    let container = containers
        .start(START_WITHIN)
        .await
        .map_err(|e| ErrorBody::unavailable(format!("cannot start a browser: {e}")))?;
    let chromium = Chromium::connect(&container.cdp_url())
        .await
        .map_err(|e| ErrorBody::unavailable(format!("cannot connect to the browser: {e}")))?;
    Ok(Started {
        chromium,
        container,
    })
}

/// The live browser. Field order is drop order: the CDP connection first, then the proxy,
/// then the container.
struct Live {
    chromium: Chromium,
    _proxy: EgressProxy,
    container: BrowserContainer,
}

pub struct SessionState {
    id: String,
    shared: Arc<Shared>,
    router: ActorRef<RouterMsg>,
    live: Option<Live>,
    /// A browser of this session died since the last reply.
    lost: bool,
    last_used: Instant,
}

pub struct BrowserSession;

impl Actor for BrowserSession {
    type Msg = SessionMsg;
    type State = SessionState;
    type Arguments = SessionArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: SessionArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        schedule_idle_check(&myself, args.shared.config.idle);
        Ok(SessionState {
            id: args.session_id,
            shared: args.shared,
            router: args.router,
            live: None,
            lost: false,
            last_used: Instant::now(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SessionMsg::Act(act) => {
                let Act {
                    action,
                    req,
                    ctx,
                    reply,
                } = *act;
                let outcome = state.act(action, &req, &ctx).await;
                state.last_used = Instant::now();
                let scope = state.scope(&req, &ctx);
                let details = match &outcome {
                    Ok(r) => json!({"action": action.as_str(), "ok": true, "url": r.url,
                                    "state_lost": r.state_lost}),
                    Err(e) => json!({"action": action.as_str(), "ok": false, "code": e.code,
                                     "error": e.message}),
                };
                state
                    .shared
                    .auditor
                    .emit(AuditKind::Finished, &scope, details);
                let _ = reply.send(outcome);
                if action == BrowserAction::Close {
                    myself.stop(Some("closed".into()));
                }
            }
            SessionMsg::IdleCheck => {
                let idle = state.shared.config.idle;
                if state.last_used.elapsed() >= idle {
                    tracing::info!(session_id = %state.id, "browser idle; closing it");
                    myself.stop(Some("idle".into()));
                } else {
                    schedule_idle_check(&myself, idle - state.last_used.elapsed());
                }
            }
        }
        Ok(())
    }
}

fn schedule_idle_check(myself: &ActorRef<SessionMsg>, after: Duration) {
    myself.send_after(after + Duration::from_millis(10), || SessionMsg::IdleCheck);
}

fn need<'a>(
    value: &'a Option<String>,
    field: &str,
    action: BrowserAction,
) -> Result<&'a str, ErrorBody> {
    value
        .as_deref()
        .filter(|v| !v.is_empty())
        .ok_or_else(|| ErrorBody::bad_request(format!("{} needs {field}", action.as_str())))
}

/// Per-field size limits, checked before anything runs.
fn check_sizes(req: &BrowserRequest) -> Result<(), ErrorBody> {
    let limits: [(&str, &Option<String>, usize); 5] = [
        ("url", &req.url, 8 * 1024),
        ("selector", &req.selector, 1024),
        ("text", &req.text, 64 * 1024),
        ("script", &req.script, 64 * 1024),
        ("key", &req.key, 32),
    ];
    for (field, value, max) in limits {
        if let Some(v) = value {
            if v.len() > max {
                return Err(ErrorBody::too_large(format!(
                    "{field} is {} bytes; at most {max}",
                    v.len()
                )));
            }
        }
    }
    Ok(())
}

/// The selector an action targets: `{index}` from the last `elements`, or `{selector}`.
fn target(req: &BrowserRequest, action: BrowserAction) -> Result<String, ErrorBody> {
    match (req.index, &req.selector) {
        (Some(i), _) => Ok(format!("[data-sandmesh-index=\"{i}\"]")),
        (None, Some(s)) if !s.trim().is_empty() => Ok(s.clone()),
        _ => Err(ErrorBody::bad_request(format!(
            "{} needs index (from elements) or selector",
            action.as_str()
        ))),
    }
}

fn action_error(e: ActionError) -> ErrorBody {
    let kind = match &e {
        ActionError::NoElement(_) | ActionError::Script(_) => ErrorKind::BadRequest,
        ActionError::Navigation { .. } => ErrorKind::Unavailable,
        ActionError::WaitTimeout(_)
        | ActionError::NoLoad { .. }
        | ActionError::Cdp(CdpError::Timeout) => ErrorKind::Timeout,
        ActionError::Cdp(_) | ActionError::Decode(_) => ErrorKind::Internal,
    };
    ErrorBody::new(kind, e.to_string())
}

/// `s` cut to at most `max` bytes on a character boundary.
fn truncate(mut s: String, max: usize) -> (String, bool) {
    if s.len() <= max {
        return (s, false);
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    (s, true)
}

impl SessionState {
    fn scope(&self, req: &BrowserRequest, ctx: &RequestContext) -> AuditScope {
        AuditScope {
            session_id: Some(self.id.clone()),
            trace_id: ctx.trace_id.clone(),
            actor: req.requested_by.clone(),
            ..Default::default()
        }
        .by(&ctx.caller)
    }

    /// Keeps the current browser while it lives, else takes a new one.
    async fn ensure_browser(&mut self) -> Result<(), ErrorBody> {
        if let Some(live) = &self.live {
            if !live.chromium.is_alive().await {
                tracing::warn!(session_id = %self.id, container = %live.container.name, "browser died; replacing it");
                self.live = None;
                self.lost = true;
            }
        }
        if self.live.is_none() {
            self.live = Some(self.start().await?);
        }
        Ok(())
    }

    async fn start(&self) -> Result<Live, ErrorBody> {
        let warm = match self
            .router
            .call(RouterMsg::Take, Some(Duration::from_secs(5)))
            .await
        {
            Ok(ractor::rpc::CallResult::Success(c)) => c,
            _ => None,
        };
        // A warm browser may have died while it waited: then it is a cold start, not lost
        // state (this session never had it).
        let Started {
            chromium,
            container,
        } = match warm {
            Some(w) if w.chromium.is_alive().await => w,
            _ => open(&self.shared.containers).await?,
        };
        let auditor = self.shared.auditor.clone();
        let scope = AuditScope {
            session_id: Some(self.id.clone()),
            ..Default::default()
        };
        let socket = container.egress_socket();
        let proxy = EgressProxy::builder(self.shared.policy.clone())
            .observer(move |event| {
                auditor.emit(AuditKind::Egress, &scope, json!(event));
            })
            .bind(&socket)
            .map_err(|e| {
                let cause = std::error::Error::source(&e)
                    .map(|c| format!(": {c}"))
                    .unwrap_or_default();
                ErrorBody::internal(format!(
                    "cannot bind the browser's egress proxy: {e}{cause}"
                ))
            })?;
        // Chromium runs as another user in the container and must be able to connect.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666))
            .map_err(|e| ErrorBody::internal(format!("egress socket permissions: {e}")))?;
        tracing::info!(session_id = %self.id, container = %container.name, "browser bound");
        Ok(Live {
            chromium,
            _proxy: proxy,
            container,
        })
    }

    async fn act(
        &mut self,
        action: BrowserAction,
        req: &BrowserRequest,
        ctx: &RequestContext,
    ) -> Result<BrowserResult, ErrorBody> {
        check_sizes(req)?;
        if action == BrowserAction::Close {
            let had = self.live.take().is_some();
            return Ok(BrowserResult {
                ok: true,
                value: Some(json!({"closed": had})),
                ..Default::default()
            });
        }
        let limit = req
            .timeout_ms
            .map(Duration::from_millis)
            .unwrap_or(self.shared.config.action_timeout)
            .min(self.shared.config.action_timeout);
        // The checks that need no browser come first: a refused URL starts nothing.
        let url = match action {
            BrowserAction::Navigate => {
                let raw = need(&req.url, "url", action)?;
                let checked = crate::guard::check(&self.shared.rules, &SystemResolver, raw)
                    .await
                    .map_err(|e| ErrorBody::denied(format!("navigation refused: {e}")))?;
                Some(checked.to_string())
            }
            _ => None,
        };
        let selector = match action {
            BrowserAction::Click | BrowserAction::Fill | BrowserAction::Type => {
                Some(target(req, action)?)
            }
            _ => None,
        };
        match action {
            BrowserAction::Fill | BrowserAction::Type => drop(need(&req.text, "text", action)?),
            BrowserAction::PressKey => drop(need(&req.key, "key", action)?),
            BrowserAction::Evaluate => drop(need(&req.script, "script", action)?),
            BrowserAction::WaitFor
                if req.text.is_none() && req.selector.is_none() && req.ms.is_none() =>
            {
                return Err(ErrorBody::bad_request(
                    "wait_for needs text, selector or ms",
                ))
            }
            _ => {}
        }

        let scope = self.scope(req, ctx);
        let shared = self.shared.clone();
        let session = self.id.clone();
        self.ensure_browser().await?;
        let lost = self.lost;
        let chromium = &self.live.as_ref().expect("ensured above").chromium;

        // What the assessor and a person see: the action, its target and what it would do;
        // a secret is never shown, only its length.
        let field = match (&selector, action) {
            (Some(s), BrowserAction::Fill | BrowserAction::Type | BrowserAction::Click) => Some(
                tokio::time::timeout(limit, chromium.describe(s))
                    .await
                    .map_err(|_| ErrorBody::timeout("describing the target timed out"))?
                    .map_err(action_error)?,
            ),
            _ => None,
        };
        let sensitive = field.as_ref().is_some_and(sensitive_field);
        let text = req.text.as_ref().map(|t| {
            if sensitive {
                format!("<{} characters, hidden>", t.chars().count())
            } else {
                t.clone()
            }
        });
        let params = json!({"url": url, "selector": selector, "index": req.index, "text": text,
                            "key": req.key, "script": req.script, "field": field,
                            "page": chromium.location().await.0});
        let summary = format!(
            "browser {} in session {session}{}",
            action.as_str(),
            field
                .as_ref()
                .map(|f| format!(" on {f}"))
                .unwrap_or_default()
        );
        let verdict = shared
            .gate
            .pass(action, params, sensitive, summary, &scope, ctx)
            .await?;

        let mut result = BrowserResult {
            ok: true,
            backend: BrowserBackend::External,
            risk_level: Some(verdict.level),
            confirmation: verdict.confirmation.as_ref().map(|c| c.1),
            confirmation_id: verdict.confirmation.map(|c| c.0),
            ..Default::default()
        };
        let run = async {
            match action {
                BrowserAction::Navigate => {
                    chromium
                        .navigate(url.as_deref().unwrap_or_default(), limit)
                        .await
                }
                BrowserAction::Back => chromium.back().await,
                BrowserAction::Click => {
                    chromium
                        .click(selector.as_deref().unwrap_or_default())
                        .await
                }
                BrowserAction::Fill | BrowserAction::Type => {
                    let clear = action == BrowserAction::Fill;
                    let text = req.text.as_deref().unwrap_or_default();
                    chromium
                        .fill(selector.as_deref().unwrap_or_default(), text, clear)
                        .await
                }
                BrowserAction::PressKey => {
                    chromium
                        .press_key(req.key.as_deref().unwrap_or_default())
                        .await
                }
                BrowserAction::Scroll => {
                    result.value = Some(chromium.scroll(req.dx.unwrap_or(0), req.dy).await?);
                    Ok(())
                }
                BrowserAction::WaitFor => match (req.text.as_deref(), req.selector.as_deref()) {
                    (None, None) => {
                        tokio::time::sleep(Duration::from_millis(req.ms.unwrap_or(0)).min(limit))
                            .await;
                        Ok(())
                    }
                    (text, sel) => {
                        let within = req
                            .ms
                            .map(Duration::from_millis)
                            .unwrap_or(limit)
                            .min(limit);
                        chromium.wait_for(text, sel, within).await
                    }
                },
                BrowserAction::Elements => {
                    result.elements = chromium.elements().await?;
                    Ok(())
                }
                BrowserAction::Screenshot => {
                    let png = chromium.screenshot(req.full_page).await?;
                    result.value = Some(json!({"bytes": png.len()}));
                    result.screenshot_base64 =
                        Some(base64::engine::general_purpose::STANDARD.encode(&png));
                    Ok(())
                }
                BrowserAction::Content => {
                    let page = match req.format {
                        ContentFormat::Text => chromium.text().await?,
                        ContentFormat::Html => chromium.html().await?,
                    };
                    let (page, truncated) = truncate(page, MAX_CONTENT_BYTES);
                    if truncated {
                        result.value = Some(json!({"truncated": true}));
                    }
                    result.content = Some(page);
                    Ok(())
                }
                BrowserAction::Evaluate => {
                    result.value = Some(
                        chromium
                            .evaluate(req.script.as_deref().unwrap_or_default())
                            .await?,
                    );
                    Ok(())
                }
                BrowserAction::Close => Ok(()),
            }
        };
        // A little more than the action's own bound: wait_for reports its own timeout.
        let outcome = match tokio::time::timeout(limit + Duration::from_secs(1), run).await {
            Ok(r) => r.map_err(action_error),
            Err(_) => Err(ErrorBody::timeout(format!(
                "{} took longer than {limit:?}",
                action.as_str()
            ))),
        };
        if let Err(e) = outcome {
            if !chromium.is_alive().await {
                self.live = None;
                self.lost = true;
                return Err(ErrorBody::unavailable(format!(
                    "the browser died during {}; its page state is lost and the next action starts a new one ({})",
                    action.as_str(), e.message
                )));
            }
            return Err(e);
        }
        (result.url, result.title) = chromium.location().await;
        // A redirect can land where the first URL's check never looked (the egress proxy
        // refused the hop, so the page is only its refusal): the answer says so, not `ok`.
        if action == BrowserAction::Navigate {
            if let Some(landed) = result.url.as_deref().filter(|u| Some(*u) != url.as_deref()) {
                if let Err(e) =
                    crate::guard::check(&self.shared.rules, &SystemResolver, landed).await
                {
                    return Err(ErrorBody::denied(format!(
                        "navigation was redirected to {landed}, which is refused: {e}"
                    )));
                }
            }
        }
        if action == BrowserAction::Evaluate {
            let size = result
                .value
                .as_ref()
                .map(|v| v.to_string().len())
                .unwrap_or(0);
            if size > MAX_CONTENT_BYTES {
                return Err(ErrorBody::too_large(format!(
                    "the script's value is {size} bytes serialized; at most {MAX_CONTENT_BYTES}"
                )));
            }
        }
        if action == BrowserAction::Screenshot {
            self.store_screenshot(req, &mut result).await?;
        }
        result.state_lost = lost;
        self.lost = false;
        Ok(result)
    }

    /// Writes the PNG to `artifacts/` in the session's workspace; keeps it inline only when
    /// asked and small enough.
    async fn store_screenshot(
        &self,
        req: &BrowserRequest,
        result: &mut BrowserResult,
    ) -> Result<(), ErrorBody> {
        let encoded = result.screenshot_base64.take().unwrap_or_default();
        let png = base64::engine::general_purpose::STANDARD
            .decode(&encoded)
            .map_err(|e| ErrorBody::internal(format!("screenshot encoding: {e}")))?;
        let path = format!(
            "artifacts/screenshot-{}.png",
            messages::new_id().to_ascii_lowercase()
        );
        self.shared
            .workspace
            .write(&self.id, &path, &png)
            .await
            .map_err(|e| {
                ErrorBody::unavailable(format!("cannot store the screenshot in the workspace: {e}"))
            })?;
        result.screenshot_path = Some(path);
        if req.inline {
            if png.len() <= self.shared.config.inline_max_bytes {
                result.screenshot_base64 = Some(encoded);
            } else {
                result.value = Some(json!({"bytes": png.len(), "inline_refused": format!(
                    "{} bytes is over the inline cap of {}; read it from the workspace",
                    png.len(), self.shared.config.inline_max_bytes)}));
            }
        }
        Ok(())
    }
}
