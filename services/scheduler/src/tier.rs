//! Where an execution runs (`docs/architecture.md#tiers`): the tier the risk policy requires under
//! the configured `SecurityMode`, raised by a session and by a client asking for stricter
//! isolation, never lowered.

use std::str::FromStr;

use messages::exec::{Tier, TierChoice};
use messages::executor::Backend;
use messages::risk::RiskLevel;

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

/// `SANDMESH_EPHEMERAL_BACKEND`: where light work (tier `ephemeral`, no session, assessed
/// SAFE) runs. Everything else runs in Docker whatever this says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EphemeralBackend {
    /// A bubblewrap node when one offers the backend (heartbeat), Docker otherwise.
    #[default]
    Auto,
    /// Bubblewrap only: light work fails as unavailable while no bwrap node runs.
    Bwrap,
    /// Docker only (the light backend is ignored).
    Docker,
}

impl FromStr for EphemeralBackend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "bwrap" => Ok(Self::Bwrap),
            "docker" => Ok(Self::Docker),
            other => Err(format!(
                "unknown ephemeral backend {other:?}; expected auto, bwrap or docker"
            )),
        }
    }
}

/// The light backend to try first for this work, if any: single-use work without a session
/// whose code the assessor found SAFE (a sandbox keeps no state, and anything riskier gets a
/// container).
pub fn light_backend(
    choice: EphemeralBackend,
    tier: Tier,
    risk: RiskLevel,
    has_session: bool,
) -> Option<Backend> {
    let light = tier == Tier::Ephemeral && risk == RiskLevel::Safe && !has_session;
    (light && choice != EphemeralBackend::Docker).then_some(Backend::Bwrap)
}

#[cfg(test)]
mod tests {
    use super::*;
    use messages::risk::{RiskAssessment, SecurityMode};

    #[test]
    fn only_safe_session_less_ephemeral_work_is_light() {
        let auto = EphemeralBackend::Auto;
        assert_eq!(
            light_backend(auto, Tier::Ephemeral, RiskLevel::Safe, false),
            Some(Backend::Bwrap)
        );
        assert_eq!(
            light_backend(auto, Tier::Ephemeral, RiskLevel::Low, false),
            None
        );
        assert_eq!(
            light_backend(auto, Tier::Ephemeral, RiskLevel::Safe, true),
            None
        );
        assert_eq!(
            light_backend(auto, Tier::Session, RiskLevel::Safe, false),
            None
        );
        assert_eq!(
            light_backend(
                EphemeralBackend::Docker,
                Tier::Ephemeral,
                RiskLevel::Safe,
                false
            ),
            None
        );
        assert_eq!("bwrap".parse(), Ok(EphemeralBackend::Bwrap));
        assert!("podman".parse::<EphemeralBackend>().is_err());
    }

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
