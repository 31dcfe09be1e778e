//! `SANDMESH_GATEWAY_*` settings, read with the kit's `ConfigReader` so every bad value is
//! reported at once.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use kit::config::{ConfigError, ConfigReader, EnvSource};
use kit::KitConfig;

use crate::keys::KEYS_FILE;

/// Where the gateway listens unless told otherwise: loopback only, so nothing outside this
/// machine reaches the API by default (a reverse proxy with TLS goes in front for more).
pub const DEFAULT_ADDR: &str = "127.0.0.1:4281";

#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// The gateway's own NATS identity (service user `gateway`): `$SRV`, heartbeats read for
    /// `/api/v1/runtimes`. Its `tenancy_file` holds the agents' credentials it acts with.
    pub kit: KitConfig,
    /// `SANDMESH_GATEWAY_ADDR`.
    pub addr: SocketAddr,
    /// `SANDMESH_E2B_ADDR`: where E2B's SDKs reach the E2B facade (`crate::e2b`); unset: no
    /// facade.
    pub e2b_addr: Option<SocketAddr>,
    /// The API keys (`SANDMESH_GATEWAY_KEYS_FILE`; default: `gateway-keys.json` beside the
    /// tenancy file).
    pub keys_file: PathBuf,
    pub limits: Limits,
}

/// What one caller may cost the gateway.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// The largest JSON body (`SANDMESH_GATEWAY_JSON_MAX_BYTES`, default 8 MiB: an execution
    /// may carry its files inline).
    pub json_max_bytes: usize,
    /// The largest file upload (`SANDMESH_GATEWAY_UPLOAD_MAX_BYTES`; default none: the
    /// workspace quota bounds it). Uploads stream to the store by chunks, so their size does
    /// not change what one request holds in memory.
    pub upload_max_bytes: Option<u64>,
    /// How long a request body may send nothing before the request fails with 408
    /// (`SANDMESH_GATEWAY_BODY_IDLE_TIMEOUT_MS`, default 30 s), on every route.
    pub body_idle_timeout: Duration,
    /// Requests per second each key may make on average (`SANDMESH_GATEWAY_RATE`, default 50).
    pub rate_per_second: f64,
    /// How many requests a key may make at once after a quiet spell
    /// (`SANDMESH_GATEWAY_BURST`, default 100).
    pub burst: u32,
    /// Look-ups, listings and file calls (`SANDMESH_GATEWAY_TIMEOUT_MS`, default 60 s).
    pub request_timeout: Duration,
    /// Sync executions, which may wait for a container and a person's approval
    /// (`SANDMESH_GATEWAY_EXEC_TIMEOUT_MS`, default the client's 600 s).
    pub exec_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            json_max_bytes: 8 << 20,
            upload_max_bytes: None,
            body_idle_timeout: Duration::from_secs(30),
            rate_per_second: 50.0,
            burst: 100,
            request_timeout: Duration::from_secs(60),
            exec_timeout: sandmesh_client::exec::EXEC_TIMEOUT,
        }
    }
}

impl GatewayConfig {
    pub fn from_env(src: &dyn EnvSource) -> Result<Self, ConfigError> {
        let mut r = ConfigReader::new(src);
        let kit = KitConfig::from_reader(&mut r);
        let addr = r.string("GATEWAY_ADDR", DEFAULT_ADDR);
        let addr = addr.parse().unwrap_or_else(|_| {
            r.error(format!(
                "SANDMESH_GATEWAY_ADDR={addr:?}: expected host:port, e.g. {DEFAULT_ADDR}"
            ));
            DEFAULT_ADDR.parse().expect("valid default")
        });
        let e2b_addr = r.optional_string("E2B_ADDR").and_then(|a| {
            a.parse()
                .map_err(|_| {
                    r.error(format!(
                        "SANDMESH_E2B_ADDR={a:?}: expected host:port, e.g. 127.0.0.1:4282"
                    ))
                })
                .ok()
        });
        let beside_tenancy = kit
            .tenancy_file
            .as_ref()
            .map(|t| t.with_file_name(KEYS_FILE));
        let keys_file = match (r.optional_string("GATEWAY_KEYS_FILE"), beside_tenancy) {
            (Some(file), _) => PathBuf::from(file),
            (None, Some(file)) => file,
            (None, None) => {
                r.error(
                    "SANDMESH_GATEWAY_KEYS_FILE: not set, and no SANDMESH_TENANCY_FILE to keep \
                     the keys beside (`sandmesh tenant key create` writes them)",
                );
                PathBuf::new()
            }
        };
        let d = Limits::default();
        let limits = Limits {
            json_max_bytes: r.parse("GATEWAY_JSON_MAX_BYTES", d.json_max_bytes),
            upload_max_bytes: r.optional("GATEWAY_UPLOAD_MAX_BYTES"),
            body_idle_timeout: r.millis("GATEWAY_BODY_IDLE_TIMEOUT_MS", d.body_idle_timeout),
            rate_per_second: r.parse("GATEWAY_RATE", d.rate_per_second),
            burst: r.parse("GATEWAY_BURST", d.burst),
            request_timeout: r.millis("GATEWAY_TIMEOUT_MS", d.request_timeout),
            exec_timeout: r.millis("GATEWAY_EXEC_TIMEOUT_MS", d.exec_timeout),
        };
        if !(limits.rate_per_second.is_finite() && limits.rate_per_second > 0.0) {
            r.error("SANDMESH_GATEWAY_RATE: must be a positive number of requests per second");
        }
        if limits.body_idle_timeout.is_zero() {
            r.error("SANDMESH_GATEWAY_BODY_IDLE_TIMEOUT_MS: must be at least 1");
        }
        if limits.burst == 0 {
            r.error("SANDMESH_GATEWAY_BURST: must be at least 1");
        }
        r.finish().map(|_| Self {
            kit,
            addr,
            e2b_addr,
            keys_file,
            limits,
        })
    }

    /// Defaults for tests and embedded use: this NATS URL (the gateway's own credentials in
    /// it), these keys, any free loopback port.
    pub fn for_url(nats_url: &str, keys_file: PathBuf) -> Self {
        Self {
            kit: KitConfig::for_url(nats_url),
            addr: "127.0.0.1:0".parse().expect("valid"),
            e2b_addr: None,
            keys_file,
            limits: Limits::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kit::config::env_map;

    #[test]
    fn every_bad_value_is_reported_together() {
        let e = GatewayConfig::from_env(&env_map(&[
            ("SANDMESH_GATEWAY_ADDR", "everywhere"),
            ("SANDMESH_GATEWAY_RATE", "0"),
            ("SANDMESH_GATEWAY_BURST", "0"),
            ("SANDMESH_E2B_ADDR", "nowhere"),
        ]))
        .unwrap_err();
        // The four above and the missing keys file.
        assert_eq!(e.0.len(), 5, "{e}");
    }

    #[test]
    fn keys_live_beside_the_tenancy_and_the_default_is_loopback() {
        let c =
            GatewayConfig::from_env(&env_map(&[("SANDMESH_TENANCY_FILE", "/data/tenancy.json")]))
                .unwrap();
        assert!(c.addr.ip().is_loopback());
        assert_eq!(c.addr.port(), 4281);
        assert_eq!(c.keys_file, PathBuf::from("/data").join(KEYS_FILE));
    }
}
