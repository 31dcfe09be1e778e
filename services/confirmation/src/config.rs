//! `SANDMESH_CONFIRM_*` settings: the decision policy and timeouts, read with the kit's
//! `ConfigReader` so every bad value is reported at once.

use std::collections::BTreeSet;
use std::time::Duration;

use kit::config::{ConfigError, ConfigReader, EnvSource};
use kit::KitConfig;

use crate::audience::OperatorScopes;
use messages::risk::RiskLevel;

/// What an unanswered request becomes when its time is up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TimeoutAction {
    /// State `timeout`: the work does not run. The safe default.
    #[default]
    Deny,
    /// State `approved` by `policy:timeout_action`. Only for unattended development setups;
    /// logged loudly at start and at every use.
    Approve,
}

/// Which requests are decided without a person, and how long a person has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyConfig {
    /// Development: approve everything not auto-denied (`SANDMESH_CONFIRM_AUTO_APPROVE`).
    pub auto_approve: bool,
    /// Levels denied at once, even with `auto_approve` (`SANDMESH_CONFIRM_AUTO_DENY_LEVELS`).
    pub auto_deny_levels: BTreeSet<RiskLevel>,
    /// Levels that need a person; others are approved by policy
    /// (`SANDMESH_CONFIRM_REQUIRE_LEVELS`, default: every level).
    pub require_levels: BTreeSet<RiskLevel>,
    /// For requests without `timeout_ms` (`SANDMESH_CONFIRM_TIMEOUT_MS`).
    pub default_timeout: Duration,
    /// The longest a request may ask to wait (`SANDMESH_CONFIRM_MAX_TIMEOUT_MS`).
    pub max_timeout: Duration,
    pub timeout_action: TimeoutAction,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            auto_approve: false,
            auto_deny_levels: BTreeSet::new(),
            require_levels: ALL_LEVELS.into_iter().collect(),
            default_timeout: Duration::from_secs(60),
            max_timeout: Duration::from_secs(3600),
            timeout_action: TimeoutAction::Deny,
        }
    }
}

const ALL_LEVELS: [RiskLevel; 5] = [
    RiskLevel::Safe,
    RiskLevel::Low,
    RiskLevel::Medium,
    RiskLevel::High,
    RiskLevel::Critical,
];

/// The bucket keeps entries for 7 days; a pending entry must outlive its own timeout.
const LONGEST_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

#[derive(Debug, Clone)]
pub struct ConfirmationConfig {
    pub kit: KitConfig,
    pub policy: PolicyConfig,
    /// Which tenants each operator may see and decide for (`SANDMESH_OPERATOR_SCOPES`).
    pub operator_scopes: OperatorScopes,
}

impl ConfirmationConfig {
    pub fn from_env(src: &dyn EnvSource) -> Result<Self, ConfigError> {
        let mut r = ConfigReader::new(src);
        let kit = KitConfig::from_reader(&mut r);
        let policy = PolicyConfig::from_reader(&mut r);
        let operator_scopes = match (r.optional_string("OPERATOR_SCOPES"), &kit.tenancy_file) {
            (Some(text), _) => OperatorScopes::parse(&text).unwrap_or_else(|e| {
                r.error(format!("SANDMESH_OPERATOR_SCOPES: {e}"));
                OperatorScopes::default()
            }),
            (None, Some(file)) => match sandmesh_auth::OperatorDirectory::file(file) {
                Ok(d) => OperatorScopes::of_directory(d),
                Err(e) => {
                    r.error(format!("SANDMESH_TENANCY_FILE: {e}"));
                    OperatorScopes::default()
                }
            },
            (None, None) => OperatorScopes::default(),
        };
        r.finish().map(|_| Self {
            kit,
            policy,
            operator_scopes,
        })
    }

    /// Defaults for tests and `sandmesh up`: this NATS URL, people decide, 60 s, deny.
    pub fn for_url(nats_url: &str) -> Self {
        Self {
            kit: KitConfig::for_url(nats_url),
            policy: PolicyConfig::default(),
            operator_scopes: OperatorScopes::default(),
        }
    }
}

impl PolicyConfig {
    pub fn from_reader(r: &mut ConfigReader<'_>) -> Self {
        let d = Self::default();
        let auto_approve = r.flag("CONFIRM_AUTO_APPROVE", d.auto_approve);
        let auto_deny_levels = levels(r, "CONFIRM_AUTO_DENY_LEVELS", d.auto_deny_levels);
        let require_levels = levels(r, "CONFIRM_REQUIRE_LEVELS", d.require_levels);
        let default_timeout = r.millis("CONFIRM_TIMEOUT_MS", d.default_timeout);
        let max_timeout = r.millis("CONFIRM_MAX_TIMEOUT_MS", d.max_timeout);
        let timeout_action = match r
            .string("CONFIRM_TIMEOUT_ACTION", "deny")
            .to_ascii_lowercase()
            .as_str()
        {
            "deny" => TimeoutAction::Deny,
            "approve" => TimeoutAction::Approve,
            other => {
                r.error(format!(
                    "SANDMESH_CONFIRM_TIMEOUT_ACTION={other:?}: expected deny or approve"
                ));
                TimeoutAction::Deny
            }
        };
        if default_timeout.is_zero() || max_timeout.is_zero() {
            r.error("SANDMESH_CONFIRM_TIMEOUT_MS and SANDMESH_CONFIRM_MAX_TIMEOUT_MS must be > 0");
        }
        if default_timeout > max_timeout {
            r.error(format!(
                "SANDMESH_CONFIRM_TIMEOUT_MS ({} ms) exceeds SANDMESH_CONFIRM_MAX_TIMEOUT_MS ({} ms)",
                default_timeout.as_millis(),
                max_timeout.as_millis()
            ));
        }
        if max_timeout > LONGEST_TIMEOUT {
            r.error(format!(
                "SANDMESH_CONFIRM_MAX_TIMEOUT_MS: at most {} (one day)",
                LONGEST_TIMEOUT.as_millis()
            ));
        }
        Self {
            auto_approve,
            auto_deny_levels,
            require_levels,
            default_timeout,
            max_timeout,
            timeout_action,
        }
    }
}

/// A comma-separated list of risk levels; `all` and `none` are accepted as shorthands.
fn levels(
    r: &mut ConfigReader<'_>,
    key: &str,
    default: BTreeSet<RiskLevel>,
) -> BTreeSet<RiskLevel> {
    let Some(text) = r.optional_string(key) else {
        return default;
    };
    match text.to_ascii_lowercase().as_str() {
        "all" => return ALL_LEVELS.into_iter().collect(),
        "none" => return BTreeSet::new(),
        _ => {}
    }
    let mut out = BTreeSet::new();
    for word in text.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        match ALL_LEVELS
            .into_iter()
            .find(|l| l.as_str().eq_ignore_ascii_case(word))
        {
            Some(level) => {
                out.insert(level);
            }
            None => r.error(format!(
                "SANDMESH_{key}: unknown level {word:?}; use safe, low, medium, high, critical, all or none"
            )),
        }
    }
    out
}

#[cfg(test)]
mod tests {

    use super::*;

    use kit::config::env_map as env;

    #[test]
    fn defaults_keep_a_person_in_the_loop() {
        let c = ConfirmationConfig::from_env(&env(&[])).unwrap();
        assert!(!c.policy.auto_approve);
        assert!(c.policy.auto_deny_levels.is_empty());
        assert_eq!(c.policy.require_levels.len(), 5);
        assert_eq!(c.policy.default_timeout, Duration::from_secs(60));
        assert_eq!(c.policy.timeout_action, TimeoutAction::Deny);
    }

    #[test]
    fn levels_and_actions_parse() {
        let c = ConfirmationConfig::from_env(&env(&[
            ("SANDMESH_CONFIRM_AUTO_DENY_LEVELS", "critical"),
            ("SANDMESH_CONFIRM_REQUIRE_LEVELS", "medium, HIGH"),
            ("SANDMESH_CONFIRM_TIMEOUT_ACTION", "approve"),
            ("SANDMESH_CONFIRM_AUTO_APPROVE", "true"),
        ]))
        .unwrap();
        assert!(c.policy.auto_approve);
        assert_eq!(
            c.policy.auto_deny_levels,
            [RiskLevel::Critical].into_iter().collect()
        );
        assert_eq!(
            c.policy.require_levels,
            [RiskLevel::Medium, RiskLevel::High].into_iter().collect()
        );
        assert_eq!(c.policy.timeout_action, TimeoutAction::Approve);
        let none =
            ConfirmationConfig::from_env(&env(&[("SANDMESH_CONFIRM_REQUIRE_LEVELS", "none")]))
                .unwrap();
        assert!(none.policy.require_levels.is_empty());
    }

    #[test]
    fn every_bad_value_is_reported_together() {
        let e = ConfirmationConfig::from_env(&env(&[
            ("SANDMESH_CONFIRM_AUTO_DENY_LEVELS", "critical,dire"),
            ("SANDMESH_CONFIRM_TIMEOUT_ACTION", "shrug"),
            ("SANDMESH_CONFIRM_AUTO_APPROVE", "perhaps"),
            ("SANDMESH_CONFIRM_TIMEOUT_MS", "90000"),
            ("SANDMESH_CONFIRM_MAX_TIMEOUT_MS", "60000"),
        ]))
        .unwrap_err();
        assert_eq!(e.0.len(), 4, "{e}");
        let text = e.to_string();
        assert!(text.contains("dire") && text.contains("shrug") && text.contains("perhaps"));
    }
}
