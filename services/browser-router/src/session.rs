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
use egress::{EgressProxy, EgressRules, SystemResolver};
use futures::future::BoxFuture;
use kit::{AuditScope, Auditor, RequestContext};
use messages::audit::{BrowserActed, BrowserOutcome};
use messages::browser::{
    BrowserBackend, BrowserCommand, BrowserRequest, BrowserResult, ContentFormat, WaitFor,
};
use messages::network::NetworkPolicy;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use sandmesh_client::WorkspaceClient;
use serde_json::json;

use crate::chromium::Chromium;
use crate::config::BrowserConfig;
use crate::container::{BrowserContainer, Containers};
use crate::error::{BrowserError, Reply};
use crate::gate::{sensitive_field, Gate};

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
    pub req: BrowserRequest,
    pub ctx: RequestContext,
    pub reply: Reply,
}

pub enum SessionMsg {
    Act(Box<Act>),
    /// Timer: stop when unused for the idle timeout.
    IdleCheck,
}

/// Takes a warm browser, if the pool has one (`None` also when it did not answer in time).
pub type TakeWarm = Arc<dyn Fn() -> BoxFuture<'static, Option<Started>> + Send + Sync>;

pub struct SessionArgs {
    pub session_id: String,
    pub shared: Arc<Shared>,
    pub take_warm: TakeWarm,
}

/// A started browser container with its CDP connection and page, not yet any session's.
/// Field order is drop order: the connection first, then the container.
pub struct Started {
    pub chromium: Chromium,
    pub container: BrowserContainer,
}

/// Starts a browser container and connects to it (the warm pool's and a cold start's way).
pub async fn open(containers: &Containers) -> Result<Started, BrowserError> {
    let container = containers
        .start(START_WITHIN)
        .await
        .map_err(|e| BrowserError::Start(Box::new(e)))?;
    let chromium = Chromium::connect(&container.cdp_url())
        .await
        .map_err(BrowserError::Connect)?;
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
    take_warm: TakeWarm,
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
            take_warm: args.take_warm,
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
                let Act { req, ctx, reply } = *act;
                let action = req.command.action();
                let outcome = state.act(&req, &ctx).await;
                state.last_used = Instant::now();
                let scope = state.scope(&req, &ctx);
                let outcome_details = match &outcome {
                    Ok(r) => BrowserOutcome::Done {
                        url: r.url.clone(),
                        state_lost: r.state_lost,
                    },
                    Err(e) => BrowserOutcome::Failed {
                        code: e.kind().code(),
                        error: e.to_string(),
                    },
                };
                let acted = BrowserActed {
                    action,
                    outcome: outcome_details,
                };
                state.shared.auditor.emit(&scope, acted);
                let _ = reply.send(outcome);
                if req.command == BrowserCommand::Close {
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

/// How long a wait may take: what it asked, bounded by the action's limit.
fn within(asked_ms: Option<u64>, limit: Duration) -> Duration {
    asked_ms
        .map(Duration::from_millis)
        .unwrap_or(limit)
        .min(limit)
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
    async fn ensure_browser(&mut self) -> Result<(), BrowserError> {
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

    async fn start(&self) -> Result<Live, BrowserError> {
        let warm = (self.take_warm)().await;
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
                auditor.emit(&scope, event.clone());
            })
            .bind(&socket)
            .map_err(BrowserError::EgressBind)?;
        // Chromium runs as another user in the container and must be able to connect.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666))
            .map_err(BrowserError::EgressPermissions)?;
        tracing::info!(session_id = %self.id, container = %container.name, "browser bound");
        Ok(Live {
            chromium,
            _proxy: proxy,
            container,
        })
    }

    async fn act(
        &mut self,
        req: &BrowserRequest,
        ctx: &RequestContext,
    ) -> Result<BrowserResult, BrowserError> {
        let action = req.command.action();
        if req.command == BrowserCommand::Close {
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
        let url = match &req.command {
            BrowserCommand::Navigate { url } => {
                let checked = crate::guard::check(&self.shared.rules, &SystemResolver, url)
                    .await
                    .map_err(BrowserError::NavigationRefused)?;
                Some(checked.to_string())
            }
            _ => None,
        };
        let selector = match &req.command {
            BrowserCommand::Click { target }
            | BrowserCommand::Fill { target, .. }
            | BrowserCommand::Type { target, .. } => Some(target.selector()),
            _ => None,
        };

        let scope = self.scope(req, ctx);
        let shared = self.shared.clone();
        let session = self.id.clone();
        self.ensure_browser().await?;
        let lost = self.lost;
        let chromium = &mut self.live.as_mut().expect("ensured above").chromium;

        // What the assessor and a person see: the action, its target and what it would do;
        // a secret is never shown, only its length.
        let field = match &selector {
            Some(s) => Some(
                tokio::time::timeout(limit, chromium.describe(s))
                    .await
                    .map_err(|_| BrowserError::DescribeTimedOut)??,
            ),
            _ => None,
        };
        let sensitive = field.as_ref().is_some_and(sensitive_field);
        // The parameters as sent, with the URL as checked and the target resolved.
        let sent = req.payload();
        let text = sent.text.map(|t| {
            if sensitive {
                format!("<{} characters, hidden>", t.chars().count())
            } else {
                t
            }
        });
        let params = json!({"url": url, "selector": selector, "index": sent.index, "text": text,
                            "key": sent.key, "script": sent.script, "field": field,
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
            match &req.command {
                BrowserCommand::Navigate { .. } => {
                    chromium
                        .navigate(url.as_deref().unwrap_or_default(), limit)
                        .await
                }
                BrowserCommand::Back => chromium.back().await,
                BrowserCommand::Click { target } => chromium.click(&target.selector()).await,
                BrowserCommand::Fill { target, text } => {
                    chromium.fill(&target.selector(), text, true).await
                }
                BrowserCommand::Type { target, text } => {
                    chromium.fill(&target.selector(), text, false).await
                }
                BrowserCommand::PressKey { key } => chromium.press_key(key).await,
                BrowserCommand::Scroll { dx, dy } => {
                    result.value = Some(chromium.scroll(*dx, *dy).await?);
                    Ok(())
                }
                BrowserCommand::WaitFor(WaitFor::Delay { ms }) => {
                    tokio::time::sleep(Duration::from_millis(*ms).min(limit)).await;
                    Ok(())
                }
                BrowserCommand::WaitFor(WaitFor::Text {
                    text,
                    selector,
                    within_ms,
                }) => {
                    let within = within(*within_ms, limit);
                    chromium
                        .wait_for(Some(text), selector.as_deref(), within)
                        .await
                }
                BrowserCommand::WaitFor(WaitFor::Selector {
                    selector,
                    within_ms,
                }) => {
                    let within = within(*within_ms, limit);
                    chromium.wait_for(None, Some(selector), within).await
                }
                BrowserCommand::Elements => {
                    result.elements = chromium.elements().await?;
                    Ok(())
                }
                BrowserCommand::Screenshot { full_page, .. } => {
                    let png = chromium.screenshot(*full_page).await?;
                    result.value = Some(json!({"bytes": png.len()}));
                    result.screenshot_base64 =
                        Some(base64::engine::general_purpose::STANDARD.encode(&png));
                    Ok(())
                }
                BrowserCommand::Content { format } => {
                    let page = match format {
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
                BrowserCommand::Evaluate { script } => {
                    result.value = Some(chromium.evaluate(script).await?);
                    Ok(())
                }
                BrowserCommand::Close => Ok(()),
            }
        };
        // A little more than the action's own bound: wait_for reports its own timeout.
        let outcome = match tokio::time::timeout(limit + Duration::from_secs(1), run).await {
            Ok(r) => r.map_err(BrowserError::Action),
            Err(_) => Err(BrowserError::ActionTimedOut { action, limit }),
        };
        if let Err(e) = outcome {
            if !chromium.is_alive().await {
                self.live = None;
                self.lost = true;
                return Err(BrowserError::BrowserDied {
                    action,
                    cause: Box::new(e),
                });
            }
            return Err(e);
        }
        (result.url, result.title) = chromium.location().await;
        // A redirect can land where the first URL's check never looked (the egress proxy
        // refused the hop, so the page is only its refusal): the answer says so, not `ok`.
        if matches!(req.command, BrowserCommand::Navigate { .. }) {
            if let Some(landed) = result.url.as_deref().filter(|u| Some(*u) != url.as_deref()) {
                if let Err(source) =
                    crate::guard::check(&self.shared.rules, &SystemResolver, landed).await
                {
                    return Err(BrowserError::Redirected {
                        landed: landed.to_string(),
                        source,
                    });
                }
            }
        }
        if matches!(req.command, BrowserCommand::Evaluate { .. }) {
            let size = result
                .value
                .as_ref()
                .map(|v| v.to_string().len())
                .unwrap_or(0);
            if size > MAX_CONTENT_BYTES {
                return Err(BrowserError::ValueTooLarge {
                    size,
                    max: MAX_CONTENT_BYTES,
                });
            }
        }
        if let BrowserCommand::Screenshot { inline, .. } = req.command {
            self.store_screenshot(inline, &mut result).await?;
        }
        result.state_lost = lost;
        self.lost = false;
        Ok(result)
    }

    /// Writes the PNG to `artifacts/` in the session's workspace; keeps it inline only when
    /// asked and small enough.
    async fn store_screenshot(
        &self,
        inline: bool,
        result: &mut BrowserResult,
    ) -> Result<(), BrowserError> {
        let encoded = result.screenshot_base64.take().unwrap_or_default();
        let png = base64::engine::general_purpose::STANDARD
            .decode(&encoded)
            .map_err(BrowserError::ScreenshotEncoding)?;
        let path = format!(
            "artifacts/screenshot-{}.png",
            messages::new_id().to_ascii_lowercase()
        );
        self.shared
            .workspace
            .write(&self.id, &path, &png)
            .await
            .map_err(BrowserError::ScreenshotStore)?;
        result.screenshot_path = Some(path);
        if inline {
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
