//! `SANDMESH_BROWSER_*` settings, every bad value reported together.

use std::path::PathBuf;
use std::time::Duration;

use kit::config::{ConfigError, ConfigReader, EnvSource};
use kit::KitConfig;
use messages::network::NetworkPolicy;

#[derive(Debug, Clone)]
pub struct BrowserConfig {
    pub kit: KitConfig,
    /// The Chromium image (`deploy/images/build-browser.sh`).
    pub image: String,
    /// Set by `sandmesh up` while it builds the image in the background: the router answers
    /// `unavailable` until the build gives it [`Self::image`]. Not a setting.
    pub image_build: Option<kit::pending::Pending>,
    /// Started browser containers kept ready for a session's first action.
    pub warm_pool: usize,
    /// Browsers (sessions) this instance holds at most; beyond it callers get 429.
    pub max_browsers: usize,
    /// A session's browser unused this long is closed.
    pub idle: Duration,
    /// Longest a single action may take (a request's `timeout_ms` is clamped to it).
    pub action_timeout: Duration,
    /// How long a person has to decide on a sensitive action.
    pub confirm_timeout: Duration,
    /// Largest screenshot returned inline (base64) when asked.
    pub inline_max_bytes: usize,
    /// The egress policy of every browser: where its traffic may go through the proxy.
    /// Default: every public host on ports 80 and 443; loopback, private, link-local and
    /// the metadata address refused.
    pub network: NetworkPolicy,
    /// Where the per-container socket directories (egress proxy, DevTools) live on this
    /// host, under one of this instance's own (`<dir>/<instance id>`).
    pub egress_dir: PathBuf,
    /// Memory limit of one browser container.
    pub memory_mb: u64,
    pub cpus: f64,
    pub pids: u64,
}

impl BrowserConfig {
    pub fn from_env(source: &dyn EnvSource) -> Result<Self, ConfigError> {
        let mut r = ConfigReader::new(source);
        let kit = KitConfig::from_reader(&mut r);
        let network = match r.optional_string("BROWSER_NETWORK_POLICY") {
            None => NetworkPolicy {
                allow_all: true,
                ..Default::default()
            },
            Some(json) => match serde_json::from_str::<NetworkPolicy>(&json) {
                Ok(p) => {
                    if let Err(e) = p.validate() {
                        r.error(format!("SANDMESH_BROWSER_NETWORK_POLICY: {e}"));
                    }
                    p
                }
                Err(e) => {
                    r.error(format!(
                        "SANDMESH_BROWSER_NETWORK_POLICY: not a policy: {e}"
                    ));
                    NetworkPolicy::default()
                }
            },
        };
        let c = Self {
            image: r.string("BROWSER_IMAGE", "sandmesh/browser:latest"),
            image_build: None,
            warm_pool: r.parse("BROWSER_WARM_POOL", 1usize),
            max_browsers: r.parse("BROWSER_MAX", 16usize),
            idle: r.millis("BROWSER_IDLE_MS", Duration::from_secs(300)),
            action_timeout: r.millis("BROWSER_ACTION_TIMEOUT_MS", Duration::from_secs(30)),
            confirm_timeout: r.millis("BROWSER_CONFIRM_TIMEOUT_MS", Duration::from_secs(120)),
            inline_max_bytes: r.parse("BROWSER_INLINE_MAX_BYTES", 512 * 1024usize),
            network,
            egress_dir: PathBuf::from(r.string("BROWSER_EGRESS_DIR", "/tmp/sandmesh-browser")),
            memory_mb: r.parse("BROWSER_MEMORY_MB", 1024u64),
            cpus: r.parse("BROWSER_CPUS", 1.0f64),
            pids: r.parse("BROWSER_PIDS", 512u64),
            kit,
        };
        if c.max_browsers == 0 {
            r.error("SANDMESH_BROWSER_MAX: must be at least 1");
        }
        if c.warm_pool > c.max_browsers {
            r.error("SANDMESH_BROWSER_WARM_POOL: must not exceed SANDMESH_BROWSER_MAX");
        }
        if c.memory_mb < 256 {
            r.error("SANDMESH_BROWSER_MEMORY_MB: Chromium needs at least 256");
        }
        r.finish().map(|_| c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kit::config::env_map;

    #[test]
    fn defaults_allow_public_hosts_only() {
        let c = BrowserConfig::from_env(&env_map(&[])).unwrap();
        assert!(c.network.allow_all);
        assert!(c.network.allow_cidrs.is_empty());
        assert_eq!(c.warm_pool, 1);
    }

    #[test]
    fn every_bad_value_is_reported_together() {
        let e = BrowserConfig::from_env(&env_map(&[
            (
                "SANDMESH_BROWSER_NETWORK_POLICY",
                "{\"allow_cidrs\":[\"nope\"]}",
            ),
            ("SANDMESH_BROWSER_MAX", "0"),
            ("SANDMESH_BROWSER_MEMORY_MB", "64"),
        ]))
        .unwrap_err();
        assert_eq!(e.0.len(), 4, "{e}");
    }
}
