//! Internal: what the scheduler sends an executor. Clients have no permission on these subjects.

use serde::{Deserialize, Serialize};

use crate::exec::{ExecRequest, Tier};
use crate::filesystem::FilesystemPolicy;
use crate::network::NetworkPolicy;
use crate::template::RunTemplate;
use crate::tenancy::{unscoped, Tenant};
use crate::validate::{validate_id, ValidationError};
use crate::Subjects;

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
        let scoped_by_tenant = |field: &str, id: &str| {
            let own = match tenant {
                Some(t) => id
                    .strip_prefix(t.as_str())
                    .and_then(|rest| rest.strip_prefix('-'))
                    .ok_or_else(|| {
                        ValidationError::invalid(field, format!("is not scoped by tenant {t}"))
                    })?,
                // An internal caller's run: a client id, or one it scoped itself.
                None => return crate::tenancy::validate_scoped_id(field, id),
            };
            validate_id(field, own)
        };
        scoped_by_tenant("execution_id", &self.execution_id)?;
        if let Some(session) = &self.request.session_id {
            scoped_by_tenant("session_id", session)?;
        }
        Ok(())
    }

    /// Where its output chunks go: the tenant's subject, under the id the client knows.
    pub fn output_subject(&self, subjects: &Subjects) -> String {
        let tenant = self.tenant.as_ref();
        subjects.output(tenant, &unscoped(tenant, &self.execution_id))
    }
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
}
