//! `SANDMESH_WS_*` settings on top of the kit's shared ones, every bad value reported together.

use std::time::Duration;

use kit::config::{ConfigError, ConfigReader, EnvSource};
use kit::KitConfig;

#[derive(Debug, Clone)]
pub struct WorkspaceConfig {
    pub kit: KitConfig,
    /// Per-session quota (`SANDMESH_WS_MAX_SIZE_MB`).
    pub max_size_mb: u64,
    /// Workspaces untouched this long are removed (`SANDMESH_WS_CLEANUP_AFTER_HOURS`).
    pub cleanup_after_hours: u64,
    /// How often one instance sweeps for expired workspaces (`SANDMESH_WS_SWEEP_INTERVAL_MS`).
    pub sweep_interval: Duration,
    /// Most entries one restore archive may hold (`SANDMESH_WS_MAX_RESTORE_ENTRIES`).
    pub max_restore_entries: u64,
    /// Most content bytes one restore archive may unpack (`SANDMESH_WS_MAX_RESTORE_MB`,
    /// defaults to the quota).
    pub max_restore_bytes: u64,
    /// Uploads not committed within this long lose their chunks
    /// (`SANDMESH_WS_UPLOAD_TTL_SECS`).
    pub upload_ttl: Duration,
}

impl WorkspaceConfig {
    pub fn from_env(source: &dyn EnvSource) -> Result<Self, ConfigError> {
        let mut r = ConfigReader::new(source);
        let kit = KitConfig::from_reader(&mut r);
        let max_size_mb = r.parse("WS_MAX_SIZE_MB", 1024u64);
        if max_size_mb == 0 {
            r.error("SANDMESH_WS_MAX_SIZE_MB: must be at least 1");
        }
        let cleanup_after_hours = r.parse("WS_CLEANUP_AFTER_HOURS", 24u64);
        if cleanup_after_hours == 0 {
            r.error("SANDMESH_WS_CLEANUP_AFTER_HOURS: must be at least 1");
        }
        let sweep_interval = r.millis("WS_SWEEP_INTERVAL_MS", Duration::from_secs(600));
        if sweep_interval < Duration::from_millis(100) {
            r.error("SANDMESH_WS_SWEEP_INTERVAL_MS: must be at least 100");
        }
        let max_restore_entries = r.parse("WS_MAX_RESTORE_ENTRIES", 100_000u64);
        if max_restore_entries == 0 {
            r.error("SANDMESH_WS_MAX_RESTORE_ENTRIES: must be at least 1");
        }
        let max_restore_mb = r.parse("WS_MAX_RESTORE_MB", max_size_mb);
        let upload_ttl_secs = r.parse("WS_UPLOAD_TTL_SECS", 3600u64);
        if upload_ttl_secs == 0 {
            r.error("SANDMESH_WS_UPLOAD_TTL_SECS: must be at least 1");
        }
        r.finish()?;
        Ok(Self {
            kit,
            max_size_mb,
            cleanup_after_hours,
            sweep_interval,
            max_restore_entries,
            max_restore_bytes: max_restore_mb.saturating_mul(1 << 20),
            upload_ttl: Duration::from_secs(upload_ttl_secs),
        })
    }

    /// Defaults around a given NATS URL, for tests and the embedded `sandmesh up`.
    pub fn for_url(url: &str) -> Self {
        let kit = KitConfig::for_url(url);
        Self {
            kit,
            max_size_mb: 1024,
            cleanup_after_hours: 24,
            sweep_interval: Duration::from_secs(600),
            max_restore_entries: 100_000,
            max_restore_bytes: 1024 << 20,
            upload_ttl: Duration::from_secs(3600),
        }
    }

    pub fn quota_bytes(&self) -> u64 {
        self.max_size_mb.saturating_mul(1 << 20)
    }

    pub fn cleanup_after(&self) -> Duration {
        Duration::from_secs(self.cleanup_after_hours.saturating_mul(3600))
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
    fn defaults_follow_the_seed() {
        let c = WorkspaceConfig::from_env(&env(&[])).unwrap();
        assert_eq!(c.max_size_mb, 1024);
        assert_eq!(c.cleanup_after_hours, 24);
        assert_eq!(c.max_restore_bytes, 1024 << 20);
    }

    #[test]
    fn every_bad_value_is_reported_together() {
        let e = WorkspaceConfig::from_env(&env(&[
            ("SANDMESH_WS_MAX_SIZE_MB", "lots"),
            ("SANDMESH_WS_CLEANUP_AFTER_HOURS", "0"),
            ("SANDMESH_WS_MAX_RESTORE_ENTRIES", "-1"),
        ]))
        .unwrap_err();
        assert_eq!(e.0.len(), 3, "{e}");
    }
}
