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
///
/// On the wire a run's tier, container and session are three fields (`tier`, `kind`,
/// `request.session_id`); here they are one [`RunKind`], and a payload whose three disagree
/// does not decode ([`RunShapeError`]). `kind` and `request` are private so the request's
/// session is always the kind's.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "wire::Run")]
pub struct ExecutorRun {
    pub execution_id: String,
    kind: RunKind,
    request: ExecRequest,
    /// Set when the session's previous node was lost: the executor restores the workspace
    /// into a fresh container and the result says process state was lost.
    pub session_restored: bool,
    /// The effective egress policy (the request's or the session's, validated and clamped by
    /// the scheduler). Set only for `Isolated` and `Session` runs: a pooled warm container
    /// has no egress socket. Absent: no network.
    pub network: Option<NetworkPolicy>,
    /// The tenant it runs for: ids in this run are scoped by it (`crate::tenancy`), and its
    /// output chunks go to the tenant's own subject.
    pub tenant: Option<Tenant>,
    /// The template it runs in, resolved by the scheduler; the executor runs it in that
    /// template's image (built on first use). Absent: the node's own sandbox image.
    pub template: Option<RunTemplate>,
    /// The filesystem policy of its template and session (validated by the scheduler),
    /// enforced by the sandbox's mounts. A run with one never takes a warm container (made
    /// without it). Absent: the sandbox's usual layout.
    pub filesystem: Option<FilesystemPolicy>,
}

impl ExecutorRun {
    /// A run of `request` in a container of `kind`, with no network, tenant, template or
    /// filesystem policy (set those after). Refused when the request names another session
    /// than the kind (or one where the kind has none).
    pub fn new(
        execution_id: String,
        request: ExecRequest,
        kind: RunKind,
    ) -> Result<Self, RunShapeError> {
        if request.session_id.as_deref() != kind.session_id() {
            return Err(RunShapeError::SessionMismatch {
                request: request.session_id,
                kind: kind.session_id().map(Into::into),
            });
        }
        Ok(Self {
            execution_id,
            kind,
            request,
            session_restored: false,
            network: None,
            tenant: None,
            template: None,
            filesystem: None,
        })
    }

    pub fn kind(&self) -> &RunKind {
        &self.kind
    }

    /// The tier its result reports, implied by its kind.
    pub fn tier(&self) -> Tier {
        self.kind.tier()
    }

    /// The session it runs in (only a `Session` run has one).
    pub fn session_id(&self) -> Option<&str> {
        self.kind.session_id()
    }

    pub fn request(&self) -> &ExecRequest {
        &self.request
    }

    /// Changes the request in place; its session stays the kind's whatever `edit` does (a
    /// run moves to another session only as a new run).
    pub fn edit_request(&mut self, edit: impl FnOnce(&mut ExecRequest)) {
        edit(&mut self.request);
        self.request.session_id = self.kind.session_id().map(Into::into);
    }

    /// The one check of a run's ids, the same on every backend: the scheduler scoped them by
    /// the run's tenant (`acme-` + the client's id), so what follows the tenant's prefix must
    /// be a valid client id — the protocol's 64 characters hold on every path.
    pub fn validate_ids(&self) -> Result<(), ValidationError> {
        let tenant = self.tenant.as_ref();
        validate_run_id(tenant, "execution_id", &self.execution_id)?;
        if let Some(session) = self.session_id() {
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
#[serde(deny_unknown_fields)]
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

    /// The service whose nodes offer it.
    pub const fn service(self) -> crate::ServiceName {
        match self {
            Backend::Docker => crate::ServiceName::DockerExecutor,
            Backend::Bwrap => crate::ServiceName::BwrapExecutor,
        }
    }
}

/// The container an [`ExecutorRun`] gets, which implies its tier and whether it has a
/// session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunKind {
    /// A pre-warmed single-use container; tier `ephemeral`, no session.
    Pooled,
    /// A fresh single-use container made for this run alone, with no workspace at all (nothing
    /// survives it). `session_grade`: tier `session`, the isolation asked of code that has no
    /// session (strict mode's answer to non-SAFE code, or a client asking tier `session`);
    /// otherwise tier `ephemeral`, a run whose network or filesystem policy needs a container
    /// of its own.
    Isolated { session_grade: bool },
    /// The session's own long-lived container; tier `session`.
    Session { session_id: String },
}

impl RunKind {
    pub fn tier(&self) -> Tier {
        match self {
            RunKind::Pooled
            | RunKind::Isolated {
                session_grade: false,
            } => Tier::Ephemeral,
            RunKind::Isolated {
                session_grade: true,
            }
            | RunKind::Session { .. } => Tier::Session,
        }
    }

    pub fn session_id(&self) -> Option<&str> {
        match self {
            RunKind::Session { session_id } => Some(session_id),
            RunKind::Pooled | RunKind::Isolated { .. } => None,
        }
    }

    /// The kind a payload's three fields name, if they agree.
    fn from_wire(
        tier: Tier,
        kind: wire::Kind,
        session_id: Option<&str>,
    ) -> Result<Self, RunShapeError> {
        Ok(match (tier, kind, session_id) {
            (Tier::Ephemeral, wire::Kind::Pooled, None) => RunKind::Pooled,
            (Tier::Ephemeral, wire::Kind::Isolated, None) => RunKind::Isolated {
                session_grade: false,
            },
            (Tier::Session, wire::Kind::Isolated, None) => RunKind::Isolated {
                session_grade: true,
            },
            (Tier::Session, wire::Kind::Session, Some(id)) => RunKind::Session {
                session_id: id.into(),
            },
            (tier, kind, session) => {
                return Err(RunShapeError::Contradiction {
                    tier,
                    kind,
                    has_session: session.is_some(),
                })
            }
        })
    }

    fn wire_kind(&self) -> wire::Kind {
        match self {
            RunKind::Pooled => wire::Kind::Pooled,
            RunKind::Isolated { .. } => wire::Kind::Isolated,
            RunKind::Session { .. } => wire::Kind::Session,
        }
    }
}

/// Why a run's tier, kind and session do not make a run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunShapeError {
    #[error(
        "tier {} with run kind {} and {}: a run is pooled (tier ephemeral), isolated (tier \
         ephemeral or session) or a session's (tier session), and only a session's names a \
         session_id",
        tier.as_str(),
        kind.as_str(),
        if *has_session { "a session_id" } else { "no session_id" }
    )]
    Contradiction {
        tier: Tier,
        kind: wire::Kind,
        has_session: bool,
    },
    #[error("the request's session_id {request:?} is not the run's session {kind:?}")]
    SessionMismatch {
        request: Option<String>,
        kind: Option<String>,
    },
}

/// The wire form of a run: three fields where [`ExecutorRun`] has one [`RunKind`].
pub mod wire {
    use serde::{Deserialize, Serialize};

    use super::{ExecutorRun, RunKind, RunShapeError};
    use crate::exec::{ExecRequest, Tier};
    use crate::filesystem::FilesystemPolicy;
    use crate::network::NetworkPolicy;
    use crate::template::RunTemplate;
    use crate::tenancy::Tenant;

    /// The `kind` field.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "snake_case")]
    pub enum Kind {
        Pooled,
        Isolated,
        Session,
    }

    impl Kind {
        pub const fn as_str(self) -> &'static str {
            match self {
                Kind::Pooled => "pooled",
                Kind::Isolated => "isolated",
                Kind::Session => "session",
            }
        }
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct Run {
        execution_id: String,
        tier: Tier,
        request: ExecRequest,
        #[serde(default)]
        session_restored: bool,
        kind: Kind,
        #[serde(default)]
        network: Option<NetworkPolicy>,
        #[serde(default)]
        tenant: Option<Tenant>,
        #[serde(default)]
        template: Option<RunTemplate>,
        #[serde(default)]
        filesystem: Option<FilesystemPolicy>,
    }

    impl TryFrom<Run> for ExecutorRun {
        type Error = RunShapeError;

        fn try_from(w: Run) -> Result<Self, RunShapeError> {
            let kind = RunKind::from_wire(w.tier, w.kind, w.request.session_id.as_deref())?;
            let mut run = ExecutorRun::new(w.execution_id, w.request, kind)?;
            run.session_restored = w.session_restored;
            run.network = w.network;
            run.tenant = w.tenant;
            run.template = w.template;
            run.filesystem = w.filesystem;
            Ok(run)
        }
    }

    /// Borrows the run, so encoding copies no code or files.
    #[derive(Serialize)]
    pub(super) struct RunRef<'a> {
        execution_id: &'a str,
        tier: Tier,
        request: &'a ExecRequest,
        session_restored: bool,
        kind: Kind,
        #[serde(skip_serializing_if = "Option::is_none")]
        network: Option<&'a NetworkPolicy>,
        #[serde(skip_serializing_if = "Option::is_none")]
        tenant: Option<&'a Tenant>,
        #[serde(skip_serializing_if = "Option::is_none")]
        template: Option<&'a RunTemplate>,
        #[serde(skip_serializing_if = "Option::is_none")]
        filesystem: Option<&'a FilesystemPolicy>,
    }

    impl<'a> From<&'a ExecutorRun> for RunRef<'a> {
        fn from(r: &'a ExecutorRun) -> Self {
            Self {
                execution_id: &r.execution_id,
                tier: r.tier(),
                request: &r.request,
                session_restored: r.session_restored,
                kind: r.kind.wire_kind(),
                network: r.network.as_ref(),
                tenant: r.tenant.as_ref(),
                template: r.template.as_ref(),
                filesystem: r.filesystem.as_ref(),
            }
        }
    }
}

impl Serialize for ExecutorRun {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        wire::RunRef::from(self).serialize(s)
    }
}

/// `executor.docker.<node>.close`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutorClose {
    pub session_id: String,
}

/// `executor.docker.<node>.drain`: stop taking new work, finish what runs, close sessions.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutorDrain {}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(tenant: Option<&str>, execution_id: String, session: Option<String>) -> ExecutorRun {
        let request = ExecRequest {
            session_id: session.clone(),
            ..Default::default()
        };
        let kind = match session {
            Some(session_id) => RunKind::Session { session_id },
            None => RunKind::Pooled,
        };
        let mut run = ExecutorRun::new(execution_id, request, kind).unwrap();
        run.tenant = tenant.map(|t| Tenant::new(t).unwrap());
        run
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

    /// A run's payload with its three shape fields set.
    fn payload(tier: &str, kind: Option<&str>, session: Option<&str>) -> serde_json::Value {
        let mut request = serde_json::json!({"language": "python", "code": "print(1)"});
        if let Some(s) = session {
            request["session_id"] = s.into();
        }
        let mut run = serde_json::json!({"execution_id": "e1", "tier": tier, "request": request});
        if let Some(k) = kind {
            run["kind"] = k.into();
        }
        run
    }

    #[test]
    fn only_the_four_shapes_of_a_run_decode() {
        let decode = |v: serde_json::Value| serde_json::from_value::<ExecutorRun>(v);
        let shapes = [
            (("ephemeral", "pooled", None), RunKind::Pooled),
            (
                ("ephemeral", "isolated", None),
                RunKind::Isolated {
                    session_grade: false,
                },
            ),
            (
                ("session", "isolated", None),
                RunKind::Isolated {
                    session_grade: true,
                },
            ),
            (
                ("session", "session", Some("s1")),
                RunKind::Session {
                    session_id: "s1".into(),
                },
            ),
        ];
        for ((tier, kind, session), expected) in shapes {
            let run = decode(payload(tier, Some(kind), session)).unwrap();
            assert_eq!(run.kind(), &expected);
            assert_eq!(run.tier().as_str(), tier);
            assert_eq!(run.request().session_id.as_deref(), session);
        }
        // Every other combination is a contradiction, including a session's run in a pooled
        // container (what was sent before run kinds existed) and tiers no executor runs.
        for (tier, kind, session) in [
            ("session", "pooled", Some("s1")),
            ("ephemeral", "pooled", Some("s1")),
            ("ephemeral", "session", Some("s1")),
            ("session", "session", None),
            ("ephemeral", "isolated", Some("s1")),
            ("session", "isolated", Some("s1")),
            ("aio", "pooled", None),
            ("reject", "isolated", None),
        ] {
            let v = payload(tier, Some(kind), session);
            assert!(decode(v.clone()).is_err(), "{v}");
            let wire: wire::Run = serde_json::from_value(v).unwrap();
            let e = ExecutorRun::try_from(wire).unwrap_err();
            assert!(matches!(e, RunShapeError::Contradiction { .. }), "{e:?}");
        }
        // The kind is required: no default stands in for a payload that omits it.
        assert!(decode(payload("ephemeral", None, None)).is_err());
        assert!(decode(payload("ephemeral", Some("warm"), None)).is_err());
    }

    #[test]
    fn a_contradiction_is_refused_as_a_malformed_payload() {
        let bytes = serde_json::to_vec(&payload("session", Some("pooled"), Some("s1"))).unwrap();
        let e = crate::Encoding::Json
            .decode::<ExecutorRun>(&bytes)
            .unwrap_err();
        assert!(
            matches!(e, crate::codec::CodecError::Malformed { .. }),
            "{e:?}"
        );
        assert_eq!(ErrorBody::from(e).code, 400);
        let mut bytes = Vec::new();
        let hostile = payload("ephemeral", Some("session"), Some("s1"));
        rmp_serde::encode::write_named(&mut bytes, &hostile).unwrap();
        assert!(crate::Encoding::MsgPack
            .decode::<ExecutorRun>(&bytes)
            .is_err());
    }

    #[test]
    fn a_runs_session_is_its_kinds() {
        let request = ExecRequest {
            session_id: Some("s1".into()),
            ..Default::default()
        };
        for kind in [
            RunKind::Pooled,
            RunKind::Session {
                session_id: "s2".into(),
            },
        ] {
            let e = ExecutorRun::new("e1".into(), request.clone(), kind).unwrap_err();
            assert!(matches!(e, RunShapeError::SessionMismatch { .. }), "{e:?}");
        }
        let session = RunKind::Session {
            session_id: "s1".into(),
        };
        let mut run = ExecutorRun::new("e1".into(), request, session).unwrap();
        run.edit_request(|r| {
            r.code = "print(2)".into();
            r.session_id = None;
        });
        assert_eq!(run.request().code, "print(2)");
        assert_eq!(run.request().session_id.as_deref(), Some("s1"));
        assert_eq!(run.session_id(), Some("s1"));
    }
}
