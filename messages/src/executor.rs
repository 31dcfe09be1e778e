//! Internal: what the scheduler sends an executor. Clients have no permission on these subjects.

use serde::{Deserialize, Serialize};

use crate::exec::{ExecRequest, ExecResult, Tier};
use crate::filesystem::FilesystemPolicy;
use crate::network::NetworkPolicy;
use crate::template::RunTemplate;
use crate::tenancy::{unscoped, Tenant};
use crate::validate::{validate_id, ValidationError};
use crate::{ErrorBody, Subjects};

/// `executor.docker.run` (any node, tier `ephemeral`) or `executor.docker.<node>.run` (the
/// node holding the session's container). Limits and timeout in `request` are already
/// validated and clamped by the scheduler; the executor clamps again to its own ceilings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutorRun {
    pub execution_id: String,
    pub tier: Tier,
    pub request: ExecRequest,
    /// Set when the session's previous node was lost: the executor restores the workspace
    /// into a fresh container and the result says process state was lost.
    #[serde(default)]
    pub session_restored: bool,
    /// Which container runs it.
    #[serde(default)]
    pub kind: RunKind,
    /// The effective egress policy (the request's or the session's, validated and clamped by
    /// the scheduler). Set only for `Isolated` and `Session` runs: a pooled warm container
    /// has no egress socket. Absent: no network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkPolicy>,
    /// The tenant it runs for: ids in this run are scoped by it (`crate::tenancy`), and its
    /// output chunks go to the tenant's own subject.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<Tenant>,
    /// The template it runs in, resolved by the scheduler; the executor runs it in that
    /// template's image (built on first use). Absent: the node's own sandbox image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<RunTemplate>,
    /// The filesystem policy of its template and session (validated by the scheduler),
    /// enforced by the sandbox's mounts. A run with one never takes a warm container (made
    /// without it). Absent: the sandbox's usual layout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filesystem: Option<FilesystemPolicy>,
}

impl ExecutorRun {
    /// The one check of a run's ids, the same on every backend: the scheduler scoped them by
    /// the run's tenant (`acme-` + the client's id), so what follows the tenant's prefix must
    /// be a valid client id — the protocol's 64 characters hold on every path.
    pub fn validate_ids(&self) -> Result<(), ValidationError> {
        let tenant = self.tenant.as_ref();
        validate_run_id(tenant, "execution_id", &self.execution_id)?;
        if let Some(session) = &self.request.session_id {
            validate_run_id(tenant, "session_id", session)?;
        }
        Ok(())
    }

    /// Where its output chunks go: the tenant's subject, under the id the client knows.
    pub fn output_subject(&self, subjects: &Subjects) -> String {
        let tenant = self.tenant.as_ref();
        subjects.output(tenant, &unscoped(tenant, &self.execution_id))
    }
}

/// An id of a run for `tenant`: scoped by it (what follows `<tenant>-` a valid client id), or
/// for an internal caller's run (no tenant) a client id or one it scoped itself.
fn validate_run_id(tenant: Option<&Tenant>, field: &str, id: &str) -> Result<(), ValidationError> {
    let Some(t) = tenant else {
        return crate::tenancy::validate_scoped_id(field, id);
    };
    let own = id
        .strip_prefix(t.as_str())
        .and_then(|rest| rest.strip_prefix('-'))
        .ok_or_else(|| ValidationError::invalid(field, format!("is not scoped by tenant {t}")))?;
    validate_id(field, own)
}

/// `executor.<backend>.<node>.status`: "what happened to this execution?" — asked by the
/// scheduler when a run's reply did not come (lost in a NATS failover, or the node's heartbeat
/// lapsed while it ran), before it calls the run lost. The id and tenant are the run's, so a
/// run of another tenant with the same client id is a different execution.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecutorStatusQuery {
    pub execution_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<Tenant>,
}

impl ExecutorStatusQuery {
    /// The query for `run`.
    pub fn of(run: &ExecutorRun) -> Self {
        Self {
            execution_id: run.execution_id.clone(),
            tenant: run.tenant.clone(),
        }
    }

    /// The same id rule as the run's.
    pub fn validate(&self) -> Result<(), ValidationError> {
        validate_run_id(self.tenant.as_ref(), "execution_id", &self.execution_id)
    }
}

/// Where an execution stands on the node that was asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// The node has no record of it: it never reached the node (or ended longer ago than the
    /// node keeps results, `SANDMESH_EXEC_RESULT_KEEP_MS`). Nothing of it runs there.
    Unknown,
    /// It runs now; a run request with the same id attaches to it instead of running it again.
    Running,
    /// It ended; the answer it gave is in `result` or `error`.
    Finished,
    /// It ended, but its answer was dropped to stay within the node's memory bound. It must
    /// not run again, and its output is gone.
    Forgotten,
}

/// The reply to an [`ExecutorStatusQuery`]. `state` has no default: a reply that does not say
/// where the run stands must not read as `unknown` (which makes the scheduler run it again).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutorRunStatus {
    pub state: RunState,
    /// `Finished` with a result: the one the run answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Box<ExecResult>>,
    /// `Finished` with an error: the error the run answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}

/// How an executor node isolates code (advertised in its heartbeat's `backends`).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// Hardened Docker containers (every tier the executor runs).
    #[default]
    Docker,
    /// A fresh bubblewrap sandbox per execution: single-use ephemeral runs only.
    Bwrap,
}

impl Backend {
    pub const ALL: [Backend; 2] = [Backend::Docker, Backend::Bwrap];

    pub const fn as_str(self) -> &'static str {
        match self {
            Backend::Docker => "docker",
            Backend::Bwrap => "bwrap",
        }
    }
}

/// The container an [`ExecutorRun`] gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunKind {
    /// A pre-warmed single-use container (tier `ephemeral`); workspace files of the request's
    /// session, if any, travel with the run.
    #[default]
    Pooled,
    /// A fresh single-use container made for this run alone, with no workspace at all: strict
    /// isolation for code that has no session (nothing survives it).
    Isolated,
    /// The session's own long-lived container (`request.session_id` is set).
    Session,
}

/// `executor.docker.<node>.close`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecutorClose {
    pub session_id: String,
}

/// `executor.docker.<node>.drain`: stop taking new work, finish what runs, close sessions.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ExecutorDrain {}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(tenant: Option<&str>, execution_id: String, session: Option<String>) -> ExecutorRun {
        ExecutorRun {
            execution_id,
            tier: Tier::Ephemeral,
            request: ExecRequest {
                session_id: session,
                ..Default::default()
            },
            session_restored: false,
            kind: RunKind::default(),
            network: None,
            tenant: tenant.map(|t| Tenant::new(t).unwrap()),
            template: None,
            filesystem: None,
        }
    }

    #[test]
    fn the_protocols_longest_id_is_valid_after_scoping_by_the_longest_tenant() {
        let tenant = "a".repeat(crate::tenancy::MAX_TENANT_LEN);
        let longest = "x".repeat(crate::validate::MAX_ID_LEN);
        let scoped = format!("{tenant}-{longest}");
        let ok = run(Some(&tenant), scoped.clone(), Some(scoped.clone()));
        assert_eq!(ok.validate_ids(), Ok(()));
        let too_long = run(Some(&tenant), format!("{scoped}x"), None);
        assert!(too_long.validate_ids().is_err());
        // An id scoped by another tenant is not this run's.
        let foreign = run(Some("acme"), format!("beta-{longest}"), None);
        assert!(foreign.validate_ids().is_err());
        let internal = run(None, longest, None);
        assert_eq!(internal.validate_ids(), Ok(()));
    }

    #[test]
    fn a_status_query_takes_the_runs_id_rule_and_old_payloads_decode() {
        let mut q = ExecutorStatusQuery::of(&run(Some("acme"), "acme-x1".into(), None));
        assert_eq!(q.validate(), Ok(()));
        q.execution_id = "beta-x1".into();
        assert!(q.validate().is_err(), "another tenant's id");
        q.execution_id = "acme-a b".into();
        assert!(q.validate().is_err());
        // A query without a tenant, and a reply with only a state, as an older peer sends.
        let q: ExecutorStatusQuery = serde_json::from_str(r#"{"execution_id":"x1"}"#).unwrap();
        assert_eq!((q.validate(), q.tenant), (Ok(()), None));
        let s: ExecutorRunStatus = serde_json::from_str(r#"{"state":"running"}"#).unwrap();
        assert_eq!(
            (s.state, s.result, s.error),
            (RunState::Running, None, None)
        );
        assert!(serde_json::from_str::<ExecutorRunStatus>("{}").is_err());
    }
}
