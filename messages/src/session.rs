//! Sessions: a workspace (always) and, in tier `session`, a container on one executor node.

use serde::{Deserialize, Serialize};

use crate::exec::{Language, Tier};
use crate::network::NetworkPolicy;
use crate::tenancy::{unscoped, Tenant};

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionState {
    /// Opened; no container placed yet.
    #[default]
    Open,
    /// Its container runs on `node`.
    Active,
    /// Its node was lost; the next execution re-places it with the workspace restored.
    Lost,
    Closed,
}

/// The value stored in KV `sandbox_sessions` under the session id.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SessionRecord {
    pub session_id: String,
    pub state: SessionState,
    pub tier: Tier,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// Unix milliseconds.
    pub created_at: u64,
    pub last_used_at: u64,
    #[serde(default)]
    pub executions: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
    /// The node the session was last lost from (while `Lost`), so re-placement avoids it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost_from: Option<String>,
    /// How many times the session was re-placed with its workspace restored.
    #[serde(default)]
    pub restores: u64,
    /// The session's egress policy, as admitted (validated, clamped by the operator's
    /// ceiling); every execution of the session runs under it. Absent: no network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkPolicy>,
    /// The template every execution of the session runs in (its container's image).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// The tenant that opened it (its id is scoped by it); `None` for internal callers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<Tenant>,
}

impl SessionRecord {
    /// The record as `tenant`'s agents know it: the id without the tenant's scope prefix.
    pub fn unscoped(mut self, tenant: Option<&Tenant>) -> Self {
        self.session_id = unscoped(tenant, &self.session_id);
        self
    }
}

/// `sessions.open`: an id may be supplied (idempotent), otherwise a ULID is assigned.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SessionOpen {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<Tier>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<Language>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
    /// Egress for every execution of the session; absent: no network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkPolicy>,
    /// The template every execution of the session runs in; absent: the sandbox image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
}

/// `sessions.get` and `sessions.close`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRef {
    pub session_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SessionList {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SessionListReply {
    pub sessions: Vec<SessionRecord>,
}
