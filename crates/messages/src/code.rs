//! What code an execution runs, and how: its language, tier, files and limits. Executions,
//! templates and risk assessments all name them, so they sit below each (`exec` re-exports
//! them, where clients find them).

use serde::{Deserialize, Serialize};

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Language {
    #[default]
    Python,
    Javascript,
    Shell,
}

impl Language {
    pub const ALL: &'static [Language] = &[Language::Python, Language::Javascript, Language::Shell];

    pub const fn as_str(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::Javascript => "javascript",
            Language::Shell => "shell",
        }
    }
}

impl std::str::FromStr for Language {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "python" | "py" | "python3" => Ok(Language::Python),
            "javascript" | "js" | "node" => Ok(Language::Javascript),
            "shell" | "sh" | "bash" => Ok(Language::Shell),
            other => Err(format!(
                "unknown language {other:?}; supported: python, javascript, shell"
            )),
        }
    }
}

/// Where code runs (`docs/architecture.md#tiers`).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// A pre-warmed single-use hardened container.
    #[default]
    Ephemeral,
    /// The session's own hardened container, reused across its executions.
    Session,
    /// An AIO sandbox bound to the session.
    Aio,
    /// Never runs.
    Reject,
}

impl Tier {
    pub const fn as_str(self) -> &'static str {
        match self {
            Tier::Ephemeral => "ephemeral",
            Tier::Session => "session",
            Tier::Aio => "aio",
            Tier::Reject => "reject",
        }
    }
}

/// The tier a client asks for; `auto` lets the risk policy decide.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TierChoice {
    #[default]
    Auto,
    Ephemeral,
    Session,
    Aio,
}

/// Resource limits a request may ask for; each is clamped to (or refused above) the ceilings.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<u64>,
}

/// How a file's `content` is written on the wire.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContentEncoding {
    #[default]
    Utf8,
    Base64,
}

/// A file placed in the workspace before the code runs.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSpec {
    pub path: String,
    pub content: String,
    #[serde(default)]
    pub encoding: ContentEncoding,
}

impl FileSpec {
    /// The file's bytes, decoding base64 when asked to.
    pub fn bytes(&self) -> Result<Vec<u8>, String> {
        crate::decode_content(&self.content, self.encoding)
    }
}
