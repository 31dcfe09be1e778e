//! Every subject of the mesh, built from one configurable prefix. Services never write a subject
//! string themselves: they call these functions, so a renamed subject changes in one place.

use crate::tenancy::{tenant_token, Tenant};

/// The protocol version, carried in every subject.
use crate::executor::Backend;

pub const VERSION: &str = "v1";
pub const DEFAULT_PREFIX: &str = "sandbox";

/// The subjects of one mesh (one prefix). Cheap to clone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subjects {
    prefix: String,
}

impl Default for Subjects {
    fn default() -> Self {
        Self {
            prefix: DEFAULT_PREFIX.to_string(),
        }
    }
}

/// Is `token` usable as one subject token (no dots, wildcards or whitespace)?
pub fn is_valid_token(token: &str) -> bool {
    !token.is_empty()
        && token.len() <= 256
        && token
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

impl Subjects {
    /// A prefix is one or more dot-separated tokens of `[A-Za-z0-9_-]`.
    pub fn new(prefix: impl Into<String>) -> Result<Self, String> {
        let prefix = prefix.into();
        if prefix.split('.').all(is_valid_token) {
            Ok(Self { prefix })
        } else {
            Err(format!(
                "invalid subject prefix {prefix:?}: use tokens of [A-Za-z0-9_-] joined by '.'"
            ))
        }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `<prefix>.v1`, the group every service endpoint hangs under.
    pub fn api(&self) -> String {
        format!("{}.{VERSION}", self.prefix)
    }

    fn at(&self, rest: &str) -> String {
        format!("{}.{VERSION}.{rest}", self.prefix)
    }

    /// `<prefix>.v1.<rest>` for subject *patterns* (permissions, exports, imports), which name
    /// groups of the subjects below with wildcards.
    pub fn pattern(&self, rest: &str) -> String {
        self.at(rest)
    }

    /// Upper-case stem for JetStream stream names: `sandbox` → `SANDBOX`.
    pub fn stream_stem(&self) -> String {
        self.prefix.replace(['.', '-'], "_").to_ascii_uppercase()
    }

    /// Lower-case stem for KV and object-store buckets: `sandbox` → `sandbox`.
    pub fn bucket_stem(&self) -> String {
        self.prefix.replace(['.', '-'], "_").to_ascii_lowercase()
    }

    // === scheduler ===
    pub fn exec(&self) -> String {
        self.at("exec")
    }
    /// Test-driven execution: code and tests in, per-test results out (`crate::testrun`).
    pub fn test(&self) -> String {
        self.at("test")
    }
    pub fn jobs_exec(&self) -> String {
        self.at("jobs.exec")
    }
    pub fn jobs_all(&self) -> String {
        self.at("jobs.>")
    }
    pub fn result(&self, execution_id: &str) -> String {
        self.at(&format!("results.{execution_id}"))
    }
    /// Every stored result: the subjects bound to the results stream.
    pub fn results_all(&self) -> String {
        self.at("results.*")
    }
    /// Looks a result up by id. Deliberately *not* `results.get`: the results stream binds
    /// `results.*`, so a request published there would be captured (and acked) by JetStream.
    pub fn results_get(&self) -> String {
        self.at("exec.result")
    }
    /// Output chunks of one execution of `tenant`. A tenant imports only its own
    /// `output.<tenant>.>`, so the token is the boundary.
    pub fn output(&self, tenant: Option<&Tenant>, execution_id: &str) -> String {
        self.at(&format!("output.{}.{execution_id}", tenant_token(tenant)))
    }
    /// What a client subscribes to for one execution's chunks: it sees only its own tenant's.
    pub fn output_any(&self, execution_id: &str) -> String {
        self.at(&format!("output.*.{execution_id}"))
    }
    /// Every tenant's output chunks (the export).
    pub fn output_all(&self) -> String {
        self.at("output.>")
    }
    /// Async jobs of `tenant`: a tenant publishes to [`Self::jobs_exec`] in its own account and
    /// its import maps that here, so the scheduler learns the tenant from the subject, which the
    /// server guarantees (the job stream keeps no `Nats-Request-Info`).
    pub fn jobs_exec_of(&self, tenant: &Tenant) -> String {
        self.at(&format!("jobs.{tenant}.exec"))
    }
    /// The tenant a job subject names (`None`: published inside the services' account).
    pub fn tenant_of_job(&self, subject: &str) -> Result<Option<Tenant>, String> {
        if subject == self.jobs_exec() {
            return Ok(None);
        }
        let rest = subject
            .strip_prefix(&self.at("jobs."))
            .and_then(|r| r.strip_suffix(".exec"))
            .ok_or_else(|| format!("{subject:?} is not a job subject"))?;
        Tenant::new(rest).map(Some).map_err(|e| e.to_string())
    }
    /// `ports.<op>`: preview ports of a session (the scheduler).
    pub fn ports(&self, op: PortsOp) -> String {
        self.at(&format!("ports.{}", op.as_str()))
    }
    /// What a tunnel's client sends (bytes, credit) to the node holding the container. The
    /// tenant is in the subject, where the server's export binds it: a tenant can publish only
    /// into its own tunnels.
    pub fn tunnel_up(&self, tenant: Option<&Tenant>, tunnel_id: &str) -> String {
        self.at(&format!("tunnel.{}.{tunnel_id}", tenant_token(tenant)))
    }
    /// Every tenant's tunnel up subjects (the export).
    pub fn tunnel_up_all(&self) -> String {
        self.at("tunnel.*.*")
    }
    /// What the node sends a tunnel's client: one of the tenant's output subjects, so it
    /// reaches that tenant alone through the export every tenant already has.
    pub fn tunnel_down(&self, tenant: Option<&Tenant>, tunnel_id: &str) -> String {
        self.at(&format!(
            "output.{}.tunnel.{tunnel_id}",
            tenant_token(tenant)
        ))
    }
    /// What a tunnel's client subscribes to: it sees only its own tenant's.
    pub fn tunnel_down_any(&self, tunnel_id: &str) -> String {
        self.at(&format!("output.*.tunnel.{tunnel_id}"))
    }
    /// A docker node's order to open a tunnel into one of its session containers.
    pub fn executor_tunnel(&self, node_id: &str) -> String {
        self.at(&format!("executor.docker.{node_id}.tunnel"))
    }
    pub fn sessions(&self, op: SessionOp) -> String {
        self.at(&format!("sessions.{}", op.as_str()))
    }
    /// A session's background processes (`crate::proc`); their live output goes to
    /// [`Self::output`] under the process's id.
    pub fn proc(&self, op: ProcOp) -> String {
        self.at(&format!("proc.{}", op.as_str()))
    }

    // === risk-assessor ===
    pub fn risk_assess(&self) -> String {
        self.at("risk.assess")
    }

    // === confirmation ===
    pub fn confirm(&self, op: ConfirmOp) -> String {
        self.at(&format!("confirm.{}", op.as_str()))
    }
    pub fn confirm_pending(&self, tenant: Option<&Tenant>, id: &str) -> String {
        self.at(&format!("confirm.pending.{}.{id}", tenant_token(tenant)))
    }
    pub fn confirm_decided(&self, tenant: Option<&Tenant>, id: &str) -> String {
        self.at(&format!("confirm.decided.{}.{id}", tenant_token(tenant)))
    }
    /// The decision on one confirmation, whichever tenant it belongs to.
    pub fn confirm_decided_any(&self, id: &str) -> String {
        self.at(&format!("confirm.decided.*.{id}"))
    }
    /// Every decision (the schedulers resume parked executions on these).
    pub fn confirm_decided_all(&self) -> String {
        self.at("confirm.decided.*.*")
    }
    /// Every pending and decided event of every tenant.
    pub fn confirm_events_all(&self) -> String {
        self.at("confirm.*.*.*")
    }
    /// Pending and decided events of one tenant (`_`: internal requests).
    pub fn confirm_events_of(&self, tenant: Option<&Tenant>) -> String {
        self.at(&format!("confirm.*.{}.*", tenant_token(tenant)))
    }
    /// The confirmation id and tenant token of a pending/decided event subject.
    pub fn parse_confirm_event<'s>(&self, subject: &'s str) -> Option<(&'s str, &'s str)> {
        let rest = subject.strip_prefix(&self.at("confirm."))?;
        let mut parts = rest.split('.');
        let (_kind, tenant, id) = (parts.next()?, parts.next()?, parts.next()?);
        parts.next().is_none().then_some((tenant, id))
    }

    // === workspace-store ===
    pub fn workspace(&self, op: WorkspaceOp) -> String {
        self.at(&format!("workspace.{}", op.as_str()))
    }

    // === templates ===
    pub fn templates(&self, op: TemplateOp) -> String {
        self.at(&format!("templates.{}", op.as_str()))
    }

    // === browser-router / aio-pool ===
    pub fn browser(&self, action: &str) -> String {
        self.at(&format!("browser.{action}"))
    }
    /// `aio.{acquire,release,exec,stats}`, what agents call. `aio.exec` is the scheduler's:
    /// an agent's command passes risk assessment and confirmation like any `exec`.
    pub fn aio(&self, op: &str) -> String {
        self.at(&format!("aio.{op}"))
    }

    // === audit ===
    /// One audit event of `tenant` (`_`: the event belongs to no tenant).
    pub fn audit(&self, tenant: Option<&Tenant>, event: &str) -> String {
        self.at(&format!("audit.{}.{event}", tenant_token(tenant)))
    }
    /// Every event of one kind, any tenant the reader can see.
    pub fn audit_kind(&self, event: &str) -> String {
        self.at(&format!("audit.*.{event}"))
    }
    /// One tenant's events.
    pub fn audit_of(&self, tenant: Option<&Tenant>) -> String {
        self.at(&format!("audit.{}.*", tenant_token(tenant)))
    }
    pub fn audit_all(&self) -> String {
        self.at("audit.>")
    }

    // === internal: executors ===
    /// Queue group subject: any docker executor takes it.
    pub fn executor_run(&self) -> String {
        self.executor_run_on(Backend::Docker)
    }
    /// One executor node's own subject.
    pub fn executor_node(&self, node_id: &str, op: ExecutorOp) -> String {
        self.executor_node_on(Backend::Docker, node_id, op)
    }
    /// Queue group subject of one backend's executors: `executor.<backend>.run`.
    pub fn executor_run_on(&self, backend: Backend) -> String {
        self.at(&format!("executor.{}.run", backend.as_str()))
    }
    /// One node of one backend: `executor.<backend>.<node_id>.<op>`.
    pub fn executor_node_on(&self, backend: Backend, node_id: &str, op: ExecutorOp) -> String {
        self.at(&format!(
            "executor.{}.{node_id}.{}",
            backend.as_str(),
            op.as_str()
        ))
    }
    /// The group under which one node serves its own endpoints.
    pub fn executor_node_group(&self, node_id: &str) -> String {
        self.at(&format!("executor.docker.{node_id}"))
    }
    /// The aio-pool's own exec: a command in an instance, for the scheduler once it has
    /// assessed (and, when asked, confirmed) it. Tenants have no import of it.
    pub fn aio_instance_exec(&self) -> String {
        self.at("executor.aio.exec")
    }
    pub fn executor_all(&self) -> String {
        self.at("executor.>")
    }

    // === JetStream asset names ===
    pub fn jobs_stream(&self) -> String {
        format!("{}_JOBS", self.stream_stem())
    }
    pub fn results_stream(&self) -> String {
        format!("{}_RESULTS", self.stream_stem())
    }
    pub fn audit_stream(&self) -> String {
        format!("{}_AUDIT", self.stream_stem())
    }
    pub fn nodes_bucket(&self) -> String {
        format!("{}_nodes", self.bucket_stem())
    }
    pub fn sessions_bucket(&self) -> String {
        format!("{}_sessions", self.bucket_stem())
    }
    /// Templates by name (the templates service owns it).
    pub fn templates_bucket(&self) -> String {
        format!("{}_templates", self.bucket_stem())
    }
    pub fn confirmations_bucket(&self) -> String {
        format!("{}_confirmations", self.bucket_stem())
    }
    pub fn workspace_index_bucket(&self) -> String {
        format!("{}_workspace_index", self.bucket_stem())
    }
    pub fn workspace_objects_bucket(&self) -> String {
        format!("{}_workspace_blobs", self.bucket_stem())
    }
    /// The stream holding `workspace.upload` chunks until their write or restore.
    pub fn workspace_uploads_stream(&self) -> String {
        format!("{}_WORKSPACE_UPLOADS", self.stream_stem())
    }
    /// `<prefix>.v1.workspace-uploads.<session>.<upload>.<seq>`: one subject per chunk (the
    /// stream keeps the last message of each, so a resent chunk replaces itself). Published by
    /// the store only; not exported to tenants.
    pub fn workspace_upload_chunk(&self, session: &str, upload: &str, seq: u64) -> String {
        self.at(&format!("workspace-uploads.{session}.{upload}.{seq}"))
    }
    /// Every chunk subject under `rest` (`>` for all, `<session>.<upload>.>` for one upload).
    pub fn workspace_uploads(&self, rest: &str) -> String {
        self.at(&format!("workspace-uploads.{rest}"))
    }
    /// The scheduler's executions parked while they wait for a person (one key per execution).
    pub fn parked_executions_bucket(&self) -> String {
        format!("{}_parked_executions", self.bucket_stem())
    }
    /// The scheduler's execution claims (one key per execution id being run).
    pub fn exec_claims_bucket(&self) -> String {
        format!("{}_exec_claims", self.bucket_stem())
    }
}

macro_rules! ops {
    ($(#[$m:meta])* $name:ident { $($variant:ident => $s:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name { $($variant),+ }
        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
            pub const fn as_str(self) -> &'static str {
                match self { $($name::$variant => $s),+ }
            }
        }
    };
}

ops!(
    /// `sandbox.v1.sessions.<op>`
    SessionOp {
        Open => "open",
        Get => "get",
        List => "list",
        Close => "close",
        SetTtl => "ttl",
    }
);
ops!(
    /// `sandbox.v1.ports.<op>`
    PortsOp { Expose => "expose", List => "list", Unexpose => "unexpose", Connect => "connect" }
);
ops!(
    /// `sandbox.v1.proc.<op>`
    ProcOp {
        Start => "start",
        List => "list",
        Output => "output",
        Input => "input",
        Signal => "signal",
        Wait => "wait",
        Resize => "resize",
    }
);
ops!(
    /// `sandbox.v1.confirm.<op>`
    ConfirmOp { Request => "request", Decide => "decide", Get => "get", List => "list" }
);
ops!(
    /// `sandbox.v1.templates.<op>`: agents read (`get`, `list`), operators and admins write.
    TemplateOp {
        Create => "create",
        Get => "get",
        List => "list",
        Update => "update",
        Delete => "delete",
    }
);
ops!(
    /// `sandbox.v1.workspace.<op>`
    WorkspaceOp {
        Init => "init",
        Write => "write",
        Read => "read",
        List => "list",
        Stat => "stat",
        Delete => "delete",
        Snapshot => "snapshot",
        Restore => "restore",
        Usage => "usage",
        Cleanup => "cleanup",
        Upload => "upload",
        Fetch => "fetch",
    }
);
ops!(
    /// `sandbox.v1.executor.<backend>.<node_id>.<op>`; `status` answers what happened to an
    /// execution the node was sent ([`crate::executor::ExecutorStatusQuery`]).
    /// `proc` carries a session's background-process operations ([`crate::proc::ProcCall`]).
    ExecutorOp {
        Run => "run",
        Close => "close",
        Drain => "drain",
        Status => "status",
        Proc => "proc",
    }
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_subjects_match_the_design() {
        let s = Subjects::default();
        assert_eq!(s.exec(), "sandbox.v1.exec");
        assert_eq!(s.test(), "sandbox.v1.test");
        assert_eq!(s.jobs_exec(), "sandbox.v1.jobs.exec");
        assert_eq!(s.result("01J"), "sandbox.v1.results.01J");
        assert_eq!(s.risk_assess(), "sandbox.v1.risk.assess");
        assert_eq!(s.confirm(ConfirmOp::Decide), "sandbox.v1.confirm.decide");
        assert_eq!(
            s.workspace(WorkspaceOp::Snapshot),
            "sandbox.v1.workspace.snapshot"
        );
        assert_eq!(s.executor_run(), "sandbox.v1.executor.docker.run");
        assert_eq!(
            s.executor_node("n1", ExecutorOp::Close),
            "sandbox.v1.executor.docker.n1.close"
        );
        assert_eq!(s.proc(ProcOp::Start), "sandbox.v1.proc.start");
        assert_eq!(
            s.executor_node("n1", ExecutorOp::Proc),
            "sandbox.v1.executor.docker.n1.proc"
        );
        assert_eq!(
            s.executor_node_on(Backend::Bwrap, "n1", ExecutorOp::Run),
            "sandbox.v1.executor.bwrap.n1.run"
        );
        assert_eq!(
            s.executor_node_on(Backend::Bwrap, "n1", ExecutorOp::Status),
            "sandbox.v1.executor.bwrap.n1.status"
        );
        assert_eq!(s.templates(TemplateOp::List), "sandbox.v1.templates.list");
        assert_eq!(s.templates_bucket(), "sandbox_templates");
        assert_eq!(s.jobs_stream(), "SANDBOX_JOBS");
        assert_eq!(s.nodes_bucket(), "sandbox_nodes");
    }

    #[test]
    fn prefix_is_validated() {
        assert!(Subjects::new("acme.prod").is_ok());
        assert!(Subjects::new("a b").is_err());
        assert!(Subjects::new("a.*").is_err());
        assert!(Subjects::new("").is_err());
        assert_eq!(
            Subjects::new("acme.prod").unwrap().jobs_stream(),
            "ACME_PROD_JOBS"
        );
    }
}
