//! `SANDMESH_AIO_*` settings of the aio-pool, every bad value reported together.

use std::time::Duration;

use kit::config::{ConfigError, ConfigReader, EnvSource};
use kit::KitConfig;

use crate::aio_client::KeyHeader;
use crate::state::Limits;

#[derive(Debug, Clone)]
pub struct AioPoolConfig {
    pub kit: KitConfig,
    /// The AIO image: the project's `sandmesh/aio` (deploy/images/build.sh aio), or one whose
    /// agent serves the same API on the control socket (`AIO_CONTROL_SOCKET`).
    pub image: String,
    /// Set by `sandmesh up` while it builds the image in the background: the pool answers
    /// `unavailable` until the build gives it [`Self::image`]. Not a setting.
    pub image_build: Option<kit::pending::Pending>,
    /// The port the agent serves its API on inside the instance (8080), for the URLs it
    /// writes for code in the instance.
    pub port: u16,
    /// Where each instance's control directory is made (`<dir>/<pool>/<instance>`, bind-mounted
    /// into that instance alone): `SANDMESH_AIO_SOCKET_DIR`, `$TMPDIR/sandmesh-aio`. Its
    /// sockets' paths must stay under 108 bytes, so a short directory.
    pub socket_dir: std::path::PathBuf,
    /// How each instance's API key is sent: `X-AIO-API-Key` (a header name) or `bearer`.
    pub key_header: KeyHeader,
    /// The user the container runs as; empty = the image's own (`sandmesh/aio` has a
    /// non-root one; upstream's starts as root and drops privileges itself).
    pub user: String,
    pub limits: Limits,
    /// Container limits.
    pub memory_mb: u64,
    pub cpus: f64,
    pub pids: u64,
    pub nofile: u64,
    /// `/tmp` (Chromium's shared memory goes there: `--disable-dev-shm-usage`).
    pub tmp_mb: u64,
    /// The home/workspace tmpfs (`/home/gem`).
    pub home_mb: u64,
    pub home_dir: String,
    /// How long a new instance may take to answer `GET /v1/sandbox`.
    pub start_timeout: Duration,
    /// Health check period of each instance; also the pool's tick (idle reclaim, warmer).
    pub health_interval: Duration,
    pub janitor_interval: Duration,
    /// Default and largest command timeout of `aio.exec`.
    pub default_exec_timeout: Duration,
    pub max_exec_timeout: Duration,
    /// Characters of stdout/stderr an execution returns.
    pub max_output_chars: usize,
}

impl AioPoolConfig {
    pub fn from_env(source: &dyn EnvSource) -> Result<Self, ConfigError> {
        let mut r = ConfigReader::new(source);
        let kit = KitConfig::from_reader(&mut r);
        let header = r.string("AIO_KEY_HEADER", "X-AIO-API-Key");
        let key_header = KeyHeader::parse(&header).unwrap_or_else(|| {
            r.error(format!(
                "SANDMESH_AIO_KEY_HEADER={header:?} is not a header name (or `bearer`)"
            ));
            KeyHeader::Bearer
        });
        let limits = Limits {
            min_instances: r.parse("AIO_MIN_INSTANCES", 1usize),
            max_instances: r.parse("AIO_MAX_INSTANCES", 8usize),
            idle_timeout: r.millis("AIO_IDLE_TIMEOUT_MS", Duration::from_secs(300)),
            max_use_count: r.parse("AIO_MAX_USE_COUNT", 100u64),
            acquire_wait: r.millis("AIO_ACQUIRE_WAIT_MS", Duration::from_secs(10)),
        };
        let c = Self {
            kit,
            image: r.string("AIO_IMAGE", "sandmesh/aio:latest"),
            image_build: None,
            port: r.parse("AIO_PORT", 8080u16),
            socket_dir: r
                .optional_string("AIO_SOCKET_DIR")
                .map(Into::into)
                .unwrap_or_else(|| std::env::temp_dir().join("sandmesh-aio")),
            key_header,
            user: r.string("AIO_USER", ""),
            limits,
            memory_mb: r.parse("AIO_MEMORY_MB", 1024u64),
            cpus: r.parse("AIO_CPUS", 1.0f64),
            pids: r.parse("AIO_PIDS", 512u64),
            nofile: r.parse("AIO_NOFILE", 4096u64),
            tmp_mb: r.parse("AIO_TMP_MB", 256u64),
            home_mb: r.parse("AIO_HOME_MB", 256u64),
            home_dir: r.string("AIO_HOME_DIR", "/home/gem"),
            start_timeout: r.millis("AIO_START_TIMEOUT_MS", Duration::from_secs(30)),
            health_interval: r.millis("AIO_HEALTH_MS", Duration::from_secs(2)),
            janitor_interval: r.millis("AIO_JANITOR_MS", Duration::from_secs(30)),
            default_exec_timeout: r.millis("AIO_DEFAULT_TIMEOUT_MS", Duration::from_secs(30)),
            max_exec_timeout: r.millis("AIO_MAX_TIMEOUT_MS", Duration::from_secs(600)),
            max_output_chars: r.parse("AIO_MAX_OUTPUT_CHARS", 256 * 1024usize),
        };
        if c.limits.max_instances == 0 {
            r.error("SANDMESH_AIO_MAX_INSTANCES must be at least 1");
        }
        if c.limits.min_instances > c.limits.max_instances {
            r.error(format!(
                "SANDMESH_AIO_MIN_INSTANCES={} is more than SANDMESH_AIO_MAX_INSTANCES={}",
                c.limits.min_instances, c.limits.max_instances
            ));
        }
        if !(c.cpus > 0.0 && c.cpus.is_finite()) {
            r.error(format!("SANDMESH_AIO_CPUS={} must be positive", c.cpus));
        }
        if c.health_interval.is_zero() || c.janitor_interval.is_zero() {
            r.error("SANDMESH_AIO_HEALTH_MS and SANDMESH_AIO_JANITOR_MS must be positive");
        }
        r.finish()?;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kit::config::env_map;

    #[test]
    fn defaults_work_and_bad_values_are_reported_together() {
        let env = env_map(&[]);
        let c = AioPoolConfig::from_env(&env).unwrap();
        assert_eq!(c.limits.max_instances, 8);
        assert_eq!(c.key_header, KeyHeader::parse("X-AIO-API-Key").unwrap());

        let env = env_map(&[
            ("SANDMESH_AIO_MIN_INSTANCES", "9"),
            ("SANDMESH_AIO_KEY_HEADER", "bad header"),
            ("SANDMESH_AIO_CPUS", "0"),
        ]);
        let e = AioPoolConfig::from_env(&env).unwrap_err();
        assert_eq!(e.0.len(), 3, "{:?}", e.0);
    }
}
