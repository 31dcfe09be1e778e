//! Where an execution runs (DESIGN.md §1 "Tiers"): the tier the risk policy requires under the
//! configured `SecurityMode`, raised by a session and by a client asking for stricter isolation,
//! never lowered.

use messages::exec::{Tier, TierChoice};

/// The tier the execution gets: the required one, at least `session` when it belongs to a
/// session (its container holds the session's state), and the client's choice when stricter.
pub fn decide_tier(required: Tier, choice: TierChoice, has_session: bool) -> Tier {
    if required == Tier::Reject {
        return Tier::Reject;
    }
    let asked = match choice {
        TierChoice::Auto | TierChoice::Ephemeral => Tier::Ephemeral,
        TierChoice::Session => Tier::Session,
        TierChoice::Aio => Tier::Aio,
    };
    let floor = if has_session {
        required.max(Tier::Session)
    } else {
        required
    };
    floor.max(asked)
}

#[cfg(test)]
mod tests {
    use super::*;
    use messages::risk::{RiskAssessment, RiskLevel, SecurityMode};

    fn risk(level: RiskLevel, suggested: Tier) -> RiskAssessment {
        RiskAssessment {
            level,
            suggested_tier: suggested,
            ..Default::default()
        }
    }

    #[test]
    fn reject_wins_in_every_mode_and_for_every_choice() {
        for mode in [SecurityMode::Strict, SecurityMode::Permissive] {
            let r = risk(RiskLevel::Critical, Tier::Reject).required_tier(mode);
            assert_eq!(r, Tier::Reject);
            for choice in [TierChoice::Auto, TierChoice::Session, TierChoice::Aio] {
                assert_eq!(decide_tier(r, choice, true), Tier::Reject);
            }
        }
    }

    #[test]
    fn strict_raises_anything_not_safe_to_session() {
        let strict = SecurityMode::Strict;
        assert_eq!(
            risk(RiskLevel::Safe, Tier::Ephemeral).required_tier(strict),
            Tier::Ephemeral
        );
        for level in [RiskLevel::Low, RiskLevel::Medium, RiskLevel::High] {
            assert_eq!(
                risk(level, Tier::Ephemeral).required_tier(strict),
                Tier::Session
            );
        }
        assert_eq!(
            risk(RiskLevel::High, Tier::Aio).required_tier(strict),
            Tier::Aio
        );
    }

    #[test]
    fn permissive_follows_the_suggestion() {
        let r = risk(RiskLevel::Medium, Tier::Ephemeral).required_tier(SecurityMode::Permissive);
        assert_eq!(r, Tier::Ephemeral);
    }

    #[test]
    fn clients_may_tighten_but_never_loosen() {
        assert_eq!(
            decide_tier(Tier::Ephemeral, TierChoice::Session, false),
            Tier::Session
        );
        assert_eq!(
            decide_tier(Tier::Session, TierChoice::Ephemeral, false),
            Tier::Session
        );
        assert_eq!(decide_tier(Tier::Aio, TierChoice::Auto, false), Tier::Aio);
    }

    #[test]
    fn a_session_forces_at_least_the_session_tier() {
        assert_eq!(
            decide_tier(Tier::Ephemeral, TierChoice::Auto, true),
            Tier::Session
        );
        assert_eq!(
            decide_tier(Tier::Ephemeral, TierChoice::Ephemeral, true),
            Tier::Session
        );
        assert_eq!(decide_tier(Tier::Aio, TierChoice::Auto, true), Tier::Aio);
    }
}
