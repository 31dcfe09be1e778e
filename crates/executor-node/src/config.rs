//! The `SANDMESH_EXEC_*` settings every backend shares: the sandbox image, the request
//! ceilings and the per-execution limits, so a request runs under the same rules whichever
//! backend takes it. A backend's own settings (its capacity, pools, paths) live in its crate
//! and are read from the same [`ConfigReader`], so every bad value of both is reported
//! together.

use std::time::Duration;

use kit::config::ConfigReader;
use kit::KitConfig;
use messages::validate::Ceilings;

use crate::results::KeepLimits;

#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub kit: KitConfig,
    /// The sandbox image (built by `deploy/images/build.sh` with the supervisor inside).
    pub image: String,
    /// Size of the `/workspace` tmpfs (it counts against the memory limit).
    pub workspace_mb: u64,
    /// Size of the `/tmp` tmpfs.
    pub tmp_mb: u64,
    pub nofile: u64,
    pub fsize_mb: u64,
    /// How long past an execution's own timeout the executor waits before it kills the
    /// sandbox (the supervisor normally ends the run at the timeout itself).
    pub kill_grace: Duration,
    pub janitor_interval: Duration,
    /// Per-request limits: defaults and the most a request may ask for.
    pub ceilings: Ceilings,
    /// How long and how much of the runs' answers the node keeps for callers whose reply was
    /// lost (`crate::results`).
    pub results: KeepLimits,
}

impl NodeConfig {
    /// Reads the shared settings; their errors are collected in `r` with the backend's own.
    pub fn from_reader(r: &mut ConfigReader<'_>) -> Self {
        let kit = KitConfig::from_reader(r);
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
        let workspace_mb = r.parse("EXEC_WORKSPACE_MB", 64u64);
        let k = KeepLimits::default();
        let results = KeepLimits {
            keep: r.millis("EXEC_RESULT_KEEP_MS", k.keep),
            max_entries: r.parse("EXEC_RESULT_KEEP_MAX", k.max_entries),
            max_bytes: r
                .parse("EXEC_RESULT_KEEP_MB", k.max_bytes >> 20)
                .saturating_mul(1 << 20),
        };
        let c = Self {
            image: r.string("EXEC_IMAGE", "sandmesh/sandbox:latest"),
            workspace_mb,
            tmp_mb: r.parse("EXEC_TMP_MB", 64u64),
            nofile: r.parse("EXEC_NOFILE", 256u64),
            fsize_mb: r.parse("EXEC_FSIZE_MB", workspace_mb),
            kill_grace: r.millis("EXEC_KILL_GRACE_MS", Duration::from_secs(5)),
            janitor_interval: r.millis("EXEC_JANITOR_MS", Duration::from_secs(30)),
            ceilings,
            results,
            kit,
        };
        c.check(r);
        c
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
        // A reply lost at a run's end is looked for once the scheduler's wait ran out: the
        // answer must still be there then.
        let longest_run = Duration::from_millis(c.max_timeout_ms) + self.kill_grace;
        if self.results.keep < longest_run {
            r.error(format!(
                "SANDMESH_EXEC_RESULT_KEEP_MS: at least the longest run ({} ms: \
                 SANDMESH_EXEC_MAX_TIMEOUT_MS plus SANDMESH_EXEC_KILL_GRACE_MS)",
                longest_run.as_millis()
            ));
        }
        if self.results.max_entries == 0 || self.results.max_bytes == 0 {
            r.error(
                "SANDMESH_EXEC_RESULT_KEEP_MAX and SANDMESH_EXEC_RESULT_KEEP_MB: greater than 0",
            );
        }
        if self.janitor_interval < Duration::from_millis(100) {
            r.error("SANDMESH_EXEC_JANITOR_MS: at least 100");
        }
    }

    /// This node's id: the instance id, also the node label of its sandboxes.
    pub fn node_id(&self) -> &str {
        &self.kit.instance_id
    }

    /// How long a drain waits for running executions: the longest a run may take, plus the
    /// grace after which the executor kills its sandbox.
    pub fn drain_grace(&self) -> Duration {
        self.kill_grace + Duration::from_millis(self.ceilings.max_timeout_ms)
    }
}

#[cfg(test)]
mod tests {
    use kit::config::env_map;

    use super::*;

    fn read(pairs: &[(&str, &str)]) -> Result<NodeConfig, kit::config::ConfigError> {
        let env = env_map(pairs);
        let mut r = ConfigReader::new(&env);
        let c = NodeConfig::from_reader(&mut r);
        r.finish().map(|_| c)
    }

    #[test]
    fn defaults_work_on_a_laptop() {
        let c = read(&[]).unwrap();
        assert_eq!(c.image, "sandmesh/sandbox:latest");
        assert_eq!(c.fsize_mb, c.workspace_mb);
    }

    #[test]
    fn every_bad_value_is_reported_together() {
        let e = read(&[
            ("SANDMESH_EXEC_DEFAULT_PIDS", "900"),
            ("SANDMESH_EXEC_NOFILE", "0"),
            ("SANDMESH_EXEC_JANITOR_MS", "5"),
            ("SANDMESH_HEARTBEAT_MS", "soon"),
            ("SANDMESH_EXEC_RESULT_KEEP_MS", "1000"),
        ])
        .unwrap_err();
        assert_eq!(e.0.len(), 5, "{e}");
        assert!(
            e.to_string().contains("SANDMESH_EXEC_RESULT_KEEP_MS"),
            "{e}"
        );
        assert!(e.to_string().contains("SANDMESH_EXEC_DEFAULT_PIDS"));
    }
}
