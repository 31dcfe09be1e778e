//! Tar archives in and out of a workspace.
//!
//! Reading is the hostile direction: the archive is checked *as a whole* before anything of
//! it is committed (restore calls `parse`, and only then touches the index). Refused: any
//! entry that is not a plain file or directory (symlinks, hardlinks, devices, fifos, sparse
//! files), paths that are absolute or climb out (`..`, also in GNU long names and pax
//! `path` records, which are parsed here with size caps rather than by the tar crate, which
//! would read them whole), duplicate files, a file where a directory is needed, more than
//! `max_entries` entries or `max_bytes` of content (declared sizes are checked before any
//! data is read). Set-id and sticky bits are dropped: modes are stored `& 0o777`.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;

use tar::{EntryType, Header, PaxExtensions};

use crate::error::{Result, StoreError};
use crate::files::sha256_hex;
use crate::index::Node;
use crate::keys::RelPath;

/// GNU long names and pax records are small; anything bigger is an attack on memory.
const MAX_LONG_NAME: u64 = 4096;
const MAX_PAX_RECORD: u64 = 64 * 1024;
/// Contents kept in memory while parsing; past this, files go to the object store at once.
const INLINE_BUDGET: u64 = 64 << 20;
/// Files above this go to the object store during the parse, whatever the budget.
const INLINE_FILE_MAX: u64 = 4 << 20;

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_entries: u64,
    pub max_bytes: u64,
}

#[derive(Debug)]
pub enum Content {
    Inline(Vec<u8>),
    /// Already uploaded during the parse, under this object name.
    Stored(String),
}

#[derive(Debug)]
pub struct StagedFile {
    pub mode: u32,
    /// Unix milliseconds.
    pub modified: u64,
    pub size: u64,
    pub sha256: String,
    pub content: Content,
}

/// A checked archive, ready to commit.
#[derive(Debug, Default)]
pub struct Staged {
    pub files: BTreeMap<RelPath, StagedFile>,
    pub dirs: BTreeSet<RelPath>,
}

impl Staged {
    pub fn bytes(&self) -> u64 {
        self.files.values().map(|f| f.size).sum()
    }
}

fn refuse(entry: &str, reason: impl std::fmt::Display) -> StoreError {
    StoreError::BadRequest(format!("archive entry {entry:?}: {reason}"))
}

fn malformed(e: impl std::fmt::Display) -> StoreError {
    StoreError::BadRequest(format!("the archive is not a valid tar: {e}"))
}

fn read_capped(entry: &mut impl Read, size: u64, cap: u64, what: &str) -> Result<Vec<u8>> {
    if size > cap {
        return Err(StoreError::BadRequest(format!(
            "a {what} of {size} bytes; at most {cap} are accepted"
        )));
    }
    let mut data = Vec::with_capacity(size as usize);
    entry.take(size).read_to_end(&mut data).map_err(malformed)?;
    if data.len() as u64 != size {
        return Err(malformed("an entry is cut short"));
    }
    Ok(data)
}

fn strip_nuls(mut bytes: Vec<u8>) -> Vec<u8> {
    while bytes.last() == Some(&0) {
        bytes.pop();
    }
    bytes
}

/// Parses and checks a whole archive. `store` uploads contents too large to keep in memory
/// and returns their object names; the caller removes those if this fails.
pub fn parse(
    reader: impl Read,
    limits: Limits,
    store: &mut dyn FnMut(&[u8]) -> Result<String>,
) -> Result<Staged> {
    let mut archive = tar::Archive::new(reader);
    let entries = archive.entries().map_err(malformed)?.raw(true);
    let mut staged = Staged::default();
    let (mut count, mut total, mut inline) = (0u64, 0u64, 0u64);
    let mut long_name: Option<Vec<u8>> = None;
    let mut pax_path: Option<Vec<u8>> = None;
    for entry in entries {
        let mut entry = entry.map_err(malformed)?;
        count += 1;
        if count > limits.max_entries {
            return Err(StoreError::TooLarge(format!(
                "the archive has more than {} entries",
                limits.max_entries
            )));
        }
        let header = entry.header().clone();
        let size = header.entry_size().map_err(malformed)?;
        let kind = header.entry_type();
        match kind {
            EntryType::GNULongName => {
                let name = read_capped(&mut entry, size, MAX_LONG_NAME, "long name")?;
                long_name = Some(strip_nuls(name));
                continue;
            }
            EntryType::XHeader => {
                let data = read_capped(&mut entry, size, MAX_PAX_RECORD, "pax header")?;
                pax_path = pax_record_path(&data)?.or(pax_path);
                continue;
            }
            EntryType::XGlobalHeader => {
                // Global defaults (comments, charset): read within the cap, otherwise unused.
                read_capped(&mut entry, size, MAX_PAX_RECORD, "pax global header")?;
                continue;
            }
            _ => {}
        }
        let raw_name = pax_path
            .take()
            .or_else(|| long_name.take())
            .unwrap_or_else(|| header.path_bytes().into_owned());
        let name =
            String::from_utf8(raw_name).map_err(|_| refuse("<binary>", "names must be UTF-8"))?;
        match kind {
            EntryType::Regular | EntryType::Directory => {}
            EntryType::Symlink | EntryType::Link | EntryType::GNULongLink => {
                return Err(refuse(&name, "links are not allowed"))
            }
            EntryType::Char | EntryType::Block => {
                return Err(refuse(&name, "device files are not allowed"))
            }
            EntryType::Fifo => return Err(refuse(&name, "fifos are not allowed")),
            other => {
                return Err(refuse(
                    &name,
                    format!("entry type {:?} is not allowed", other.as_byte() as char),
                ))
            }
        }
        let Some(path) = entry_path(&name)? else {
            continue; // the archive's own root, `./`
        };
        if kind == EntryType::Directory {
            staged.dirs.insert(path);
            continue;
        }
        if total.saturating_add(size) > limits.max_bytes {
            return Err(StoreError::TooLarge(format!(
                "the archive unpacks to more than {} bytes",
                limits.max_bytes
            )));
        }
        total += size;
        if staged.files.contains_key(&path) {
            return Err(refuse(&name, "appears twice"));
        }
        let data = read_capped(&mut entry, size, u64::MAX, "file")?;
        let sha256 = sha256_hex(&data);
        let content = if size > INLINE_FILE_MAX || inline + size > INLINE_BUDGET {
            Content::Stored(store(&data)?)
        } else {
            inline += size;
            Content::Inline(data)
        };
        let mode = header.mode().map_err(malformed)? & 0o777;
        let modified = header.mtime().map_err(malformed)?.saturating_mul(1000);
        staged.files.insert(
            path,
            StagedFile {
                mode,
                modified,
                size,
                sha256,
                content,
            },
        );
    }
    check_shape(&staged)?;
    Ok(staged)
}

/// The `path` of a pax record set; `size` and sparse records are refused (they would change
/// how the data that follows is read).
fn pax_record_path(data: &[u8]) -> Result<Option<Vec<u8>>> {
    let mut path = None;
    for record in PaxExtensions::new(data) {
        let record = record.map_err(malformed)?;
        let key = record.key().map_err(malformed)?;
        if key == "path" {
            path = Some(record.value_bytes().to_vec());
        } else if key == "size" || key.starts_with("GNU.sparse.") {
            return Err(malformed(format!("pax record {key:?} is not supported")));
        }
    }
    Ok(path)
}

/// A workspace path from an archive name: `./` prefixes and a trailing `/` are dropped, the
/// rest must pass the same checks as any request path. `None` for the root itself.
fn entry_path(name: &str) -> Result<Option<RelPath>> {
    let mut rest = name;
    while let Some(r) = rest.strip_prefix("./") {
        rest = r;
    }
    let rest = rest.trim_end_matches('/');
    if rest.is_empty() || rest == "." {
        if name.starts_with('/') {
            return Err(refuse(name, "absolute paths are not allowed"));
        }
        return Ok(None);
    }
    RelPath::parse("entry", rest)
        .map(|(p, _)| Some(p))
        .map_err(|e| refuse(name, e))
}

/// No file may stand where the archive needs a directory.
fn check_shape(staged: &Staged) -> Result<()> {
    for path in staged.files.keys().chain(staged.dirs.iter()) {
        for ancestor in path.ancestors() {
            if staged.files.contains_key(&ancestor) {
                return Err(refuse(
                    &path.to_string(),
                    format!("{ancestor} is a file in the same archive"),
                ));
            }
        }
    }
    if let Some(both) = staged.dirs.iter().find(|d| staged.files.contains_key(d)) {
        return Err(refuse(&both.to_string(), "is both a file and a directory"));
    }
    Ok(())
}

/// The tar header of a node (owner 0, permission bits only).
pub fn header_of(node: &Node) -> Header {
    let mut header = Header::new_gnu();
    header.set_entry_type(if node.is_dir() {
        EntryType::Directory
    } else {
        EntryType::Regular
    });
    header.set_size(if node.is_dir() { 0 } else { node.size });
    header.set_mode(node.mode & 0o777);
    header.set_mtime(node.modified / 1000);
    header.set_uid(0);
    header.set_gid(0);
    header
}

/// Appends one node; `data` is the content of a file (empty for directories).
pub fn append(
    builder: &mut tar::Builder<impl std::io::Write>,
    path: &RelPath,
    node: &Node,
    data: impl Read,
) -> std::io::Result<()> {
    let mut header = header_of(node);
    let name = if node.is_dir() {
        format!("{path}/")
    } else {
        path.to_string()
    };
    builder.append_data(&mut header, name, data)
}

#[cfg(test)]
mod tests;
