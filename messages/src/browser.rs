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
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AioLease {
    pub session_id: String,
    pub instance_id: String,
    /// Base URL of the instance's HTTP API (published on 127.0.0.1).
    pub base_url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cdp_url: Option<String>,
}

/// `sandbox.v1.aio.release`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AioRelease {
    pub session_id: String,
}

/// `sandbox.v1.aio.exec`: run a shell command in the session's AIO instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AioExec {
    pub session_id: String,
    pub command: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct AioStats {
    pub total: u32,
    pub warm: u32,
    pub bound: u32,
    pub max: u32,
}
