//! Per-tenant quotas: how much of the mesh one tenant may
//! hold at once. Set by an administrator (`sandmesh tenant add NAME --max-…`, kept in the
//! tenancy file), read by each service that owns the resource, and answered — when a request
//! would go over — with 429 naming the quota, its limit and when to retry, never by silently
//! evicting what the tenant already has.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::tenancy::Tenant;
use crate::ErrorBody;

/// One tenant's limits; `None` is "no limit of this kind" (concurrent executions then fall
/// back to the scheduler's share of its queue).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Quotas {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrent_executions: Option<u32>,
    /// Sessions open (created and not closed) at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sessions: Option<u32>,
    /// Bytes in all of the tenant's workspaces together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_bytes: Option<u64>,
    /// Browser sessions (each its own Chromium container) at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub browsers: Option<u32>,
    /// AIO instances held at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aio_instances: Option<u32>,
}

/// Which quota a refusal is about (its wire name is `details.quota` of the 429).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quota {
    ConcurrentExecutions,
    Sessions,
    WorkspaceBytes,
    Browsers,
    AioInstances,
}

impl Quota {
    pub const ALL: [Quota; 5] = [
        Quota::ConcurrentExecutions,
        Quota::Sessions,
        Quota::WorkspaceBytes,
        Quota::Browsers,
        Quota::AioInstances,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Quota::ConcurrentExecutions => "concurrent_executions",
            Quota::Sessions => "sessions",
            Quota::WorkspaceBytes => "workspace_bytes",
            Quota::Browsers => "browsers",
            Quota::AioInstances => "aio_instances",
        }
    }

    /// What is counted, for messages ("3 sessions").
    fn noun(self) -> &'static str {
        match self {
            Quota::ConcurrentExecutions => "executions in flight",
            Quota::Sessions => "open sessions",
            Quota::WorkspaceBytes => "workspace bytes",
            Quota::Browsers => "browsers",
            Quota::AioInstances => "AIO instances",
        }
    }

    /// What frees some of it, said to a caller who is over.
    fn remedy(self) -> &'static str {
        match self {
            Quota::ConcurrentExecutions => "retry when one of them has finished",
            Quota::Sessions => "close one of them (sessions.close) or retry later",
            Quota::WorkspaceBytes => "remove files from a workspace or close a session",
            Quota::Browsers => "close a browser (browser close) or retry later",
            Quota::AioInstances => "release one (aio.release) or retry later",
        }
    }
}

impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Quotas {
    /// The limit of `quota` (`None`: none set).
    pub fn limit(&self, quota: Quota) -> Option<u64> {
        match quota {
            Quota::ConcurrentExecutions => self.concurrent_executions.map(u64::from),
            Quota::Sessions => self.sessions.map(u64::from),
            Quota::WorkspaceBytes => self.workspace_bytes,
            Quota::Browsers => self.browsers.map(u64::from),
            Quota::AioInstances => self.aio_instances.map(u64::from),
        }
    }

    pub fn is_empty(&self) -> bool {
        *self == Quotas::default()
    }

    /// `Ok` when `used + adding` stays within `quota`'s limit (or there is none), else the
    /// refusal that says which quota, its limit and the use now.
    pub fn admit(
        &self,
        tenant: &Tenant,
        quota: Quota,
        used: u64,
        adding: u64,
    ) -> Result<(), OverQuota> {
        match self.limit(quota) {
            Some(limit) if used.saturating_add(adding) > limit => Err(OverQuota {
                tenant: tenant.clone(),
                quota,
                limit,
                used,
            }),
            _ => Ok(()),
        }
    }
}

/// How long a caller over a quota is told to wait before it tries again.
pub const RETRY_AFTER_MS: u64 = 500;

/// A request would take `tenant` over `quota`. Kept as a value while it travels up; the wire
/// body — 429 (`overloaded`) with `details {quota, limit, used, retry_after_ms}` — is made
/// from it at the endpoint.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "tenant {tenant} is at its quota of {limit} {} ({quota}: {used} in use); {}",
    quota.noun(),
    quota.remedy()
)]
pub struct OverQuota {
    pub tenant: Tenant,
    pub quota: Quota,
    pub limit: u64,
    pub used: u64,
}

impl From<OverQuota> for ErrorBody {
    fn from(e: OverQuota) -> Self {
        ErrorBody::overloaded(e.to_string()).with_details(serde_json::json!({
            "quota": e.quota.as_str(),
            "limit": e.limit,
            "used": e.used,
            "retry_after_ms": RETRY_AFTER_MS,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn a_request_within_the_limit_passes_and_one_over_it_is_a_429_naming_the_quota() {
        let acme = Tenant::new("acme").unwrap();
        let q = Quotas {
            sessions: Some(2),
            ..Default::default()
        };
        assert!(q.admit(&acme, Quota::Sessions, 1, 1).is_ok());
        let e = ErrorBody::from(q.admit(&acme, Quota::Sessions, 2, 1).unwrap_err());
        assert_eq!(e.kind, ErrorKind::Overloaded);
        let d = e.details.unwrap();
        assert_eq!(d["quota"], "sessions");
        assert_eq!(d["limit"], 2);
        assert_eq!(d["used"], 2);
        assert!(e.message.contains("close one of them"), "{}", e.message);
        assert!(
            q.admit(&acme, Quota::Browsers, 1_000, 1).is_ok(),
            "no limit set"
        );
    }

    #[test]
    fn the_refusal_keeps_its_wire_form() {
        let over = OverQuota {
            tenant: Tenant::new("acme").unwrap(),
            quota: Quota::AioInstances,
            limit: 1,
            used: 1,
        };
        let body = serde_json::to_string(&ErrorBody::from(over)).unwrap();
        assert_eq!(
            body,
            concat!(
                r#"{"code":429,"kind":"overloaded","message":"tenant acme is at its quota of 1 "#,
                r#"AIO instances (aio_instances: 1 in use); release one (aio.release) or retry "#,
                r#"later","details":{"limit":1,"quota":"aio_instances","retry_after_ms":500,"#,
                r#""used":1}}"#
            )
        );
    }

    #[test]
    fn quotas_round_trip_and_unknown_fields_are_refused() {
        let q = Quotas {
            workspace_bytes: Some(1 << 30),
            aio_instances: Some(1),
            ..Default::default()
        };
        let text = serde_json::to_string(&q).unwrap();
        assert_eq!(text, r#"{"workspace_bytes":1073741824,"aio_instances":1}"#);
        assert_eq!(serde_json::from_str::<Quotas>(&text).unwrap(), q);
        assert!(serde_json::from_str::<Quotas>(r#"{"sesions":1}"#).is_err());
    }
}
