//! Preview ports: a TCP port a session's container listens on, reachable from outside through
//! the gateway (`/api/v1/sessions/{id}/ports/{port}/…`) while it is exposed.
//!
//! `ports.{expose,list,unexpose}` keep which ports of a session are exposed (in its record);
//! `ports.connect` opens one byte tunnel to an exposed port. A tunnel is two NATS subjects and
//! a credit window each way ([`TunnelFrame`]): the node holding the container receives on
//! [`crate::Subjects::tunnel_up`] and sends on [`crate::Subjects::tunnel_down`] (one of the
//! tenant's output subjects), and neither side sends more bytes than the other granted, so a
//! slow reader at either end holds at most [`TUNNEL_WINDOW`] bytes in flight.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::tenancy::Tenant;
use crate::validate::{validate_id, ValidationError};

/// How long an exposure lasts when `ttl_ms` is left out.
pub const DEFAULT_EXPOSE_TTL_MS: u64 = 60 * 60 * 1000;
/// The longest an exposure may last (its token is a bearer credential: it should expire).
pub const MAX_EXPOSE_TTL_MS: u64 = 24 * 60 * 60 * 1000;
/// At most this many ports of one session are exposed at once.
pub const MAX_EXPOSED_PORTS: usize = 16;
/// Bytes one side may send before the other grants more: the bound on what a tunnel holds in
/// flight in each direction.
pub const TUNNEL_WINDOW: u64 = 256 * 1024;
/// The largest data frame of a tunnel.
pub const TUNNEL_CHUNK: usize = 32 * 1024;
/// A tunnel that hears nothing from its client this long is closed (the client sends a
/// keepalive credit of 0 bytes at a third of it while idle).
pub const TUNNEL_IDLE_MS: u64 = 90_000;
/// The query parameter and cookie that carry a port's token for a browser.
pub const TOKEN_PARAM: &str = "sandmesh_token";

/// A port the sandbox may listen on: 1..=65535.
pub fn validate_port(port: u32) -> Result<u16, ValidationError> {
    u16::try_from(port)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| ValidationError::invalid("port", "must be 1..=65535"))
}

/// `ports.expose`: makes `port` of the session reachable through the gateway until `ttl_ms`
/// passes (default [`DEFAULT_EXPOSE_TTL_MS`], at most [`MAX_EXPOSE_TTL_MS`]). Exposing an
/// exposed port again renews it with a new token (the old one stops working).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortExpose {
    #[serde(default)]
    pub session_id: String,
    pub port: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
}

impl PortExpose {
    /// The port and lifetime asked for: a port outside 1..=65535 or a `ttl_ms` of 0 or beyond
    /// [`MAX_EXPOSE_TTL_MS`] is refused, not clamped.
    pub fn admit(&self) -> Result<(u16, u64), ValidationError> {
        validate_id("session_id", &self.session_id)?;
        let port = validate_port(self.port)?;
        let ttl = self.ttl_ms.unwrap_or(DEFAULT_EXPOSE_TTL_MS);
        if ttl == 0 || ttl > MAX_EXPOSE_TTL_MS {
            return Err(ValidationError::invalid(
                "ttl_ms",
                format!("must be 1..={MAX_EXPOSE_TTL_MS} milliseconds"),
            ));
        }
        Ok((port, ttl))
    }
}

/// `ports.unexpose` (one port) and `ports.list` (`port` left out).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortRef {
    #[serde(default)]
    pub session_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
}

/// An exposed port as its tenant sees it. `token` is in `expose`'s reply only: it is stored
/// hashed, so `list` cannot show it again.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ExposedPort {
    pub session_id: String,
    pub port: u16,
    /// Where it is reached: the gateway's path (`/api/v1/sessions/{id}/ports/{port}/`); the
    /// gateway answers with an absolute URL.
    pub url: String,
    /// A bearer credential for this port alone (for a browser: the `sandmesh_token` query
    /// parameter or cookie), valid until `expires_at`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// Unix milliseconds.
    pub expires_at: u64,
}

/// `ports.list`'s reply.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PortList {
    pub ports: Vec<ExposedPort>,
}

/// What a session record keeps of one exposed port.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Exposure {
    /// SHA-256 (hex) of the port's token: the token itself is never stored.
    pub token_sha256: String,
    /// Unix milliseconds.
    pub expires_at: u64,
}

/// The exposed ports of a session, by port.
pub type Exposures = BTreeMap<u16, Exposure>;

/// The path under the gateway's API where `port` of `session_id` is reached.
pub fn port_path(session_id: &str, port: u16) -> String {
    format!("/api/v1/sessions/{session_id}/ports/{port}/")
}

/// A port's token: `<tenant>.<64 hex digits>` (`_` for no tenant). The tenant tells the gateway
/// whose connection to check it with; the rest is 256 random bits.
pub fn make_token(tenant: Option<&Tenant>, secret: &[u8; 32]) -> String {
    let mut token = String::with_capacity(80);
    token.push_str(tenant.map_or(NO_TENANT, Tenant::as_str));
    token.push('.');
    for b in secret {
        token.push_str(&format!("{b:02x}"));
    }
    token
}

const NO_TENANT: &str = "_";

/// The tenant a token names (`Ok(None)`: no tenant), or why it is not a token.
pub fn token_tenant(token: &str) -> Result<Option<Tenant>, TokenError> {
    let (tenant, secret) = token.split_once('.').ok_or(TokenError::Malformed)?;
    if secret.len() != 64 || !secret.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(TokenError::Malformed);
    }
    if tenant == NO_TENANT {
        return Ok(None);
    }
    Tenant::new(tenant)
        .map(Some)
        .map_err(|_| TokenError::Malformed)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("not a port token")]
    Malformed,
}

/// `ports.connect`: opens a tunnel to an exposed port. The client picks `tunnel_id` (it
/// subscribes to the tunnel's down subject before asking, so nothing sent is missed); with
/// `token`, the port's token must match (a browser's request), without it the caller's tenant
/// suffices (an API key's).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TunnelConnect {
    #[serde(default)]
    pub session_id: String,
    pub port: u32,
    #[serde(default)]
    pub tunnel_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

impl TunnelConnect {
    pub fn admit(&self) -> Result<u16, ValidationError> {
        validate_id("session_id", &self.session_id)?;
        validate_tunnel_id(&self.tunnel_id)?;
        validate_port(self.port)
    }
}

/// A tunnel id is a subject token: 16..=64 of `[A-Za-z0-9_-]`.
pub fn validate_tunnel_id(id: &str) -> Result<(), ValidationError> {
    if id.len() < 16 {
        return Err(ValidationError::invalid(
            "tunnel_id",
            "must be 16..=64 characters",
        ));
    }
    validate_id("tunnel_id", id)
}

/// Internal: `executor.docker.<node>.tunnel`, the scheduler's order to the node holding the
/// session's container. Ids are scoped; the tenant names the tunnel's subjects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutorTunnel {
    pub session_id: String,
    pub port: u16,
    pub tunnel_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<Tenant>,
}

/// The answer to `ports.connect` (and to `executor.docker.<node>.tunnel`): the tunnel is
/// connected to the port and the node listens on its up subject.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TunnelOpened {
    pub tunnel_id: String,
    /// Where the client sends its frames (the tunnel's up subject, its tenant's name in it).
    #[serde(default)]
    pub up: String,
}

/// The header naming a tunnel message's kind; data frames carry their bytes as the payload.
pub const TUNNEL_KIND_HEADER: &str = "Sandmesh-Tunnel";
/// The header of a `credit` frame: how many more bytes the receiver may be sent.
pub const TUNNEL_CREDIT_HEADER: &str = "Sandmesh-Tunnel-Credit";
/// Every tunnel message counts from 0 in its direction: a gap (a message NATS dropped) ends
/// the tunnel instead of corrupting its stream.
pub const TUNNEL_SEQ_HEADER: &str = "Sandmesh-Tunnel-Seq";

/// One message of a tunnel, in either direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TunnelFrame {
    /// Bytes of the stream, at most [`TUNNEL_CHUNK`].
    Data(Vec<u8>),
    /// The receiver may be sent this many more bytes (0: a keepalive).
    Credit(u64),
    /// The sender will send no more bytes (a half close); the other direction goes on.
    Eof,
    /// The tunnel is over (with why, when it failed).
    Close(String),
}

impl TunnelFrame {
    pub const fn kind(&self) -> &'static str {
        match self {
            TunnelFrame::Data(_) => "data",
            TunnelFrame::Credit(_) => "credit",
            TunnelFrame::Eof => "eof",
            TunnelFrame::Close(_) => "close",
        }
    }

    /// The frame a message's kind header, credit header and payload make.
    pub fn parse(kind: &str, credit: Option<&str>, payload: &[u8]) -> Result<Self, FrameError> {
        Ok(match kind {
            "data" if payload.len() <= TUNNEL_CHUNK => TunnelFrame::Data(payload.to_vec()),
            "data" => return Err(FrameError::TooLarge(payload.len())),
            "credit" => TunnelFrame::Credit(
                credit
                    .and_then(|c| c.parse().ok())
                    .ok_or(FrameError::Credit)?,
            ),
            "eof" => TunnelFrame::Eof,
            "close" => TunnelFrame::Close(String::from_utf8_lossy(payload).into_owned()),
            other => return Err(FrameError::Kind(other.chars().take(32).collect())),
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("a tunnel data frame of {0} bytes (the limit is {TUNNEL_CHUNK})")]
    TooLarge(usize),
    #[error("a credit frame without a number of bytes")]
    Credit,
    #[error("unknown tunnel frame kind {0:?}")]
    Kind(String),
    #[error("tunnel frame {got} arrived where {expected} was due (a message was lost)")]
    Gap { expected: u64, got: u64 },
    #[error("the peer sent {sent} bytes beyond the {granted} it was granted")]
    Overrun { sent: u64, granted: u64 },
}

/// The receiving half's bookkeeping of one direction: sequence numbers in order, and no more
/// bytes than granted. Shared by both ends, so they cannot disagree.
#[derive(Debug, Clone, Default)]
pub struct Inbound {
    next_seq: u64,
    /// Bytes the sender may still send.
    granted: u64,
}

impl Inbound {
    pub fn new(initial_grant: u64) -> Self {
        Self {
            next_seq: 0,
            granted: initial_grant,
        }
    }

    /// Checks one arriving frame against the order and the grant.
    pub fn accept(&mut self, seq: Option<&str>, frame: &TunnelFrame) -> Result<(), FrameError> {
        let got = seq.and_then(|s| s.parse().ok()).unwrap_or(u64::MAX);
        if got != self.next_seq {
            return Err(FrameError::Gap {
                expected: self.next_seq,
                got,
            });
        }
        self.next_seq += 1;
        if let TunnelFrame::Data(bytes) = frame {
            let sent = bytes.len() as u64;
            if sent > self.granted {
                return Err(FrameError::Overrun {
                    sent,
                    granted: self.granted,
                });
            }
            self.granted -= sent;
        }
        Ok(())
    }

    /// The receiver granted `bytes` more.
    pub fn grant(&mut self, bytes: u64) {
        self.granted += bytes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_and_ttls_outside_their_bounds_are_refused() {
        let ok = PortExpose {
            session_id: "s1".into(),
            port: 8000,
            ttl_ms: None,
        };
        assert_eq!(ok.admit().unwrap(), (8000, DEFAULT_EXPOSE_TTL_MS));
        for port in [0, 65536, u32::MAX] {
            assert!(PortExpose { port, ..ok.clone() }.admit().is_err(), "{port}");
        }
        for ttl in [0, MAX_EXPOSE_TTL_MS + 1] {
            let e = PortExpose {
                ttl_ms: Some(ttl),
                ..ok.clone()
            };
            assert!(e.admit().is_err(), "{ttl}");
        }
        let bad_id = PortExpose {
            session_id: "a.b".into(),
            ..ok
        };
        assert!(bad_id.admit().is_err());
    }

    #[test]
    fn a_token_names_its_tenant_and_nothing_else_parses() {
        let tenant = Tenant::new("acme").unwrap();
        let token = make_token(Some(&tenant), &[7; 32]);
        assert_eq!(token_tenant(&token).unwrap(), Some(tenant));
        assert_eq!(token_tenant(&make_token(None, &[1; 32])).unwrap(), None);
        for bad in [
            "",
            "acme",
            "acme.",
            "acme.zz",
            "ACME.00",
            &format!("a-b.{}", "0".repeat(64)),
        ] {
            assert!(token_tenant(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn inbound_refuses_gaps_and_overruns() {
        let mut inbound = Inbound::new(10);
        let data = TunnelFrame::Data(vec![0; 6]);
        inbound.accept(Some("0"), &data).unwrap();
        assert!(matches!(
            inbound.accept(Some("2"), &data),
            Err(FrameError::Gap { expected: 1, .. })
        ));
        assert!(matches!(
            inbound.accept(Some("1"), &data),
            Err(FrameError::Overrun {
                sent: 6,
                granted: 4
            })
        ));
        inbound.grant(6);
        inbound.accept(Some("2"), &data).unwrap();
        assert!(inbound.accept(None, &TunnelFrame::Eof).is_err());
    }

    #[test]
    fn frames_parse_from_their_headers() {
        assert_eq!(
            TunnelFrame::parse("credit", Some("42"), b"").unwrap(),
            TunnelFrame::Credit(42)
        );
        assert!(TunnelFrame::parse("credit", Some("x"), b"").is_err());
        assert!(TunnelFrame::parse("data", None, &vec![0; TUNNEL_CHUNK + 1]).is_err());
        assert!(TunnelFrame::parse("bogus", None, b"").is_err());
        assert_eq!(
            TunnelFrame::parse("close", None, b"gone").unwrap(),
            TunnelFrame::Close("gone".into())
        );
    }
}
