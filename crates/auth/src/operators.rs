//! Operators' scopes as a service consults them at each request: fixed
//! (`SANDMESH_OPERATOR_SCOPES`), everyone (no tenancy at all), or following the tenancy file —
//! re-read when the file changes, so `sandmesh operator add` / `remove` take effect in the
//! confirmation service and the console at once, without a restart.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::{FollowedTenancy, Scope, Tenancy, TenancyError};

/// Who is an operator, and with which scope.
#[derive(Debug)]
pub struct OperatorDirectory(Source);

#[derive(Debug)]
enum Source {
    /// No tenancy configured (`--insecure`): whoever NATS lets in sees every tenant.
    Everyone,
    Fixed(BTreeMap<String, Scope>),
    File(FollowedTenancy),
}

impl OperatorDirectory {
    pub fn everyone() -> Self {
        Self(Source::Everyone)
    }

    /// From the `alice=*;bob=acme,beta` form.
    pub fn fixed(text: &str) -> Result<Self, String> {
        Tenancy::parse_operator_scopes(text).map(|s| Self(Source::Fixed(s)))
    }

    /// The operators of `tenancy` as they are now.
    pub fn of_tenancy(tenancy: &Tenancy) -> Self {
        let scopes = tenancy
            .operators
            .iter()
            .map(|(user, op)| (user.clone(), op.scope.clone()))
            .collect();
        Self(Source::Fixed(scopes))
    }

    /// Following `path` (read now, so a broken file is reported at start).
    pub fn file(path: impl Into<PathBuf>) -> Result<Self, TenancyError> {
        FollowedTenancy::open(path).map(|f| Self(Source::File(f)))
    }

    pub fn is_everyone(&self) -> bool {
        matches!(self.0, Source::Everyone)
    }

    /// The scope of `user`, or `None` when `user` is no operator.
    pub fn scope_of(&self, user: &str) -> Option<Scope> {
        match &self.0 {
            Source::Everyone => Some(Scope::All),
            Source::Fixed(map) => map.get(user).cloned(),
            Source::File(file) => file
                .current()
                .operators
                .get(user)
                .map(|op| op.scope.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use messages::tenancy::Tenant;
    use messages::Subjects;

    #[test]
    fn an_operator_added_to_the_file_is_known_at_its_next_look_and_a_removed_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tenancy.json");
        let mut t = Tenancy::generate(&Subjects::default());
        t.save(&path).unwrap();
        let operators = OperatorDirectory::file(&path).unwrap();
        assert_eq!(operators.scope_of("carol"), None);

        let acme = Tenant::new("acme").unwrap();
        t.add_operator("carol", Scope::Tenants(vec![acme.clone()]));
        t.save(&path).unwrap();
        assert_eq!(
            operators.scope_of("carol"),
            Some(Scope::Tenants(vec![acme]))
        );
        assert_eq!(operators.scope_of("operator"), Some(Scope::All));

        assert!(t.remove_operator("carol"));
        t.save(&path).unwrap();
        assert_eq!(operators.scope_of("carol"), None);
    }

    #[test]
    fn fixed_scopes_and_everyone() {
        let fixed = OperatorDirectory::fixed("alice=*;bob=acme").unwrap();
        assert_eq!(fixed.scope_of("alice"), Some(Scope::All));
        assert_eq!(fixed.scope_of("mallory"), None);
        assert_eq!(
            OperatorDirectory::everyone().scope_of("anyone"),
            Some(Scope::All)
        );
    }
}
