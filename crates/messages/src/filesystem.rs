//! Filesystem policy (denyRead / allowWrite / denyWrite) of a template or a
//! session, enforced by the backends with mounts — never by checking paths in code:
//!
//! - the sandbox's root is read-only; `/tmp` and the workspace are its writable places;
//! - `deny_read`: each directory is hidden behind an empty read-only tmpfs;
//! - `allow_write`: each directory becomes an empty writable tmpfs of the sandbox user;
//! - `deny_write`: each directory inside a writable place becomes an empty read-only tmpfs
//!   (elsewhere the root is read-only already, so such an entry is refused as pointless).
//!
//! Entries are directories (a mount hides a directory, not a file: a policy naming a file of
//! the image fails the sandbox's start), and stay out of the workspace (synced by the executor
//! before and after every run) and of what the sandbox needs to start.

use serde::{Deserialize, Serialize};

use crate::validate::ValidationError;

/// Where a sandbox's workspace is mounted (the code's working directory).
pub const WORKSPACE_DIR: &str = "/workspace";
/// The in-sandbox supervisor every backend starts.
pub const SUPERVISOR_PATH: &str = "/usr/local/bin/sandmesh-supervisor";
/// Writable in every sandbox, whatever the policy.
pub const TMP_DIR: &str = "/tmp";
/// Most entries of each list.
pub const MAX_ENTRIES: usize = 16;
/// Longest entry.
pub const MAX_ENTRY_BYTES: usize = 256;
/// The kernel's views: mounted by the backends themselves.
const KERNEL_DIRS: [&str; 3] = ["/proc", "/dev", "/sys"];

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilesystemPolicy {
    /// Directories hidden from the code (an empty read-only directory in their place).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny_read: Vec<String>,
    /// Directories the code may write besides `/tmp` and the workspace (empty at start).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_write: Vec<String>,
    /// Directories inside `/tmp` or an `allow_write` entry that stay read-only (and empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny_write: Vec<String>,
}

/// How a backend mounts one directory of a policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mount {
    /// An empty read-only tmpfs (`deny_read`, `deny_write`).
    EmptyReadOnly,
    /// An empty writable tmpfs owned by the sandbox user (`allow_write`).
    Writable,
}

/// `path` is `dir` or inside it.
fn within(path: &str, dir: &str) -> bool {
    path == dir
        || path
            .strip_prefix(dir)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// An absolute, normalised directory path of plain characters: `/a/b`, never `/`, `a/b`,
/// `/a/../b`, `/a//b`, `/a/` or `/a/*.pem`.
fn validate_entry(field: &str, path: &str) -> Result<(), ValidationError> {
    let bad = |why: &str| Err(ValidationError::invalid(field, format!("{path:?}: {why}")));
    if path.len() > MAX_ENTRY_BYTES {
        return bad(&format!("longer than {MAX_ENTRY_BYTES} bytes"));
    }
    if !path.starts_with('/') || path == "/" {
        return bad("must be an absolute directory other than /");
    }
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-+@".contains(c);
    if !path.chars().all(plain) {
        return bad("only letters, digits and / . _ - + @ (no patterns: mounts need paths)");
    }
    if path[1..]
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return bad("empty, '.' and '..' components are not allowed");
    }
    if KERNEL_DIRS.iter().any(|d| within(path, d)) {
        return bad("the kernel's views (/proc, /dev, /sys) are mounted by the sandbox");
    }
    if within(path, WORKSPACE_DIR) || within(WORKSPACE_DIR, path) {
        return bad("the workspace (and what holds it) is synced by the executor; not mountable");
    }
    if within(SUPERVISOR_PATH, path) {
        return bad("holds the sandbox's supervisor");
    }
    Ok(())
}

impl FilesystemPolicy {
    pub fn is_empty(&self) -> bool {
        self.deny_read.is_empty() && self.allow_write.is_empty() && self.deny_write.is_empty()
    }

    /// Checks every entry (see the module docs), at most [`MAX_ENTRIES`] per list.
    pub fn validate(&self) -> Result<(), ValidationError> {
        let lists = [
            ("filesystem.deny_read", &self.deny_read),
            ("filesystem.allow_write", &self.allow_write),
            ("filesystem.deny_write", &self.deny_write),
        ];
        for (field, list) in lists {
            if list.len() > MAX_ENTRIES {
                return Err(ValidationError::invalid(
                    field,
                    format!("at most {MAX_ENTRIES} directories"),
                ));
            }
            for path in list {
                validate_entry(field, path)?;
            }
        }
        for path in &self.allow_write {
            if within(path, TMP_DIR) {
                return Err(ValidationError::invalid(
                    "filesystem.allow_write",
                    format!("{path:?} is writable already (/tmp)"),
                ));
            }
        }
        for path in &self.deny_write {
            let writable = within(path, TMP_DIR)
                || self
                    .allow_write
                    .iter()
                    .any(|w| within(path, w) && path != w);
            if !writable {
                return Err(ValidationError::invalid(
                    "filesystem.deny_write",
                    format!(
                        "{path:?} is read-only already: deny_write names a directory inside \
                         /tmp or an allow_write directory"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Both policies at once (a template's and a session's): every entry of either.
    pub fn union(&self, other: &FilesystemPolicy) -> FilesystemPolicy {
        let join = |a: &[String], b: &[String]| {
            let mut all: Vec<String> = a.iter().chain(b).cloned().collect();
            all.sort();
            all.dedup();
            all
        };
        FilesystemPolicy {
            deny_read: join(&self.deny_read, &other.deny_read),
            allow_write: join(&self.allow_write, &other.allow_write),
            deny_write: join(&self.deny_write, &other.deny_write),
        }
    }

    /// The mounts a backend makes, parents before what they hold (a `deny_write` inside an
    /// `allow_write` directory is mounted over it). A directory both hidden and writable is
    /// hidden.
    pub fn mounts(&self) -> Vec<(String, Mount)> {
        let mut mounts: Vec<(String, Mount)> = self
            .allow_write
            .iter()
            .filter(|p| !self.deny_read.contains(p))
            .map(|p| (p.clone(), Mount::Writable))
            .chain(
                self.deny_read
                    .iter()
                    .chain(&self.deny_write)
                    .map(|p| (p.clone(), Mount::EmptyReadOnly)),
            )
            .collect();
        mounts.sort_by(|(a, _), (b, _)| {
            let depth = |p: &str| p.matches('/').count();
            depth(a).cmp(&depth(b)).then_with(|| a.cmp(b))
        });
        mounts.dedup_by(|a, b| a.0 == b.0);
        mounts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(deny_read: &[&str], allow_write: &[&str], deny_write: &[&str]) -> FilesystemPolicy {
        let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
        FilesystemPolicy {
            deny_read: own(deny_read),
            allow_write: own(allow_write),
            deny_write: own(deny_write),
        }
    }

    #[test]
    fn entries_are_plain_absolute_directories_outside_the_sandboxs_own() {
        let ok = policy(
            &["/etc/ssl", "/home/sandbox/.ssh"],
            &["/opt/cache"],
            &["/tmp/locked", "/opt/cache/ro"],
        );
        ok.validate().unwrap();
        for bad in [
            policy(&["relative"], &[], &[]),
            policy(&["/"], &[], &[]),
            policy(&["/etc/../root"], &[], &[]),
            policy(&["/etc//ssl"], &[], &[]),
            policy(&["/etc/"], &[], &[]),
            policy(&["/etc/*.pem"], &[], &[]),
            policy(&["/etc/a b"], &[], &[]),
            policy(&["/proc/self"], &[], &[]),
            policy(&["/dev"], &[], &[]),
            policy(&["/workspace/secrets"], &[], &[]),
            policy(&["/workspace"], &[], &[]),
            policy(&["/usr/local"], &[], &[]),
            policy(&[&format!("/{}", "a".repeat(MAX_ENTRY_BYTES))], &[], &[]),
            policy(&[], &["/tmp/x"], &[]),
            policy(&[], &[], &["/etc"]),
            policy(&[], &["/opt/cache"], &["/opt/cache"]),
        ] {
            assert!(bad.validate().is_err(), "accepted {bad:?}");
        }
        let many: Vec<String> = (0..=MAX_ENTRIES).map(|i| format!("/d{i}")).collect();
        let too_many = FilesystemPolicy {
            deny_read: many,
            ..Default::default()
        };
        assert!(too_many.validate().is_err());
    }

    #[test]
    fn mounts_go_parents_first_and_hiding_wins() {
        let p = policy(
            &["/opt/both", "/etc/ssl"],
            &["/opt/cache", "/opt/both"],
            &["/opt/cache/ro"],
        );
        assert_eq!(
            p.mounts(),
            [
                ("/etc/ssl".to_string(), Mount::EmptyReadOnly),
                ("/opt/both".to_string(), Mount::EmptyReadOnly),
                ("/opt/cache".to_string(), Mount::Writable),
                ("/opt/cache/ro".to_string(), Mount::EmptyReadOnly),
            ]
        );
    }

    #[test]
    fn a_union_holds_every_entry_once() {
        let a = policy(&["/etc/ssl"], &["/opt/a"], &[]);
        let b = policy(&["/etc/ssl", "/srv"], &[], &["/tmp/x"]);
        assert_eq!(
            a.union(&b),
            policy(&["/etc/ssl", "/srv"], &["/opt/a"], &["/tmp/x"])
        );
    }
}
