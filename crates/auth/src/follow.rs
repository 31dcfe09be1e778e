//! `FollowedTenancy`: the tenancy file as a service consults it at each request — re-read when
//! the file changes, so what `sandmesh operator add` or `sandmesh tenant add --max-…` saves
//! takes effect in a running mesh without a restart.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use crate::{Tenancy, TenancyError};

/// A file's modification time and length: a change of either means it was rewritten.
type Stamp = Option<(SystemTime, u64)>;

#[derive(Debug)]
pub struct FollowedTenancy {
    path: PathBuf,
    /// What was read at the file's last change, with its stamp then.
    seen: Mutex<(Stamp, Arc<Tenancy>)>,
}

impl FollowedTenancy {
    /// Following `path` (read now, so a broken file is reported at start).
    pub fn open(path: impl Into<PathBuf>) -> Result<Self, TenancyError> {
        let path = path.into();
        let stamp = stamp(&path);
        let tenancy = Tenancy::load(&path)?;
        Ok(Self {
            path,
            seen: Mutex::new((stamp, Arc::new(tenancy))),
        })
    }

    /// The tenancy as the file says now: one `stat` per call, a parse only after a change.
    pub fn current(&self) -> Arc<Tenancy> {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let now = stamp(&self.path);
        if now != seen.0 {
            // A file being rewritten may not parse for a moment: the last good reading
            // stands, and the next look tries again.
            if let Ok(t) = Tenancy::load(&self.path) {
                *seen = (now, Arc::new(t));
            }
        }
        seen.1.clone()
    }
}

fn stamp(path: &Path) -> Stamp {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}
