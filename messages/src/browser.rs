//! Browser actions (browser-router) and AIO sandbox pool calls (aio-pool).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BrowserAction {
    Navigate,
    Back,
    Click,
    Fill,
    Type,
    PressKey,
    Scroll,
    WaitFor,
    Elements,
    Screenshot,
    Content,
    Evaluate,
    Close,
}

impl BrowserAction {
    pub const ALL: &'static [BrowserAction] = &[
        BrowserAction::Navigate,
        BrowserAction::Back,
        BrowserAction::Click,
        BrowserAction::Fill,
        BrowserAction::Type,
        BrowserAction::PressKey,
        BrowserAction::Scroll,
        BrowserAction::WaitFor,
        BrowserAction::Elements,
        BrowserAction::Screenshot,
        BrowserAction::Content,
        BrowserAction::Evaluate,
        BrowserAction::Close,
    ];

    /// The last token of `sandbox.v1.browser.<action>`.
    pub const fn as_str(self) -> &'static str {
        match self {
            BrowserAction::Navigate => "navigate",
            BrowserAction::Back => "back",
            BrowserAction::Click => "click",
            BrowserAction::Fill => "fill",
            BrowserAction::Type => "type",
            BrowserAction::PressKey => "press_key",
            BrowserAction::Scroll => "scroll",
            BrowserAction::WaitFor => "wait_for",
            BrowserAction::Elements => "elements",
            BrowserAction::Screenshot => "screenshot",
            BrowserAction::Content => "content",
            BrowserAction::Evaluate => "evaluate",
            BrowserAction::Close => "close",
        }
    }

    pub fn parse(token: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|a| a.as_str() == token)
    }
}

/// Which browser serves a session (seed 000 §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BrowserBackend {
    /// The session's own hardened Chromium container.
    #[default]
    External,
    /// The browser of the session's AIO sandbox (aio-pool).
    Aio,
}

impl BrowserBackend {
    /// Seed 000 §7: work that needs the session's files or is research goes to the AIO
    /// browser; an explicit `backend` in the request wins.
    pub fn route(req: &BrowserRequest) -> Self {
        match req.backend {
            Some(b) => b,
            None if req.needs_file_access || req.is_research => BrowserBackend::Aio,
            None => BrowserBackend::External,
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            BrowserBackend::External => "external",
            BrowserBackend::Aio => "aio",
        }
    }
}

/// What `content` returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContentFormat {
    /// The page's visible text (`document.body.innerText`).
    #[default]
    Text,
    /// The serialized DOM.
    Html,
}

/// `sandbox.v1.browser.<action>`. Which fields an action reads:
/// `navigate` url; `click` index | selector; `fill`/`type` (index | selector) + text;
/// `press_key` key (on the focused element); `scroll` dx/dy (pixels; default one screen
/// down); `wait_for` text | selector | ms (bounded by timeout_ms); `screenshot` full_page,
/// inline; `content` format; `evaluate` script.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct BrowserRequest {
    pub session_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// An index from the last `elements` reply of the current page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// A key name as in the DOM's `KeyboardEvent.key`: `Enter`, `Tab`, `ArrowDown`, `a`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dx: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dy: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ms: Option<u64>,
    #[serde(default)]
    pub full_page: bool,
    /// Also return the screenshot as base64 in the reply (refused above the size cap).
    #[serde(default)]
    pub inline: bool,
    #[serde(default)]
    pub format: ContentFormat,
    /// Route to the session's AIO browser instead of the external one (seed 000 §7).
    #[serde(default)]
    pub needs_file_access: bool,
    #[serde(default)]
    pub is_research: bool,
    /// Overrides the routing above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<BrowserBackend>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
}

/// One interactive element of the page, as `elements` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct BrowserElement {
    /// Valid for the page it was listed on, until the next navigation.
    pub index: u32,
    pub tag: String,
    /// ARIA role, explicit or implied by the tag (`link`, `button`, `textbox`, ...).
    pub role: String,
    /// Accessible name: label, aria-label, text, placeholder, title or name attribute.
    #[serde(default)]
    pub name: String,
    /// `type` of an input (`password`, `email`, `submit`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_type: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct BrowserResult {
    pub ok: bool,
    /// The page's URL and title after the action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub elements: Vec<BrowserElement>,
    /// Workspace path of a screenshot (under `artifacts/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub screenshot_path: Option<String>,
    /// The PNG itself, base64, when `inline` was asked and it is under the cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub screenshot_base64: Option<String>,
    #[serde(default)]
    pub backend: BrowserBackend,
    /// The session's previous browser died (crash, killed container): this action ran on a
    /// new one, and cookies, history and open pages were lost.
    #[serde(default)]
    pub state_lost: bool,
    /// The risk assessor's level for this action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub risk_level: Option<crate::risk::RiskLevel>,
    /// Set when the action needed a person's decision: its final state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmation: Option<crate::confirm::ConfirmState>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmation_id: Option<String>,
}

/// `sandbox.v1.aio.acquire`: bind an AIO instance to a session (idempotent per session).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AioAcquire {
    pub session_id: String,
    /// Also start the instance's browser and return its CDP URL in the lease.
    #[serde(default)]
    pub browser: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AioLease {
    pub session_id: String,
    pub instance_id: String,
    /// Base URL of the instance's HTTP API (its address on the pool's internal bridge).
    pub base_url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cdp_url: Option<String>,
}

/// `sandbox.v1.aio.release`: destroys the session's instance (it never passes to another
/// session).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AioRelease {
    pub session_id: String,
    /// When given, must be the session's instance (a release naming another is refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
}

/// `sandbox.v1.aio.release` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AioReleased {
    pub session_id: String,
    pub instance_id: String,
}

/// `sandbox.v1.aio.exec`: run a shell command in the session's AIO instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AioExec {
    pub session_id: String,
    pub command: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// When given, must be the session's instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
}

/// `sandbox.v1.aio.exec` answer.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct AioExecResult {
    pub session_id: String,
    pub instance_id: String,
    /// `ok` (exit 0), `error` (non-zero exit), `timeout`.
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub exec_ms: u64,
    /// The instance reached `max_use_count` with this execution and was retired; the
    /// session's next acquire gets a fresh one.
    #[serde(default)]
    pub retired: bool,
}

/// `sandbox.v1.aio.stats` request (`{}`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct AioStatsRequest {}

/// `sandbox.v1.aio.stats` answer (also in the heartbeat's metrics).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct AioStats {
    pub total: u32,
    pub warm: u32,
    pub bound: u32,
    pub max: u32,
    #[serde(default)]
    pub creating: u32,
    #[serde(default)]
    pub retiring: u32,
    /// Acquires waiting for capacity.
    #[serde(default)]
    pub waiting: u32,
    #[serde(default)]
    pub min: u32,
}
