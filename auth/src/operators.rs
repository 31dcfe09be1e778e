//! Operators' scopes as a service consults them at each request: fixed
//! (`SANDMESH_OPERATOR_SCOPES`), everyone (no tenancy at all), or following the tenancy file —
//! re-read when the file changes, so `sandmesh operator add` / `remove` take effect in the
//! confirmation service and the console at once, without a restart.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::SystemTime;

use crate::{Scope, Tenancy, TenancyError};

/// Who is an operator, and with which scope.
#[derive(Debug)]
pub struct OperatorDirectory(Source);

/// A file's modification time and length: a change of either means it was rewritten.
type Stamp = Option<(SystemTime, u64)>;

/// The operators read from the file, and its stamp then.
type Reading = (Stamp, BTreeMap<String, Scope>);

#[derive(Debug)]
enum Source {
    /// No tenancy configured (`--insecure`): whoever NATS lets in sees every tenant.
    Everyone,
    Fixed(BTreeMap<String, Scope>),
    /// The tenancy file, with what was read at its last change.
    File {
        path: PathBuf,
        seen: Mutex<Reading>,
    },
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
        Self(Source::Fixed(scopes_of(tenancy)))
    }

    /// Following `path` (read now, so a broken file is reported at start).
    pub fn file(path: impl Into<PathBuf>) -> Result<Self, TenancyError> {
        let path = path.into();
        let stamp = stamp(&path);
        let scopes = scopes_of(&Tenancy::load(&path)?);
        Ok(Self(Source::File {
            path,
            seen: Mutex::new((stamp, scopes)),
        }))
    }

    pub fn is_everyone(&self) -> bool {
        matches!(self.0, Source::Everyone)
    }

    /// The scope of `user`, or `None` when `user` is no operator.
    pub fn scope_of(&self, user: &str) -> Option<Scope> {
        match &self.0 {
            Source::Everyone => Some(Scope::All),
            Source::Fixed(map) => map.get(user).cloned(),
            Source::File { path, seen } => {
                let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
                let now = stamp(path);
                if now != seen.0 {
                    // A file being rewritten may not parse for a moment: the last good
                    // reading stands, and the next look tries again.
                    if let Ok(t) = Tenancy::load(path) {
                        *seen = (now, scopes_of(&t));
                    }
                }
                seen.1.get(user).cloned()
            }
        }
    }
}

fn stamp(path: &std::path::Path) -> Stamp {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

fn scopes_of(t: &Tenancy) -> BTreeMap<String, Scope> {
    t.operators
        .iter()
        .map(|(user, op)| (user.clone(), op.scope.clone()))
        .collect()
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
