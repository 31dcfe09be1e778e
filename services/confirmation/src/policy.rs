//! Decisions made without a person: the configured policy, session-scoped approvals, and what a
//! timeout means. Pure functions, so every rule is unit-tested here.
//!
//! Precedence, first match wins: `auto_deny_levels` → `auto_approve` → level not in
//! `require_levels` → a session grant covering every finding → a person decides.

use std::collections::BTreeMap;
use std::time::Duration;

use messages::confirm::ConfirmState;
use messages::risk::RiskAssessment;
use messages::validate::ValidationError;
use serde::{Deserialize, Serialize};

use crate::config::{PolicyConfig, TimeoutAction};

/// A decision taken on the spot, with who took it (`policy:<name>` or `session-scope:<who>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AutoDecision {
    pub state: ConfirmState,
    pub by: String,
    pub reason: String,
}

#[derive(Debug, Clone)]
pub struct Policy {
    config: PolicyConfig,
}

impl Policy {
    pub fn new(config: PolicyConfig) -> Self {
        if config.auto_approve {
            tracing::warn!(
                "SANDMESH_CONFIRM_AUTO_APPROVE is on: risky work runs without a person's approval \
                 (development only)"
            );
        }
        if config.timeout_action == TimeoutAction::Approve {
            tracing::warn!(
                "SANDMESH_CONFIRM_TIMEOUT_ACTION=approve: unanswered requests are APPROVED when \
                 they time out"
            );
        }
        Self { config }
    }

    pub fn config(&self) -> &PolicyConfig {
        &self.config
    }

    /// The configured decision for this risk, if the configuration decides it.
    pub fn automatic(&self, risk: &RiskAssessment) -> Option<AutoDecision> {
        let level = risk.level.as_str();
        if self.config.auto_deny_levels.contains(&risk.level) {
            return Some(AutoDecision {
                state: ConfirmState::Denied,
                by: "policy:auto_deny_levels".into(),
                reason: format!("risk level {level} is denied by configuration"),
            });
        }
        if self.config.auto_approve {
            return Some(AutoDecision {
                state: ConfirmState::Approved,
                by: "policy:auto_approve".into(),
                reason: "auto-approve is on (development)".into(),
            });
        }
        if !self.config.require_levels.contains(&risk.level) {
            return Some(AutoDecision {
                state: ConfirmState::Approved,
                by: "policy:require_levels".into(),
                reason: format!("risk level {level} does not require a person's approval"),
            });
        }
        None
    }

    /// How long this request may wait: its own `timeout_ms` or the default, within the maximum.
    pub fn timeout_for(&self, requested_ms: Option<u64>) -> Result<Duration, ValidationError> {
        let Some(ms) = requested_ms else {
            return Ok(self.config.default_timeout);
        };
        let max = self.config.max_timeout.as_millis() as u64;
        if ms == 0 || ms > max {
            return Err(ValidationError::invalid(
                "timeout_ms",
                format!("must be 1..={max} (got {ms})"),
            ));
        }
        Ok(Duration::from_millis(ms))
    }

    /// What a request becomes when nobody decided within `waited`.
    pub fn on_timeout(&self, waited: Duration) -> AutoDecision {
        let ms = waited.as_millis();
        match self.config.timeout_action {
            TimeoutAction::Deny => AutoDecision {
                state: ConfirmState::Timeout,
                by: "policy:timeout".into(),
                reason: format!("no decision within {ms} ms"),
            },
            TimeoutAction::Approve => {
                tracing::warn!(
                    waited_ms = ms as u64,
                    "confirmation timed out and is APPROVED by SANDMESH_CONFIRM_TIMEOUT_ACTION"
                );
                AutoDecision {
                    state: ConfirmState::Approved,
                    by: "policy:timeout_action".into(),
                    reason: format!(
                        "no decision within {ms} ms; SANDMESH_CONFIRM_TIMEOUT_ACTION=approve"
                    ),
                }
            }
        }
    }
}

/// Rules approved for the rest of one session (stored per session in the confirmations bucket).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SessionGrants {
    pub session_id: String,
    /// Rule id → the approval that granted it.
    #[serde(default)]
    pub rules: BTreeMap<String, Grant>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// Who approved with `scope: session`.
    pub by: String,
    pub confirmation_id: String,
    pub granted_at: u64,
}

impl SessionGrants {
    /// Adds every rule of `risk` under one approval; returns whether anything was new.
    pub fn grant(&mut self, risk: &RiskAssessment, grant: &Grant) -> bool {
        let mut changed = false;
        for finding in &risk.findings {
            if !self.rules.contains_key(&finding.rule) {
                self.rules.insert(finding.rule.clone(), grant.clone());
                changed = true;
            }
        }
        changed
    }

    /// Approves `risk` when every one of its findings is a granted rule. A request without
    /// findings is never covered: there is no rule a person could have meant.
    pub fn covers(&self, risk: &RiskAssessment) -> Option<AutoDecision> {
        let first = risk.findings.first()?;
        if !risk
            .findings
            .iter()
            .all(|f| self.rules.contains_key(&f.rule))
        {
            return None;
        }
        let grant = &self.rules[&first.rule];
        Some(AutoDecision {
            state: ConfirmState::Approved,
            by: format!("session-scope:{}", grant.by),
            reason: format!(
                "rules approved for session {} by confirmation {}",
                self.session_id, grant.confirmation_id
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use messages::risk::{Finding, RiskLevel};

    use super::*;

    fn risk(level: RiskLevel, rules: &[&str]) -> RiskAssessment {
        RiskAssessment {
            level,
            findings: rules
                .iter()
                .map(|r| Finding {
                    rule: r.to_string(),
                    severity: level,
                    description: String::new(),
                    line: None,
                    start: None,
                    end: None,
                    path: None,
                })
                .collect(),
            ..Default::default()
        }
    }

    fn policy(f: impl FnOnce(&mut PolicyConfig)) -> Policy {
        let mut c = PolicyConfig::default();
        f(&mut c);
        Policy::new(c)
    }

    #[test]
    fn by_default_a_person_decides() {
        assert_eq!(
            policy(|_| {}).automatic(&risk(RiskLevel::High, &["r"])),
            None
        );
    }

    #[test]
    fn auto_deny_wins_over_auto_approve() {
        let p = policy(|c| {
            c.auto_approve = true;
            c.auto_deny_levels.insert(RiskLevel::Critical);
        });
        let d = p.automatic(&risk(RiskLevel::Critical, &[])).unwrap();
        assert_eq!(
            (d.state, d.by.as_str()),
            (ConfirmState::Denied, "policy:auto_deny_levels")
        );
        let d = p.automatic(&risk(RiskLevel::High, &[])).unwrap();
        assert_eq!(
            (d.state, d.by.as_str()),
            (ConfirmState::Approved, "policy:auto_approve")
        );
    }

    #[test]
    fn levels_outside_require_levels_are_approved() {
        let p = policy(|c| c.require_levels = [RiskLevel::High].into_iter().collect());
        let d = p.automatic(&risk(RiskLevel::Medium, &[])).unwrap();
        assert_eq!(d.by, "policy:require_levels");
        assert_eq!(p.automatic(&risk(RiskLevel::High, &[])), None);
    }

    #[test]
    fn timeouts_are_bounded_and_deny_by_default() {
        let p = policy(|_| {});
        assert_eq!(p.timeout_for(None).unwrap(), Duration::from_secs(60));
        for out_of_bounds in [0, u64::MAX] {
            assert!(matches!(
                p.timeout_for(Some(out_of_bounds)),
                Err(ValidationError::Invalid { .. })
            ));
        }
        assert_eq!(
            p.on_timeout(Duration::from_secs(1)).state,
            ConfirmState::Timeout
        );
        let lax = policy(|c| c.timeout_action = TimeoutAction::Approve);
        assert_eq!(
            lax.on_timeout(Duration::from_secs(1)).state,
            ConfirmState::Approved
        );
    }

    #[test]
    fn a_session_grant_covers_only_requests_whose_findings_are_all_granted() {
        let mut g = SessionGrants {
            session_id: "s1".into(),
            ..Default::default()
        };
        let grant = Grant {
            by: "alice".into(),
            confirmation_id: "c1".into(),
            granted_at: 1,
        };
        assert!(g.grant(&risk(RiskLevel::High, &["net", "fs"]), &grant));
        assert!(!g.grant(&risk(RiskLevel::High, &["net"]), &grant));
        let d = g.covers(&risk(RiskLevel::High, &["fs"])).unwrap();
        assert_eq!(d.by, "session-scope:alice");
        assert_eq!(g.covers(&risk(RiskLevel::High, &["fs", "exec"])), None);
        assert_eq!(g.covers(&risk(RiskLevel::High, &[])), None);
    }

    #[test]
    fn an_empty_require_levels_approves_every_level_not_denied() {
        let p = policy(|c| {
            c.require_levels.clear();
            c.auto_deny_levels.insert(RiskLevel::Critical);
        });
        for level in [RiskLevel::Safe, RiskLevel::Medium, RiskLevel::High] {
            let d = p.automatic(&risk(level, &["r"])).unwrap();
            assert_eq!(
                (d.state, d.by.as_str()),
                (ConfirmState::Approved, "policy:require_levels")
            );
        }
        let d = p.automatic(&risk(RiskLevel::Critical, &["r"])).unwrap();
        assert_eq!(d.state, ConfirmState::Denied);
    }

    #[test]
    fn a_request_may_ask_for_the_maximum_timeout_but_not_more() {
        let p = policy(|c| c.max_timeout = Duration::from_secs(10));
        assert_eq!(
            p.timeout_for(Some(10_000)).unwrap(),
            Duration::from_secs(10)
        );
        let e = p.timeout_for(Some(10_001)).unwrap_err();
        assert!(
            matches!(&e, ValidationError::Invalid { field, .. } if field == "timeout_ms"),
            "{e:?}"
        );
    }

    #[test]
    fn a_timeout_says_how_long_it_waited_and_who_decided() {
        let d = policy(|_| {}).on_timeout(Duration::from_millis(1500));
        assert_eq!(d.by, "policy:timeout");
        assert!(d.reason.contains("1500 ms"), "{}", d.reason);
        let lax = policy(|c| c.timeout_action = TimeoutAction::Approve);
        assert_eq!(
            lax.on_timeout(Duration::from_millis(1)).by,
            "policy:timeout_action"
        );
    }
}
