//! The two kinds of policy entry: domain patterns (`api.example.com`, `*.example.org`) and CIDR
//! blocks (`127.0.0.1/32`), parsed once so matching never re-reads text.

use std::fmt;
use std::net::{AddrParseError, IpAddr};
use std::str::FromStr;

/// Longest domain name DNS can carry (RFC 1035, without the trailing dot).
const MAX_DOMAIN_LEN: usize = 253;
const MAX_LABEL_LEN: usize = 63;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("empty domain")]
    Empty,
    #[error("longer than {MAX_DOMAIN_LEN} characters")]
    TooLong,
    #[error("`*` is only allowed as a whole leading label (`*.example.com`)")]
    MisplacedWildcard,
    #[error("is an IP address; put addresses in allow_cidrs")]
    IpAddress,
    #[error("label {label:?}: {reason}")]
    BadLabel { label: String, reason: &'static str },
}

/// A domain entry of a policy. Matching is case-insensitive and ignores one trailing dot.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DomainPattern {
    /// Bare `*`: every name (only meaningful with `allow_all`).
    Any,
    /// Exactly this name.
    Exact(String),
    /// `*.suffix`: every name strictly below `suffix`, not `suffix` itself.
    Subdomains(String),
}

impl DomainPattern {
    pub fn parse(text: &str) -> Result<Self, PatternError> {
        if text == "*" {
            return Ok(DomainPattern::Any);
        }
        match text.strip_prefix("*.") {
            Some(suffix) => Ok(DomainPattern::Subdomains(parse_domain(suffix)?)),
            None => Ok(DomainPattern::Exact(parse_domain(text)?)),
        }
    }

    /// Whether `host` (a name as a client sent it) falls under this pattern.
    pub fn matches(&self, host: &str) -> bool {
        let host = normalize_host(host);
        match self {
            DomainPattern::Any => true,
            DomainPattern::Exact(name) => host == *name,
            DomainPattern::Subdomains(suffix) => is_strictly_below(&host, suffix),
        }
    }

    /// Whether every name `other` matches is also matched by `self` (used to clamp a policy
    /// by an operator ceiling).
    pub fn covers(&self, other: &DomainPattern) -> bool {
        match (self, other) {
            (DomainPattern::Any, _) => true,
            (_, DomainPattern::Any) => false,
            (DomainPattern::Exact(a), DomainPattern::Exact(b)) => a == b,
            (DomainPattern::Exact(_), DomainPattern::Subdomains(_)) => false,
            (DomainPattern::Subdomains(a), DomainPattern::Exact(b)) => is_strictly_below(b, a),
            (DomainPattern::Subdomains(a), DomainPattern::Subdomains(b)) => {
                a == b || is_strictly_below(b, a)
            }
        }
    }
}

impl fmt::Display for DomainPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DomainPattern::Any => f.write_str("*"),
            DomainPattern::Exact(name) => f.write_str(name),
            DomainPattern::Subdomains(suffix) => write!(f, "*.{suffix}"),
        }
    }
}

/// Lower case, without one trailing dot: the form patterns are stored in.
pub fn normalize_host(host: &str) -> String {
    host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase()
}

fn is_strictly_below(host: &str, suffix: &str) -> bool {
    host.len() > suffix.len() + 1
        && host.ends_with(suffix)
        && host.as_bytes()[host.len() - suffix.len() - 1] == b'.'
}

/// A host name: dot-separated labels of letters, digits and inner hyphens (RFC 1123).
fn parse_domain(text: &str) -> Result<String, PatternError> {
    let name = normalize_host(text);
    if name.is_empty() {
        return Err(PatternError::Empty);
    }
    if name.len() > MAX_DOMAIN_LEN {
        return Err(PatternError::TooLong);
    }
    if name.parse::<IpAddr>().is_ok() {
        return Err(PatternError::IpAddress);
    }
    for label in name.split('.') {
        let bad = |reason| {
            Err(PatternError::BadLabel {
                label: label.to_string(),
                reason,
            })
        };
        if label.contains('*') {
            return Err(PatternError::MisplacedWildcard);
        }
        if label.is_empty() {
            return bad("empty label");
        }
        if label.len() > MAX_LABEL_LEN {
            return bad("longer than 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return bad("only letters, digits and '-' are allowed");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return bad("must not start or end with '-'");
        }
    }
    Ok(name)
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    #[error("bad address")]
    Address(#[source] AddrParseError),
    #[error("prefix {0:?} is not a number from 0 to the address width")]
    Prefix(String),
    #[error("has bits set after the /{prefix} prefix (did you mean {network}/{prefix}?)")]
    HostBits { network: IpAddr, prefix: u8 },
}

/// An address block, `address/prefix`; a bare address means the single address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Whether `addr` is inside; an IPv4-mapped IPv6 address counts as its IPv4 address.
    pub fn contains(&self, addr: IpAddr) -> bool {
        match (self.network, addr.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(a)) => {
                let mask = mask_bits(self.prefix, 32) as u32;
                u32::from(a) & mask == u32::from(net)
            }
            (IpAddr::V6(net), IpAddr::V6(a)) => {
                u128::from(a) & mask_bits(self.prefix, 128) == u128::from(net)
            }
            _ => false,
        }
    }

    pub fn is_subnet_of(&self, other: &Cidr) -> bool {
        self.prefix >= other.prefix && other.contains(self.network)
    }
}

/// The top `prefix` bits of a `width`-bit address set.
fn mask_bits(prefix: u8, width: u8) -> u128 {
    match prefix {
        0 => 0,
        p => (u128::MAX << (128 - u32::from(p))) >> (128 - u32::from(width)),
    }
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(text: &str) -> Result<Self, CidrError> {
        let (addr, prefix) = match text.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (text, None),
        };
        let network: IpAddr = addr.parse().map_err(CidrError::Address)?;
        let width = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => width,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= width)
                .ok_or_else(|| CidrError::Prefix(p.to_string()))?,
        };
        let masked = Cidr { network, prefix };
        let canonical = match network {
            IpAddr::V4(a) => {
                IpAddr::from((u32::from(a) & mask_bits(prefix, 32) as u32).to_be_bytes())
            }
            IpAddr::V6(a) => IpAddr::from((u128::from(a) & mask_bits(prefix, 128)).to_be_bytes()),
        };
        if canonical != network {
            return Err(CidrError::HostBits {
                network: canonical,
                prefix,
            });
        }
        Ok(masked)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pattern(text: &str) -> DomainPattern {
        DomainPattern::parse(text).unwrap()
    }

    #[test]
    fn exact_and_wildcard_matching() {
        assert!(pattern("api.example.com").matches("API.Example.com."));
        assert!(!pattern("api.example.com").matches("x.api.example.com"));
        assert!(pattern("*.example.org").matches("a.b.example.org"));
        assert!(!pattern("*.example.org").matches("example.org"));
        assert!(!pattern("*.example.org").matches("badexample.org"));
        assert!(pattern("*").matches("anything.at.all"));
    }

    #[test]
    fn bad_domains_are_refused_with_the_reason() {
        assert_eq!(DomainPattern::parse(""), Err(PatternError::Empty));
        assert_eq!(
            DomainPattern::parse("a.*.com"),
            Err(PatternError::MisplacedWildcard)
        );
        assert_eq!(
            DomainPattern::parse("*x.com"),
            Err(PatternError::MisplacedWildcard)
        );
        assert_eq!(
            DomainPattern::parse("10.0.0.1"),
            Err(PatternError::IpAddress)
        );
        assert!(matches!(
            DomainPattern::parse("-a.com"),
            Err(PatternError::BadLabel { .. })
        ));
        assert!(matches!(
            DomainPattern::parse("a..com"),
            Err(PatternError::BadLabel { .. })
        ));
        assert!(matches!(
            DomainPattern::parse("a_b.com"),
            Err(PatternError::BadLabel { .. })
        ));
        assert_eq!(
            DomainPattern::parse(&"a.".repeat(130)),
            Err(PatternError::TooLong)
        );
    }

    #[test]
    fn cidrs_parse_contain_and_nest() {
        let net: Cidr = "10.0.0.0/8".parse().unwrap();
        assert!(net.contains("10.1.2.3".parse().unwrap()));
        assert!(net.contains("::ffff:10.1.2.3".parse().unwrap()));
        assert!(!net.contains("11.0.0.1".parse().unwrap()));
        let one: Cidr = "127.0.0.1".parse().unwrap();
        assert_eq!(one.to_string(), "127.0.0.1/32");
        assert!("10.2.0.0/16".parse::<Cidr>().unwrap().is_subnet_of(&net));
        assert!(!net.is_subnet_of(&"10.2.0.0/16".parse().unwrap()));
        let any: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(any.contains("8.8.8.8".parse().unwrap()));
        assert!(!any.contains("::1".parse().unwrap()));
        assert!("fd00::/8"
            .parse::<Cidr>()
            .unwrap()
            .contains("fd12::1".parse().unwrap()));
        assert!(matches!(
            "10.0.0.5/8".parse::<Cidr>(),
            Err(CidrError::HostBits { prefix: 8, .. })
        ));
        assert!(matches!(
            "10.0.0.0/33".parse::<Cidr>(),
            Err(CidrError::Prefix(_))
        ));
        assert!(matches!(
            "ten/8".parse::<Cidr>(),
            Err(CidrError::Address(_))
        ));
    }

    fn label() -> impl Strategy<Value = String> {
        "[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?"
    }

    fn domain() -> impl Strategy<Value = String> {
        prop::collection::vec(label(), 1..4).prop_map(|labels| labels.join(".") + ".test")
    }

    proptest! {
        #[test]
        fn parsing_arbitrary_text_never_panics(text in ".{0,300}") {
            let _ = DomainPattern::parse(&text);
            let _ = text.parse::<Cidr>();
        }

        #[test]
        fn a_wildcard_matches_every_subdomain_but_not_itself(d in domain(), l in label()) {
            let wildcard = pattern(&format!("*.{d}"));
            let below = format!("{l}.{d}");
            prop_assert!(wildcard.matches(&below));
            prop_assert!(!wildcard.matches(&d));
        }

        #[test]
        fn an_exact_name_matches_only_itself(d in domain(), other in domain()) {
            prop_assert!(pattern(&d).matches(&d.to_uppercase()));
            prop_assert_eq!(pattern(&d).matches(&other), d == other);
        }

        #[test]
        fn covering_implies_matching(base in domain(), q_extra in prop::option::of(label()),
                                     host_extra in prop::option::of(label()),
                                     pw in any::<bool>(), qw in any::<bool>()) {
            // q and the host are built below p's name so that coverage actually happens.
            let below = |extra: Option<String>, name: &str| match extra {
                Some(l) => format!("{l}.{name}"),
                None => name.to_string(),
            };
            let q_name = below(q_extra, &base);
            let host = below(host_extra, &q_name);
            let p = pattern(&if pw { format!("*.{base}") } else { base.clone() });
            let q = pattern(&if qw { format!("*.{q_name}") } else { q_name });
            if p.covers(&q) && q.matches(&host) {
                prop_assert!(p.matches(&host));
            }
            prop_assert!(p.covers(&p));
            prop_assert!(DomainPattern::Any.covers(&p) && !p.covers(&DomainPattern::Any));
        }

        #[test]
        fn a_matched_name_ends_with_the_pattern(d in domain(), host in domain()) {
            if pattern(&format!("*.{d}")).matches(&host) {
                let suffix = format!(".{d}");
                prop_assert!(host.ends_with(&suffix));
            }
        }

        #[test]
        fn a_cidr_contains_its_network_and_nests_in_shorter_prefixes(
            a in any::<u32>(), p in 0u8..=32, q in 0u8..=32
        ) {
            let (long, short) = (p.max(q), p.min(q));
            let net = |prefix: u8| -> Cidr {
                let bits = a & mask_bits(prefix, 32) as u32;
                format!("{}/{prefix}", std::net::Ipv4Addr::from(bits)).parse().unwrap()
            };
            prop_assert!(net(long).contains(std::net::Ipv4Addr::from(a).into()));
            prop_assert!(net(long).is_subnet_of(&net(short)));
        }
    }
}
