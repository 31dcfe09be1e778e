//! `SANDMESH_CONSOLE_*` settings, read with the kit's `ConfigReader` so every bad value is
//! reported at once, and who the operators are.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kit::config::{ConfigError, ConfigReader, EnvSource};
use kit::KitConfig;
use sandmesh_auth::{OperatorDirectory, Scope};

/// Where the console listens unless told otherwise: loopback only, so nothing outside this
/// machine reaches the page by default.
pub const DEFAULT_ADDR: &str = "127.0.0.1:4280";

#[derive(Debug, Clone)]
pub struct ConsoleConfig {
    /// The console's own NATS identity (service user `console`): history reads and `$SRV`.
    pub kit: KitConfig,
    /// `SANDMESH_CONSOLE_ADDR`.
    pub addr: SocketAddr,
    /// Origins besides the listening address that may post to the console (a reverse proxy's
    /// `https://console.example.com`): `SANDMESH_CONSOLE_ORIGINS`, comma-separated.
    pub extra_origins: Vec<String>,
    /// How long a login lasts (`SANDMESH_CONSOLE_SESSION_TTL_MS`, default 12 h).
    pub session_ttl: Duration,
    /// Where logins are kept across restarts of the console (`SANDMESH_CONSOLE_STATE_DIR`);
    /// in memory only when unset.
    pub state_dir: Option<PathBuf>,
    /// Who may log in and which tenants each one sees.
    pub operators: Operators,
}

impl ConsoleConfig {
    pub fn from_env(src: &dyn EnvSource) -> Result<Self, ConfigError> {
        let mut r = ConfigReader::new(src);
        let kit = KitConfig::from_reader(&mut r);
        let addr = r.string("CONSOLE_ADDR", DEFAULT_ADDR);
        let addr = addr.parse().unwrap_or_else(|_| {
            r.error(format!(
                "SANDMESH_CONSOLE_ADDR={addr:?}: expected host:port, e.g. {DEFAULT_ADDR}"
            ));
            DEFAULT_ADDR.parse().expect("valid default")
        });
        let extra_origins = r
            .optional_string("CONSOLE_ORIGINS")
            .map(|list| {
                list.split(',')
                    .map(|o| o.trim().trim_end_matches('/').to_string())
                    .filter(|o| !o.is_empty())
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        for origin in &extra_origins {
            if !(origin.starts_with("http://") || origin.starts_with("https://")) {
                r.error(format!(
                    "SANDMESH_CONSOLE_ORIGINS: {origin:?} is not an http(s) origin"
                ));
            }
        }
        let session_ttl = r.millis("CONSOLE_SESSION_TTL_MS", Duration::from_secs(12 * 3600));
        if session_ttl < Duration::from_secs(60) {
            r.error("SANDMESH_CONSOLE_SESSION_TTL_MS: must be at least 60000");
        }
        let state_dir = r.optional_string("CONSOLE_STATE_DIR").map(PathBuf::from);
        let operators = match (
            r.optional_string("OPERATOR_SCOPES"),
            kit.tenancy_file.clone(),
        ) {
            (Some(text), _) => Operators::parse(&text).unwrap_or_else(|e| {
                r.error(format!("SANDMESH_OPERATOR_SCOPES: {e}"));
                Operators::anyone()
            }),
            (None, Some(file)) => match Operators::of_file(&file) {
                Ok(o) => o,
                Err(e) => {
                    r.error(format!("SANDMESH_TENANCY_FILE: {e}"));
                    Operators::anyone()
                }
            },
            (None, None) => Operators::anyone(),
        };
        r.finish().map(|_| Self {
            kit,
            addr,
            extra_origins,
            session_ttl,
            state_dir,
            operators,
        })
    }

    /// Defaults for tests and embedded use: this NATS URL (the console's own credentials),
    /// any free loopback port, logins in memory.
    pub fn for_url(nats_url: &str, operators: Operators) -> Self {
        Self {
            kit: KitConfig::for_url(nats_url),
            addr: "127.0.0.1:0".parse().expect("valid"),
            extra_origins: Vec::new(),
            session_ttl: Duration::from_secs(12 * 3600),
            state_dir: None,
            operators,
        }
    }
}

/// Who may log in. NATS checks the password; this says which authenticated users are
/// operators (a tenant's agent has a valid password too) and what each one sees. Following the
/// tenancy file, an operator added with `sandmesh operator add` may log in at once.
#[derive(Debug, Clone)]
pub struct Operators(Arc<OperatorDirectory>);

impl Operators {
    /// No tenancy configured (a server without accounts, `sandmesh up --insecure`): whoever
    /// NATS lets in, seeing every tenant.
    pub fn anyone() -> Self {
        Self(Arc::new(OperatorDirectory::everyone()))
    }

    /// The format `sandmesh up` hands every service (`SANDMESH_OPERATOR_SCOPES`):
    /// `alice=*;bob=acme,beta`.
    pub fn parse(text: &str) -> Result<Self, String> {
        OperatorDirectory::fixed(text).map(|d| Self(Arc::new(d)))
    }

    pub fn of_tenancy(tenancy: &sandmesh_auth::Tenancy) -> Self {
        Self(Arc::new(OperatorDirectory::of_tenancy(tenancy)))
    }

    /// The operators of the tenancy file at `path`, as it changes.
    pub fn of_file(path: &std::path::Path) -> Result<Self, sandmesh_auth::TenancyError> {
        OperatorDirectory::file(path).map(|d| Self(Arc::new(d)))
    }

    pub fn is_anyone(&self) -> bool {
        self.0.is_everyone()
    }

    /// The scope of `user`, or `None` when `user` is no operator.
    pub fn scope_of(&self, user: &str) -> Option<Scope> {
        self.0.scope_of(user)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kit::config::env_map;

    #[test]
    fn every_bad_value_is_reported_together() {
        let e = ConsoleConfig::from_env(&env_map(&[
            ("SANDMESH_CONSOLE_ADDR", "everywhere"),
            ("SANDMESH_CONSOLE_ORIGINS", "ftp://x"),
            ("SANDMESH_CONSOLE_SESSION_TTL_MS", "5"),
            ("SANDMESH_OPERATOR_SCOPES", "bob"),
        ]))
        .unwrap_err();
        assert_eq!(e.0.len(), 4, "{e}");
    }

    #[test]
    fn defaults_listen_on_loopback() {
        let c = ConsoleConfig::from_env(&env_map(&[])).unwrap();
        assert!(c.addr.ip().is_loopback());
        assert!(c.operators.is_anyone());
    }

    #[test]
    fn scopes_name_the_operators() {
        let ops = Operators::parse("alice=*; bob=acme").unwrap();
        assert_eq!(ops.scope_of("alice"), Some(Scope::All));
        assert_eq!(
            ops.scope_of("bob"),
            Some(Scope::Tenants(vec![
                messages::tenancy::Tenant::new("acme").unwrap()
            ]))
        );
        assert_eq!(ops.scope_of("default-agent"), None);
        assert!(Operators::parse("bob=Acme").is_err());
    }
}
