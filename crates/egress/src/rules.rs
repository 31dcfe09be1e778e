//! The policy decision, pure: first the port, then the host name (deny wins, then allow), then
//! every resolved address (internal ranges refused unless an allowed CIDR holds them).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use messages::network::{normalize_host, Cidr, DomainPattern, NetworkPolicy, ParsedPolicy};
use messages::validate::ValidationError;

/// Why a destination is refused; the text is the 403 body and the audit rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("port {0} not allowed")]
    Port(u16),
    #[error("denied by deny_domains {0}")]
    DeniedDomain(DomainPattern),
    #[error("{0} is not in allow_domains")]
    NotAllowedDomain(String),
    #[error("{0} is not in allow_cidrs")]
    NotAllowedAddress(IpAddr),
    #[error("resolves to {ip}: {range}")]
    ResolvesInternal { ip: IpAddr, range: &'static str },
    #[error("{ip}: {range}")]
    InternalAddress { ip: IpAddr, range: &'static str },
}

/// A destination that passed the name checks: what to dial next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A name to resolve; `rule` says which entry allowed it.
    Name { host: String, rule: String },
    /// An IP literal, already checked.
    Address { ip: IpAddr, rule: String },
}

/// One container's policy, parsed for decisions.
#[derive(Debug, Clone)]
pub struct EgressRules {
    policy: ParsedPolicy,
}

impl EgressRules {
    pub fn new(policy: &NetworkPolicy) -> Result<Self, ValidationError> {
        Ok(Self {
            policy: policy.parse()?,
        })
    }

    /// The checks that need no DNS: port, deny list, allow list (or allow_cidrs for an IP
    /// literal, which also passes the internal-range check here).
    pub fn check_target(&self, host: &str, port: u16) -> Result<Target, Refusal> {
        if !self.policy.ports.contains(&port) {
            return Err(Refusal::Port(port));
        }
        let literal = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = literal.parse::<IpAddr>() {
            let ip = ip.to_canonical();
            if let Some(cidr) = self.allowing_cidr(ip) {
                return Ok(Target::Address {
                    ip,
                    rule: format!("allowed by allow_cidrs {cidr}"),
                });
            }
            if !self.policy.allow_all {
                return Err(Refusal::NotAllowedAddress(ip));
            }
            if let Some(range) = internal_range(ip) {
                return Err(Refusal::InternalAddress { ip, range });
            }
            return Ok(Target::Address {
                ip,
                rule: "allowed by allow_all".into(),
            });
        }
        let host = normalize_host(host);
        if let Some(deny) = self.policy.deny_domains.iter().find(|p| p.matches(&host)) {
            return Err(Refusal::DeniedDomain(deny.clone()));
        }
        let rule = match self.policy.allow_domains.iter().find(|p| p.matches(&host)) {
            Some(allow) => format!("allowed by allow_domains {allow}"),
            None if self.policy.allow_all => "allowed by allow_all".to_string(),
            None => return Err(Refusal::NotAllowedDomain(host)),
        };
        Ok(Target::Name { host, rule })
    }

    /// A resolved address of an allowed name: internal ranges only through an allowed CIDR.
    /// Returns the CIDR rule that let an internal address through, if one did.
    pub fn check_resolved(&self, ip: IpAddr) -> Result<Option<String>, Refusal> {
        let ip = ip.to_canonical();
        match (internal_range(ip), self.allowing_cidr(ip)) {
            (None, _) => Ok(None),
            (Some(_), Some(cidr)) => Ok(Some(format!("allow_cidrs {cidr}"))),
            (Some(range), None) => Err(Refusal::ResolvesInternal { ip, range }),
        }
    }

    fn allowing_cidr(&self, ip: IpAddr) -> Option<&Cidr> {
        self.policy.allow_cidrs.iter().find(|c| c.contains(ip))
    }
}

/// The range an address belongs to when it is not a public unicast address; `None` for public.
pub fn internal_range(ip: IpAddr) -> Option<&'static str> {
    match ip.to_canonical() {
        IpAddr::V4(v4) => v4_range(v4),
        IpAddr::V6(v6) => v6_range(v6),
    }
}

fn v4_range(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    Some(match () {
        _ if ip.is_unspecified() || a == 0 => "unspecified",
        _ if ip.is_loopback() => "loopback",
        _ if ip.is_private() => "private range",
        _ if a == 100 && (64..128).contains(&b) => "shared address space (CGNAT)",
        _ if ip == Ipv4Addr::new(169, 254, 169, 254) => "link-local (cloud metadata)",
        _ if ip.is_link_local() => "link-local",
        _ if ip.is_broadcast() => "broadcast",
        _ if ip.is_multicast() => "multicast",
        _ if a >= 240 => "reserved range",
        _ if ip.is_documentation() => "documentation range",
        _ if a == 198 && (b == 18 || b == 19) => "benchmarking range",
        _ if a == 192 && b == 0 && c == 0 => "IETF protocol range",
        _ => return None,
    })
}

fn v6_range(ip: Ipv6Addr) -> Option<&'static str> {
    let segments = ip.segments();
    // NAT64 (64:ff9b::/96) and 6to4 (2002::/16) carry an IPv4 address a gateway may reach.
    let embedded = |bits: u32| Ipv4Addr::from(bits);
    let bits = u128::from(ip);
    Some(match () {
        _ if ip.is_unspecified() => "unspecified",
        _ if ip.is_loopback() => "loopback",
        _ if bits >> 32 == 0 => "IPv4-compatible (deprecated)",
        _ if ip.is_unique_local() => "unique local (IPv6 ULA)",
        _ if ip.is_unicast_link_local() => "link-local",
        _ if segments[0] & 0xffc0 == 0xfec0 => "site-local (deprecated)",
        _ if ip.is_multicast() => "multicast",
        _ if segments[0] == 0x2001 && segments[1] == 0x0db8 => "documentation range",
        _ if bits >> 32 == 0x0064_ff9b_0000_0000_0000_0000 => {
            return v4_range(embedded(bits as u32)).map(|_| "NAT64 of an internal IPv4 address")
        }
        _ if segments[0] == 0x2002 => {
            return v4_range(embedded((bits >> 80) as u32))
                .map(|_| "6to4 of an internal IPv4 address")
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rules(json: serde_json::Value) -> EgressRules {
        EgressRules::new(&serde_json::from_value(json).unwrap()).unwrap()
    }

    #[test]
    fn deny_wins_over_allow_and_over_allow_all() {
        let r = rules(
            json!({"allow_domains": ["*.example.com"], "deny_domains": ["secret.example.com"], "allow_all": true}),
        );
        assert_eq!(
            r.check_target("SECRET.example.com.", 443),
            Err(Refusal::DeniedDomain(DomainPattern::Exact(
                "secret.example.com".into()
            )))
        );
        assert!(matches!(
            r.check_target("api.example.com", 443),
            Ok(Target::Name { rule, .. }) if rule == "allowed by allow_domains *.example.com"
        ));
        assert!(matches!(
            r.check_target("other.org", 80),
            Ok(Target::Name { rule, .. }) if rule == "allowed by allow_all"
        ));
    }

    #[test]
    fn ports_default_to_80_and_443() {
        let r = rules(json!({"allow_domains": ["a.com"]}));
        assert_eq!(r.check_target("a.com", 22), Err(Refusal::Port(22)));
        assert!(r.check_target("a.com", 80).is_ok());
        let r = rules(json!({"allow_domains": ["a.com"], "ports": [8443]}));
        assert_eq!(r.check_target("a.com", 443), Err(Refusal::Port(443)));
        assert!(r.check_target("a.com", 8443).is_ok());
    }

    #[test]
    fn ip_literals_need_a_cidr_or_allow_all_and_a_public_address() {
        let r = rules(json!({"allow_domains": ["a.com"], "allow_cidrs": ["127.0.0.1/32"]}));
        assert!(r.check_target("127.0.0.1", 80).is_ok());
        assert_eq!(
            r.check_target("8.8.8.8", 80),
            Err(Refusal::NotAllowedAddress("8.8.8.8".parse().unwrap()))
        );
        let all = rules(json!({"allow_all": true}));
        assert!(all.check_target("[2606:4700::1111]", 443).is_ok());
        assert!(matches!(
            all.check_target("[::ffff:169.254.169.254]", 80),
            Err(Refusal::InternalAddress {
                range: "link-local (cloud metadata)",
                ..
            })
        ));
    }

    #[test]
    fn resolved_internal_addresses_are_refused_unless_a_cidr_allows_them() {
        let r = rules(json!({"allow_domains": ["a.com"], "allow_cidrs": ["127.0.0.1/32"]}));
        let check = |ip: &str| r.check_resolved(ip.parse().unwrap());
        assert_eq!(check("93.184.216.34"), Ok(None));
        assert_eq!(
            check("127.0.0.1"),
            Ok(Some("allow_cidrs 127.0.0.1/32".into()))
        );
        assert_eq!(
            check("127.0.0.2").unwrap_err().to_string(),
            "resolves to 127.0.0.2: loopback"
        );
        assert_eq!(
            check("10.0.0.5").unwrap_err().to_string(),
            "resolves to 10.0.0.5: private range"
        );
    }

    #[test]
    fn every_internal_range_is_named() {
        let cases = [
            ("0.0.0.0", "unspecified"),
            ("127.1.2.3", "loopback"),
            ("10.0.0.1", "private range"),
            ("172.16.0.1", "private range"),
            ("192.168.1.1", "private range"),
            ("100.64.0.1", "shared address space (CGNAT)"),
            ("169.254.169.254", "link-local (cloud metadata)"),
            ("169.254.1.1", "link-local"),
            ("224.0.0.1", "multicast"),
            ("255.255.255.255", "broadcast"),
            ("240.0.0.1", "reserved range"),
            ("::", "unspecified"),
            ("::1", "loopback"),
            ("::ffff:10.0.0.1", "private range"),
            ("::10.0.0.1", "IPv4-compatible (deprecated)"),
            ("fd00:ec2::254", "unique local (IPv6 ULA)"),
            ("fe80::1", "link-local"),
            ("ff02::1", "multicast"),
            ("64:ff9b::a9fe:a9fe", "NAT64 of an internal IPv4 address"),
            ("2002:0a00:0001::1", "6to4 of an internal IPv4 address"),
        ];
        for (ip, range) in cases {
            assert_eq!(internal_range(ip.parse().unwrap()), Some(range), "{ip}");
        }
        for public in [
            "8.8.8.8",
            "100.128.0.1",
            "2606:4700::1111",
            "64:ff9b::808:808",
        ] {
            assert_eq!(internal_range(public.parse().unwrap()), None, "{public}");
        }
    }
}
