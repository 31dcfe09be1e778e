//! Who is calling: tenants are NATS accounts, and a service learns the
//! caller only from the `Nats-Request-Info` header that the server stamps on every request that
//! crosses an account boundary through a service import with `share: true`. Nothing the caller
//! writes (a body field, a header of its own) changes who it is: the server replaces a forged
//! `Nats-Request-Info`, and a request without one came from inside the `SANDBOX` account
//! (another service, or an open server started with `--insecure`).
//!
//! Tenants never see each other's ids: an id an agent names (session, execution) is *scoped*
//! by its tenant before it is stored or looked up (`acme` + `s1` → `acme-s1`), so tenant B asking
//! for A's `s1` looks up `b-s1` and finds nothing — a 404, the same answer as for an id that was
//! never used, so ids cannot be probed. Tenant names have no `-`, which makes the scoped form
//! unambiguous. Internal callers pass scoped ids on verbatim.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::validate::{validate_id, ValidationError};
use crate::ErrorBody;

/// The account the services run in.
pub const SANDBOX_ACCOUNT: &str = "SANDBOX";
/// The account of the people who decide confirmations and read audit and status.
pub const OPERATORS_ACCOUNT: &str = "OPERATORS";
/// Stamped by nats-server on requests through a `share: true` service import.
pub const REQUEST_INFO_HEADER: &str = "Nats-Request-Info";
/// The tenant `sandmesh up` creates.
pub const DEFAULT_TENANT: &str = "default";
/// Longest tenant name: a scoped id is at most this, a `-` and a 64-character id.
pub const MAX_TENANT_LEN: usize = 15;
/// The subject token of events that belong to no tenant (internal callers).
pub const NO_TENANT_TOKEN: &str = "_";

/// A tenant's name, which is also its NATS account name: 1–15 of `[a-z0-9]`. Lower case only,
/// so it can never be `SANDBOX` or `OPERATORS`; no `-` or `_`, so scoped ids are unambiguous.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Tenant(String);

impl Tenant {
    pub fn new(name: impl Into<String>) -> Result<Self, ValidationError> {
        let name = name.into();
        let ok = !name.is_empty()
            && name.len() <= MAX_TENANT_LEN
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        if ok {
            Ok(Self(name))
        } else {
            Err(ValidationError::invalid(
                "tenant",
                format!("{name:?}: use 1..={MAX_TENANT_LEN} of a-z and 0-9"),
            ))
        }
    }

    pub fn default_tenant() -> Self {
        Self(DEFAULT_TENANT.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Tenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for Tenant {
    type Error = ValidationError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::new(s)
    }
}

impl From<Tenant> for String {
    fn from(t: Tenant) -> Self {
        t.0
    }
}

/// The subject token naming `tenant`'s events (`_` for none).
pub fn tenant_token(tenant: Option<&Tenant>) -> &str {
    tenant.map_or(NO_TENANT_TOKEN, Tenant::as_str)
}

/// What the server says about the caller (the fields sandmesh uses).
#[derive(Debug, Clone, Deserialize)]
struct RequestInfo {
    acc: String,
    #[serde(default)]
    user: Option<String>,
}

/// Who sent a request, as the server established it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// From inside the `SANDBOX` account: a service, or anyone on a server without accounts.
    Internal,
    /// An agent of a tenant: its own sessions, executions, workspaces and results only.
    Agent { tenant: Tenant, user: String },
    /// A person who decides confirmations and reads audit and status.
    Operator { user: String },
}

impl Caller {
    /// The caller of a request with these headers (`get` looks one up by name).
    pub fn from_header(request_info: Option<&str>) -> Result<Self, ErrorBody> {
        let Some(raw) = request_info else {
            return Ok(Caller::Internal);
        };
        let info: RequestInfo = serde_json::from_str(raw).map_err(|e| {
            ErrorBody::denied(format!("unreadable {REQUEST_INFO_HEADER} header: {e}"))
        })?;
        let user = info.user.unwrap_or_default();
        match info.acc.as_str() {
            SANDBOX_ACCOUNT => Ok(Caller::Internal),
            OPERATORS_ACCOUNT => Ok(Caller::Operator { user }),
            account => match Tenant::new(account) {
                Ok(tenant) => Ok(Caller::Agent { tenant, user }),
                Err(_) => Err(ErrorBody::denied(format!(
                    "account {account:?} is not a sandmesh tenant"
                ))),
            },
        }
    }

    /// The tenant whose data this caller may touch (`None`: internal, ids are already scoped).
    pub fn tenant(&self) -> Option<&Tenant> {
        match self {
            Caller::Agent { tenant, .. } => Some(tenant),
            Caller::Internal | Caller::Operator { .. } => None,
        }
    }

    /// The NATS account, for the audit trail.
    pub fn account(&self) -> &str {
        match self {
            Caller::Internal => SANDBOX_ACCOUNT,
            Caller::Agent { tenant, .. } => tenant.as_str(),
            Caller::Operator { .. } => OPERATORS_ACCOUNT,
        }
    }

    /// The authenticated user, for the audit trail (`None` for internal callers).
    pub fn user(&self) -> Option<&str> {
        match self {
            Caller::Internal => None,
            Caller::Agent { user, .. } | Caller::Operator { user } => Some(user),
        }
    }

    pub fn is_agent(&self) -> bool {
        matches!(self, Caller::Agent { .. })
    }

    /// The stored form of an id this caller names (see the module docs), validated.
    pub fn scope(&self, field: &str, id: &str) -> Result<String, ValidationError> {
        match self.tenant() {
            Some(tenant) => {
                validate_id(field, id)?;
                Ok(scoped(tenant, id))
            }
            None => {
                validate_scoped_id(field, id)?;
                Ok(id.to_string())
            }
        }
    }

    /// The id as this caller knows it: the stored form without its tenant. An id of another
    /// tenant never reaches here (lookups are scoped), so a missing prefix is left alone.
    pub fn unscope(&self, id: &str) -> String {
        unscoped(self.tenant(), id)
    }
}

/// `tenant-id`.
pub fn scoped(tenant: &Tenant, id: &str) -> String {
    format!("{tenant}-{id}")
}

/// The tenant a stored id is scoped by (`acme-s1` → `acme`), for a service that an internal
/// caller hands a scoped id (the scheduler binding a session's AIO instance). `None` for an id
/// with no tenant-shaped prefix; a prefix that only looks like a tenant names one without
/// quotas, so nothing is limited by mistake.
pub fn tenant_of_scoped(id: &str) -> Option<Tenant> {
    id.split_once('-').and_then(|(t, _)| Tenant::new(t).ok())
}

/// The id without `tenant`'s prefix (unchanged without a tenant or a matching prefix).
pub fn unscoped(tenant: Option<&Tenant>, id: &str) -> String {
    match tenant {
        Some(t) => id
            .strip_prefix(t.as_str())
            .and_then(|rest| rest.strip_prefix('-'))
            .unwrap_or(id)
            .to_string(),
        None => id.to_string(),
    }
}

/// A stored id: a client id (≤ 64), or one scoped by a tenant (≤ 80).
pub fn validate_scoped_id(field: &str, id: &str) -> Result<(), ValidationError> {
    match id.split_once('-') {
        Some((tenant, rest)) if id.len() > crate::validate::MAX_ID_LEN => {
            Tenant::new(tenant).map_err(|_| {
                ValidationError::invalid(
                    field,
                    format!("must be 1..={} characters", crate::validate::MAX_ID_LEN),
                )
            })?;
            validate_id(field, rest)
        }
        _ => validate_id(field, id),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(acc: &str, user: &str) -> String {
        serde_json::json!({"acc": acc, "user": user, "rtt": 1000, "id": 7}).to_string()
    }

    #[test]
    fn the_account_names_the_caller() {
        assert_eq!(Caller::from_header(None).unwrap(), Caller::Internal);
        assert_eq!(
            Caller::from_header(Some(&info("SANDBOX", "scheduler"))).unwrap(),
            Caller::Internal
        );
        assert_eq!(
            Caller::from_header(Some(&info("OPERATORS", "alice"))).unwrap(),
            Caller::Operator {
                user: "alice".into()
            }
        );
        assert_eq!(
            Caller::from_header(Some(&info("acme", "agent"))).unwrap(),
            Caller::Agent {
                tenant: Tenant::new("acme").unwrap(),
                user: "agent".into()
            }
        );
        // An account that cannot be a tenant is refused, not treated as internal.
        let e = Caller::from_header(Some(&info("$G", "x"))).unwrap_err();
        assert_eq!(e.code, 403, "{e:?}");
        let e = Caller::from_header(Some("not json")).unwrap_err();
        assert_eq!(e.code, 403, "{e:?}");
    }

    #[test]
    fn tenant_names_exclude_what_would_make_scoping_ambiguous() {
        for bad in [
            "",
            "SANDBOX",
            "a-b",
            "a_b",
            "a.b",
            "sixteen-chars-xx",
            "Acme",
            "*",
        ] {
            assert!(Tenant::new(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["a", "acme", "t2", "abcdefghijklmno"] {
            assert!(Tenant::new(good).is_ok(), "{good:?} refused");
        }
    }

    #[test]
    fn agents_ids_are_scoped_and_unscoped() {
        let a = Caller::Agent {
            tenant: Tenant::new("acme").unwrap(),
            user: "u".into(),
        };
        let b = Caller::Agent {
            tenant: Tenant::new("beta").unwrap(),
            user: "u".into(),
        };
        let id = "s-1";
        let stored = a.scope("session_id", id).unwrap();
        assert_eq!(stored, "acme-s-1");
        assert_eq!(a.unscope(&stored), id);
        // The same name from another tenant is another id.
        assert_ne!(b.scope("session_id", id).unwrap(), stored);
        // Internal callers pass stored ids through, up to the scoped length.
        assert_eq!(
            Caller::Internal.scope("session_id", &stored).unwrap(),
            stored
        );
        let longest = format!("abcdefghijklmno-{}", "x".repeat(64));
        assert!(Caller::Internal.scope("session_id", &longest).is_ok());
        // Agents' own ids keep the client limit and alphabet.
        assert!(a.scope("session_id", &"x".repeat(65)).is_err());
        assert!(a.scope("session_id", "a.b").is_err());
    }
}
