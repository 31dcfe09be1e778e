//! `/v1/file/*`: files under the workspace (the user's home), nowhere else.
//!
//! A path may be absolute (under the workspace) or relative to it. `..`, NUL and any symlink
//! on the way are refused, and the last component is opened with `O_NOFOLLOW`. This is API
//! hygiene, not the isolation boundary: commands run as the same user in the same container,
//! and the container is the boundary.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::time::SystemTime;

use base64::Engine;
use nix::fcntl::OFlag;
use serde::Serialize;

use crate::api::{
    FileContentEncoding, FileInfo, FileListRequest, FileListResult, FileReadRequest,
    FileReadResult, FileUploadResult, FileWriteRequest, FileWriteResult,
};

/// Longest path accepted (Linux's `PATH_MAX`).
const MAX_PATH: usize = 4096;
/// Most entries one `list` returns.
const MAX_LIST_ENTRIES: usize = 10_000;

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("path contains NUL")]
    Nul,
    #[error("path is longer than {MAX_PATH} bytes")]
    TooLong,
    #[error("path {0} has a `..` component")]
    Parent(String),
    #[error("path {path} is outside the workspace {root}")]
    Outside { path: String, root: String },
    #[error("path {0} goes through a symlink")]
    Symlink(String),
    #[error("content is not valid base64")]
    Base64(#[source] base64::DecodeError),
    #[error("{path} is {size} bytes, more than {limit} can be read in one answer")]
    TooLarge { path: String, size: u64, limit: u64 },
    #[error(transparent)]
    Edit(#[from] EditError),
    #[error("{path} is not a directory")]
    NotDirectory { path: String },
    #[error("{op} {path}")]
    Io {
        op: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Why a text tool ([`crate::edit`]) refused: here, beside the [`FileError`] that carries it
/// to the file API's answer, because the tools sit above the files they edit.
#[derive(Debug, thiserror::Error)]
pub enum EditError {
    #[error("invalid pattern")]
    Pattern(#[source] regex::Error),
    #[error("{0} is not UTF-8 text")]
    NotText(String),
    #[error("`{0}` is required for this command")]
    Missing(&'static str),
    #[error("no replacement was performed: old_str did not appear verbatim in {0}")]
    NotFound(String),
    #[error(
        "no replacement was performed: old_str occurs {} times (lines {lines:?}) in {path}; \
         make it unique or set replace_mode to ALL",
        lines.len()
    )]
    NotUnique { path: String, lines: Vec<usize> },
    #[error("file already exists at {0}: `create` does not overwrite")]
    Exists(String),
    #[error("{0}")]
    Range(&'static str),
    #[error("no edit to undo for {0}")]
    NoHistory(String),
    #[error("{0} is a directory: only `view` works on one")]
    Directory(String),
}

/// `FileOperationError`: what a failed file call carries in `data` (HTTP 200,
/// `success: false`), as the upstream API does.
#[derive(Debug, Serialize)]
pub struct FileOperationError {
    pub path: String,
    pub operation: &'static str,
    pub message: String,
    pub error_type: &'static str,
    pub retryable: bool,
    pub errno: Option<i32>,
    pub errno_name: Option<String>,
    pub exception_type: Option<String>,
}

impl FileError {
    pub fn to_operation_error(&self, path: &str, operation: &'static str) -> FileOperationError {
        let (error_type, errno) = match self {
            FileError::Nul
            | FileError::TooLong
            | FileError::Parent(_)
            | FileError::Base64(_)
            | FileError::NotDirectory { .. } => ("invalid_argument", None),
            FileError::Edit(EditError::NotText(_)) => ("not_text", None),
            FileError::Edit(EditError::Exists(_)) => ("already_exists", None),
            FileError::Edit(EditError::Directory(_)) => ("is_directory", None),
            FileError::Edit(_) => ("invalid_argument", None),
            FileError::Outside { .. } | FileError::Symlink(_) => ("permission_denied", None),
            FileError::TooLarge { .. } => ("too_large", None),
            FileError::Io { source, .. } => (
                match source.kind() {
                    std::io::ErrorKind::NotFound => "not_found",
                    std::io::ErrorKind::PermissionDenied => "permission_denied",
                    std::io::ErrorKind::AlreadyExists => "already_exists",
                    _ => "io_error",
                },
                source.raw_os_error(),
            ),
        };
        FileOperationError {
            path: path.to_string(),
            operation,
            message: error_chain(self),
            error_type,
            retryable: false,
            errno,
            errno_name: None,
            exception_type: None,
        }
    }
}

/// The message with its causes (`a: b: c`).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}

pub(crate) fn io<'a>(
    op: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> FileError + 'a {
    move |source| FileError::Io {
        op,
        path: path.display().to_string(),
        source,
    }
}

/// The workspace root and the file operations confined to it.
#[derive(Debug, Clone)]
pub struct Workspace {
    root: PathBuf,
    max_read_bytes: u64,
}

impl Workspace {
    /// `root` must exist; it is canonicalised once, here.
    pub fn new(root: &Path, max_read_bytes: u64) -> std::io::Result<Self> {
        Ok(Self {
            root: root.canonicalize()?,
            max_read_bytes,
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The checked absolute path for `requested`; components that exist are not symlinks.
    pub fn resolve(&self, requested: &str) -> Result<PathBuf, FileError> {
        if requested.contains('\0') {
            return Err(FileError::Nul);
        }
        if requested.len() > MAX_PATH {
            return Err(FileError::TooLong);
        }
        let requested_path = Path::new(requested);
        let relative = if requested_path.is_absolute() {
            requested_path
                .strip_prefix(&self.root)
                .map_err(|_| FileError::Outside {
                    path: requested.to_string(),
                    root: self.root.display().to_string(),
                })?
        } else {
            requested_path
        };
        let mut path = self.root.clone();
        // Once a component does not exist, nothing below it can be a symlink.
        let mut exists = true;
        for component in relative.components() {
            match component {
                Component::Normal(name) => path.push(name),
                Component::CurDir => continue,
                Component::ParentDir => return Err(FileError::Parent(requested.to_string())),
                Component::RootDir | Component::Prefix(_) => {
                    return Err(FileError::Outside {
                        path: requested.to_string(),
                        root: self.root.display().to_string(),
                    })
                }
            }
            if exists {
                match std::fs::symlink_metadata(&path) {
                    Ok(meta) if meta.file_type().is_symlink() => {
                        return Err(FileError::Symlink(requested.to_string()))
                    }
                    Ok(_) => {}
                    Err(_) => exists = false,
                }
            }
        }
        Ok(path)
    }

    /// The working directory for a command or kernel: the workspace, a directory relative to
    /// it (checked like a file path), or any existing absolute directory, as upstream
    /// allows. The file calls' confinement is API hygiene; a command's working directory
    /// grants nothing its own `cd` could not.
    pub fn exec_dir(&self, requested: Option<&str>) -> Result<PathBuf, FileError> {
        let dir = match requested {
            None | Some("") => return Ok(self.root.clone()),
            Some(dir) if dir.contains('\0') => return Err(FileError::Nul),
            Some(dir) if dir.len() > MAX_PATH => return Err(FileError::TooLong),
            Some(dir) if Path::new(dir).is_absolute() => PathBuf::from(dir),
            Some(dir) => self.resolve(dir)?,
        };
        match std::fs::metadata(&dir) {
            Ok(meta) if meta.is_dir() => Ok(dir),
            Ok(_) => Err(FileError::NotDirectory {
                path: dir.display().to_string(),
            }),
            Err(source) => Err(FileError::Io {
                op: "open directory",
                path: dir.display().to_string(),
                source,
            }),
        }
    }

    pub fn read(&self, req: &FileReadRequest) -> Result<FileReadResult, FileError> {
        let path = self.resolve(&req.file)?;
        let bytes = self.read_bytes(&path)?;
        let text = String::from_utf8_lossy(&bytes);
        let content = if req.start_line.is_some() || req.end_line.is_some() {
            // 0-based, end exclusive; lines keep their terminators.
            let start = req.start_line.unwrap_or(0);
            let end = req.end_line.unwrap_or(usize::MAX);
            text.split_inclusive('\n')
                .skip(start)
                .take(end.saturating_sub(start))
                .collect()
        } else {
            text.into_owned()
        };
        Ok(FileReadResult {
            content,
            file: path.display().to_string(),
        })
    }

    /// The bytes of a regular file (no symlink as last component), at most `max_read_bytes`.
    pub fn read_bytes(&self, path: &Path) -> Result<Vec<u8>, FileError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(OFlag::O_NOFOLLOW.bits())
            .open(path)
            .map_err(io("open", path))?;
        let size = file.metadata().map_err(io("stat", path))?.len();
        if size > self.max_read_bytes {
            return Err(FileError::TooLarge {
                path: path.display().to_string(),
                size,
                limit: self.max_read_bytes,
            });
        }
        let mut bytes = Vec::with_capacity(size as usize);
        std::io::Read::read_to_end(
            &mut std::io::Read::take(file, self.max_read_bytes),
            &mut bytes,
        )
        .map_err(io("read", path))?;
        Ok(bytes)
    }

    pub fn write(&self, req: &FileWriteRequest) -> Result<FileWriteResult, FileError> {
        let path = self.resolve(&req.file)?;
        let mut bytes = match req.encoding.unwrap_or_default() {
            FileContentEncoding::Base64 => base64::engine::general_purpose::STANDARD
                .decode(req.content.as_bytes())
                .map_err(FileError::Base64)?,
            FileContentEncoding::Utf8 | FileContentEncoding::Raw => req.content.clone().into(),
        };
        if req.leading_newline == Some(true) {
            bytes.insert(0, b'\n');
        }
        if req.trailing_newline == Some(true) {
            bytes.push(b'\n');
        }
        let written = self.write_bytes(&path, &bytes, req.append == Some(true))?;
        Ok(FileWriteResult {
            file: path.display().to_string(),
            bytes_written: written,
        })
    }

    /// Writes `bytes` to a checked path, making its missing parent directories.
    pub fn write_bytes(&self, path: &Path, bytes: &[u8], append: bool) -> Result<u64, FileError> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io("create directories for", path))?;
        }
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .append(append)
            .truncate(!append)
            .custom_flags(OFlag::O_NOFOLLOW.bits())
            .open(path)
            .map_err(io("open", path))?;
        file.write_all(bytes).map_err(io("write", path))?;
        Ok(bytes.len() as u64)
    }

    pub fn list(&self, req: &FileListRequest) -> Result<FileListResult, FileError> {
        let dir = self.resolve(&req.path)?;
        let max_depth = if req.recursive == Some(true) {
            req.max_depth.unwrap_or(usize::MAX)
        } else {
            1
        };
        let mut files = Vec::new();
        self.walk(
            &dir,
            1,
            max_depth,
            req.show_hidden != Some(false),
            &mut files,
        )?;
        files.sort_by(|a, b| a.path.cmp(&b.path));
        let directory_count = files.iter().filter(|f| f.is_directory).count();
        Ok(FileListResult {
            path: dir.display().to_string(),
            total_count: files.len(),
            directory_count,
            file_count: files.len() - directory_count,
            files,
        })
    }

    fn walk(
        &self,
        dir: &Path,
        depth: usize,
        max_depth: usize,
        show_hidden: bool,
        out: &mut Vec<FileInfo>,
    ) -> Result<(), FileError> {
        for entry in std::fs::read_dir(dir).map_err(io("list", dir))? {
            let entry = entry.map_err(io("list", dir))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !show_hidden && name.starts_with('.') {
                continue;
            }
            if out.len() >= MAX_LIST_ENTRIES {
                return Ok(());
            }
            let path = entry.path();
            // symlink_metadata: a symlink is listed, never followed.
            let meta = std::fs::symlink_metadata(&path).map_err(io("stat", &path))?;
            let is_directory = meta.is_dir();
            out.push(FileInfo {
                extension: (!is_directory)
                    .then(|| path.extension().map(|e| e.to_string_lossy().into_owned()))
                    .flatten(),
                name,
                path: path.display().to_string(),
                is_directory,
                size: Some(meta.len()),
                modified_time: meta.modified().ok().map(rfc3339),
                permissions: Some(format!("{:o}", meta.permissions().mode() & 0o7777)),
            });
            if is_directory && depth < max_depth {
                self.walk(&path, depth + 1, max_depth, show_hidden, out)?;
            }
        }
        Ok(())
    }

    /// `POST /v1/file/upload`: `path` is the target file, or the workspace directory plus
    /// the part's file name when absent.
    pub fn upload(&self, upload: &Upload) -> Result<FileUploadResult, FileError> {
        let target = match (&upload.path, &upload.file_name) {
            (Some(path), _) => path.clone(),
            (None, Some(name)) => name.clone(),
            (None, None) => "upload.bin".to_string(),
        };
        let path = self.resolve(&target)?;
        let size = self.write_bytes(&path, &upload.content, false)?;
        Ok(FileUploadResult {
            file_path: path.display().to_string(),
            file_size: size,
            success: true,
        })
    }
}

/// A `multipart/form-data` upload: fields `file` (required) and `path`.
#[derive(Debug, Default, PartialEq)]
pub struct Upload {
    pub content: Vec<u8>,
    pub file_name: Option<String>,
    pub path: Option<String>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum MultipartError {
    #[error("Content-Type is not multipart/form-data with a boundary")]
    NotMultipart,
    #[error("malformed multipart body: {0}")]
    Malformed(&'static str),
    #[error("multipart body has no `file` field")]
    NoFile,
}

/// Parses a whole (size-limited) `multipart/form-data` body.
pub fn parse_upload(content_type: &str, body: &[u8]) -> Result<Upload, MultipartError> {
    let boundary = content_type
        .split(';')
        .map(str::trim)
        .skip_while(|p| !p.eq_ignore_ascii_case("multipart/form-data"))
        .find_map(|p| p.strip_prefix("boundary="))
        .map(|b| b.trim_matches('"'))
        .filter(|b| !b.is_empty())
        .ok_or(MultipartError::NotMultipart)?;
    let delimiter = format!("--{boundary}");
    let mut upload = Upload::default();
    let mut found_file = false;
    let mut rest = body;
    let start = find(rest, delimiter.as_bytes()).ok_or(MultipartError::Malformed("no boundary"))?;
    rest = &rest[start + delimiter.len()..];
    loop {
        if rest.starts_with(b"--") {
            break;
        }
        rest = rest
            .strip_prefix(b"\r\n")
            .ok_or(MultipartError::Malformed("boundary not followed by CRLF"))?;
        let header_end =
            find(rest, b"\r\n\r\n").ok_or(MultipartError::Malformed("part without headers"))?;
        let headers = String::from_utf8_lossy(&rest[..header_end]);
        rest = &rest[header_end + 4..];
        let end_marker = format!("\r\n{delimiter}");
        let end = find(rest, end_marker.as_bytes())
            .ok_or(MultipartError::Malformed("unterminated part"))?;
        let content = &rest[..end];
        rest = &rest[end + end_marker.len()..];
        let disposition = headers
            .lines()
            .find(|l| l.to_ascii_lowercase().starts_with("content-disposition:"))
            .unwrap_or("");
        match disposition_param(disposition, "name").as_deref() {
            Some("file") => {
                found_file = true;
                upload.content = content.to_vec();
                upload.file_name = disposition_param(disposition, "filename");
            }
            Some("path") => {
                upload.path = Some(String::from_utf8_lossy(content).into_owned());
            }
            _ => {}
        }
    }
    if !found_file {
        return Err(MultipartError::NoFile);
    }
    Ok(upload)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn disposition_param(header: &str, key: &str) -> Option<String> {
    header.split(';').map(str::trim).find_map(|p| {
        let (k, v) = p.split_once('=')?;
        (k.trim() == key).then(|| v.trim().trim_matches('"').to_string())
    })
}

/// `2026-11-26T10:00:00Z` without a date crate (Howard Hinnant's civil-from-days).
fn rfc3339(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workspace() -> (tempfile::TempDir, Workspace) {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::new(dir.path(), 1 << 20).unwrap();
        (dir, ws)
    }

    #[test]
    fn resolves_relative_and_absolute_paths_inside() {
        let (_d, ws) = workspace();
        let root = ws.root().to_path_buf();
        assert_eq!(ws.resolve("a/b.txt").unwrap(), root.join("a/b.txt"));
        let abs = root.join("c.txt");
        assert_eq!(ws.resolve(abs.to_str().unwrap()).unwrap(), abs);
        assert_eq!(ws.resolve("./x").unwrap(), root.join("x"));
    }

    #[test]
    fn refuses_escapes() {
        let (_d, ws) = workspace();
        assert!(matches!(ws.resolve("../x"), Err(FileError::Parent(_))));
        assert!(matches!(ws.resolve("a/../../x"), Err(FileError::Parent(_))));
        assert!(matches!(
            ws.resolve("/etc/passwd"),
            Err(FileError::Outside { .. })
        ));
        assert!(matches!(ws.resolve("a\0b"), Err(FileError::Nul)));
        assert!(matches!(
            ws.resolve(&"a".repeat(5000)),
            Err(FileError::TooLong)
        ));
        // A sibling directory whose name starts with the root's is still outside.
        let sibling = format!("{}x/file", ws.root().display());
        assert!(matches!(
            ws.resolve(&sibling),
            Err(FileError::Outside { .. })
        ));
    }

    #[test]
    fn commands_may_run_in_any_existing_absolute_directory() {
        let (_d, ws) = workspace();
        std::fs::create_dir(ws.root().join("sub")).unwrap();
        assert_eq!(ws.exec_dir(None).unwrap(), ws.root());
        assert_eq!(ws.exec_dir(Some("sub")).unwrap(), ws.root().join("sub"));
        assert_eq!(ws.exec_dir(Some("/etc")).unwrap(), Path::new("/etc"));
        assert!(matches!(
            ws.exec_dir(Some("../x")),
            Err(FileError::Parent(_))
        ));
        assert!(matches!(
            ws.exec_dir(Some("/etc/passwd")),
            Err(FileError::NotDirectory { .. })
        ));
        assert!(matches!(
            ws.exec_dir(Some("/nonexistent")),
            Err(FileError::Io { .. })
        ));
        assert!(matches!(ws.exec_dir(Some("/tmp\0x")), Err(FileError::Nul)));
    }

    #[test]
    fn refuses_symlinks_anywhere_on_the_path() {
        let (_d, ws) = workspace();
        std::os::unix::fs::symlink("/etc", ws.root().join("etc")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", ws.root().join("pw")).unwrap();
        assert!(matches!(
            ws.resolve("etc/passwd"),
            Err(FileError::Symlink(_))
        ));
        assert!(matches!(ws.resolve("pw"), Err(FileError::Symlink(_))));
        let read = FileReadRequest {
            file: "pw".into(),
            start_line: None,
            end_line: None,
        };
        assert!(ws.read(&read).is_err());
    }

    #[test]
    fn write_read_list_round_trip() {
        let (_d, ws) = workspace();
        let write = |file: &str, content: &str, encoding| FileWriteRequest {
            file: file.into(),
            content: content.into(),
            encoding,
            append: None,
            leading_newline: None,
            trailing_newline: None,
        };
        ws.write(&write("d/one.txt", "a\nb\nc\n", None)).unwrap();
        ws.write(&write("two.bin", "AAEC", Some(FileContentEncoding::Base64)))
            .unwrap();
        assert!(matches!(
            ws.write(&write("bad", "!!", Some(FileContentEncoding::Base64))),
            Err(FileError::Base64(_))
        ));
        let read = ws
            .read(&FileReadRequest {
                file: "d/one.txt".into(),
                start_line: Some(1),
                end_line: Some(2),
            })
            .unwrap();
        assert_eq!(read.content, "b\n");
        assert_eq!(
            std::fs::read(ws.root().join("two.bin")).unwrap(),
            [0u8, 1, 2]
        );
        let list = ws
            .list(&FileListRequest {
                path: ".".into(),
                recursive: Some(true),
                show_hidden: None,
                max_depth: None,
            })
            .unwrap();
        let names: Vec<_> = list.files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["d", "one.txt", "two.bin"]);
        assert_eq!((list.directory_count, list.file_count), (1, 2));
    }

    #[test]
    fn reads_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::new(dir.path(), 4).unwrap();
        std::fs::write(ws.root().join("big"), "12345").unwrap();
        let path = ws.resolve("big").unwrap();
        assert!(matches!(
            ws.read_bytes(&path),
            Err(FileError::TooLarge { size: 5, .. })
        ));
    }

    #[test]
    fn parses_a_multipart_upload() {
        let body = b"--XyZ\r\nContent-Disposition: form-data; name=\"path\"\r\n\r\nout/f.bin\r\n\
--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f.bin\"\r\n\
Content-Type: application/octet-stream\r\n\r\n\x00\x01\r\n\x02\r\n--XyZ--\r\n";
        let upload = parse_upload("multipart/form-data; boundary=XyZ", body).unwrap();
        assert_eq!(upload.content, b"\x00\x01\r\n\x02");
        assert_eq!(upload.file_name.as_deref(), Some("f.bin"));
        assert_eq!(upload.path.as_deref(), Some("out/f.bin"));
    }

    #[test]
    fn refuses_malformed_multipart() {
        assert_eq!(
            parse_upload("application/json", b""),
            Err(MultipartError::NotMultipart)
        );
        assert_eq!(
            parse_upload(
                "multipart/form-data; boundary=a",
                b"--a\r\nX: y\r\n\r\nno end"
            ),
            Err(MultipartError::Malformed("unterminated part"))
        );
        let no_file = b"--a\r\nContent-Disposition: form-data; name=\"path\"\r\n\r\np\r\n--a--";
        assert_eq!(
            parse_upload("multipart/form-data; boundary=a", no_file),
            Err(MultipartError::NoFile)
        );
    }

    #[test]
    fn formats_times() {
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_764_151_200);
        assert_eq!(rfc3339(t), "2025-11-26T10:00:00Z");
    }
}
