//! Sessions: a workspace (always) and, in tier `session`, a container on one executor node.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::exec::{ExecRequest, Language, Tier};
use crate::filesystem::FilesystemPolicy;
use crate::network::NetworkPolicy;
use crate::tenancy::{unscoped, Tenant};
use crate::validate::{clamp_timeout, validate_env, Ceilings, ValidationError};

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

/// Why a session closed.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CloseReason {
    /// `sessions.close`.
    Requested,
    /// Its `ttl_ms` ran out.
    Ttl,
    /// Unused for its idle time.
    Idle,
}

impl CloseReason {
    pub const fn as_str(self) -> &'static str {
        match self {
            CloseReason::Requested => "requested",
            CloseReason::Ttl => "ttl",
            CloseReason::Idle => "idle",
        }
    }
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
    /// Unix milliseconds until which an execution started in it may still run (its start
    /// plus its deadline): the idle clock does not run before, so a run longer than the
    /// session's idle time is not closed under it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy_until: Option<u64>,
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
    /// The template every execution of the session runs in (its container's image): the one
    /// it opened with, or — opened without one — its first execution's, fixed when its first
    /// container is placed ([`SessionRecord::admits_template`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// The tenant that opened it (its id is scoped by it); `None` for internal callers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<Tenant>,
    /// Env of every execution of the session (as admitted); a request's own env wins.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// The timeout of an execution that names none (clamped by the ceilings when opened).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Unix milliseconds when the session closes itself (`created_at` + its `ttl_ms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
    /// How long it may go unused before it closes itself; absent: the scheduler's default
    /// (`SANDMESH_SESSION_IDLE_MS`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_ms: Option<u64>,
    /// Directories hidden, writable or read-only in its container (`crate::filesystem`),
    /// added to its template's; enforced by mounts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filesystem: Option<FilesystemPolicy>,
    /// Unix milliseconds when it closed; the record is removed a retention time later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed_at: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub close_reason: Option<CloseReason>,
    /// Its exposed ports (`crate::ports`), each with its token's hash and expiry. In JSON an
    /// object whose keys are the port numbers written as strings, as JSON keys are.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = BTreeMap<String, crate::ports::Exposure>)
    )]
    pub ports: crate::ports::Exposures,
}

impl SessionRecord {
    /// The record as `tenant`'s agents know it: the id without the tenant's scope prefix.
    pub fn unscoped(mut self, tenant: Option<&Tenant>) -> Self {
        self.session_id = unscoped(tenant, &self.session_id);
        self
    }

    /// Why an open session must close at `now`, if it must: its TTL ran out, or it went
    /// unused for its idle time (`default_idle_ms` when it set none).
    pub fn lapsed(&self, now: u64, default_idle_ms: u64) -> Option<CloseReason> {
        if self.state == SessionState::Closed {
            return None;
        }
        if self.expires_at.is_some_and(|at| at <= now) {
            return Some(CloseReason::Ttl);
        }
        let idle = self.idle_ms.unwrap_or(default_idle_ms);
        let used = self.last_used_at.max(self.busy_until.unwrap_or(0));
        (used.saturating_add(idle) <= now).then_some(CloseReason::Idle)
    }

    /// What an execution of the session leaves out, the session fills in: its env (the
    /// request's own variables win), its timeout, and its template.
    pub fn apply_defaults(&self, req: &mut ExecRequest) {
        for (name, value) in &self.env {
            req.env.entry(name.clone()).or_insert_with(|| value.clone());
        }
        req.timeout_ms = req.timeout_ms.or(self.timeout_ms);
        if req.template.is_none() {
            req.template = self.template.clone();
        }
    }

    /// Whether an execution naming `asked` may run in the session: its container runs one
    /// image, so another template than the session's is refused (409) — the run would not
    /// get the image it named. A session opened without a template takes the one its first
    /// execution names when it is placed (it has no container yet, so nothing is lost).
    pub fn admits_template(&self, asked: Option<&str>) -> Result<(), crate::ErrorBody> {
        let adoptable = self.template.is_none() && self.state == SessionState::Open;
        if adoptable || asked == self.template.as_deref() {
            return Ok(());
        }
        let runs_in = match &self.template {
            Some(t) => format!("template {t}"),
            None => "the sandbox image (no template)".into(),
        };
        let asked = asked.map_or_else(|| "no template".into(), |t| format!("template {t}"));
        let id = &self.session_id;
        Err(crate::ErrorBody::conflict(format!(
            "session {id} runs in {runs_in}; this execution names {asked}: run it without a \
             template, or open another session for that template"
        ))
        .with_details(serde_json::json!({
            "field": "template",
            "session_template": self.template,
        })))
    }
}

/// `sessions.open`: an id may be supplied (idempotent), otherwise a ULID is assigned.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
    /// Env of every execution of the session; a request's own env wins. Checked like a
    /// request's (names, sizes, count).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// The timeout of an execution that names none; clamped by the ceilings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// The session closes itself this long after it opened (its container, AIO instance and
    /// browser go with it). At most [`SessionLifetime::max_ms`]; absent: no limit but idling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// The session closes itself when unused this long. At most [`SessionLifetime::max_ms`];
    /// absent: the scheduler's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_ms: Option<u64>,
    /// Directories hidden, writable or read-only in the session's container, added to its
    /// template's (`crate::filesystem`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filesystem: Option<FilesystemPolicy>,
}

/// How long sessions may live: the bound of `ttl_ms` and `idle_ms` (an operator's setting).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLifetime {
    pub max_ms: u64,
}

impl SessionOpen {
    /// Checks what the session would give every execution (env like a request's, the timeout
    /// clamped by the ceilings) and its lifetime: `ttl_ms` and `idle_ms` of 0 or beyond
    /// `lifetime` are refused, not clamped — a session that would live a different time than
    /// asked is a surprise for its caller.
    pub fn admit(
        &mut self,
        c: &Ceilings,
        lifetime: SessionLifetime,
    ) -> Result<(), ValidationError> {
        validate_env(&self.env, c)?;
        if let Some(filesystem) = &self.filesystem {
            filesystem.validate()?;
        }
        if let Some(asked) = self.timeout_ms {
            self.timeout_ms = Some(clamp_timeout(Some(asked), asked, c)?);
        }
        for (field, asked) in [("ttl_ms", self.ttl_ms), ("idle_ms", self.idle_ms)] {
            if asked.is_some_and(|ms| ms == 0 || ms > lifetime.max_ms) {
                return Err(ValidationError::invalid(
                    field,
                    format!("must be 1..={} milliseconds", lifetime.max_ms),
                ));
            }
        }
        Ok(())
    }
}

/// `sessions.ttl`: the session closes itself `ttl_ms` from now (a live session only; bounded
/// like `SessionOpen::ttl_ms`). Answered with the record as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionTtl {
    pub session_id: String,
    pub ttl_ms: u64,
}

impl SessionTtl {
    /// `ttl_ms` of 0 or beyond `lifetime` is refused, as when a session opens.
    pub fn admit(&self, lifetime: SessionLifetime) -> Result<(), ValidationError> {
        if self.ttl_ms == 0 || self.ttl_ms > lifetime.max_ms {
            return Err(ValidationError::invalid(
                "ttl_ms",
                format!("must be 1..={} milliseconds", lifetime.max_ms),
            ));
        }
        Ok(())
    }
}

/// `sessions.get` and `sessions.close`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionRef {
    pub session_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionList {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SessionListReply {
    pub sessions: Vec<SessionRecord>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::Ceilings;

    const LIFETIME: SessionLifetime = SessionLifetime { max_ms: 60_000 };

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn open_is_checked_like_a_request_and_its_lifetime_is_bounded() {
        let c = Ceilings::default();
        let mut ok = SessionOpen {
            env: env(&[("MODE", "fast")]),
            timeout_ms: Some(u64::MAX),
            ttl_ms: Some(60_000),
            idle_ms: Some(1),
            ..Default::default()
        };
        ok.admit(&c, LIFETIME).unwrap();
        assert_eq!(
            ok.timeout_ms,
            Some(c.max_timeout_ms),
            "clamped, not refused"
        );

        let too_many = (0..=c.max_env).map(|i| (format!("V{i}"), String::new()));
        let bad = [
            SessionOpen {
                env: env(&[("LD_PRELOAD", "/x.so")]),
                ..Default::default()
            },
            SessionOpen {
                env: env(&[("1X", "y")]),
                ..Default::default()
            },
            SessionOpen {
                env: env(&[("BIG", &"x".repeat(c.max_env_value_bytes + 1))]),
                ..Default::default()
            },
            SessionOpen {
                env: too_many.collect(),
                ..Default::default()
            },
            SessionOpen {
                timeout_ms: Some(0),
                ..Default::default()
            },
            SessionOpen {
                ttl_ms: Some(0),
                ..Default::default()
            },
            SessionOpen {
                ttl_ms: Some(60_001),
                ..Default::default()
            },
            SessionOpen {
                idle_ms: Some(u64::MAX),
                ..Default::default()
            },
        ];
        for mut open in bad {
            let before = open.clone();
            assert!(open.admit(&c, LIFETIME).is_err(), "accepted {before:?}");
        }
    }

    #[test]
    fn a_session_lapses_by_ttl_first_then_by_idling() {
        let r = SessionRecord {
            last_used_at: 1_000,
            expires_at: Some(5_000),
            ..Default::default()
        };
        assert_eq!(r.lapsed(1_500, 1_000), None);
        assert_eq!(r.lapsed(2_000, 1_000), Some(CloseReason::Idle));
        assert_eq!(r.lapsed(5_000, 1_000), Some(CloseReason::Ttl));
        let own_idle = SessionRecord {
            idle_ms: Some(10_000),
            ..r.clone()
        };
        assert_eq!(
            own_idle.lapsed(2_000, 1_000),
            None,
            "its own idle time wins"
        );
        let running = SessionRecord {
            busy_until: Some(4_000),
            ..r.clone()
        };
        assert_eq!(
            running.lapsed(4_999, 1_000),
            None,
            "not idle while a run may go on"
        );
        assert_eq!(running.lapsed(5_000, 1_000), Some(CloseReason::Ttl));
        let closed = SessionRecord {
            state: SessionState::Closed,
            ..r
        };
        assert_eq!(closed.lapsed(u64::MAX, 0), None);
    }

    #[test]
    fn the_request_wins_over_the_session() {
        let r = SessionRecord {
            env: env(&[("A", "session"), ("B", "session")]),
            timeout_ms: Some(9_000),
            template: Some("python-data".into()),
            ..Default::default()
        };
        let mut req = ExecRequest {
            env: env(&[("A", "request")]),
            ..Default::default()
        };
        r.apply_defaults(&mut req);
        assert_eq!(req.env, env(&[("A", "request"), ("B", "session")]));
        assert_eq!(req.timeout_ms, Some(9_000));
        assert_eq!(req.template.as_deref(), Some("python-data"));
        let mut own = ExecRequest {
            timeout_ms: Some(1),
            ..Default::default()
        };
        r.apply_defaults(&mut own);
        assert_eq!(own.timeout_ms, Some(1));
    }

    #[test]
    fn another_template_than_the_sessions_is_a_conflict() {
        let r = SessionRecord {
            session_id: "s1".into(),
            state: SessionState::Active,
            template: Some("python-data".into()),
            ..Default::default()
        };
        assert!(r.admits_template(Some("python-data")).is_ok());
        let e = r.admits_template(Some("node-default")).unwrap_err();
        assert_eq!(e.kind, crate::ErrorKind::Conflict);
        assert!(e.message.contains("template python-data"), "{e:?}");
        assert!(r.admits_template(None).is_err());
        let placed_plain = SessionRecord {
            state: SessionState::Active,
            ..Default::default()
        };
        assert!(placed_plain.admits_template(None).is_ok());
        assert!(placed_plain.admits_template(Some("python-data")).is_err());
        let unplaced_plain = SessionRecord::default();
        assert!(
            unplaced_plain.admits_template(Some("python-data")).is_ok(),
            "adopted when placed"
        );
    }
}
