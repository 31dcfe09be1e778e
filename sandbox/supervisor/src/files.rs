//! The workspace side of an execution: unpack the archive the executor sent (the session's
//! snapshot plus the request's files), remember what is there, and after the run find what
//! was created, modified or deleted and pack the changed files.
//!
//! The changes listed are bounded ([`bound`]): the report is one frame, so a run that makes
//! tens of thousands of files keeps those nearest the workspace's root and counts the rest,
//! instead of losing its whole report.
//!
//! Unpacking never follows a symlink: code of an earlier execution in the same session may
//! have planted one (`ln -s /etc workspace/data`), so every path component that is not a
//! plain directory is replaced, and files are created with `O_EXCL` (which does not follow).

use std::collections::{BTreeMap, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

use sandbox_protocol::{MAX_CHANGED_PATHS, MAX_CHANGE_LIST_BYTES, PUSHED_MANIFEST};
use serde::{Deserialize, Serialize};

/// The most entries a manifest records; a workspace with more is reported as a warning.
const MAX_ENTRIES: usize = 100_000;

/// The most warnings unpacking adds to a report, each naming a path (a workspace larger than
/// the sandbox's disk fails on every file); the rest are counted in one more.
const MAX_UNPACK_WARNINGS: usize = 100;

/// A plain relative path (no root, no `..`), or `None`.
fn clean_relative(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(part) => out.push(part),
            Component::CurDir => {}
            Component::RootDir | Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    (!out.as_os_str().is_empty()).then_some(out)
}

/// Makes `root/rel` a real directory, replacing anything else found on the way.
fn ensure_dir(root: &Path, rel: &Path) -> io::Result<()> {
    let mut cur = root.to_path_buf();
    for c in rel.components() {
        cur.push(c);
        match fs::symlink_metadata(&cur) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                fs::remove_file(&cur)?;
                fs::create_dir(&cur)?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => fs::create_dir(&cur)?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn write_file(root: &Path, rel: &Path, data: &[u8], mode: u32) -> io::Result<()> {
    if let Some(parent) = rel.parent() {
        ensure_dir(root, parent)?;
    }
    let target = root.join(rel);
    match fs::symlink_metadata(&target) {
        Ok(m) if m.is_file() && m.len() == data.len() as u64 => {
            // Unchanged content is left alone (a session re-sends its whole workspace).
            if fs::read(&target).map(|old| old == data).unwrap_or(false) {
                return Ok(());
            }
            fs::remove_file(&target)?;
        }
        Ok(m) if m.is_dir() => fs::remove_dir_all(&target)?,
        Ok(_) => fs::remove_file(&target)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if mode & 0o111 != 0 { 0o755 } else { 0o644 })
        .open(&target)?;
    f.write_all(data)
}

/// Unpacks regular files and directories of `archive` under `root` (later entries win). Other entry types
/// (symlinks, hard links, devices) and unsafe paths are skipped with a warning.
pub fn unpack(root: &Path, archive: &[u8], warnings: &mut Vec<String>) -> io::Result<()> {
    if archive.is_empty() {
        return Ok(());
    }
    let mut ar = tar::Archive::new(archive);
    // The executor sends the session snapshot and the request's files as two archives back
    // to back; reading past the first end-of-archive marker takes both.
    ar.set_ignore_zeros(true);
    let mut unsaid = 0usize;
    let mut warn = |warning: String| {
        if warnings.len() < MAX_UNPACK_WARNINGS {
            warnings.push(warning);
        } else {
            unsaid += 1;
        }
    };
    for entry in ar.entries()? {
        let mut entry = entry?;
        let raw = entry.path()?.into_owned();
        let Some(rel) = clean_relative(&raw) else {
            warn(format!("skipped unsafe path {raw:?}"));
            continue;
        };
        match entry.header().entry_type() {
            tar::EntryType::Directory => ensure_dir(root, &rel)?,
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let mode = entry.header().mode().unwrap_or(0o644);
                let mut data = Vec::with_capacity(entry.size() as usize);
                entry.read_to_end(&mut data)?;
                if let Err(e) = write_file(root, &rel, &data, mode) {
                    warn(format!("could not write {}: {e}", rel.display()));
                }
            }
            other => warn(format!("skipped {} ({other:?})", rel.display())),
        }
    }
    if unsaid > 0 {
        warnings.push(format!("and {unsaid} more problems placing the workspace"));
    }
    Ok(())
}

/// What identifies one version of a file: a rewrite changes `ctime` even when the content
/// and `mtime` are made to look the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Stamp {
    size: u64,
    mtime_ns: i64,
    ctime_ns: i64,
    ino: u64,
}

/// The regular files under a root, by relative path.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Manifest {
    root: PathBuf,
    files: BTreeMap<String, Stamp>,
    pub truncated: bool,
}

impl Manifest {
    /// Walks `root` breadth-first, each directory in name order: when the walk stops at
    /// [`MAX_ENTRIES`] files, what it saw is the files nearest the root, the same ones every time.
    pub fn scan(root: &Path) -> Manifest {
        Self::scan_up_to(root, MAX_ENTRIES)
    }

    /// The manifest the session's last run left at [`PUSHED_MANIFEST`], when it is one of
    /// `root`. The sandbox's code can write that file too, which shapes only its own session's
    /// changes (it can change the files themselves anyway); its size is bounded.
    pub fn pushed(root: &Path) -> Option<Manifest> {
        Self::read_from(Path::new(PUSHED_MANIFEST), root)
    }

    /// Leaves this manifest for the session's next run (written beside, then renamed: a
    /// run killed halfway leaves the old one or none, never half of one).
    pub fn save_pushed(&self) -> io::Result<()> {
        self.write_to(Path::new(PUSHED_MANIFEST))
    }

    fn read_from(path: &Path, root: &Path) -> Option<Manifest> {
        // Generous for MAX_ENTRIES paths and stamps.
        const MAX_BYTES: u64 = 64 << 20;
        let mut json = Vec::new();
        File::open(path)
            .ok()?
            .take(MAX_BYTES)
            .read_to_end(&mut json)
            .ok()?;
        let manifest: Manifest = serde_json::from_slice(&json).ok()?;
        (manifest.root == root).then_some(manifest)
    }

    fn write_to(&self, path: &Path) -> io::Result<()> {
        let json = serde_json::to_vec(self).map_err(io::Error::other)?;
        let beside = path.with_extension("partial");
        let _ = fs::remove_file(&beside);
        fs::write(&beside, json)?;
        fs::rename(&beside, path)
    }

    fn scan_up_to(root: &Path, max_entries: usize) -> Manifest {
        let mut m = Manifest {
            root: root.to_path_buf(),
            ..Manifest::default()
        };
        let mut dirs = VecDeque::from([(root.to_path_buf(), String::new())]);
        while let Some((dir, prefix)) = dirs.pop_front() {
            if !m.list(&dir, &prefix, max_entries, &mut dirs) {
                m.truncated = true;
                break;
            }
        }
        m
    }

    /// Records the files of one directory and queues its subdirectories; `false` when the
    /// manifest is full.
    fn list(
        &mut self,
        dir: &Path,
        prefix: &str,
        max_entries: usize,
        dirs: &mut VecDeque<(PathBuf, String)>,
    ) -> bool {
        let Ok(entries) = fs::read_dir(dir) else {
            return true;
        };
        let mut entries: Vec<fs::DirEntry> = entries.flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            if self.files.len() >= max_entries {
                return false;
            }
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue; // Not UTF-8: the workspace store could not hold it anyway.
            };
            let rel = if prefix.is_empty() {
                name
            } else {
                format!("{prefix}/{name}")
            };
            let Ok(meta) = entry.path().symlink_metadata() else {
                continue;
            };
            if meta.is_dir() {
                dirs.push_back((entry.path(), rel));
            } else if meta.is_file() {
                let stamp = Stamp {
                    size: meta.len(),
                    mtime_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
                    ctime_ns: meta.ctime() * 1_000_000_000 + meta.ctime_nsec(),
                    ino: meta.ino(),
                };
                self.files.insert(rel, stamp);
            }
        }
        true
    }

    /// Whether `path` is gone from the workspace: not in a complete manifest, or, past the
    /// end of a truncated one, nothing there any more (a file the walk did not reach is not
    /// deleted).
    fn lost(&self, path: &str) -> bool {
        let missing = !self.files.contains_key(path);
        missing && (!self.truncated || self.root.join(path).symlink_metadata().is_err())
    }
}

/// Changes between two manifests, each list sorted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diff {
    pub created: Vec<String>,
    pub modified: Vec<String>,
    pub deleted: Vec<String>,
}

pub fn diff(before: &Manifest, after: &Manifest) -> Diff {
    let mut d = Diff::default();
    for (path, stamp) in &after.files {
        match before.files.get(path) {
            None => d.created.push(path.clone()),
            Some(old) if old != stamp => d.modified.push(path.clone()),
            Some(_) => {}
        }
    }
    d.deleted = before
        .files
        .keys()
        .filter(|p| after.lost(p))
        .cloned()
        .collect();
    d
}

/// Keeps the changes that fit in [`MAX_CHANGED_PATHS`] and whose names fit in
/// [`MAX_CHANGE_LIST_BYTES`], nearest the workspace's root first (a result file beside a large extracted tree is kept, the tree cut), and counts
/// the ones left out.
pub fn bound(diff: Diff) -> (Diff, u64) {
    #[derive(Clone, Copy)]
    enum Change {
        Created,
        Modified,
        Deleted,
    }
    // What a name adds to the report: a JSON string and a comma.
    let cost = |path: &str| serde_json::to_string(path).map_or(usize::MAX, |json| json.len() + 1);
    let mut all: Vec<(String, Change)> = Vec::new();
    all.extend(diff.created.into_iter().map(|p| (p, Change::Created)));
    all.extend(diff.modified.into_iter().map(|p| (p, Change::Modified)));
    all.extend(diff.deleted.into_iter().map(|p| (p, Change::Deleted)));
    let total = all.len();
    let needed = all
        .iter()
        .map(|(p, _)| cost(p))
        .fold(0usize, usize::saturating_add);
    if all.len() > MAX_CHANGED_PATHS || needed > MAX_CHANGE_LIST_BYTES {
        let depth = |p: &str| p.bytes().filter(|b| *b == b'/').count();
        all.sort_by(|(a, _), (b, _)| (depth(a), a).cmp(&(depth(b), b)));
        let mut used = 0usize;
        let fit = all
            .iter()
            .take_while(|(p, _)| {
                used = used.saturating_add(cost(p));
                used <= MAX_CHANGE_LIST_BYTES
            })
            .count();
        all.truncate(fit.min(MAX_CHANGED_PATHS));
    }
    let omitted = (total - all.len()) as u64;
    let mut kept = Diff::default();
    for (path, change) in all {
        match change {
            Change::Created => kept.created.push(path),
            Change::Modified => kept.modified.push(path),
            Change::Deleted => kept.deleted.push(path),
        }
    }
    kept.created.sort_unstable();
    kept.modified.sort_unstable();
    kept.deleted.sort_unstable();
    (kept, omitted)
}

/// Packs `paths` (relative to `root`) into a tar written to `out`, stopping before the total
/// content passes `max_bytes`. Returns the paths left out.
pub fn pack(
    root: &Path,
    paths: &[String],
    max_bytes: u64,
    out: impl Write,
) -> io::Result<Vec<String>> {
    let mut builder = tar::Builder::new(out);
    let mut total = 0u64;
    let mut skipped = Vec::new();
    for rel in paths {
        let path = root.join(rel);
        // Opened without following symlinks: the scan saw a regular file here.
        let Ok(mut file) = OpenOptions::new()
            .read(true)
            .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
            .open(&path)
        else {
            skipped.push(rel.clone());
            continue;
        };
        let meta = file.metadata()?;
        if !meta.is_file() || total + meta.len() > max_bytes {
            skipped.push(rel.clone());
            continue;
        }
        total += meta.len();
        let mut header = tar::Header::new_gnu();
        header.set_size(meta.len());
        header.set_mode(meta.mode() & 0o755);
        header.set_mtime(meta.mtime().max(0) as u64);
        header.set_entry_type(tar::EntryType::Regular);
        builder.append_data(&mut header, rel, &mut LimitedFile(&mut file, meta.len()))?;
    }
    builder.into_inner()?.flush()?;
    Ok(skipped)
}

/// A reader that yields at most the size recorded in the tar header, so a file growing after
/// the scan cannot corrupt the archive.
struct LimitedFile<'a>(&'a mut File, u64);

impl Read for LimitedFile<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.1 == 0 {
            return Ok(0);
        }
        let max = buf.len().min(self.1 as usize);
        let n = self.0.read(&mut buf[..max])?;
        self.1 -= n as u64;
        if n == 0 {
            // Shrunk after the scan: pad with zeros to keep the archive well-formed.
            let pad = max;
            buf[..pad].fill(0);
            self.1 -= pad as u64;
            return Ok(pad);
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_of(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, data) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_entry_type(tar::EntryType::Regular);
            // `append_data` refuses `..`, so write the name field directly.
            h.as_gnu_mut().unwrap().name[..path.len()].copy_from_slice(path.as_bytes());
            h.set_cksum();
            b.append(&h, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    #[test]
    fn unpack_skips_escapes_and_replaces_planted_symlinks() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("data")).unwrap();
        let archive = tar_of(&[
            ("../escape.txt", b"x"),
            ("/abs.txt", b"x"),
            ("data/in.txt", b"inside"),
            ("code/main.py", b"print(1)"),
        ]);
        let mut warnings = Vec::new();
        unpack(root.path(), &archive, &mut warnings).unwrap();
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(fs::read_dir(outside.path()).unwrap().next().is_none());
        assert!(root
            .path()
            .join("data")
            .symlink_metadata()
            .unwrap()
            .is_dir());
        assert_eq!(
            fs::read(root.path().join("data/in.txt")).unwrap(),
            b"inside"
        );
        assert_eq!(
            fs::read(root.path().join("code/main.py")).unwrap(),
            b"print(1)"
        );
    }

    #[test]
    fn a_saved_manifest_is_the_next_baseline_for_its_root_only() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("ws");
        fs::create_dir(&root).unwrap();
        fs::write(root.join("kept.txt"), "1").unwrap();
        let saved = dir.path().join("pushed.json");
        Manifest::scan(&root).write_to(&saved).unwrap();
        // Written after the save (as a background process would): a change against it.
        fs::write(root.join("later.txt"), "2").unwrap();
        let baseline = Manifest::read_from(&saved, &root).expect("read back");
        let d = diff(&baseline, &Manifest::scan(&root));
        assert_eq!(d.created, ["later.txt"]);
        assert!(d.modified.is_empty() && d.deleted.is_empty(), "{d:?}");
        // Another root's, or garbage: none.
        assert!(Manifest::read_from(&saved, dir.path()).is_none());
        fs::write(&saved, "{not json").unwrap();
        assert!(Manifest::read_from(&saved, &root).is_none());
    }

    #[test]
    fn diff_finds_created_modified_and_deleted() {
        let root = tempfile::tempdir().unwrap();
        fs::write(root.path().join("keep"), "a").unwrap();
        fs::write(root.path().join("change"), "a").unwrap();
        fs::write(root.path().join("gone"), "a").unwrap();
        let before = Manifest::scan(root.path());
        fs::write(root.path().join("change"), "b").unwrap();
        fs::remove_file(root.path().join("gone")).unwrap();
        fs::create_dir(root.path().join("sub")).unwrap();
        fs::write(root.path().join("sub/new"), "n").unwrap();
        let d = diff(&before, &Manifest::scan(root.path()));
        assert_eq!(d.created, vec!["sub/new"]);
        assert_eq!(d.modified, vec!["change"]);
        assert_eq!(d.deleted, vec!["gone"]);
    }

    #[test]
    fn a_truncated_scan_keeps_the_files_nearest_the_root_and_deletes_none_it_missed() {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir(root.path().join("bulk")).unwrap();
        for i in 0..5 {
            fs::write(root.path().join(format!("bulk/f{i}")), "x").unwrap();
        }
        let before = Manifest::scan_up_to(root.path(), 4);
        fs::write(root.path().join("result.csv"), "1").unwrap();
        let after = Manifest::scan_up_to(root.path(), 4);
        assert!(before.truncated && after.truncated);
        assert!(after.files.contains_key("result.csv"), "{after:?}");
        let d = diff(&before, &after);
        assert_eq!(d.created, vec!["result.csv"]);
        assert!(
            d.deleted.is_empty(),
            "files past the cut are not deleted: {d:?}"
        );
        // Positive control: a file really removed is still seen as deleted.
        fs::remove_file(root.path().join("bulk/f2")).unwrap();
        let d = diff(&after, &Manifest::scan_up_to(root.path(), 4));
        assert_eq!(d.deleted, vec!["bulk/f2"], "{d:?}");
    }

    #[test]
    fn a_change_list_past_its_bound_keeps_the_shallowest_names_and_counts_the_rest() {
        let small = Diff {
            created: vec!["a".into(), "b/c".into()],
            modified: vec!["m".into()],
            deleted: vec!["gone".into()],
        };
        let (kept, omitted) = bound(small.clone());
        assert_eq!(
            (kept, omitted),
            (small, 0),
            "a list within the bound is kept whole"
        );

        let bulk: Vec<String> = (0..60_000)
            .map(|i| format!("node_modules/pkg/f{i:05}.js"))
            .collect();
        let created: Vec<String> = bulk
            .iter()
            .cloned()
            .chain(["result.csv".to_string(), "weird\nname".to_string()])
            .collect();
        let (kept, omitted) = bound(Diff {
            created,
            modified: vec!["data/in.txt".into()],
            deleted: vec!["old/x".into()],
        });
        assert!(kept.created.contains(&"result.csv".to_string()));
        assert!(kept.created.contains(&"weird\nname".to_string()));
        assert_eq!(kept.modified, vec!["data/in.txt"]);
        assert_eq!(kept.deleted, vec!["old/x"]);
        let listed = kept.created.len() + kept.modified.len() + kept.deleted.len();
        assert_eq!(listed as u64 + omitted, 60_004);
        assert!(omitted > 0);
        let json = serde_json::to_vec(&(&kept.created, &kept.modified, &kept.deleted)).unwrap();
        assert!(json.len() <= MAX_CHANGE_LIST_BYTES, "{}", json.len());
        assert!(listed <= MAX_CHANGED_PATHS);
        // The cut is a prefix of the deepest level, in name order.
        assert!(kept.created.contains(&bulk[0]) && !kept.created.contains(&bulk[59_999]));
    }

    #[test]
    fn pack_respects_the_size_bound() {
        let root = tempfile::tempdir().unwrap();
        fs::write(root.path().join("small"), "12345").unwrap();
        fs::write(root.path().join("big"), vec![b'x'; 100]).unwrap();
        let mut out = Vec::new();
        let paths = vec!["big".to_string(), "small".to_string()];
        let skipped = pack(root.path(), &paths, 50, &mut out).unwrap();
        assert_eq!(skipped, vec!["big"]);
        let mut ar = tar::Archive::new(&out[..]);
        let names: Vec<String> = ar
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(names, vec!["small"]);
    }
}
