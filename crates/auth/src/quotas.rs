//! `QuotaBook`: each tenant's quotas as the service that owns a resource consults them at each
//! request — from the tenancy file, followed, so `sandmesh tenant add NAME --max-…` applies to
//! a running mesh at once; fixed (tests, or a deployment without a file); or none.

use std::collections::BTreeMap;

use messages::quota::Quotas;
use messages::tenancy::Tenant;

use crate::{FollowedTenancy, TenancyError};

#[derive(Debug)]
pub struct QuotaBook(Source);

#[derive(Debug)]
enum Source {
    Fixed(BTreeMap<Tenant, Quotas>),
    File(FollowedTenancy),
}

impl QuotaBook {
    /// No tenant has a quota.
    pub fn none() -> Self {
        Self(Source::Fixed(BTreeMap::new()))
    }

    pub fn fixed(quotas: BTreeMap<Tenant, Quotas>) -> Self {
        Self(Source::Fixed(quotas))
    }

    /// Following the tenancy file at `path`.
    pub fn file(path: impl Into<std::path::PathBuf>) -> Result<Self, TenancyError> {
        FollowedTenancy::open(path).map(|f| Self(Source::File(f)))
    }

    /// `tenant`'s quotas now (all unset when it has none).
    pub fn of(&self, tenant: &Tenant) -> Quotas {
        match &self.0 {
            Source::Fixed(map) => map.get(tenant).copied().unwrap_or_default(),
            Source::File(file) => file
                .current()
                .quotas
                .get(tenant)
                .copied()
                .unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Tenancy;
    use messages::Subjects;

    #[test]
    fn a_quota_saved_to_the_file_applies_at_the_next_look_and_a_cleared_one_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tenancy.json");
        let mut t = Tenancy::generate(&Subjects::default());
        t.save(&path).unwrap();
        let book = QuotaBook::file(&path).unwrap();
        let acme = Tenant::new("acme").unwrap();
        assert_eq!(book.of(&acme), Quotas::default());

        let q = Quotas {
            sessions: Some(3),
            ..Default::default()
        };
        t.set_quotas(&acme, q);
        t.save(&path).unwrap();
        assert_eq!(book.of(&acme), q);

        t.set_quotas(&acme, Quotas::default());
        t.save(&path).unwrap();
        assert_eq!(book.of(&acme), Quotas::default());
        assert!(!std::fs::read_to_string(&path).unwrap().contains("quotas"));
    }
}
