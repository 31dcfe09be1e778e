//! Which subjects each role may publish and subscribe to, and what the `SANDBOX` account exports.
//!
//! JetStream is reached through `$JS.API.<verb>.<asset>` subjects, so naming the asset in every
//! verb a role needs confines it to those streams and buckets. Nobody but the admin may delete
//! a stream (`STREAM.DELETE`): a compromised service can spoil its own data, never another's.

use std::fmt::Write as _;

use messages::subjects::TemplateOp;
use messages::tenancy::{Tenant, OPERATORS_ACCOUNT, SANDBOX_ACCOUNT};
use messages::{ServiceName, Subjects};

use crate::Scope;

/// How long the scheduler and the docker executors may take to answer a run: a run's first
/// use of a template waits for its image to be built (minutes; the scheduler allows
/// `SANDMESH_SCHED_TEMPLATE_BUILD_MS`, 15 min, on top of the run's own time).
const SLOW_REPLY: &str = "30m";

/// One user's permissions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Permissions {
    pub publish: Vec<String>,
    pub deny_publish: Vec<String>,
    pub subscribe: Vec<String>,
    /// How many replies the user may send to a request it received (0: none). Replies to
    /// requests through an import go to `_R_.…` subjects no allow-list could name in advance.
    pub responses: u32,
    /// How long after the request those replies may come (nats-server's default: 2 min).
    /// `None`: the default.
    pub responses_expire: Option<String>,
}

impl Permissions {
    pub fn render(&self) -> String {
        let list = |v: &[String]| {
            let quoted: Vec<String> = v.iter().map(|s| format!("{s:?}")).collect();
            format!("[{}]", quoted.join(", "))
        };
        let mut out = format!("{{publish: {{allow: {}", list(&self.publish));
        if !self.deny_publish.is_empty() {
            let _ = write!(out, ", deny: {}", list(&self.deny_publish));
        }
        let _ = write!(out, "}}, subscribe: {{allow: {}}}", list(&self.subscribe));
        if self.responses > 0 {
            let _ = write!(out, ", allow_responses: {{max: {}", self.responses);
            if let Some(expires) = &self.responses_expire {
                let _ = write!(out, ", expires: {expires:?}");
            }
            out.push('}');
        }
        out.push('}');
        out
    }

    fn publish(&mut self, subjects: impl IntoIterator<Item = String>) -> &mut Self {
        self.publish.extend(subjects);
        self
    }

    fn subscribe(&mut self, subjects: impl IntoIterator<Item = String>) -> &mut Self {
        self.subscribe.extend(subjects);
        self
    }

    /// Reads a stream: info, message and direct gets, ephemeral and ordered consumers, acks
    /// and flow control.
    fn read_stream(&mut self, stream: &str) -> &mut Self {
        self.publish([
            "$JS.API.INFO".to_string(),
            format!("$JS.API.STREAM.INFO.{stream}"),
            format!("$JS.API.STREAM.MSG.GET.{stream}"),
            format!("$JS.API.DIRECT.GET.{stream}"),
            format!("$JS.API.DIRECT.GET.{stream}.>"),
            format!("$JS.API.CONSUMER.CREATE.{stream}"),
            format!("$JS.API.CONSUMER.CREATE.{stream}.>"),
            format!("$JS.API.CONSUMER.INFO.{stream}.>"),
            format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.>"),
            format!("$JS.API.CONSUMER.DELETE.{stream}.>"),
            format!("$JS.ACK.{stream}.>"),
            format!("$JS.FC.{stream}.>"),
        ])
    }

    /// Creates and maintains a stream it owns (never deletes it).
    fn own_stream(&mut self, stream: &str) -> &mut Self {
        self.read_stream(stream).publish([
            format!("$JS.API.STREAM.CREATE.{stream}"),
            format!("$JS.API.STREAM.UPDATE.{stream}"),
            format!("$JS.API.STREAM.PURGE.{stream}"),
            format!("$JS.API.STREAM.MSG.DELETE.{stream}"),
            format!("$JS.API.CONSUMER.DURABLE.CREATE.{stream}.>"),
        ])
    }

    fn read_kv(&mut self, bucket: &str) -> &mut Self {
        self.read_stream(&format!("KV_{bucket}"))
    }

    fn own_kv(&mut self, bucket: &str) -> &mut Self {
        self.own_stream(&format!("KV_{bucket}"))
            .publish([format!("$KV.{bucket}.>")])
    }
}

/// The permissions and exports of one deployment (one subject prefix).
pub(crate) struct Plan<'s> {
    s: &'s Subjects,
}

impl<'s> Plan<'s> {
    pub(crate) fn new(s: &'s Subjects) -> Self {
        Self { s }
    }

    /// 1-based position of the tenant token in `<prefix>.v1.<rest…>` when it follows
    /// `depth` tokens of `rest`.
    fn tenant_position(&self, depth: usize) -> usize {
        self.s.prefix().split('.').count() + 1 + depth + 1
    }

    /// What every service needs: discovery, replies, its own heartbeat key.
    fn base(&self, service: ServiceName, responses: u32) -> Permissions {
        let nodes = self.s.nodes_bucket();
        let mut p = Permissions {
            responses,
            ..Default::default()
        };
        // Its own inboxes only (`kit::connect` names them so); it publishes there to learn
        // that the server has processed its subscriptions.
        let inbox = format!("_INBOX_{}.>", service.as_str());
        p.subscribe(["$SRV.>".to_string(), inbox.clone()])
            .read_kv(&nodes)
            .publish([
                inbox,
                format!("$JS.API.STREAM.CREATE.KV_{nodes}"),
                format!("$KV.{nodes}.{}.>", service.as_str()),
            ]);
        p
    }

    /// Stores audit events (and creates the audit stream if it is missing).
    fn audits(&self, p: &mut Permissions) {
        p.own_stream(&self.s.audit_stream())
            .publish([self.s.audit_all()]);
    }

    pub(crate) fn service(&self, service: ServiceName) -> Permissions {
        let s = self.s;
        match service {
            ServiceName::RiskAssessor => {
                let mut p = self.base(service, 1);
                p.subscribe([s.risk_assess()]);
                self.audits(&mut p);
                p
            }
            ServiceName::Confirmation => {
                let mut p = self.base(service, 1);
                p.subscribe([s.pattern("confirm.*")])
                    .publish([
                        s.pattern("confirm.pending.>"),
                        s.pattern("confirm.decided.>"),
                    ])
                    .own_kv(&s.confirmations_bucket());
                self.audits(&mut p);
                p
            }
            ServiceName::Templates => {
                let mut p = self.base(service, 1);
                p.subscribe([s.pattern("templates.*")])
                    .own_kv(&s.templates_bucket());
                self.audits(&mut p);
                p
            }
            ServiceName::Scheduler => {
                // A sync caller that opted in gets a notice before its result.
                let mut p = self.base(service, 2);
                p.responses_expire = Some(SLOW_REPLY.into());
                p.subscribe([
                    s.exec(),
                    // A test run is an execution (and waits for a person the same way).
                    s.test(),
                    s.results_get(),
                    s.pattern("sessions.*"),
                    s.pattern("ports.*"),
                    // A session's background processes, held by its executor node.
                    s.pattern("proc.*"),
                    s.confirm_decided_all(),
                    // An agent's AIO command is an execution: assessed, confirmed, audited.
                    s.aio("exec"),
                    // A result stored by another instance ends a parked caller's wait.
                    s.results_all(),
                ])
                .publish([
                    s.executor_all(),
                    s.risk_assess(),
                    s.pattern("confirm.*"),
                    s.pattern("workspace.*"),
                    s.pattern("aio.*"),
                    // Resolves the template an execution or session names.
                    s.templates(TemplateOp::Get),
                    s.pattern("results.>"),
                    s.pattern("output.>"),
                ])
                .own_stream(&s.jobs_stream())
                .own_stream(&s.results_stream())
                .own_kv(&s.sessions_bucket())
                .own_kv(&s.parked_executions_bucket())
                .own_kv(&s.exec_claims_bucket());
                self.audits(&mut p);
                p
            }
            ServiceName::DockerExecutor => {
                let mut p = self.base(service, 1);
                p.responses_expire = Some(SLOW_REPLY.into());
                // Tunnels' up subjects: bytes and credit from the tenants' clients.
                p.subscribe([s.pattern("executor.docker.>"), s.tunnel_up_all()])
                    .publish([s.pattern("output.>"), s.pattern("workspace.*")])
                    .read_kv(&s.workspace_index_bucket());
                self.audits(&mut p);
                p
            }
            ServiceName::BwrapExecutor => {
                let mut p = self.base(service, 1);
                p.subscribe([s.pattern("executor.bwrap.>")])
                    .publish([s.pattern("output.>")]);
                self.audits(&mut p);
                p
            }
            ServiceName::WorkspaceStore => {
                let blobs = s.workspace_objects_bucket();
                let mut p = self.base(service, 1);
                p.subscribe([s.pattern("workspace.*")])
                    .own_kv(&s.workspace_index_bucket())
                    .own_stream(&format!("OBJ_{blobs}"))
                    .publish([format!("$O.{blobs}.>")])
                    .own_stream(&s.workspace_uploads_stream())
                    .publish([s.workspace_uploads(">")])
                    // An agent's read of a session with running processes first asks its node
                    // to carry the container's changes here (`ProcCall::Sync`).
                    .read_kv(&s.sessions_bucket())
                    .publish([s.pattern("executor.docker.*.proc")]);
                self.audits(&mut p);
                p
            }
            ServiceName::AioPool => {
                let mut p = self.base(service, 1);
                p.subscribe([
                    s.aio("acquire"),
                    s.aio("release"),
                    s.aio("stats"),
                    s.aio_instance_exec(),
                ])
                .publish([s.pattern("workspace.*")]);
                self.audits(&mut p);
                p
            }
            ServiceName::BrowserRouter => {
                // Two replies: an action waiting for a person tells its caller first.
                let mut p = self.base(service, 2);
                // session_closed events close a session's browser.
                p.subscribe([s.pattern("browser.*"), s.audit_kind("session_closed")])
                    .publish([
                        s.risk_assess(),
                        s.pattern("confirm.*"),
                        s.pattern("workspace.*"),
                        s.pattern("aio.*"),
                    ]);
                self.audits(&mut p);
                p
            }
            ServiceName::Console => {
                let mut p = self.base(service, 1);
                p.subscribe([s.confirm_events_all(), s.audit_all()])
                    .publish([s.pattern("confirm.*"), s.results_get()])
                    .read_stream(&s.results_stream());
                self.audits(&mut p);
                p
            }
            // Its own user only answers `$SRV` and reads the heartbeats (`/api/v1/runtimes`);
            // every call for a tenant goes over that tenant's agent user.
            // (`Runtime::start` ensures the audit stream, as every service does.)
            ServiceName::Gateway => {
                let mut p = self.base(service, 1);
                self.audits(&mut p);
                p
            }
        }
    }

    /// The client-facing request subjects, as the services' account exports them.
    fn services(&self) -> Vec<(String, bool)> {
        let s = self.s;
        // (subject, may answer with several messages)
        vec![
            (s.exec(), true),
            // Like `exec`: a notice that a person must decide may precede the report.
            (s.test(), true),
            (s.results_get(), false),
            (s.pattern("sessions.*"), false),
            (s.pattern("ports.*"), false),
            (s.pattern("proc.*"), false),
            (s.risk_assess(), false),
            (s.pattern("confirm.*"), false),
            (s.pattern("workspace.*"), false),
            // Like `exec`: an action that waits for a person says so before its reply.
            (s.pattern("browser.*"), true),
            // Agents read; writing is refused to them twice (`Plan::agent`, and the service
            // checks the caller).
            (s.pattern("templates.*"), false),
            (s.aio("acquire"), false),
            (s.aio("release"), false),
            (s.aio("stats"), false),
            // Like `exec`: a notice that a person must decide may precede the result.
            (s.aio("exec"), true),
        ]
    }

    pub(crate) fn exports<'t>(&self, tenants: impl Iterator<Item = &'t Tenant>) -> Vec<String> {
        let s = self.s;
        let mut out: Vec<String> = self
            .services()
            .into_iter()
            .map(|(subject, stream)| {
                let kind = if stream {
                    ", response_type: stream"
                } else {
                    ""
                };
                format!("{{service: {subject:?}{kind}}}")
            })
            .collect();
        // Jobs: the tenant's name is in the subject, checked by the server.
        out.push(format!(
            "{{service: {:?}, account_token_position: {}}}",
            s.pattern("jobs.*.exec"),
            self.tenant_position(1)
        ));
        // Tunnels' up subjects: a tenant publishes only into its own tunnels.
        out.push(format!(
            "{{service: {:?}, account_token_position: {}}}",
            s.tunnel_up_all(),
            self.tenant_position(1)
        ));
        // Output chunks, to each tenant its own (nobody else reads them).
        out.push(format!(
            "{{stream: {:?}, account_token_position: {}}}",
            s.pattern("output.*.>"),
            self.tenant_position(1)
        ));
        // Audit and confirmation events go to operators too. nats-server picks among
        // overlapping wildcard exports in no fixed order, so each tenant gets an exact export
        // of its own subjects (found before any wildcard) naming it as the only importer.
        for tenant in tenants {
            for subject in self.tenant_events(tenant).into_iter().skip(1) {
                out.push(format!(
                    "{{stream: {subject:?}, accounts: [{:?}]}}",
                    tenant.as_str()
                ));
            }
        }
        for subject in [s.audit_all(), s.confirm_events_all()] {
            out.push(format!(
                "{{stream: {subject:?}, accounts: [{OPERATORS_ACCOUNT:?}]}}"
            ));
        }
        out
    }

    pub(crate) fn tenant_imports(&self, tenant: &Tenant) -> Vec<String> {
        let s = self.s;
        let mut out: Vec<String> = self
            .services()
            .into_iter()
            .map(|(subject, _)| {
                format!("{{service: {{account: {SANDBOX_ACCOUNT:?}, subject: {subject:?}}}, share: true}}")
            })
            .collect();
        out.push(format!(
            "{{service: {{account: {SANDBOX_ACCOUNT:?}, subject: {:?}}}, to: {:?}}}",
            s.jobs_exec_of(tenant),
            s.jobs_exec()
        ));
        out.push(format!(
            "{{service: {{account: {SANDBOX_ACCOUNT:?}, subject: {:?}}}}}",
            s.tunnel_up(Some(tenant), "*")
        ));
        for subject in self.tenant_events(tenant) {
            out.push(format!(
                "{{stream: {{account: {SANDBOX_ACCOUNT:?}, subject: {subject:?}}}}}"
            ));
        }
        out
    }

    /// The event subjects of one tenant: output chunks first, then audit and confirmations.
    fn tenant_events(&self, tenant: &Tenant) -> Vec<String> {
        let s = self.s;
        vec![
            s.pattern(&format!("output.{tenant}.>")),
            s.pattern(&format!("audit.{tenant}.>")),
            s.pattern(&format!("confirm.*.{tenant}.*")),
        ]
    }

    pub(crate) fn agent(&self, user: &str) -> Permissions {
        let s = self.s;
        let mut p = Permissions::default();
        // Its own inboxes: `subscribe_live` publishes there to learn its subscription is live.
        // `_INBOX.>` for any NATS client as it comes; the tenant's account holds only its
        // own agents, so nobody else's replies arrive there. Its own prefix too, which
        // sandmesh's clients use for every user (`crate::inbox_prefix`).
        let own = format!("{}.>", crate::inbox_prefix(user));
        p.publish(self.services().into_iter().map(|(subject, _)| subject))
            .publish([s.jobs_exec(), "_INBOX.>".to_string(), own.clone()])
            // Its tunnels' bytes; only its own tenant's are imported.
            .publish([s.tunnel_up_all()])
            .subscribe(["_INBOX.>".to_string(), own])
            // Any event subject of its own account: only its own tenant's events are imported
            // there, so `output.*.<id>` or `audit.>` can never match another tenant's.
            .subscribe([s.output_all(), s.audit_all(), s.confirm_events_all()]);
        // Imported so agents can follow their own confirmations, but deciding is an operator's:
        // the server refuses it with a permissions violation.
        p.deny_publish = vec![s.confirm(messages::subjects::ConfirmOp::Decide)];
        // Templates are the operators' to write.
        p.deny_publish.extend(
            [TemplateOp::Create, TemplateOp::Update, TemplateOp::Delete].map(|op| s.templates(op)),
        );
        p
    }

    pub(crate) fn operator_imports(&self) -> Vec<String> {
        let s = self.s;
        let mut out: Vec<String> = [s.pattern("confirm.*"), s.pattern("templates.*")]
            .iter()
            .map(|subject| {
                format!(
                    "{{service: {{account: {SANDBOX_ACCOUNT:?}, subject: {subject:?}}}, share: true}}"
                )
            })
            .collect();
        for subject in [s.audit_all(), s.confirm_events_all()] {
            out.push(format!(
                "{{stream: {{account: {SANDBOX_ACCOUNT:?}, subject: {subject:?}}}}}"
            ));
        }
        out
    }

    /// Operators share one account, so a shared `_INBOX.>` would let one read another's
    /// replies (another tenant's pending code, in `confirm.list`): each may subscribe only
    /// below its own inbox prefix, which the server enforces.
    pub(crate) fn operator(&self, user: &str, scope: &Scope) -> Permissions {
        let s = self.s;
        let mut p = Permissions::default();
        let own = format!("{}.>", crate::inbox_prefix(user));
        p.publish([
            s.pattern("confirm.*"),
            s.pattern("templates.*"),
            own.clone(),
        ])
        .subscribe([own]);
        match scope {
            Scope::All => {
                p.subscribe([s.audit_all(), s.confirm_events_all()]);
            }
            Scope::Tenants(set) => {
                for t in set {
                    p.subscribe([
                        s.pattern(&format!("audit.{t}.>")),
                        s.pattern(&format!("confirm.*.{t}.*")),
                    ]);
                }
            }
        }
        p
    }
}
