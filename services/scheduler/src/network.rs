//! Admitting a requested egress policy: validated (400 naming the
//! bad entry), then clamped by the operator's ceiling `SANDMESH_NETWORK_ALLOW` (403 naming
//! every entry beyond it). The executor receives only the admitted policy.

use messages::exec::ExecRequest;
use messages::network::NetworkPolicy;
use messages::validate::ValidationError;

use crate::error::SchedulerError;

/// The policy a session or execution runs under.
pub fn admit(
    wanted: &NetworkPolicy,
    ceiling: &NetworkPolicy,
) -> Result<NetworkPolicy, SchedulerError> {
    Ok(wanted.clamp(ceiling)?.admitted()?)
}

/// Replaces a request's own policy by its admitted form. A session's executions run under the
/// session's policy, so a request naming a session may not bring one.
pub fn admit_request(req: &mut ExecRequest, ceiling: &NetworkPolicy) -> Result<(), SchedulerError> {
    let Some(wanted) = &req.network else {
        return Ok(());
    };
    if req.session_id.is_some() {
        return Err(ValidationError::Invalid {
            field: "network".into(),
            reason: "a session's network policy is set when it opens (sessions.open); \
                     its executions cannot bring their own"
                .into(),
        }
        .into());
    }
    req.network = Some(admit(wanted, ceiling)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use messages::ErrorKind;
    use serde_json::json;

    fn policy(v: serde_json::Value) -> NetworkPolicy {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn within_the_ceiling_is_admitted_with_its_denials() {
        let ceiling = NetworkPolicy::ceiling("*.example.org !secret.example.org", "").unwrap();
        let admitted = admit(
            &policy(json!({"allow_domains": ["api.example.org"]})),
            &ceiling,
        );
        assert_eq!(
            admitted.unwrap(),
            policy(json!({"allow_domains": ["api.example.org"],
                          "deny_domains": ["secret.example.org"]}))
        );
    }

    #[test]
    fn beyond_the_ceiling_is_403_and_malformed_is_400() {
        let none = NetworkPolicy::default();
        let e = admit(
            &policy(json!({"allow_domains": ["pkgs.example.org"]})),
            &none,
        )
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Denied);
        assert!(
            e.to_string().contains("allow_domains pkgs.example.org"),
            "{e:?}"
        );
        let e = admit(&policy(json!({"allow_domains": ["a..b"]})), &none).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::BadRequest);
        let many = NetworkPolicy {
            allow_domains: (0..65).map(|i| format!("h{i}.org")).collect(),
            ..Default::default()
        };
        let e = admit(&many, &none).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::BadRequest);
        assert!(e.to_string().contains("65 entries"), "{e:?}");
    }

    #[test]
    fn a_session_request_cannot_bring_a_policy() {
        let ceiling = NetworkPolicy::ceiling("*", "").unwrap();
        let mut req = ExecRequest {
            session_id: Some("s1".into()),
            network: Some(policy(json!({"allow_domains": ["pkgs.example.org"]}))),
            ..Default::default()
        };
        let e = admit_request(&mut req, &ceiling).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::BadRequest);
        req.session_id = None;
        admit_request(&mut req, &ceiling).unwrap();
    }
}
