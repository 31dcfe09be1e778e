//! Who sees which confirmations. An agent sees its own tenant's; an
//! operator the tenants in its scope; a service (inside the services' account) every one. A
//! confirmation outside the caller's audience is answered exactly like one that does not exist
//! (404), so ids cannot be probed.

use std::sync::Arc;

use messages::confirm::Confirmation;
use messages::tenancy::{Caller, Tenant};
use sandmesh_auth::{OperatorDirectory, Scope};

/// The operators' scopes: `SANDMESH_OPERATOR_SCOPES` (`alice=*;bob=acme,beta`), else the
/// tenancy file's operators, followed as it changes (an operator added with `sandmesh operator
/// add` decides at once); with neither, every operator sees every tenant, which is what a
/// deployment with one kind of operator wants. An operator missing from them sees nothing.
#[derive(Debug, Clone)]
pub struct OperatorScopes(Arc<OperatorDirectory>);

impl Default for OperatorScopes {
    fn default() -> Self {
        Self(Arc::new(OperatorDirectory::everyone()))
    }
}

impl OperatorScopes {
    pub fn parse(text: &str) -> Result<Self, String> {
        OperatorDirectory::fixed(text).map(|d| Self(Arc::new(d)))
    }

    pub fn of_directory(directory: OperatorDirectory) -> Self {
        Self(Arc::new(directory))
    }

    fn of(&self, user: &str) -> Option<Scope> {
        self.0.scope_of(user)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Audience {
    Everyone,
    /// These tenants' confirmations only (one for an agent, the scope for an operator).
    Tenants(Vec<Tenant>),
}

impl Audience {
    pub fn of(caller: &Caller, scopes: &OperatorScopes) -> Self {
        match caller {
            Caller::Internal => Audience::Everyone,
            Caller::Agent { tenant, .. } => Audience::Tenants(vec![tenant.clone()]),
            Caller::Operator { user } => match scopes.of(user) {
                Some(Scope::All) => Audience::Everyone,
                Some(Scope::Tenants(set)) => Audience::Tenants(set),
                None => Audience::Tenants(Vec::new()),
            },
        }
    }

    pub fn sees(&self, c: &Confirmation) -> bool {
        match self {
            Audience::Everyone => true,
            Audience::Tenants(set) => c.tenant.as_ref().is_some_and(|t| set.contains(t)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(tenant: Option<&str>) -> Confirmation {
        Confirmation {
            tenant: tenant.map(|t| Tenant::new(t).unwrap()),
            ..Default::default()
        }
    }

    #[test]
    fn each_caller_sees_its_own() {
        let scopes = OperatorScopes::parse("alice=*; bob=acme").unwrap();
        let acme = of(Some("acme"));
        let beta = of(Some("beta"));
        let internal = of(None);
        let agent = Caller::Agent {
            tenant: Tenant::new("acme").unwrap(),
            user: "a".into(),
        };
        let see = |caller: &Caller, c: &Confirmation| Audience::of(caller, &scopes).sees(c);
        assert!(see(&agent, &acme) && !see(&agent, &beta) && !see(&agent, &internal));
        let alice = Caller::Operator {
            user: "alice".into(),
        };
        assert!(see(&alice, &acme) && see(&alice, &beta) && see(&alice, &internal));
        let bob = Caller::Operator { user: "bob".into() };
        assert!(see(&bob, &acme) && !see(&bob, &beta) && !see(&bob, &internal));
        let carol = Caller::Operator {
            user: "carol".into(),
        };
        assert!(!see(&carol, &acme));
        assert!(see(&Caller::Internal, &beta));
        // Without configured scopes every operator sees everything.
        assert!(Audience::of(&carol, &OperatorScopes::default()).sees(&beta));
    }

    #[test]
    fn bad_scopes_are_refused() {
        assert!(OperatorScopes::parse("bob").is_err());
        assert!(OperatorScopes::parse("bob=Acme").is_err());
    }
}
