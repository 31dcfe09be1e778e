//! Configuration from `SANDMESH_*` environment variables (or any injectable source), with every
//! bad value collected and reported together. Binaries exit with code 64 (EX_USAGE) on error.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use messages::Subjects;

/// Where configuration values come from: the process environment, or a map in tests.
pub trait EnvSource {
    fn var(&self, key: &str) -> Option<String>;
}

/// The process environment.
pub struct ProcessEnv;

impl EnvSource for ProcessEnv {
    fn var(&self, key: &str) -> Option<String> {
        std::env::var(key).ok()
    }
}

impl EnvSource for HashMap<String, String> {
    fn var(&self, key: &str) -> Option<String> {
        self.get(key).cloned()
    }
}

/// Every problem found in the configuration, one per line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub Vec<String>);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "invalid configuration:")?;
        for e in &self.0 {
            writeln!(f, "  - {e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

pub const ENV_PREFIX: &str = "SANDMESH_";

/// An environment from pairs: for tests, and for configs built in code (`for_url`).
pub fn env_map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Reads `SANDMESH_<KEY>` values, remembering every error instead of stopping at the first.
pub struct ConfigReader<'a> {
    source: &'a dyn EnvSource,
    errors: Vec<String>,
}

impl<'a> ConfigReader<'a> {
    pub fn new(source: &'a dyn EnvSource) -> Self {
        Self {
            source,
            errors: Vec::new(),
        }
    }

    fn raw(&self, key: &str) -> Option<(String, String)> {
        let name = format!("{ENV_PREFIX}{key}");
        let value = self.source.var(&name)?;
        let value = value.trim().to_string();
        (!value.is_empty()).then_some((name, value))
    }

    /// A string value, or the default.
    pub fn string(&mut self, key: &str, default: &str) -> String {
        self.raw(key)
            .map(|(_, v)| v)
            .unwrap_or_else(|| default.to_string())
    }

    pub fn optional_string(&mut self, key: &str) -> Option<String> {
        self.raw(key).map(|(_, v)| v)
    }

    /// A parsed value, or the default; a value that does not parse is recorded as an error.
    pub fn parse<T: FromStr>(&mut self, key: &str, default: T) -> T
    where
        T::Err: fmt::Display,
    {
        self.optional(key).unwrap_or(default)
    }

    pub fn optional<T: FromStr>(&mut self, key: &str) -> Option<T>
    where
        T::Err: fmt::Display,
    {
        let (name, value) = self.raw(key)?;
        match value.parse() {
            Ok(v) => Some(v),
            Err(e) => {
                self.errors.push(format!("{name}={value:?}: {e}"));
                None
            }
        }
    }

    /// A duration in milliseconds (`SANDMESH_X_MS`).
    pub fn millis(&mut self, key: &str, default: Duration) -> Duration {
        Duration::from_millis(self.parse(key, default.as_millis() as u64))
    }

    /// A boolean: 1/0, true/false, yes/no, on/off.
    pub fn flag(&mut self, key: &str, default: bool) -> bool {
        let Some((name, value)) = self.raw(key) else {
            return default;
        };
        match value.to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => true,
            "0" | "false" | "no" | "off" => false,
            _ => {
                self.errors
                    .push(format!("{name}={value:?}: expected true or false"));
                default
            }
        }
    }

    /// Records an error found by a cross-field check.
    pub fn error(&mut self, message: impl Into<String>) {
        self.errors.push(message.into());
    }

    pub fn finish(self) -> Result<(), ConfigError> {
        if self.errors.is_empty() {
            Ok(())
        } else {
            Err(ConfigError(self.errors))
        }
    }
}

/// Prints the error and exits with 64 (EX_USAGE), the convention for bad configuration.
pub fn exit_on_error<T>(result: Result<T, ConfigError>) -> T {
    result.unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(64)
    })
}

/// What every service needs: where NATS is, the subject prefix, who this instance is.
#[derive(Debug, Clone)]
pub struct KitConfig {
    pub nats_url: String,
    pub nats_user: Option<String>,
    pub nats_password: Option<String>,
    /// The deployment's tenancy file (`SANDMESH_TENANCY_FILE`, written by `sandmesh up` or
    /// `sandmesh tenant init`): a service takes its own credentials from it, so a deployment
    /// mounts one secret instead of a password per service.
    pub tenancy_file: Option<std::path::PathBuf>,
    pub subjects: Subjects,
    pub instance_id: String,
    /// OTLP gRPC endpoint; tracing export is off when absent.
    pub otlp_endpoint: Option<String>,
    pub log_json: bool,
    /// How long in-flight requests may take to finish after a shutdown signal.
    pub shutdown_grace: Duration,
    pub heartbeat_interval: Duration,
    /// Bound on concurrently handled requests per endpoint; beyond it callers get 429.
    pub max_in_flight: usize,
    /// Where to serve Prometheus `/metrics` (`SANDMESH_METRICS_ADDR`, an `ip:port`); off when
    /// absent. Services of one process given the same address share one endpoint.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Replicas of every stream, KV bucket and object store this service creates
    /// (`SANDMESH_JS_REPLICAS`): 1 on one server, 3 on a three-node cluster. An asset that
    /// exists keeps the replicas it was created with.
    pub js_replicas: usize,
}

/// The most replicas JetStream allows for one asset.
pub const MAX_JS_REPLICAS: usize = 5;

impl KitConfig {
    pub fn from_reader(r: &mut ConfigReader<'_>) -> Self {
        let prefix = r.string("PREFIX", messages::subjects::DEFAULT_PREFIX);
        let subjects = Subjects::new(prefix).unwrap_or_else(|e| {
            r.error(format!("SANDMESH_PREFIX: {e}"));
            Subjects::default()
        });
        let instance_id = r.string("INSTANCE_ID", &messages::new_id().to_ascii_lowercase());
        if messages::validate::validate_id("SANDMESH_INSTANCE_ID", &instance_id).is_err() {
            r.error(format!(
                "SANDMESH_INSTANCE_ID={instance_id:?}: use 1-64 of [A-Za-z0-9_-]"
            ));
        }
        let heartbeat_interval = r.millis("HEARTBEAT_MS", Duration::from_secs(2));
        if heartbeat_interval < Duration::from_millis(100) {
            r.error("SANDMESH_HEARTBEAT_MS: must be at least 100");
        }
        let max_in_flight = r.parse("MAX_IN_FLIGHT", 256usize);
        if max_in_flight == 0 {
            r.error("SANDMESH_MAX_IN_FLIGHT: must be at least 1");
        }
        let js_replicas = r.parse("JS_REPLICAS", 1usize);
        if !(1..=MAX_JS_REPLICAS).contains(&js_replicas) {
            r.error(format!(
                "SANDMESH_JS_REPLICAS={js_replicas}: use 1 to {MAX_JS_REPLICAS} (and no more than the cluster's servers)"
            ));
        }
        let nats_url = r.string("NATS_URL", "nats://127.0.0.1:4222");
        if sandmesh_auth::servers(&sandmesh_auth::split_url(&nats_url).0).is_empty() {
            r.error(format!("SANDMESH_NATS_URL={nats_url:?}: names no server"));
        }
        Self {
            nats_url,
            nats_user: r.optional_string("NATS_USER"),
            nats_password: r.optional_string("NATS_PASSWORD"),
            tenancy_file: r.optional_string("TENANCY_FILE").map(Into::into),
            subjects,
            instance_id,
            otlp_endpoint: r.optional_string("OTLP_ENDPOINT"),
            log_json: r.flag("LOG_JSON", false),
            shutdown_grace: r.millis("SHUTDOWN_GRACE_MS", Duration::from_secs(10)),
            heartbeat_interval,
            max_in_flight,
            metrics_addr: r.optional("METRICS_ADDR"),
            js_replicas,
        }
    }

    pub fn from_env(source: &dyn EnvSource) -> Result<Self, ConfigError> {
        let mut r = ConfigReader::new(source);
        let c = Self::from_reader(&mut r);
        r.finish().map(|_| c)
    }

    /// The tenants' quotas: following the tenancy file when there is one (so a quota set on a
    /// running mesh applies at once), none without.
    pub fn quota_book(&self) -> Result<sandmesh_auth::QuotaBook, sandmesh_auth::TenancyError> {
        match &self.tenancy_file {
            Some(path) => sandmesh_auth::QuotaBook::file(path),
            None => Ok(sandmesh_auth::QuotaBook::none()),
        }
    }

    /// A config for tests and embedded use: this NATS URL, defaults for the rest.
    pub fn for_url(nats_url: &str) -> Self {
        Self::from_env(&env_map(&[("SANDMESH_NATS_URL", nats_url)])).expect("defaults are valid")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::env_map as env;

    #[test]
    fn defaults_work_on_a_laptop() {
        let c = KitConfig::from_env(&env(&[])).unwrap();
        assert_eq!(c.nats_url, "nats://127.0.0.1:4222");
        assert_eq!(c.subjects.prefix(), "sandbox");
        assert!(c.otlp_endpoint.is_none());
        assert!(c.metrics_addr.is_none(), "metrics are off by default");
        assert_eq!(c.js_replicas, 1);
    }

    #[test]
    fn replicas_and_server_lists_are_checked() {
        let c = KitConfig::from_env(&env(&[
            ("SANDMESH_JS_REPLICAS", "3"),
            (
                "SANDMESH_NATS_URL",
                "nats://u:p@a:4222, nats://b:4222,nats://c:4222",
            ),
        ]))
        .unwrap();
        assert_eq!(c.js_replicas, 3);
        let e = KitConfig::from_env(&env(&[
            ("SANDMESH_JS_REPLICAS", "0"),
            ("SANDMESH_NATS_URL", " , "),
        ]))
        .unwrap_err();
        assert_eq!(e.0.len(), 2, "{e}");
        assert!(e.to_string().contains("SANDMESH_JS_REPLICAS"), "{e}");
        assert!(KitConfig::from_env(&env(&[("SANDMESH_JS_REPLICAS", "7")])).is_err());
        assert!(KitConfig::from_env(&env(&[("SANDMESH_JS_REPLICAS", "three")])).is_err());
    }

    #[test]
    fn every_bad_value_is_reported_together() {
        let e = KitConfig::from_env(&env(&[
            ("SANDMESH_PREFIX", "bad prefix"),
            ("SANDMESH_HEARTBEAT_MS", "soon"),
            ("SANDMESH_LOG_JSON", "maybe"),
            ("SANDMESH_MAX_IN_FLIGHT", "0"),
            ("SANDMESH_METRICS_ADDR", "localhost"),
        ]))
        .unwrap_err();
        assert_eq!(e.0.len(), 5, "{e}");
        assert!(e.to_string().contains("SANDMESH_METRICS_ADDR"));
        assert!(e.to_string().contains("SANDMESH_HEARTBEAT_MS"));
    }
}
