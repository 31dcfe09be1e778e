//! The egress proxy: how a sandbox with a [`NetworkPolicy`] reaches the network
//! (`docs/guide/network.md`).
//!
//! A container keeps `NetworkMode none`. Its creator binds an [`EgressProxy`] on a Unix socket
//! for that container alone and bind-mounts it; inside, the supervisor relays
//! `127.0.0.1:3128` to the socket and sets `HTTP_PROXY`/`HTTPS_PROXY`/`ALL_PROXY`. The socket
//! identifies the container, so no credentials travel. The proxy serves HTTP `CONNECT`
//! (tunnels, e.g. HTTPS) and absolute-URI `http://` requests; nothing else (origin-form → 400).
//!
//! # Decision order (per request)
//! 1. An absolute-URI request whose `Host` header names another host or port, or that has
//!    several, is refused (400): the upstream must serve the host the policy judged.
//! 2. The port must be in the policy's `ports` (80 and 443 by default): `port 22 not allowed`.
//! 3. An IP literal is allowed by an `allow_cidrs` entry, or by `allow_all` when it is public.
//! 4. A name matching `deny_domains` is refused (deny wins): `denied by deny_domains *.x`.
//! 5. The name must match `allow_domains` (exact, or `*.x` for names strictly below `x`) or
//!    the policy must `allow_all`.
//! 6. The proxy resolves the name itself ([`Resolver`]; the system resolver by default) and
//!    checks every answer: loopback, RFC 1918, CGNAT, link-local (with 169.254.169.254),
//!    multicast, broadcast, unspecified, reserved, IPv6 ULA/link-local/site-local and
//!    IPv4-mapped, NAT64 or 6to4 forms of those are refused (`resolves to 10.0.0.5: private
//!    range`) unless an `allow_cidrs` entry holds the address.
//! 7. It dials exactly the address it checked, so DNS rebinding and `/etc/hosts` tricks in the
//!    sandbox change nothing. Redirects are the client's: each new request is judged again.
//!
//! Refusals are 403 with a plain-text body naming the rule. Every decision, allowed or not, is
//! an [`EgressEvent`] for the observer (the embedding service audits it on
//! `sandbox.v1.audit.egress`; this crate does not know NATS), and [`EgressProxy::stats`] counts
//! connections allowed/denied and bytes up/down per container. Request heads are bounded
//! ([`MAX_HEAD_BYTES`], [`MAX_HEADERS`] → 431, a header timeout), as are connections.
//! Dropping or [closing](EgressProxy::close) the proxy ends its connections and removes its
//! socket file.
//!
//! # Limits
//! - Programs that ignore the proxy variables (raw sockets, DNS over UDP, QUIC) have no route
//!   at all: they fail closed, not open.
//! - Domain fronting: inside a CONNECT tunnel the proxy sees no TLS, so a client can ask an
//!   allowed CDN name for another site behind the same CDN.
//! - An allowed domain can still receive exfiltrated data; allow narrowly.
//! - DNS answers are trusted only as far as the checks after them: a resolver can send an
//!   allowed name to any *public* address, never to an internal one without a CIDR.

mod handler;
mod proxy;
mod resolver;
mod rules;
mod stats;

use std::path::PathBuf;

pub use messages::network::NetworkPolicy;
pub use proxy::{EgressProxy, EgressProxyBuilder, MAX_CONNECTIONS, MAX_HEADERS, MAX_HEAD_BYTES};
pub use resolver::{Resolver, StaticResolver, SystemResolver};
pub use rules::{internal_range, EgressRules, Refusal, Target};
pub use stats::{EgressEvent, EgressStats, Observer};

#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    #[error("invalid network policy")]
    Policy(#[source] messages::validate::ValidationError),
    #[error("cannot bind the egress socket {}", path.display())]
    Bind {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}
