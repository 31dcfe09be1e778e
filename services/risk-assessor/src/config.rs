//! `SANDMESH_RISK_*` configuration, read together with the kit's settings so every bad value
//! (including a bad policy file, with its line) is reported at once.

use std::time::Duration;

use kit::config::{ConfigError, ConfigReader, EnvSource};
use kit::KitConfig;
use messages::risk::SecurityMode;

use crate::assess::Limits;
use crate::policy::Policy;

#[derive(Debug, Clone)]
pub struct RiskAssessorConfig {
    pub kit: KitConfig,
    /// `SANDMESH_RISK_MODE=strict|permissive`: the mode for requests that name none.
    pub mode: SecurityMode,
    /// The default policy with the `SANDMESH_RISK_POLICY` overlay applied.
    pub policy: Policy,
    /// `SANDMESH_RISK_MAX_CONTENT_BYTES` (default 256 KiB), `SANDMESH_RISK_PARSE_BUDGET_MS`
    /// (default 2000), `SANDMESH_RISK_MAX_FINDINGS` (default 64).
    pub limits: Limits,
}

pub fn parse_mode(value: &str) -> Result<SecurityMode, String> {
    match value.to_ascii_lowercase().as_str() {
        "strict" => Ok(SecurityMode::Strict),
        "permissive" => Ok(SecurityMode::Permissive),
        other => Err(format!(
            "unknown mode {other:?}; supported: strict, permissive"
        )),
    }
}

impl RiskAssessorConfig {
    pub fn from_env(source: &dyn EnvSource) -> Result<Self, ConfigError> {
        let mut r = ConfigReader::new(source);
        let kit = KitConfig::from_reader(&mut r);
        let mode = match r.optional_string("RISK_MODE") {
            None => SecurityMode::Strict,
            Some(v) => parse_mode(&v).unwrap_or_else(|e| {
                r.error(format!("SANDMESH_RISK_MODE: {e}"));
                SecurityMode::Strict
            }),
        };
        let defaults = Limits::default();
        let limits = Limits {
            max_content_bytes: r.parse("RISK_MAX_CONTENT_BYTES", defaults.max_content_bytes),
            parse_budget: r.millis("RISK_PARSE_BUDGET_MS", defaults.parse_budget),
            max_findings: r.parse("RISK_MAX_FINDINGS", defaults.max_findings),
        };
        if limits.max_content_bytes == 0 {
            r.error("SANDMESH_RISK_MAX_CONTENT_BYTES: must be at least 1");
        }
        if limits.parse_budget < Duration::from_millis(1) {
            r.error("SANDMESH_RISK_PARSE_BUDGET_MS: must be at least 1");
        }
        let policy = match r.optional_string("RISK_POLICY") {
            None => Policy::default_policy(),
            Some(path) => match std::fs::read_to_string(&path) {
                Ok(text) => Policy::load(Some((&path, &text))).unwrap_or_else(|e| {
                    r.error(format!("SANDMESH_RISK_POLICY: {e}"));
                    Policy::default_policy()
                }),
                Err(e) => {
                    r.error(format!("SANDMESH_RISK_POLICY={path:?}: cannot read: {e}"));
                    Policy::default_policy()
                }
            },
        };
        r.finish()?;
        Ok(Self {
            kit,
            mode,
            policy,
            limits,
        })
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    use kit::config::env_map as env;

    #[test]
    fn defaults_are_strict_with_a_256_kib_ceiling() {
        let c = RiskAssessorConfig::from_env(&env(&[])).unwrap();
        assert_eq!(c.mode, SecurityMode::Strict);
        assert_eq!(c.limits.max_content_bytes, 256 * 1024);
        assert!(c.policy.rule("py.eval").is_some());
    }

    #[test]
    fn every_bad_value_is_reported_with_the_policy_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy.toml");
        std::fs::write(
            &path,
            "[[rules]]\nid = \"py.eval\"\n\nseverity = \"dire\"\n",
        )
        .unwrap();
        let e = RiskAssessorConfig::from_env(&env(&[
            ("SANDMESH_RISK_MODE", "lax"),
            ("SANDMESH_RISK_MAX_CONTENT_BYTES", "0"),
            ("SANDMESH_RISK_POLICY", path.to_str().unwrap()),
        ]))
        .unwrap_err();
        assert_eq!(e.0.len(), 3, "{e}");
        let policy_error = e.0.iter().find(|m| m.contains("RISK_POLICY")).unwrap();
        assert!(policy_error.contains("line 4"), "{policy_error}");
    }

    #[test]
    fn an_overlay_file_regrades_without_a_rebuild() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy.toml");
        std::fs::write(&path, "[[rules]]\nid = \"py.read\"\nseverity = \"low\"\n").unwrap();
        let c =
            RiskAssessorConfig::from_env(&env(&[("SANDMESH_RISK_POLICY", path.to_str().unwrap())]))
                .unwrap();
        assert_eq!(
            c.policy.rule("py.read").unwrap().severity,
            messages::risk::RiskLevel::Low
        );
    }
}
