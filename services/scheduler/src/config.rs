//! Scheduler configuration: the shared `SANDMESH_*` settings plus the scheduler's own, read from
//! one [`ConfigReader`] so every bad value is reported together.

use std::time::Duration;

use kit::config::{ConfigError, ConfigReader, EnvSource};
use kit::KitConfig;
use messages::network::NetworkPolicy;
use messages::risk::SecurityMode;
use messages::validate::Ceilings;

use crate::placement::Strategy;
use crate::tier::EphemeralBackend;

#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    pub kit: KitConfig,
    /// `SANDMESH_SECURITY_MODE`: strict (default) or permissive.
    pub security_mode: SecurityMode,
    /// `SANDMESH_PLACEMENT`: round_robin, least_loaded (default) or resource_aware.
    pub placement: Strategy,
    /// `SANDMESH_SCHED_MAX_QUEUE`: executions in flight at once (sync and async together);
    /// beyond it sync callers get 429 and async jobs stay in the stream.
    pub max_queue: usize,
    /// `SANDMESH_SCHED_TENANT_MAX`: executions one tenant may have in flight on this instance
    /// (default three quarters of the queue), so no tenant can take every slot.
    pub tenant_max: usize,
    pub ceilings: Ceilings,
    /// How long the risk-assessor may take.
    pub assess_timeout: Duration,
    /// How long a person has to decide a confirmation before it counts as a timeout.
    pub confirm_timeout: Duration,
    /// `SANDMESH_SCHED_PARKED_SWEEP_MS`: how often parked executions past their expiry are
    /// looked at (decisions themselves arrive as events).
    pub parked_sweep: Duration,
    /// Added to an execution's own timeout for container start and workspace sync; past it the
    /// executor counts as lost.
    pub exec_grace: Duration,
    /// `SANDMESH_SCHED_TEMPLATE_BUILD_MS` (default 15 min): added to `exec_grace` for a run in a
    /// template that adds packages, whose image the executor builds on first use.
    pub template_build_grace: Duration,
    /// `SANDMESH_SCHED_JOB_QUEUE_TTL_MS`: how long an accepted async job may wait for an
    /// executor, counted from its publication; it is retried with backoff until then, and
    /// ends `unavailable` after.
    pub job_queue_ttl: Duration,
    /// How long a delivered job may go without an ack or progress before redelivery.
    pub job_ack_wait: Duration,
    /// Jobs pulled per fetch (never more than free queue slots).
    pub job_batch: usize,
    /// Lifetime of an execution claim unless renewed; a crashed scheduler's claims expire.
    pub claim_ttl: Duration,
    /// `SANDMESH_NETWORK_ALLOW` (and `SANDMESH_NETWORK_PORTS`): the egress a deployment
    /// permits at all; a requested network policy beyond it is refused (403). Default:
    /// nothing, so every policy is refused until an operator allows domains.
    pub network_ceiling: NetworkPolicy,
    /// `SANDMESH_EPHEMERAL_BACKEND`: auto (default), bwrap or docker — where SAFE ephemeral
    /// work without a session runs.
    pub ephemeral_backend: EphemeralBackend,
    pub sessions: SessionSettings,
}

/// How sessions end by themselves ([`crate::session_reaper`]).
#[derive(Debug, Clone, Copy)]
pub struct SessionSettings {
    /// `SANDMESH_SESSION_IDLE_MS` (default 1 h): a session unused this long closes, unless it
    /// asked for another idle time when it opened.
    pub idle: Duration,
    /// `SANDMESH_SESSION_MAX_TTL_MS` (default 7 days): the longest `ttl_ms` or `idle_ms` a
    /// session may ask for.
    pub max_lifetime: Duration,
    /// `SANDMESH_SESSION_RETENTION_MS` (default 24 h): how long a closed session's record is
    /// kept (`sessions.get` answers it closed, its id cannot be opened again) before it is
    /// removed.
    pub retention: Duration,
    /// `SANDMESH_SESSION_SWEEP_MS` (default 10 s): how often sessions are looked at.
    pub sweep: Duration,
}

impl SessionSettings {
    fn read(r: &mut ConfigReader<'_>) -> Self {
        let settings = Self {
            idle: r.millis("SESSION_IDLE_MS", Duration::from_secs(3600)),
            max_lifetime: r.millis("SESSION_MAX_TTL_MS", Duration::from_secs(7 * 24 * 3600)),
            retention: r.millis("SESSION_RETENTION_MS", Duration::from_secs(24 * 3600)),
            sweep: r.millis("SESSION_SWEEP_MS", Duration::from_secs(10)),
        };
        if settings.idle.is_zero() || settings.idle > settings.max_lifetime {
            r.error("SANDMESH_SESSION_IDLE_MS: must be between 1 and SANDMESH_SESSION_MAX_TTL_MS");
        }
        if settings.sweep < Duration::from_millis(100) {
            r.error("SANDMESH_SESSION_SWEEP_MS: must be at least 100");
        }
        settings
    }

    pub fn lifetime(&self) -> messages::session::SessionLifetime {
        messages::session::SessionLifetime {
            max_ms: self.max_lifetime.as_millis() as u64,
        }
    }
}

fn parse_mode(r: &mut ConfigReader<'_>) -> SecurityMode {
    match r.string("SECURITY_MODE", "strict").as_str() {
        "strict" => SecurityMode::Strict,
        "permissive" => SecurityMode::Permissive,
        other => {
            r.error(format!(
                "SANDMESH_SECURITY_MODE={other:?}: expected strict or permissive"
            ));
            SecurityMode::Strict
        }
    }
}

fn ceilings(r: &mut ConfigReader<'_>) -> Ceilings {
    let d = Ceilings::default();
    let c = Ceilings {
        max_code_bytes: r.parse("SCHED_MAX_CODE_BYTES", d.max_code_bytes),
        max_timeout_ms: r.parse("SCHED_MAX_TIMEOUT_MS", d.max_timeout_ms),
        default_timeout_ms: r.parse("SCHED_DEFAULT_TIMEOUT_MS", d.default_timeout_ms),
        max_memory_mb: r.parse("SCHED_MAX_MEMORY_MB", d.max_memory_mb),
        max_cpus: r.parse("SCHED_MAX_CPUS", d.max_cpus),
        max_output_bytes: r.parse("SCHED_MAX_OUTPUT_BYTES", d.max_output_bytes),
        ..d
    };
    if c.default_timeout_ms == 0 || c.default_timeout_ms > c.max_timeout_ms {
        r.error("SANDMESH_SCHED_DEFAULT_TIMEOUT_MS: must be between 1 and the max timeout");
    }
    if !(c.max_cpus.is_finite() && c.max_cpus > 0.0) {
        r.error("SANDMESH_SCHED_MAX_CPUS: must be a positive number");
    }
    c
}

impl SchedulerConfig {
    pub fn from_env(source: &dyn EnvSource) -> Result<Self, ConfigError> {
        let mut r = ConfigReader::new(source);
        let kit = KitConfig::from_reader(&mut r);
        let security_mode = parse_mode(&mut r);
        let placement = r.parse("PLACEMENT", Strategy::LeastLoaded);
        let ephemeral_backend = r.parse("EPHEMERAL_BACKEND", EphemeralBackend::Auto);
        let max_queue = r.parse("SCHED_MAX_QUEUE", 64usize);
        let tenant_max = r.parse("SCHED_TENANT_MAX", (max_queue * 3 / 4).max(1));
        if tenant_max == 0 {
            r.error("SANDMESH_SCHED_TENANT_MAX: must be at least 1");
        }
        if max_queue == 0 {
            r.error("SANDMESH_SCHED_MAX_QUEUE: must be at least 1");
        }
        let ceilings = ceilings(&mut r);
        let job_queue_ttl = r.millis("SCHED_JOB_QUEUE_TTL_MS", Duration::from_secs(600));
        if job_queue_ttl.is_zero() {
            r.error("SANDMESH_SCHED_JOB_QUEUE_TTL_MS: must be more than 0");
        }
        let job_batch = r.parse("SCHED_JOB_BATCH", 4usize);
        if job_batch == 0 {
            r.error("SANDMESH_SCHED_JOB_BATCH: must be at least 1");
        }
        let job_ack_wait = r.millis("SCHED_JOB_ACK_WAIT_MS", Duration::from_secs(30));
        let claim_ttl = r.millis("SCHED_CLAIM_TTL_MS", Duration::from_secs(30));
        for (name, d) in [
            ("SCHED_JOB_ACK_WAIT_MS", job_ack_wait),
            ("SCHED_CLAIM_TTL_MS", claim_ttl),
        ] {
            // Progress and claim renewals run at a third of these; KV TTLs are whole seconds.
            if d < Duration::from_secs(3) {
                r.error(format!("SANDMESH_{name}: must be at least 3000"));
            }
        }
        let network_ceiling = NetworkPolicy::ceiling(
            &r.string("NETWORK_ALLOW", ""),
            &r.string("NETWORK_PORTS", ""),
        )
        .unwrap_or_else(|e| {
            r.error(format!(
                "SANDMESH_NETWORK_ALLOW / SANDMESH_NETWORK_PORTS: {e}"
            ));
            NetworkPolicy::default()
        });
        let parked_sweep = r.millis("SCHED_PARKED_SWEEP_MS", Duration::from_secs(5));
        if parked_sweep < Duration::from_millis(100) {
            r.error("SANDMESH_SCHED_PARKED_SWEEP_MS: must be at least 100");
        }
        let sessions = SessionSettings::read(&mut r);
        let config = Self {
            kit,
            sessions,
            security_mode,
            placement,
            max_queue,
            tenant_max,
            ceilings,
            assess_timeout: r.millis("SCHED_ASSESS_TIMEOUT_MS", Duration::from_secs(10)),
            confirm_timeout: r.millis("SCHED_CONFIRM_TIMEOUT_MS", Duration::from_secs(300)),
            parked_sweep,
            exec_grace: r.millis("SCHED_EXEC_GRACE_MS", Duration::from_secs(30)),
            template_build_grace: r.millis("SCHED_TEMPLATE_BUILD_MS", Duration::from_secs(900)),
            job_queue_ttl,
            job_ack_wait,
            job_batch,
            claim_ttl,
            network_ceiling,
            ephemeral_backend,
        };
        r.finish().map(|_| config)
    }

    /// Defaults for tests and embedded use, pointed at one NATS server.
    pub fn job_settings(&self) -> crate::jobs::JobSettings {
        crate::jobs::JobSettings {
            queue_ttl: self.job_queue_ttl,
            ack_wait: self.job_ack_wait,
            batch: self.job_batch,
            claim_ttl: self.claim_ttl,
        }
    }

    pub fn policy(&self) -> crate::pipeline::Policy {
        crate::pipeline::Policy {
            security_mode: self.security_mode,
            ceilings: self.ceilings.clone(),
            assess_timeout: self.assess_timeout,
            exec_grace: self.exec_grace,
            network_ceiling: self.network_ceiling.clone(),
            session_lifetime: self.sessions.lifetime(),
        }
    }

    pub fn for_url(nats_url: &str) -> Self {
        Self::from_env(&kit::config::env_map(&[("SANDMESH_NATS_URL", nats_url)]))
            .expect("defaults are valid")
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    use kit::config::env_map as env;

    #[test]
    fn defaults_are_strict_and_least_loaded() {
        let c = SchedulerConfig::from_env(&env(&[])).unwrap();
        assert_eq!(c.security_mode, SecurityMode::Strict);
        assert_eq!(c.placement, Strategy::LeastLoaded);
        assert_eq!(c.max_queue, 64);
        assert_eq!(
            c.network_ceiling,
            NetworkPolicy::default(),
            "no egress by default"
        );
    }

    #[test]
    fn every_bad_value_is_reported_together() {
        let e = SchedulerConfig::from_env(&env(&[
            ("SANDMESH_SECURITY_MODE", "lax"),
            ("SANDMESH_PLACEMENT", "random"),
            ("SANDMESH_EPHEMERAL_BACKEND", "podman"),
            ("SANDMESH_SCHED_MAX_QUEUE", "0"),
            ("SANDMESH_SCHED_CLAIM_TTL_MS", "10"),
            ("SANDMESH_SCHED_PARKED_SWEEP_MS", "0"),
            ("SANDMESH_HEARTBEAT_MS", "x"),
            ("SANDMESH_NETWORK_ALLOW", "a..b"),
            ("SANDMESH_SESSION_IDLE_MS", "0"),
            ("SANDMESH_SESSION_SWEEP_MS", "5"),
        ]))
        .unwrap_err();
        assert_eq!(e.0.len(), 10, "{e}");
    }

    #[test]
    fn mode_and_strategy_are_read() {
        let c = SchedulerConfig::from_env(&env(&[
            ("SANDMESH_SECURITY_MODE", "permissive"),
            ("SANDMESH_PLACEMENT", "resource_aware"),
        ]))
        .unwrap();
        assert_eq!(c.security_mode, SecurityMode::Permissive);
        assert_eq!(c.placement, Strategy::ResourceAware);
    }
}
