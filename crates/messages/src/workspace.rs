//! Per-session workspaces (workspace-store).

use serde::{Deserialize, Serialize};

use crate::exec::ContentEncoding;
use crate::tenancy::{unscoped, Tenant};

/// The largest content (file or tar) that travels inside one message; anything larger is handed
/// over through the workspace objects bucket (`object` fields). base64 grows it by 4/3, and the
/// message must stay below the 1 MiB default max payload. The store, its
/// clients and the executors all decide by this one number.
pub const INLINE_MAX_BYTES: u64 = 700 * 1024;

/// Chunk size of objects put in the workspace objects bucket: few round trips, each chunk well
/// below the max payload.
pub const OBJECT_CHUNK_SIZE: usize = 512 * 1024;

/// Where a client puts an object it hands over (`upload/<token>`, token 1–64 of
/// `[A-Za-z0-9_-]`); the store takes it over when the write or restore names it.
pub const UPLOAD_PREFIX: &str = "upload/";

/// The most bytes one `workspace.upload` chunk or one ranged read carries: like an inline
/// write, it must fit one message once base64-encoded.
pub const TRANSFER_CHUNK_MAX_BYTES: u64 = INLINE_MAX_BYTES;

/// The size of the ranges a client reads a large file or snapshot in: one object chunk, so
/// every range is one direct get in the store.
pub const READ_RANGE_BYTES: u64 = OBJECT_CHUNK_SIZE as u64;

/// Uploads one session may have open at once (chunks stored, not yet committed).
pub const MAX_UPLOADS_PER_SESSION: usize = 8;

/// A fresh name to hand content over under.
pub fn upload_name() -> String {
    format!("{UPLOAD_PREFIX}{}", crate::new_id())
}

/// Content as it goes on the wire: UTF-8 text when it is text *and* JSON-escaping would not
/// make it larger than base64 (quotes and control characters grow), so an inline reply never
/// outgrows the message it was sized for.
pub fn wire_content(bytes: &[u8]) -> (String, ContentEncoding) {
    if let Ok(text) = std::str::from_utf8(bytes) {
        let escaped: usize = text
            .bytes()
            .map(|b| match b {
                b'"' | b'\\' | b'\n' | b'\r' | b'\t' => 2,
                0..=0x1f => 6,
                _ => 1,
            })
            .sum();
        if escaped <= bytes.len().div_ceil(3) * 4 {
            return (text.to_string(), ContentEncoding::Utf8);
        }
    }
    (crate::encode_base64(bytes), ContentEncoding::Base64)
}

/// The directories every workspace starts with.
pub const LAYOUT_DIRS: &[&str] = &["code", "data", "output", "artifacts", "temp", ".memory"];
/// The memory files created by `init`, with their first line.
pub const MEMORY_FILES: &[(&str, &str)] = &[
    (".memory/task_plan.md", "# Task Plan\n"),
    (".memory/findings.md", "# Findings\n"),
    (".memory/progress.md", "# Progress\n"),
];

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WsInit {
    pub session_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WsWrite {
    pub session_id: String,
    pub path: String,
    pub content: String,
    #[serde(default)]
    pub encoding: ContentEncoding,
    /// Append instead of replacing.
    #[serde(default)]
    pub append: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
    /// Large writes: the name (`upload/<token>`) of an object the client put in the workspace
    /// objects bucket; `content` stays empty. The store takes the object over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
    /// Large writes by request/reply only: the chunks sent with `upload` under this id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload: Option<UploadRef>,
}

/// `upload`: one chunk of content on its way into the workspace, stored by the store until a
/// write or restore names its upload (or the upload expires). Chunks may arrive in any
/// order after `seq` 0, which opens the upload; sending a chunk again replaces it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WsUploadChunk {
    pub session_id: String,
    /// Chosen by the client (1–64 of `[A-Za-z0-9_-]`, e.g. a ULID), unique per session.
    pub upload_id: String,
    pub seq: u64,
    /// At most [`TRANSFER_CHUNK_MAX_BYTES`]; base64 in JSON, bin in msgpack.
    #[serde(with = "crate::codec::bytes_b64")]
    pub data: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct WsUploadAck {
    pub upload_id: String,
    pub seq: u64,
}

/// Names a finished upload in a write or restore: the content is its chunks `0..chunks` in
/// order, and must hash to `sha256` (hex).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UploadRef {
    pub upload_id: String,
    pub chunks: u64,
    pub sha256: String,
}

/// `fetch`: a range of a staged snapshot (`WsArchive::object`) of the caller's session.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WsFetch {
    pub session_id: String,
    pub object: String,
    pub offset: u64,
    pub length: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WsRead {
    pub session_id: String,
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub length: Option<u64>,
    /// Preferred encoding of the reply; binary content always comes back as base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<ContentEncoding>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WsFile {
    pub path: String,
    pub content: String,
    pub encoding: ContentEncoding,
    /// The whole file's size, even when a range was read.
    pub size: u64,
    /// Set instead of `content` when the file is too large to travel inline: the object in
    /// the workspace objects bucket holding it, to fetch from the object store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
    /// SHA-256 of the whole file, hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WsList {
    pub session_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    #[serde(default)]
    pub recursive: bool,
    /// Paging: continue after this path (the `next` of the previous page).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    /// Paging: at most this many entries (the store may return fewer to fit one message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WsEntry {
    pub path: String,
    pub size: u64,
    pub is_dir: bool,
    /// Unix milliseconds.
    pub modified: u64,
    /// Permission bits (`& 0o777`; set-id and sticky bits are never stored).
    #[serde(default)]
    pub mode: u32,
    /// SHA-256 of a file's content, hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct WsListing {
    pub entries: Vec<WsEntry>,
    /// Set when more entries follow: ask again with `after` set to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// `stat` and `delete` name one path.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WsPath {
    pub session_id: String,
    pub path: String,
    #[serde(default)]
    pub recursive: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
}

/// `snapshot`: the workspace as a tar. Small snapshots come inline (base64 in JSON, bin in
/// msgpack); larger ones are left in the object store under `object` for the caller to fetch.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WsSnapshot {
    pub session_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WsArchive {
    pub session_id: String,
    /// Inline tar bytes, base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tar_base64: Option<String>,
    /// Object-store name holding the tar when it is too large to travel inline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
    pub size: u64,
    pub files: u64,
    /// The session's revision read before the snapshot was taken: the archive holds at
    /// least every change up to it. `None`: the session has no revision yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<u64>,
}

/// The KV key (in the workspace index bucket, `Subjects::workspace_index_bucket`) whose
/// entry revision is the session's workspace revision: every change of the workspace (write,
/// delete, restore, init, cleanup) puts it once, after the change landed, so a reader that
/// sees the same entry revision twice knows nothing changed in between — one direct KV read,
/// no workspace-store request. Gone when the workspace is removed.
pub fn revision_key(session_id: &str) -> String {
    format!("{session_id}.rev")
}

/// `restore`: unpack a tar into the workspace, all or nothing.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WsRestore {
    pub session_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tar_base64: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
    /// The archive sent with `upload` chunks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload: Option<UploadRef>,
    /// Remove files not present in the archive.
    #[serde(default)]
    pub replace: bool,
    /// Paths to remove in the same all-or-nothing step (files the code deleted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub delete: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct WsRestored {
    pub files_created: Vec<String>,
    pub files_modified: Vec<String>,
    pub files_deleted: Vec<String>,
    /// The session's revision after this restore ([`revision_key`]), and the one just before
    /// it: a caller that held `previous_revision` now holds `revision`, because no other
    /// change came in between.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_revision: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WsUsageRequest {
    pub session_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WsUsage {
    pub session_id: String,
    pub bytes: u64,
    pub files: u64,
    pub quota_bytes: u64,
    /// Unix milliseconds of the last change.
    pub last_modified: u64,
}

/// `cleanup`: remove one session's workspace, or sweep every workspace idle past the TTL.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WsCleanup {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub older_than_hours: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct WsCleaned {
    pub sessions_removed: Vec<String>,
}

/// A plain acknowledgement for calls that change state and have nothing else to say.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Ack {
    pub ok: bool,
}

/// A workspace request names its session: a tenant's agent names it as it knows it, and the
/// store scopes it by the caller's tenant (`crate::tenancy`) before looking anything up.
pub trait NamesSession {
    /// The session id to scope (`None`: the request names no session).
    fn session_mut(&mut self) -> Option<&mut String>;

    /// Whether the request names an object of the workspace objects bucket, which only
    /// services may do: an agent could name another tenant's object.
    fn names_object(&self) -> bool {
        false
    }
}

/// A workspace reply that names its session: unscoped for the tenant's agent.
pub trait ShowsSession: Sized {
    fn unscoped(self, _tenant: Option<&Tenant>) -> Self {
        self
    }
}

macro_rules! names_session {
    ($($t:ty),*) => {$(
        impl NamesSession for $t {
            fn session_mut(&mut self) -> Option<&mut String> {
                Some(&mut self.session_id)
            }
        }
    )*};
}
names_session!(
    WsInit,
    WsRead,
    WsList,
    WsPath,
    WsSnapshot,
    WsUsageRequest,
    WsUploadChunk,
    WsFetch
);

impl NamesSession for WsWrite {
    fn session_mut(&mut self) -> Option<&mut String> {
        Some(&mut self.session_id)
    }
    fn names_object(&self) -> bool {
        self.object.is_some()
    }
}

impl NamesSession for WsRestore {
    fn session_mut(&mut self) -> Option<&mut String> {
        Some(&mut self.session_id)
    }
    fn names_object(&self) -> bool {
        self.object.is_some()
    }
}

impl NamesSession for WsCleanup {
    fn session_mut(&mut self) -> Option<&mut String> {
        self.session_id.as_mut()
    }
}

impl ShowsSession for WsFile {}
impl ShowsSession for WsEntry {}
impl ShowsSession for WsListing {}
impl ShowsSession for WsRestored {}
impl ShowsSession for Ack {}
impl ShowsSession for WsUploadAck {}

impl ShowsSession for WsArchive {
    fn unscoped(mut self, tenant: Option<&Tenant>) -> Self {
        self.session_id = unscoped(tenant, &self.session_id);
        self
    }
}

impl ShowsSession for WsUsage {
    fn unscoped(mut self, tenant: Option<&Tenant>) -> Self {
        self.session_id = unscoped(tenant, &self.session_id);
        self
    }
}

impl ShowsSession for WsCleaned {
    fn unscoped(mut self, tenant: Option<&Tenant>) -> Self {
        self.sessions_removed = self
            .sessions_removed
            .iter()
            .map(|s| unscoped(tenant, s))
            .collect();
        self
    }
}
