//! The NATS accounts, users and permissions of a sandmesh deployment.
//!
//! [`Tenancy`] holds the generated credentials (saved as `tenancy.json`, mode 0600, in the data
//! directory of `sandmesh up`) and renders the `accounts { … }` block of the server config:
//!
//! - `SANDBOX`: the services, one user each, allowed only their own subjects and their own
//!   JetStream assets (streams, buckets and consumers named; no `$JS.API.>`), plus `admin`, the
//!   deployment's owner (the local `sandmesh` CLI, loadtests, operational tooling). It exports
//!   the client-facing subjects as services and the per-tenant event subjects as streams.
//! - `OPERATORS`: people who decide confirmations and read audit events; an operator's scope is
//!   every tenant or a named set, enforced by subscribe permissions on the events and by the
//!   confirmation service on decisions.
//! - one account per tenant, with agent users: it imports the services with `share: true`, so
//!   the server stamps `Nats-Request-Info` (account, user) on every request, and imports only its
//!   own events (`account_token_position` makes the server refuse any other import). Agents may
//!   publish only the imported subjects: `confirm.decide` is a permission violation.
//!
//! Passwords are random (128 bits) and stored in clear in files only the owner can read: the
//! server compares them on every connect, and bcrypt would cost tens of milliseconds per
//! connection for no gain over a 0600 file.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use messages::quota::Quotas;
use messages::tenancy::{Tenant, OPERATORS_ACCOUNT, SANDBOX_ACCOUNT};
use messages::{ServiceName, Subjects};
use serde::{Deserialize, Serialize};

mod cluster;
mod follow;
mod operators;
mod permissions;
mod quotas;

pub use cluster::{deployment_nodes, servers, ClusterNode};
pub use follow::FollowedTenancy;
pub use operators::OperatorDirectory;
pub use permissions::Permissions;
pub use quotas::QuotaBook;

/// A user and password.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credentials {
    pub user: String,
    pub password: String,
}

impl Credentials {
    fn generate(user: impl Into<String>) -> Self {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).expect("the OS random number generator");
        Self {
            user: user.into(),
            password: hex::encode(bytes),
        }
    }

    /// `nats://user:password@host:port` for a server URL `nats://host:port`. User names and
    /// passwords are `[a-z0-9-]`, so nothing needs escaping.
    pub fn url(&self, server: &str) -> String {
        let (scheme, rest) = server.split_once("://").unwrap_or(("nats", server));
        format!("{scheme}://{}:{}@{rest}", self.user, self.password)
    }
}

/// The inbox prefix of `user`'s connections: `_INBOX_<user>`. Operators may subscribe only
/// below their own (they share one account); sandmesh's clients use it for every user.
pub fn inbox_prefix(user: &str) -> String {
    format!("_INBOX_{user}")
}

/// Splits `nats://user:password@host:port` (the form `sandmesh creds` prints, which the `nats`
/// CLI and nats-py accept) into the URL without credentials and the credentials, for clients
/// that take them separately (async-nats ignores credentials in a URL). Several servers may be
/// given, comma-separated; the first one with credentials supplies them.
pub fn split_url(url: &str) -> (String, Option<Credentials>) {
    let mut found = None;
    let plain: Vec<String> = url
        .split(',')
        .map(|server| {
            let server = server.trim();
            let (scheme, rest) = match server.split_once("://") {
                Some((scheme, rest)) => (Some(scheme), rest),
                None => (None, server),
            };
            let rest = match rest.rsplit_once('@') {
                Some((auth, host)) => {
                    if let Some((user, password)) = auth.split_once(':') {
                        found.get_or_insert_with(|| Credentials {
                            user: user.to_string(),
                            password: password.to_string(),
                        });
                    }
                    host
                }
                None => rest,
            };
            match scheme {
                Some(scheme) => format!("{scheme}://{rest}"),
                None => rest.to_string(),
            }
        })
        .collect();
    (plain.join(","), found)
}

/// Which tenants an operator may see and decide for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    All,
    Tenants(Vec<Tenant>),
}

impl Scope {
    pub fn covers(&self, tenant: Option<&Tenant>) -> bool {
        match (self, tenant) {
            (Scope::All, _) => true,
            (Scope::Tenants(set), Some(t)) => set.contains(t),
            (Scope::Tenants(_), None) => false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Operator {
    pub credentials: Credentials,
    pub scope: Scope,
}

/// Who connects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role<'a> {
    /// The deployment's owner: everything in the `SANDBOX` account.
    Admin,
    Service(ServiceName),
    /// The first agent user of a tenant.
    Agent(&'a Tenant),
    Operator(&'a str),
}

/// Why a tenancy file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TenancyError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a sandmesh tenancy file: {source}")]
    Parse {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("writing {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the tenancy file names the subject prefix {0:?}, which is not valid")]
    Prefix(String),
}

/// Every account and user of one deployment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tenancy {
    pub prefix: String,
    pub admin: Credentials,
    /// Keyed by service name.
    pub services: BTreeMap<String, Credentials>,
    /// A tenant's agent users.
    pub tenants: BTreeMap<Tenant, Vec<Credentials>>,
    /// Keyed by user name.
    pub operators: BTreeMap<String, Operator>,
    /// Each tenant's limits (`sandmesh tenant add NAME --max-…`); a tenant not named has none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub quotas: BTreeMap<Tenant, Quotas>,
}

impl Tenancy {
    /// Fresh credentials: every service, the tenant `default` with one agent, one operator
    /// (`operator`, every tenant) and the admin.
    pub fn generate(subjects: &Subjects) -> Self {
        let mut t = Self {
            prefix: subjects.prefix().to_string(),
            admin: Credentials::generate("admin"),
            services: ServiceName::ALL
                .iter()
                .map(|s| (s.as_str().to_string(), Credentials::generate(s.as_str())))
                .collect(),
            tenants: BTreeMap::new(),
            operators: BTreeMap::new(),
            quotas: BTreeMap::new(),
        };
        t.add_tenant(&Tenant::default_tenant());
        t.add_operator("operator", Scope::All);
        t
    }

    pub fn subjects(&self) -> Subjects {
        Subjects::new(self.prefix.clone()).expect("validated when loaded or generated")
    }

    /// Gives credentials to every service that has none: one added to the mesh after this
    /// tenancy was generated (e.g. `templates`). Returns whether any was added.
    pub fn add_missing_services(&mut self) -> bool {
        let mut added = false;
        for s in ServiceName::ALL {
            if !self.services.contains_key(s.as_str()) {
                let c = Credentials::generate(s.as_str());
                self.services.insert(s.as_str().to_string(), c);
                added = true;
            }
        }
        added
    }

    /// Adds a tenant with one agent user `<tenant>-agent` (nothing changes if it exists).
    pub fn add_tenant(&mut self, tenant: &Tenant) -> &Credentials {
        let agents = self
            .tenants
            .entry(tenant.clone())
            .or_insert_with(|| vec![Credentials::generate(format!("{tenant}-agent"))]);
        &agents[0]
    }

    /// Adds an operator (its scope is updated if it exists).
    pub fn add_operator(&mut self, user: &str, scope: Scope) -> &Operator {
        let op = self
            .operators
            .entry(user.to_string())
            .or_insert_with(|| Operator {
                credentials: Credentials::generate(user),
                scope: scope.clone(),
            });
        op.scope = scope;
        op
    }

    /// Removes an operator; `false` when there was none of that name.
    pub fn remove_operator(&mut self, user: &str) -> bool {
        self.operators.remove(user).is_some()
    }

    /// Sets `tenant`'s quotas (none set removes its entry).
    pub fn set_quotas(&mut self, tenant: &Tenant, quotas: Quotas) {
        if quotas.is_empty() {
            self.quotas.remove(tenant);
        } else {
            self.quotas.insert(tenant.clone(), quotas);
        }
    }

    pub fn credentials(&self, role: Role<'_>) -> Option<&Credentials> {
        match role {
            Role::Admin => Some(&self.admin),
            Role::Service(s) => self.services.get(s.as_str()),
            Role::Agent(t) => self.tenants.get(t).and_then(|a| a.first()),
            Role::Operator(u) => self.operators.get(u).map(|o| &o.credentials),
        }
    }

    /// Each operator's scope, as the confirmation service reads it
    /// (`SANDMESH_OPERATOR_SCOPES`): `alice=*;bob=acme,beta`.
    pub fn operator_scopes(&self) -> String {
        let mut out = Vec::new();
        for (user, op) in &self.operators {
            let scope = match &op.scope {
                Scope::All => "*".to_string(),
                Scope::Tenants(set) => set.iter().map(Tenant::as_str).collect::<Vec<_>>().join(","),
            };
            out.push(format!("{user}={scope}"));
        }
        out.join(";")
    }

    /// Reads what [`Tenancy::operator_scopes`] writes: each operator's scope by user name.
    pub fn parse_operator_scopes(text: &str) -> Result<BTreeMap<String, Scope>, String> {
        let mut scopes = BTreeMap::new();
        for entry in text.split(';').map(str::trim).filter(|e| !e.is_empty()) {
            let (user, tenants) = entry
                .split_once('=')
                .ok_or_else(|| format!("{entry:?}: expected user=tenant,tenant or user=*"))?;
            let scope = if tenants.trim() == "*" {
                Scope::All
            } else {
                let set = tenants
                    .split(',')
                    .map(|t| Tenant::new(t.trim()).map_err(|e| e.to_string()))
                    .collect::<Result<Vec<_>, _>>()?;
                Scope::Tenants(set)
            };
            scopes.insert(user.trim().to_string(), scope);
        }
        Ok(scopes)
    }

    pub fn load(path: &Path) -> Result<Self, TenancyError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| TenancyError::Read {
            path: shown.clone(),
            source,
        })?;
        let t: Self = serde_json::from_str(&text).map_err(|source| TenancyError::Parse {
            path: shown,
            source,
        })?;
        Subjects::new(t.prefix.clone()).map_err(|_| TenancyError::Prefix(t.prefix.clone()))?;
        Ok(t)
    }

    /// Writes the file readable by its owner only.
    pub fn save(&self, path: &Path) -> Result<(), TenancyError> {
        let text = serde_json::to_string_pretty(self).expect("tenancy serialises");
        write_private(path, &text)
    }

    /// The `accounts { … }` block for nats-server.
    pub fn accounts_config(&self) -> String {
        let s = self.subjects();
        let p = permissions::Plan::new(&s);
        let mut out = String::new();
        out.push_str("accounts {\n");
        // The services' account.
        let _ = writeln!(
            out,
            "  {SANDBOX_ACCOUNT} {{\n    jetstream: enabled\n    users: ["
        );
        let _ = writeln!(out, "      {}", user_entry(&self.admin, None));
        for (name, creds) in &self.services {
            let perms = name.parse::<ServiceName>().ok().map(|n| p.service(n));
            let _ = writeln!(out, "      {}", user_entry(creds, perms.as_ref()));
        }
        out.push_str("    ]\n    exports: [\n");
        for export in p.exports(self.tenants.keys()) {
            let _ = writeln!(out, "      {export}");
        }
        out.push_str("    ]\n  }\n");
        // The operators' account.
        let _ = writeln!(out, "  {OPERATORS_ACCOUNT} {{\n    users: [");
        for (user, op) in &self.operators {
            let perms = p.operator(user, &op.scope);
            let _ = writeln!(out, "      {}", user_entry(&op.credentials, Some(&perms)));
        }
        out.push_str("    ]\n    imports: [\n");
        for import in p.operator_imports() {
            let _ = writeln!(out, "      {import}");
        }
        out.push_str("    ]\n  }\n");
        // One account per tenant.
        for (tenant, agents) in &self.tenants {
            let _ = writeln!(out, "  {tenant} {{\n    users: [");
            for a in agents {
                let perms = p.agent(&a.user);
                let _ = writeln!(out, "      {}", user_entry(a, Some(&perms)));
            }
            out.push_str("    ]\n    imports: [\n");
            for import in p.tenant_imports(tenant) {
                let _ = writeln!(out, "      {import}");
            }
            out.push_str("    ]\n  }\n");
        }
        out.push_str("}\n");
        out
    }
}

fn user_entry(c: &Credentials, perms: Option<&Permissions>) -> String {
    let mut e = format!("{{user: {:?}, password: {:?}", c.user, c.password);
    if let Some(p) = perms {
        let _ = write!(e, ", permissions: {}", p.render());
    }
    e.push('}');
    e
}

/// Writes `text` to `path` with mode 0600 (created so, never widened for a moment).
pub fn write_private(path: &Path, text: &str) -> Result<(), TenancyError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let failed = |source| TenancyError::Write {
        path: path.display().to_string(),
        source,
    };
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(failed)?;
    f.write_all(text.as_bytes()).map_err(failed)?;
    f.sync_all().map_err(failed)?;
    std::fs::rename(&tmp, path).map_err(failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_tenancy_round_trips_and_renders_every_account() {
        let dir = std::env::temp_dir().join(format!("sandmesh-auth-{}", messages::new_id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tenancy.json");
        let mut t = Tenancy::generate(&Subjects::default());
        t.add_tenant(&Tenant::new("acme").unwrap());
        t.save(&path).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(Tenancy::load(&path).unwrap(), t);
        let conf = t.accounts_config();
        for account in ["SANDBOX {", "OPERATORS {", "default {", "acme {"] {
            assert!(conf.contains(account), "{account} missing:\n{conf}");
        }
        // No user anywhere may call every JetStream API.
        assert!(!conf.contains("\"$JS.API.>\""), "{conf}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_service_added_later_gets_credentials_once() {
        let mut t = Tenancy::generate(&Subjects::default());
        let before = t.clone();
        assert!(!t.add_missing_services());
        t.services.remove(ServiceName::Templates.as_str());
        assert!(t.add_missing_services());
        assert!(t
            .credentials(Role::Service(ServiceName::Templates))
            .is_some());
        assert_eq!(t.services.len(), before.services.len());
    }

    #[test]
    fn passwords_differ_and_urls_carry_them() {
        let t = Tenancy::generate(&Subjects::default());
        let a = t.credentials(Role::Admin).unwrap();
        let s = t
            .credentials(Role::Service(ServiceName::Scheduler))
            .unwrap();
        assert_ne!(a.password, s.password);
        assert_eq!(a.password.len(), 32);
        assert_eq!(
            a.url("nats://127.0.0.1:4222"),
            format!("nats://admin:{}@127.0.0.1:4222", a.password)
        );
    }

    #[test]
    fn urls_split_into_address_and_credentials() {
        assert_eq!(
            split_url("nats://u:p@127.0.0.1:4222"),
            (
                "nats://127.0.0.1:4222".to_string(),
                Some(Credentials {
                    user: "u".into(),
                    password: "p".into()
                })
            )
        );
        assert_eq!(split_url("127.0.0.1:4222"), ("127.0.0.1:4222".into(), None));
        let (plain, creds) = split_url("nats://a:b@h1:1, nats://h2:2");
        assert_eq!(plain, "nats://h1:1,nats://h2:2");
        assert_eq!(creds.unwrap().user, "a");
    }

    #[test]
    fn scopes_render_for_the_confirmation_service() {
        let mut t = Tenancy::generate(&Subjects::default());
        t.add_operator(
            "bob",
            Scope::Tenants(vec![
                Tenant::new("acme").unwrap(),
                Tenant::new("beta").unwrap(),
            ]),
        );
        assert_eq!(t.operator_scopes(), "bob=acme,beta;operator=*");
        let scope = &t.operators["bob"].scope;
        assert!(scope.covers(Some(&Tenant::new("acme").unwrap())));
        assert!(!scope.covers(Some(&Tenant::new("default").unwrap())));
        assert!(!scope.covers(None));
    }
}
