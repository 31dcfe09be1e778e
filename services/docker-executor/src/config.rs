//! Settings of the docker-executor: the shared `SANDMESH_EXEC_*` limits and ceilings
//! ([`NodeConfig`]) and what only containers have (capacity, warm pool, sessions, workspace
//! sync, egress sockets). Every bad value of both is reported together.

use std::time::Duration;

use executor_node::{NodeConfig, UidRange};
use kit::config::{ConfigError, ConfigReader, EnvSource};

#[derive(Debug, Clone)]
pub struct ExecutorConfig {
    /// Image, ceilings and per-execution limits, shared with every backend.
    pub node: NodeConfig,
    /// Pre-started single-use containers kept ready whatever the demand (the pool's floor).
    pub warm_pool: usize,
    /// `SANDMESH_EXEC_WARM_POOL_MAX`: containers kept ready at most, however busy the window
    /// was. Default: `max_sessions` (at least `warm_pool`). A warm container is what an idle
    /// session's container is (same image, same resident supervisor), and the node already
    /// admits `max_sessions` of those, so a host sized for its sessions holds this many warm
    /// ones too; and the pool only grows that far after that many takes within 10 s.
    pub warm_pool_max: usize,
    /// `SANDMESH_EXEC_WARM_POOL_WINDOW_MS`: how long the pool remembers its busiest 10 s of
    /// takes, the demand it is sized to (`crate::demand`).
    pub warm_pool_window: Duration,
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
    /// `SANDMESH_EXEC_PORTS_DIR`: where containers' ports socket directories are made (one
    /// per container, for preview ports; the Docker daemon must see this path). Default:
    /// `sandmesh-ports` in the system temporary directory.
    pub ports_dir: std::path::PathBuf,
    /// `SANDMESH_EXEC_UIDS` (`FIRST-LAST`): the host uids containers run as, one per container
    /// (warm, isolated or session), so no per-user kernel budget is shared between two.
    /// Default: 2000000000-2000099999. Executors sharing a Docker daemon may share a range (a
    /// container's name is its uid, and the daemon keeps names unique); a bubblewrap node of
    /// the same host needs a range apart (its default is).
    pub uids: UidRange,
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
        let warm_pool = r.parse("EXEC_WARM_POOL", 2usize);
        let max_sessions = r.parse("EXEC_MAX_SESSIONS", 64usize);
        let warm_pool_max = r.optional("EXEC_WARM_POOL_MAX");
        let c = Self {
            node,
            warm_pool,
            warm_pool_max: warm_pool_max.unwrap_or(max_sessions.max(warm_pool)),
            warm_pool_window: r.millis("EXEC_WARM_POOL_WINDOW_MS", Duration::from_secs(600)),
            capacity: r.parse("EXEC_CAPACITY", 8usize),
            max_sessions,
            session_idle: r.millis("EXEC_SESSION_IDLE_MS", Duration::from_secs(600)),
            workspace_sync,
            egress_dir: r
                .optional_string("EXEC_EGRESS_DIR")
                .map(Into::into)
                .unwrap_or_else(|| std::env::temp_dir().join("sandmesh-egress")),
            ports_dir: r
                .optional_string("EXEC_PORTS_DIR")
                .map(Into::into)
                .unwrap_or_else(|| std::env::temp_dir().join("sandmesh-ports")),
            uids: UidRange::read(&mut r, "EXEC_UIDS", UidRange::DOCKER),
        };
        if c.capacity == 0 {
            r.error("SANDMESH_EXEC_CAPACITY: at least 1");
        }
        if c.warm_pool_max < c.warm_pool {
            r.error(format!(
                "SANDMESH_EXEC_WARM_POOL_MAX={}: at least SANDMESH_EXEC_WARM_POOL ({})",
                c.warm_pool_max, c.warm_pool
            ));
        }
        if c.uids.count() < c.capacity as u64 {
            r.error(format!(
                "SANDMESH_EXEC_UIDS={}: at least SANDMESH_EXEC_CAPACITY ({}) uids, one per \
                 container (plus the warm pool's and the sessions')",
                c.uids, c.capacity
            ));
        }
        if c.warm_pool_window.is_zero() {
            // Zero would forget every take at once; a fixed pool is WARM_POOL_MAX=WARM_POOL.
            r.error("SANDMESH_EXEC_WARM_POOL_WINDOW_MS: at least 1");
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
        assert_eq!(
            c.warm_pool_max, 64,
            "as many as the sessions the node holds"
        );
        assert_eq!(c.warm_pool_window, Duration::from_secs(600));
        assert!(c.workspace_sync);
        assert_eq!(c.node.image, "sandmesh/sandbox:latest");
        assert_eq!(c.uids, UidRange::DOCKER);
    }

    #[test]
    fn a_uid_range_smaller_than_the_capacity_is_refused() {
        let e = ExecutorConfig::from_env(&env_map(&[
            ("SANDMESH_EXEC_UIDS", "5000-5003"),
            ("SANDMESH_EXEC_CAPACITY", "8"),
        ]))
        .unwrap_err();
        assert_eq!(e.0.len(), 1, "{e}");
        assert!(e.0[0].contains("SANDMESH_EXEC_UIDS=5000-5003"), "{e}");
    }

    #[test]
    fn bad_values_of_the_node_and_the_backend_are_reported_together() {
        let e = ExecutorConfig::from_env(&env_map(&[
            ("SANDMESH_EXEC_WARM_POOL", "many"),
            ("SANDMESH_EXEC_WORKSPACE", "maybe"),
            ("SANDMESH_EXEC_CAPACITY", "0"),
            ("SANDMESH_EXEC_DEFAULT_PIDS", "900"),
            ("SANDMESH_HEARTBEAT_MS", "soon"),
            ("SANDMESH_EXEC_UIDS", "0-99"),
        ]))
        .unwrap_err();
        assert_eq!(e.0.len(), 6, "{e}");
        assert!(e.to_string().contains("SANDMESH_EXEC_UIDS=\"0-99\""), "{e}");
        assert!(e.to_string().contains("SANDMESH_EXEC_DEFAULT_PIDS"));
    }

    #[test]
    fn the_warm_pool_cap_is_never_below_its_floor_and_the_window_never_empty() {
        let e = ExecutorConfig::from_env(&env_map(&[
            ("SANDMESH_EXEC_WARM_POOL", "4"),
            ("SANDMESH_EXEC_WARM_POOL_MAX", "3"),
            ("SANDMESH_EXEC_WARM_POOL_WINDOW_MS", "0"),
        ]))
        .unwrap_err();
        assert_eq!(e.0.len(), 2, "{e}");
        assert!(e.0[0].contains("SANDMESH_EXEC_WARM_POOL_MAX=3"), "{e}");
        assert!(e.0[1].contains("SANDMESH_EXEC_WARM_POOL_WINDOW_MS"), "{e}");
        let e = ExecutorConfig::from_env(&env_map(&[("SANDMESH_EXEC_WARM_POOL_MAX", "lots")]));
        assert!(e.unwrap_err().to_string().contains("WARM_POOL_MAX"));
        // A floor above the default cap raises the cap instead of failing a config that
        // never named one.
        let c = ExecutorConfig::from_env(&env_map(&[
            ("SANDMESH_EXEC_WARM_POOL", "80"),
            ("SANDMESH_EXEC_MAX_SESSIONS", "10"),
        ]))
        .unwrap();
        assert_eq!(c.warm_pool_max, 80);
    }
}
