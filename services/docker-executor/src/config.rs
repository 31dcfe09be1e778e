//! `SANDMESH_EXEC_*` settings of the docker-executor, every bad value reported together.

use std::time::Duration;

use kit::config::{ConfigError, ConfigReader, EnvSource};
use kit::KitConfig;
use messages::validate::Ceilings;

#[derive(Debug, Clone)]
pub struct ExecutorConfig {
    pub kit: KitConfig,
    /// The sandbox image (built by `deploy/images/build.sh` with the supervisor inside).
    pub image: String,
    /// Pre-started single-use containers kept ready.
    pub warm_pool: usize,
    /// Executions running (or queued in sessions) at once; beyond it callers get 429.
    pub capacity: usize,
    /// Session containers this node holds at most.
    pub max_sessions: usize,
    /// A session container unused this long is removed.
    pub session_idle: Duration,
    /// Pull the session's workspace from workspace-store before a run and push changes after.
    pub workspace_sync: bool,
    /// Size of the `/workspace` tmpfs (it counts against the memory limit).
    pub workspace_mb: u64,
    /// Size of the `/tmp` tmpfs.
    pub tmp_mb: u64,
    pub nofile: u64,
    pub fsize_mb: u64,
    /// How long past an execution's own timeout the executor waits before it kills the
    /// container (the supervisor normally ends the run at the timeout itself).
    pub kill_grace: Duration,
    pub janitor_interval: Duration,
    /// Per-request limits: defaults and the most a request may ask for.
    pub ceilings: Ceilings,
    /// `SANDMESH_EXEC_EGRESS_DIR`: where containers' egress socket directories are made (one
    /// per container with a network policy; the Docker daemon must see this path). Default:
    /// `sandmesh-egress` in the system temporary directory.
    pub egress_dir: std::path::PathBuf,
}

impl ExecutorConfig {
    pub fn from_env(source: &dyn EnvSource) -> Result<Self, ConfigError> {
        let mut r = ConfigReader::new(source);
        let kit = KitConfig::from_reader(&mut r);
        let d = Ceilings::default();
        let ceilings = Ceilings {
            default_timeout_ms: r.parse("EXEC_DEFAULT_TIMEOUT_MS", d.default_timeout_ms),
            max_timeout_ms: r.parse("EXEC_MAX_TIMEOUT_MS", d.max_timeout_ms),
            default_memory_mb: r.parse("EXEC_DEFAULT_MEMORY_MB", d.default_memory_mb),
            max_memory_mb: r.parse("EXEC_MAX_MEMORY_MB", d.max_memory_mb),
            default_cpus: r.parse("EXEC_DEFAULT_CPUS", d.default_cpus),
            max_cpus: r.parse("EXEC_MAX_CPUS", d.max_cpus),
            default_pids: r.parse("EXEC_DEFAULT_PIDS", d.default_pids),
            max_pids: r.parse("EXEC_MAX_PIDS", d.max_pids),
            default_output_bytes: r.parse("EXEC_DEFAULT_OUTPUT_BYTES", d.default_output_bytes),
            max_output_bytes: r.parse("EXEC_MAX_OUTPUT_BYTES", d.max_output_bytes),
            ..d
        };
        let workspace = r.string("EXEC_WORKSPACE", "on");
        let workspace_sync = match workspace.as_str() {
            "on" => true,
            "off" => false,
            other => {
                r.error(format!(
                    "SANDMESH_EXEC_WORKSPACE={other:?}: expected on or off"
                ));
                true
            }
        };
        let workspace_mb = r.parse("EXEC_WORKSPACE_MB", 64u64);
        let c = Self {
            image: r.string("EXEC_IMAGE", "sandmesh/sandbox:latest"),
            warm_pool: r.parse("EXEC_WARM_POOL", 2usize),
            capacity: r.parse("EXEC_CAPACITY", 8usize),
            max_sessions: r.parse("EXEC_MAX_SESSIONS", 64usize),
            session_idle: r.millis("EXEC_SESSION_IDLE_MS", Duration::from_secs(600)),
            workspace_sync,
            workspace_mb,
            tmp_mb: r.parse("EXEC_TMP_MB", 64u64),
            nofile: r.parse("EXEC_NOFILE", 256u64),
            fsize_mb: r.parse("EXEC_FSIZE_MB", workspace_mb),
            kill_grace: r.millis("EXEC_KILL_GRACE_MS", Duration::from_secs(5)),
            janitor_interval: r.millis("EXEC_JANITOR_MS", Duration::from_secs(30)),
            ceilings,
            egress_dir: r
                .optional_string("EXEC_EGRESS_DIR")
                .map(Into::into)
                .unwrap_or_else(|| std::env::temp_dir().join("sandmesh-egress")),
            kit,
        };
        c.check(&mut r);
        r.finish().map(|_| c)
    }

    /// Cross-field checks, each reported with the variable to fix.
    fn check(&self, r: &mut ConfigReader<'_>) {
        let c = &self.ceilings;
        let pairs = [
            (
                "TIMEOUT_MS",
                c.default_timeout_ms as f64,
                c.max_timeout_ms as f64,
            ),
            (
                "MEMORY_MB",
                c.default_memory_mb as f64,
                c.max_memory_mb as f64,
            ),
            ("CPUS", c.default_cpus, c.max_cpus),
            ("PIDS", c.default_pids as f64, c.max_pids as f64),
            (
                "OUTPUT_BYTES",
                c.default_output_bytes as f64,
                c.max_output_bytes as f64,
            ),
        ];
        for (name, default, max) in pairs {
            if !(default > 0.0 && default.is_finite() && max.is_finite()) || default > max {
                r.error(format!(
                    "SANDMESH_EXEC_DEFAULT_{name} must be positive and at most SANDMESH_EXEC_MAX_{name}"
                ));
            }
        }
        if c.max_memory_mb < 32 {
            r.error("SANDMESH_EXEC_MAX_MEMORY_MB: at least 32");
        }
        if self.capacity == 0 {
            r.error("SANDMESH_EXEC_CAPACITY: at least 1");
        }
        for (name, v) in [
            ("SANDMESH_EXEC_WORKSPACE_MB", self.workspace_mb),
            ("SANDMESH_EXEC_TMP_MB", self.tmp_mb),
            ("SANDMESH_EXEC_NOFILE", self.nofile),
            ("SANDMESH_EXEC_FSIZE_MB", self.fsize_mb),
        ] {
            if v == 0 {
                r.error(format!("{name}: must be greater than 0"));
            }
        }
        if self.janitor_interval < Duration::from_millis(100) {
            r.error("SANDMESH_EXEC_JANITOR_MS: at least 100");
        }
    }

    /// This node's id: the instance id, also the `sandmesh.node` label of its containers.
    pub fn node_id(&self) -> &str {
        &self.kit.instance_id
    }

    /// A config for tests and embedded use: this NATS URL, defaults for the rest.
    pub fn for_url(nats_url: &str) -> Self {
        let env = std::collections::HashMap::from([(
            "SANDMESH_NATS_URL".to_string(),
            nats_url.to_string(),
        )]);
        Self::from_env(&env).expect("defaults are valid")
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_work_on_a_laptop() {
        let c = ExecutorConfig::from_env(&env(&[])).unwrap();
        assert_eq!(c.warm_pool, 2);
        assert!(c.workspace_sync);
        assert_eq!(c.image, "sandmesh/sandbox:latest");
        assert_eq!(c.fsize_mb, c.workspace_mb);
    }

    #[test]
    fn every_bad_value_is_reported_together() {
        let e = ExecutorConfig::from_env(&env(&[
            ("SANDMESH_EXEC_WARM_POOL", "many"),
            ("SANDMESH_EXEC_WORKSPACE", "maybe"),
            ("SANDMESH_EXEC_CAPACITY", "0"),
            ("SANDMESH_EXEC_DEFAULT_PIDS", "900"),
            ("SANDMESH_HEARTBEAT_MS", "soon"),
        ]))
        .unwrap_err();
        assert_eq!(e.0.len(), 5, "{e}");
        assert!(e.to_string().contains("SANDMESH_EXEC_DEFAULT_PIDS"));
    }
}
