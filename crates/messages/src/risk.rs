//! Static risk assessment: advisory input to routing and confirmation, never the boundary.

use serde::{Deserialize, Serialize};

use crate::code::Tier;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContentType {
    Python,
    Javascript,
    Shell,
    Browser,
}

impl ContentType {
    pub const SUPPORTED: &'static str = "python, javascript, shell, browser";

    pub const fn as_str(self) -> &'static str {
        match self {
            ContentType::Python => "python",
            ContentType::Javascript => "javascript",
            ContentType::Shell => "shell",
            ContentType::Browser => "browser",
        }
    }
}

impl From<crate::code::Language> for ContentType {
    fn from(l: crate::code::Language) -> Self {
        match l {
            crate::code::Language::Python => ContentType::Python,
            crate::code::Language::Javascript => ContentType::Javascript,
            crate::code::Language::Shell => ContentType::Shell,
        }
    }
}

/// Strict (production default): anything not SAFE goes to `session` or stricter.
/// Permissive (development): the assessor's suggestion is followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SecurityMode {
    #[default]
    Strict,
    Permissive,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum RiskLevel {
    #[default]
    Safe,
    Low,
    Medium,
    High,
    Critical,
}

impl RiskLevel {
    pub const fn as_str(self) -> &'static str {
        match self {
            RiskLevel::Safe => "safe",
            RiskLevel::Low => "low",
            RiskLevel::Medium => "medium",
            RiskLevel::High => "high",
            RiskLevel::Critical => "critical",
        }
    }
}

/// The `params` key (`true`) saying the code runs under a network egress policy: the policy
/// bounds what it can reach, so fetching is no risk by itself.
pub const NETWORK_POLICY_PARAM: &str = "network_policy";

/// `sandbox.v1.risk.assess` request. `content` is the code (or, for `browser`, the action
/// name); `params` carries browser action parameters (url, selector, text, ...), and for code
/// [`NETWORK_POLICY_PARAM`]. `files` are the files placed beside the code, which it may run:
/// each is assessed like code of its language, and the verdict covers them all.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AssessRequest {
    pub content: String,
    pub content_type: ContentType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<SecurityMode>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<crate::code::FileSpec>,
}

impl AssessRequest {
    /// Code (or a browser action) alone, with no params, files or mode.
    pub fn new(content: impl Into<String>, content_type: ContentType) -> Self {
        Self {
            content: content.into(),
            content_type,
            params: None,
            mode: None,
            files: Vec::new(),
        }
    }

    /// Whether the code runs under a network policy ([`NETWORK_POLICY_PARAM`]).
    pub fn under_network_policy(&self) -> bool {
        self.params
            .as_ref()
            .and_then(|p| p.get(NETWORK_POLICY_PARAM))
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false)
    }
}

/// One rule that matched, with where it matched when the source was parsed.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    pub rule: String,
    pub severity: RiskLevel,
    pub description: String,
    /// The request's file it was found in (its `path`); absent: in the code itself. `line`,
    /// `start` and `end` are then into that file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// 1-based line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    /// Byte offsets into the content.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<u32>,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RiskAssessment {
    pub level: RiskLevel,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub requires_confirmation: bool,
    #[serde(default)]
    pub requires_isolation: bool,
    pub suggested_tier: Tier,
    #[serde(default)]
    pub findings: Vec<Finding>,
}

impl RiskAssessment {
    /// The least isolated tier this assessment allows under `mode`: strict
    /// sends anything not SAFE to `session` or stricter; permissive follows the suggestion. A
    /// `reject` (critical shell) stays a reject in both modes, as it is the strictest tier.
    /// One rule for the assessor and the scheduler, so both sides of the wire agree.
    pub fn required_tier(&self, mode: SecurityMode) -> Tier {
        match mode {
            SecurityMode::Strict if self.level != RiskLevel::Safe => {
                self.suggested_tier.max(Tier::Session)
            }
            _ => self.suggested_tier,
        }
    }
}
