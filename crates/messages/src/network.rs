//! Network egress policy: which hosts a sandbox may reach through its egress proxy
//! (`docs/guide/network.md`). No policy means no network. A requested policy is validated, then
//! clamped by the operator's ceiling (the domains, CIDRs and ports a deployment permits at all).

mod pattern;

use serde::{Deserialize, Serialize};

pub use pattern::{normalize_host, Cidr, CidrError, DomainPattern, PatternError};

use crate::error::ErrorBody;
use crate::validate::ValidationError;

/// Most entries in any one list of a policy.
pub const MAX_POLICY_ENTRIES: usize = 64;
/// Ports reachable when a policy names none.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];

/// A sandbox's egress policy as it travels (on `sessions.open`, on one `ExecRequest`, and as
/// the operator's ceiling). Deny wins over allow; `*.x` matches names strictly below `x`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[serde(deny_unknown_fields)]
pub struct NetworkPolicy {
    /// Names reachable: `api.example.com`, `*.example.org`; bare `*` only with `allow_all`.
    pub allow_domains: Vec<String>,
    /// Names never reachable, even when an allow entry or `allow_all` matches.
    pub deny_domains: Vec<String>,
    /// Address blocks reachable even though they are internal (loopback, private, ...), and IP
    /// literals reachable without a name.
    pub allow_cidrs: Vec<String>,
    /// Every public name not denied.
    pub allow_all: bool,
    /// Destination ports; `None` means [`DEFAULT_PORTS`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<u16>>,
}

/// A validated policy, its entries parsed for matching.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedPolicy {
    pub allow_domains: Vec<DomainPattern>,
    pub deny_domains: Vec<DomainPattern>,
    pub allow_cidrs: Vec<Cidr>,
    pub allow_all: bool,
    pub ports: Vec<u16>,
}

impl NetworkPolicy {
    pub fn validate(&self) -> Result<(), ValidationError> {
        self.parse().map(|_| ())
    }

    /// Validates every entry: domain syntax, at most [`MAX_POLICY_ENTRIES`] per list, no bare
    /// `*` unless `allow_all`, CIDRs and ports well formed.
    pub fn parse(&self) -> Result<ParsedPolicy, ValidationError> {
        let domains = |field: &str, list: &[String]| {
            check_len(field, list.len())?;
            list.iter()
                .enumerate()
                .map(|(i, text)| {
                    let invalid = |reason: String| ValidationError::Invalid {
                        field: format!("network.{field}[{i}]"),
                        reason: format!("{text:?} {reason}"),
                    };
                    match DomainPattern::parse(text) {
                        Ok(DomainPattern::Any) if !self.allow_all => {
                            Err(invalid("(bare `*`) needs allow_all".into()))
                        }
                        Ok(pattern) => Ok(pattern),
                        Err(e) => Err(invalid(e.to_string())),
                    }
                })
                .collect::<Result<Vec<_>, _>>()
        };
        let allow_domains = domains("allow_domains", &self.allow_domains)?;
        let deny_domains = domains("deny_domains", &self.deny_domains)?;
        check_len("allow_cidrs", self.allow_cidrs.len())?;
        let allow_cidrs = self
            .allow_cidrs
            .iter()
            .enumerate()
            .map(|(i, text)| {
                text.parse::<Cidr>().map_err(|e| ValidationError::Invalid {
                    field: format!("network.allow_cidrs[{i}]"),
                    reason: format!("{text:?}: {e}"),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let ports = self.effective_ports();
        check_len("ports", ports.len())?;
        if ports.contains(&0) {
            return Err(ValidationError::Invalid {
                field: "network.ports".into(),
                reason: "port 0 is not a destination".into(),
            });
        }
        Ok(ParsedPolicy {
            allow_domains,
            deny_domains,
            allow_cidrs,
            allow_all: self.allow_all,
            ports,
        })
    }

    fn effective_ports(&self) -> Vec<u16> {
        self.ports.clone().unwrap_or_else(|| DEFAULT_PORTS.to_vec())
    }

    /// This policy narrowed to what `ceiling` permits. Entries outside the ceiling are dropped
    /// and listed in [`Clamped::refused`]; the ceiling's own deny list is added. Both policies
    /// must be valid.
    pub fn clamp(&self, ceiling: &NetworkPolicy) -> Result<Clamped, ValidationError> {
        let wanted = self.parse()?;
        let limit = ceiling.parse()?;
        let mut refused = Vec::new();
        let mut policy = NetworkPolicy {
            deny_domains: self.deny_domains.clone(),
            ..NetworkPolicy::default()
        };
        for (text, pattern) in self.allow_domains.iter().zip(&wanted.allow_domains) {
            if limit.allow_all || limit.allow_domains.iter().any(|c| c.covers(pattern)) {
                policy.allow_domains.push(text.clone());
            } else {
                refused.push(Refusal::new("allow_domains", text));
            }
        }
        for deny in &ceiling.deny_domains {
            if !policy.deny_domains.contains(deny) {
                policy.deny_domains.push(deny.clone());
            }
        }
        for (text, cidr) in self.allow_cidrs.iter().zip(&wanted.allow_cidrs) {
            if limit.allow_cidrs.iter().any(|c| cidr.is_subnet_of(c)) {
                policy.allow_cidrs.push(text.clone());
            } else {
                refused.push(Refusal::new("allow_cidrs", text));
            }
        }
        if self.allow_all {
            if limit.allow_all {
                policy.allow_all = true;
            } else {
                refused.push(Refusal::new("allow_all", "true"));
            }
        }
        let (ports, beyond): (Vec<u16>, Vec<u16>) =
            wanted.ports.iter().partition(|p| limit.ports.contains(p));
        refused.extend(beyond.iter().map(|p| Refusal::new("ports", p)));
        policy.ports = (ports != DEFAULT_PORTS).then_some(ports);
        Ok(Clamped { policy, refused })
    }
}

fn check_len(field: &str, len: usize) -> Result<(), ValidationError> {
    if len > MAX_POLICY_ENTRIES {
        return Err(ValidationError::Invalid {
            field: format!("network.{field}"),
            reason: format!("{len} entries; at most {MAX_POLICY_ENTRIES} are allowed"),
        });
    }
    Ok(())
}

impl NetworkPolicy {
    /// The operator's ceiling from its configuration text: `allow` lists entries separated by
    /// commas or whitespace — a domain pattern (`pkgs.example.org`, `*.example.org`), a CIDR
    /// (`10.0.0.0/8`), `!name` for a denied domain, or `*` for every public name; `ports`
    /// lists the destination ports (empty: [`DEFAULT_PORTS`]). Empty `allow` permits nothing.
    pub fn ceiling(allow: &str, ports: &str) -> Result<Self, ValidationError> {
        let mut policy = NetworkPolicy::default();
        for entry in allow
            .split([',', ' ', '\t', '\n'])
            .filter(|e| !e.is_empty())
        {
            if entry == "*" {
                policy.allow_all = true;
            } else if let Some(denied) = entry.strip_prefix('!') {
                policy.deny_domains.push(denied.to_string());
            } else if entry.contains('/') {
                policy.allow_cidrs.push(entry.to_string());
            } else {
                policy.allow_domains.push(entry.to_string());
            }
        }
        let ports: Vec<&str> = ports.split([',', ' ']).filter(|p| !p.is_empty()).collect();
        if !ports.is_empty() {
            let parsed = ports
                .iter()
                .map(|p| {
                    p.parse::<u16>().map_err(|e| ValidationError::Invalid {
                        field: "network.ports".into(),
                        reason: format!("{p:?}: {e}"),
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            policy.ports = Some(parsed);
        }
        policy.validate()?;
        Ok(policy)
    }
}

/// Most distinct entries in each list of a [`NetworkReport`]; more are counted, not listed.
pub const MAX_REPORTED: usize = 64;

/// What one execution did on the network: the destinations its egress proxy let through and
/// those it refused, each once.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkReport {
    #[serde(default)]
    pub contacted: Vec<Contact>,
    #[serde(default)]
    pub refused: Vec<RefusedContact>,
    /// Decisions beyond [`MAX_REPORTED`] distinct entries, not listed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unlisted: u64,
}

pub(crate) fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Contact {
    pub host: String,
    pub port: u16,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedContact {
    pub host: String,
    pub port: u16,
    /// The rule that refused it (the text of the proxy's 403).
    pub rule: String,
}

impl NetworkReport {
    /// Adds one proxy decision; repeats of a listed destination change nothing.
    pub fn record(&mut self, host: &str, port: u16, allowed: bool, rule: &str) {
        let listed = if allowed {
            self.contacted
                .iter()
                .any(|c| c.host == host && c.port == port)
        } else {
            self.refused
                .iter()
                .any(|r| r.host == host && r.port == port && r.rule == rule)
        };
        if listed {
            return;
        }
        let full = if allowed {
            self.contacted.len()
        } else {
            self.refused.len()
        } >= MAX_REPORTED;
        if full {
            self.unlisted += 1;
        } else if allowed {
            self.contacted.push(Contact {
                host: host.to_string(),
                port,
            });
        } else {
            self.refused.push(RefusedContact {
                host: host.to_string(),
                port,
                rule: rule.to_string(),
            });
        }
    }
}

/// One entry of a requested policy that the ceiling does not permit.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    pub field: String,
    pub entry: String,
}

impl Refusal {
    fn new(field: &str, entry: impl ToString) -> Self {
        Self {
            field: field.to_string(),
            entry: entry.to_string(),
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.field, self.entry)
    }
}

/// A policy after clamping, with what the ceiling refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Clamped {
    pub policy: NetworkPolicy,
    pub refused: Vec<Refusal>,
}

impl Clamped {
    /// The clamped policy when nothing was refused; otherwise the refusal (a 403 to the caller).
    pub fn admitted(self) -> Result<NetworkPolicy, BeyondCeiling> {
        if self.refused.is_empty() {
            Ok(self.policy)
        } else {
            Err(BeyondCeiling {
                refused: self.refused,
            })
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "network policy beyond what this deployment permits: {}",
    list(refused)
)]
pub struct BeyondCeiling {
    pub refused: Vec<Refusal>,
}

fn list(refused: &[Refusal]) -> String {
    refused
        .iter()
        .map(Refusal::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

impl From<BeyondCeiling> for ErrorBody {
    fn from(e: BeyondCeiling) -> Self {
        ErrorBody::denied(e.to_string()).with_details(serde_json::json!({ "refused": e.refused }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(json: serde_json::Value) -> NetworkPolicy {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn every_field_defaults_and_both_encodings_round_trip() {
        assert_eq!(policy(serde_json::json!({})), NetworkPolicy::default());
        let p = policy(serde_json::json!({
            "allow_domains": ["pkgs.example.org", "*.files.example.org"],
            "allow_cidrs": ["127.0.0.1/32"],
            "ports": [443, 8443],
        }));
        let json = serde_json::to_vec(&p).unwrap();
        assert_eq!(serde_json::from_slice::<NetworkPolicy>(&json).unwrap(), p);
        let msgpack = rmp_serde::to_vec_named(&p).unwrap();
        assert_eq!(rmp_serde::from_slice::<NetworkPolicy>(&msgpack).unwrap(), p);
    }

    #[test]
    fn validation_names_the_bad_entry() {
        let err = |p: NetworkPolicy| match p.validate() {
            Err(ValidationError::Invalid { field, reason }) => format!("{field}: {reason}"),
            other => panic!("expected Invalid, got {other:?}"),
        };
        let bare = policy(serde_json::json!({"allow_domains": ["ok.com", "*"]}));
        assert!(err(bare).starts_with("network.allow_domains[1]"));
        assert!(
            policy(serde_json::json!({"allow_domains": ["*"], "allow_all": true}))
                .validate()
                .is_ok()
        );
        let cidr = policy(serde_json::json!({"allow_cidrs": ["10.0.0.0/99"]}));
        assert!(err(cidr).starts_with("network.allow_cidrs[0]"));
        let wild = policy(serde_json::json!({"deny_domains": ["a.*.com"]}));
        assert!(err(wild).starts_with("network.deny_domains[0]"));
        let many = NetworkPolicy {
            allow_domains: (0..65).map(|i| format!("h{i}.com")).collect(),
            ..NetworkPolicy::default()
        };
        assert!(err(many).contains("65 entries"));
        let zero = policy(serde_json::json!({"ports": [0]}));
        assert!(err(zero).starts_with("network.ports"));
    }

    #[test]
    fn clamping_keeps_what_the_ceiling_permits_and_reports_the_rest() {
        let ceiling = policy(serde_json::json!({
            "allow_domains": ["*.example.org", "pkgs.example.org"],
            "deny_domains": ["secret.example.org"],
            "allow_cidrs": ["10.0.0.0/8"],
        }));
        let wanted = policy(serde_json::json!({
            "allow_domains": ["api.example.org", "*.a.example.org", "evil.com", "pkgs.example.org"],
            "allow_cidrs": ["10.1.0.0/16", "192.168.0.0/16"],
            "allow_all": true,
            "ports": [443, 22],
        }));
        let clamped = wanted.clamp(&ceiling).unwrap();
        assert_eq!(
            clamped.policy,
            policy(serde_json::json!({
                "allow_domains": ["api.example.org", "*.a.example.org", "pkgs.example.org"],
                "deny_domains": ["secret.example.org"],
                "allow_cidrs": ["10.1.0.0/16"],
                "ports": [443],
            }))
        );
        let refused: Vec<String> = clamped.refused.iter().map(Refusal::to_string).collect();
        assert_eq!(
            refused,
            [
                "allow_domains evil.com",
                "allow_cidrs 192.168.0.0/16",
                "allow_all true",
                "ports 22"
            ]
        );
        let body = ErrorBody::from(clamped.admitted().unwrap_err());
        assert_eq!(body.code, 403);
        assert!(body.message.contains("allow_domains evil.com"));
    }

    #[test]
    fn a_policy_within_the_ceiling_is_admitted_unchanged() {
        let ceiling = policy(serde_json::json!({"allow_all": true, "allow_domains": ["*"]}));
        let wanted = policy(serde_json::json!({"allow_domains": ["pkgs.example.org"]}));
        assert_eq!(wanted.clamp(&ceiling).unwrap().admitted(), Ok(wanted));
        let nothing = NetworkPolicy::default();
        let refused = policy(serde_json::json!({"allow_domains": ["pkgs.example.org"]}))
            .clamp(&nothing)
            .unwrap()
            .refused;
        assert_eq!(refused, [Refusal::new("allow_domains", "pkgs.example.org")]);
    }

    #[test]
    fn a_ceiling_is_read_from_its_configuration_text() {
        let c = NetworkPolicy::ceiling(
            "pkgs.example.org, *.files.example.org !evil.files.example.org 127.0.0.1/32",
            "443,8080",
        )
        .unwrap();
        assert_eq!(
            c,
            policy(serde_json::json!({
                "allow_domains": ["pkgs.example.org", "*.files.example.org"],
                "deny_domains": ["evil.files.example.org"],
                "allow_cidrs": ["127.0.0.1/32"],
                "ports": [443, 8080],
            }))
        );
        assert_eq!(
            NetworkPolicy::ceiling("", "").unwrap(),
            NetworkPolicy::default()
        );
        assert!(NetworkPolicy::ceiling("*", "").unwrap().allow_all);
        assert!(NetworkPolicy::ceiling("bad..name", "").is_err());
        assert!(NetworkPolicy::ceiling("a.com", "http").is_err());
        assert!(NetworkPolicy::ceiling("a.com", "0").is_err());
    }

    #[test]
    fn a_report_lists_each_destination_once_and_counts_past_its_bound() {
        let mut r = NetworkReport::default();
        r.record(
            "pkgs.example.org",
            443,
            true,
            "allowed by allow_domains pkgs.example.org",
        );
        r.record(
            "pkgs.example.org",
            443,
            true,
            "allowed by allow_domains pkgs.example.org",
        );
        r.record("evil.com", 443, false, "evil.com is not in allow_domains");
        r.record("evil.com", 443, false, "evil.com is not in allow_domains");
        assert_eq!(r.contacted.len(), 1);
        assert_eq!(r.refused.len(), 1);
        for i in 0..MAX_REPORTED + 3 {
            r.record(&format!("h{i}.com"), 80, false, "no");
        }
        assert_eq!(r.refused.len(), MAX_REPORTED);
        assert_eq!(r.unlisted, 4);
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(
            json["contacted"][0],
            serde_json::json!({"host": "pkgs.example.org", "port": 443})
        );
    }
}
