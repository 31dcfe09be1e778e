//! Settings of the docker-executor: the shared `SANDMESH_EXEC_*` limits and ceilings
//! ([`NodeConfig`]) and what only containers have (capacity, warm pool, sessions, workspace
//! sync, egress sockets). Every bad value of both is reported together.

use std::time::Duration;

use executor_node::NodeConfig;
use kit::config::{ConfigError, ConfigReader, EnvSource};

#[derive(Debug, Clone)]
pub struct ExecutorConfig {
    /// Image, ceilings and per-execution limits, shared with every backend.
    pub node: NodeConfig,
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
    /// `SANDMESH_EXEC_EGRESS_DIR`: where containers' egress socket directories are made (one
    /// per container with a network policy; the Docker daemon must see this path). Default:
    /// `sandmesh-egress` in the system temporary directory.
    pub egress_dir: std::path::PathBuf,
}

impl ExecutorConfig {
    pub fn from_env(source: &dyn EnvSource) -> Result<Self, ConfigError> {
        let mut r = ConfigReader::new(source);
        let node = NodeConfig::from_reader(&mut r);
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
        let c = Self {
            node,
            warm_pool: r.parse("EXEC_WARM_POOL", 2usize),
            capacity: r.parse("EXEC_CAPACITY", 8usize),
            max_sessions: r.parse("EXEC_MAX_SESSIONS", 64usize),
            session_idle: r.millis("EXEC_SESSION_IDLE_MS", Duration::from_secs(600)),
            workspace_sync,
            egress_dir: r
                .optional_string("EXEC_EGRESS_DIR")
                .map(Into::into)
                .unwrap_or_else(|| std::env::temp_dir().join("sandmesh-egress")),
        };
        if c.capacity == 0 {
            r.error("SANDMESH_EXEC_CAPACITY: at least 1");
        }
        r.finish().map(|_| c)
    }

    /// This node's id: the instance id, also the `sandmesh.node` label of its containers.
    pub fn node_id(&self) -> &str {
        self.node.node_id()
    }

    /// A config for tests and embedded use: this NATS URL, defaults for the rest.
    pub fn for_url(nats_url: &str) -> Self {
        let env = kit::config::env_map(&[("SANDMESH_NATS_URL", nats_url)]);
        Self::from_env(&env).expect("defaults are valid")
    }
}

#[cfg(test)]
mod tests {
    use kit::config::env_map;

    use super::*;

    #[test]
    fn defaults_work_on_a_laptop() {
        let c = ExecutorConfig::from_env(&env_map(&[])).unwrap();
        assert_eq!(c.warm_pool, 2);
        assert!(c.workspace_sync);
        assert_eq!(c.node.image, "sandmesh/sandbox:latest");
    }

    #[test]
    fn bad_values_of_the_node_and_the_backend_are_reported_together() {
        let e = ExecutorConfig::from_env(&env_map(&[
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
