//! Host uids for sandboxes: every sandbox runs as a host uid of its own, taken from a
//! [`UidPool`] and given back when the sandbox is gone ([`UidLease`]). The kernel keeps some
//! budgets per user — inotify instances, POSIX message-queue bytes, pending signals, user
//! namespaces — so two sandboxes of one host uid share them, and one could use them all up for
//! the other (another tenant's `inotify_init` or `mq_open` then fails with EMFILE).
//!
//! Two nodes of one host must never hand out the same uid, and a uid is handed out again only
//! once its sandbox is gone. Within a node the pool's own record says which uids are out; across
//! nodes each backend claims a uid where the claim lasts exactly as long as the sandbox:
//! - bubblewrap: an exclusive `flock` on `<claims dir>/<uid>`, a directory every node of the
//!   host shares. The kernel releases it when the node's process ends, and its sandboxes end
//!   with it (they die with their parent), so a crashed node's uids come free with its
//!   sandboxes and not before.
//! - Docker: the container's name is made from its uid, and the daemon refuses a second
//!   container of one name, whichever node (or crashed node) made the first: the claim is the
//!   container itself and ends with its removal. That also holds for executors in containers
//!   of their own, which share no directory.
//!
//! The two backends default to disjoint ranges, so neither needs to see the other's claims.

use std::collections::HashSet;
use std::fmt;
use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use kit::config::ConfigReader;

/// Uids `first..=last` (and the gids of the same numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UidRange {
    pub first: u32,
    pub last: u32,
}

impl UidRange {
    /// Docker sandboxes' default: within the range that Linux distributions leave unused
    /// (above container ranges of 524288..1879048191, below 2^31, which some tools take for
    /// negative), so no host user shares a sandbox's budgets or owns its files.
    pub const DOCKER: UidRange = UidRange {
        first: 2_000_000_000,
        last: 2_000_099_999,
    };
    /// Bubblewrap sandboxes' default: the same unused range, after Docker's.
    pub const BWRAP: UidRange = UidRange {
        first: 2_000_100_000,
        last: 2_000_199_999,
    };

    /// How many uids the range holds.
    pub fn count(&self) -> u64 {
        u64::from(self.last - self.first) + 1
    }

    pub fn contains(&self, uid: u32) -> bool {
        (self.first..=self.last).contains(&uid)
    }

    /// Reads `SANDMESH_<key>` as `FIRST-LAST`, reporting a bad value with the reader's others.
    pub fn read(r: &mut ConfigReader<'_>, key: &str, default: UidRange) -> UidRange {
        match r.optional_string(key) {
            None => default,
            Some(text) => text.parse().unwrap_or_else(|e| {
                r.error(format!("SANDMESH_{key}={text:?}: {e}"));
                default
            }),
        }
    }
}

// The defaults stay apart (a node of each backend on one host never meets the other's uids)
// and below 2^31.
const _: () =
    assert!(UidRange::DOCKER.last < UidRange::BWRAP.first && UidRange::BWRAP.last < 1 << 31);

impl fmt::Display for UidRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

impl FromStr for UidRange {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (first, last) = s
            .split_once('-')
            .ok_or("expected FIRST-LAST, e.g. 2000000000-2000099999")?;
        let number = |n: &str| {
            n.trim()
                .parse::<u32>()
                .map_err(|_| format!("{n:?} is not a uid"))
        };
        let (first, last) = (number(first)?, number(last)?);
        if first == 0 {
            return Err("sandboxes never run as root (uid 0)".into());
        }
        // (uid_t)-1 means "no change" to setresuid and chown.
        if last == u32::MAX {
            return Err(format!("{} is not a valid uid", u32::MAX));
        }
        if first > last {
            return Err("FIRST is above LAST".into());
        }
        Ok(UidRange { first, last })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum UidError {
    #[error(
        "every uid of {range} is held by a sandbox (of this node or another of the host); \
         widen the node's uid range or lower its capacity"
    )]
    Exhausted { range: UidRange },
    #[error("the uid claims directory {dir}")]
    Claims {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The uids of one node. Cheap to share (`Arc`); each [`UidLease`] gives its uid back.
#[derive(Debug)]
pub struct UidPool {
    range: UidRange,
    /// Where uids are claimed host-wide by `flock` (bubblewrap); `None` when the claim is made
    /// elsewhere (Docker: the container's name).
    claims: Option<PathBuf>,
    state: Mutex<PoolState>,
}

#[derive(Debug)]
struct PoolState {
    /// Where the next search starts (an offset in the range): uids are handed out in turn, so
    /// the one given back last is the last taken again.
    next: u64,
    /// The uids this node holds now.
    held: HashSet<u32>,
}

/// One uid while its sandbox may still exist: dropping it gives the uid back (and releases
/// its host-wide claim, when there is one).
#[derive(Debug)]
pub struct UidLease {
    uid: u32,
    pool: Arc<UidPool>,
    /// Holds the `flock`; closing it releases the claim.
    _claim: Option<File>,
}

impl UidLease {
    pub fn uid(&self) -> u32 {
        self.uid
    }
}

impl Drop for UidLease {
    fn drop(&mut self) {
        let mut state = self.pool.state.lock().unwrap_or_else(|e| e.into_inner());
        state.held.remove(&self.uid);
    }
}

impl UidPool {
    /// A pool whose uids are claimed host-wide by the caller (Docker: by the container's name).
    pub fn new(range: UidRange) -> Arc<Self> {
        Arc::new(Self::with(range, None))
    }

    /// A pool whose uids are claimed by `flock` on files in `dir`, shared by every node of the
    /// host (created when missing).
    pub fn claimed_in(range: UidRange, dir: &Path) -> Result<Arc<Self>, UidError> {
        std::fs::create_dir_all(dir).map_err(|source| UidError::Claims {
            dir: dir.to_path_buf(),
            source,
        })?;
        Ok(Arc::new(Self::with(range, Some(dir.to_path_buf()))))
    }

    fn with(range: UidRange, claims: Option<PathBuf>) -> Self {
        // Nodes starting together begin their searches apart, so they rarely try one uid.
        let start = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| {
                u64::from(d.subsec_nanos()) ^ u64::from(std::process::id())
            });
        Self {
            range,
            claims,
            state: Mutex::new(PoolState {
                next: start % range.count(),
                held: HashSet::new(),
            }),
        }
    }

    pub fn range(&self) -> UidRange {
        self.range
    }

    /// The next uid that neither this node nor (with claims) another node of the host holds.
    pub fn take(self: &Arc<Self>) -> Result<UidLease, UidError> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let len = self.range.count();
        for step in 0..len {
            let offset = (state.next + step) % len;
            let uid = self.range.first + offset as u32;
            if state.held.contains(&uid) {
                continue;
            }
            let claim = match &self.claims {
                None => None,
                Some(dir) => match claim(dir, uid)? {
                    Some(file) => Some(file),
                    None => continue, // another node's
                },
            };
            state.next = (offset + 1) % len;
            state.held.insert(uid);
            return Ok(UidLease {
                uid,
                pool: self.clone(),
                _claim: claim,
            });
        }
        Err(UidError::Exhausted { range: self.range })
    }
}

/// An exclusive lock on `<dir>/<uid>`, or `None` when another holder has it. The files stay:
/// removing one could let two holders lock two different files of one name.
fn claim(dir: &Path, uid: u32) -> Result<Option<File>, UidError> {
    let path = dir.join(uid.to_string());
    let err = |source| UidError::Claims {
        dir: dir.to_path_buf(),
        source,
    };
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(err)?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(TryLockError::WouldBlock) => Ok(None),
        Err(TryLockError::Error(e)) => Err(err(e)),
    }
}

#[cfg(test)]
mod tests {
    use kit::config::env_map;

    use super::*;

    fn range(first: u32, last: u32) -> UidRange {
        UidRange { first, last }
    }

    #[test]
    fn ranges_parse_and_bad_ones_say_why() {
        assert_eq!("5-7".parse::<UidRange>(), Ok(range(5, 7)));
        assert_eq!(range(5, 7).count(), 3);
        for bad in ["", "5", "a-7", "0-7", "7-5", "5-4294967295"] {
            assert!(bad.parse::<UidRange>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_bad_range_is_reported_with_the_other_errors() {
        let env = env_map(&[("SANDMESH_EXEC_UIDS", "7-5"), ("SANDMESH_X", "1")]);
        let mut r = ConfigReader::new(&env);
        let got = UidRange::read(&mut r, "EXEC_UIDS", UidRange::DOCKER);
        r.error("another");
        assert_eq!(got, UidRange::DOCKER);
        let e = r.finish().unwrap_err();
        assert_eq!(e.0.len(), 2, "{e}");
        assert!(e.0[0].contains("SANDMESH_EXEC_UIDS=\"7-5\""), "{e}");
    }

    #[test]
    fn a_uid_is_handed_out_again_only_after_its_lease_is_gone() {
        let pool = UidPool::new(range(100, 101));
        let a = pool.take().unwrap();
        let b = pool.take().unwrap();
        assert_ne!(a.uid(), b.uid());
        assert!(matches!(pool.take(), Err(UidError::Exhausted { .. })));
        let freed = a.uid();
        drop(a);
        assert_eq!(pool.take().unwrap().uid(), freed);
    }

    #[test]
    fn two_nodes_sharing_a_claims_directory_never_hold_one_uid() {
        let dir = std::env::temp_dir().join(format!("sandmesh-uids-{}", messages::new_id()));
        let one = UidPool::claimed_in(range(100, 102), &dir).unwrap();
        let other = UidPool::claimed_in(range(100, 102), &dir).unwrap();
        let a = one.take().unwrap();
        let b = other.take().unwrap();
        let c = one.take().unwrap();
        let mut uids = [a.uid(), b.uid(), c.uid()];
        uids.sort();
        assert_eq!(uids, [100, 101, 102]);
        // The other node's claim holds even though this node's own record is empty of it.
        assert!(matches!(one.take(), Err(UidError::Exhausted { .. })));
        let freed = b.uid();
        drop(b);
        assert_eq!(one.take().unwrap().uid(), freed);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
