//! Browser actions (browser-router) and AIO sandbox pool calls (aio-pool).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BrowserAction {
    Navigate,
    Click,
    Fill,
    Type,
    Screenshot,
    Content,
    Evaluate,
    Close,
}

impl BrowserAction {
    pub const ALL: &'static [BrowserAction] = &[
        BrowserAction::Navigate,
        BrowserAction::Click,
        BrowserAction::Fill,
        BrowserAction::Type,
        BrowserAction::Screenshot,
        BrowserAction::Content,
        BrowserAction::Evaluate,
        BrowserAction::Close,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            BrowserAction::Navigate => "navigate",
            BrowserAction::Click => "click",
            BrowserAction::Fill => "fill",
            BrowserAction::Type => "type",
            BrowserAction::Screenshot => "screenshot",
            BrowserAction::Content => "content",
            BrowserAction::Evaluate => "evaluate",
            BrowserAction::Close => "close",
        }
    }
}

/// `sandbox.v1.browser.<action>`
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct BrowserRequest {
    pub session_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<String>,
    /// Route to the session's AIO browser instead of the external one (seed 000 §7).
    #[serde(default)]
    pub needs_file_access: bool,
    #[serde(default)]
    pub is_research: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct BrowserResult {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<serde_json::Value>,
    /// Workspace path of a screenshot (under `artifacts/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub screenshot_path: Option<String>,
    /// `external` or `aio`.
    #[serde(default)]
    pub backend: String,
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
