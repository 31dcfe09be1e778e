//! `WorkspaceClient`: typed calls to the workspace-store for other services and the CLI,
//! with the large-content hand-off done for the caller — content too large for one message
//! goes through the object store (`upload/<id>` on the way in; the object named in a read or
//! snapshot reply on the way out).

use std::time::Duration;

use async_nats::jetstream::{self, object_store};
use kit::{CallError, Caller};
use messages::exec::ContentEncoding;
use messages::subjects::WorkspaceOp;
use messages::workspace::{
    Ack, WsArchive, WsCleaned, WsCleanup, WsEntry, WsFile, WsInit, WsList, WsListing, WsPath,
    WsRead, WsRestore, WsRestored, WsSnapshot, WsUsage, WsUsageRequest, WsWrite,
};
use messages::{ErrorKind, Subjects};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::blobs::{CHUNK_SIZE, UPLOAD_PREFIX};
use crate::store::INLINE_MAX_BYTES;

/// Calls that move whole files or archives may take longer than the caller's default.
const BULK_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(transparent)]
    Call(#[from] CallError),
    #[error("workspace objects: {0}")]
    Objects(String),
    #[error("bad reply: {0}")]
    Reply(String),
}

impl ClientError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            ClientError::Call(e) => e.kind(),
            ClientError::Objects(_) => ErrorKind::Unavailable,
            ClientError::Reply(_) => ErrorKind::Internal,
        }
    }
}

pub type Result<T> = std::result::Result<T, ClientError>;

#[derive(Clone)]
pub struct WorkspaceClient {
    caller: Caller,
    subjects: Subjects,
    js: jetstream::Context,
}

impl WorkspaceClient {
    pub fn new(caller: Caller, subjects: Subjects) -> Self {
        let js = jetstream::new(caller.client().clone());
        Self {
            caller,
            subjects,
            js,
        }
    }

    async fn call<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        op: WorkspaceOp,
        req: &Req,
        bulk: bool,
    ) -> Result<Resp> {
        let subject = self.subjects.workspace(op);
        Ok(if bulk {
            self.caller.call_timeout(subject, req, BULK_TIMEOUT).await?
        } else {
            self.caller.call(subject, req).await?
        })
    }

    async fn objects(&self) -> Result<object_store::ObjectStore> {
        let bucket = self.subjects.workspace_objects_bucket();
        self.js.get_object_store(&bucket).await.map_err(|e| {
            ClientError::Objects(format!("{bucket}: {e} (is workspace-store running?)"))
        })
    }

    /// Puts `data` under a fresh `upload/<id>` name and returns it.
    async fn upload(&self, data: &[u8]) -> Result<String> {
        let name = format!("{UPLOAD_PREFIX}{}", messages::new_id());
        let meta = object_store::ObjectMetadata {
            name: name.clone(),
            chunk_size: Some(CHUNK_SIZE),
            ..Default::default()
        };
        let mut reader = data;
        self.objects()
            .await?
            .put(meta, &mut reader)
            .await
            .map_err(|e| ClientError::Objects(format!("uploading {name}: {e}")))?;
        Ok(name)
    }

    async fn fetch(&self, name: &str) -> Result<Vec<u8>> {
        let bucket = self.subjects.workspace_objects_bucket();
        kit::objects::read_all(&self.js, &bucket, name)
            .await
            .map_err(|e| ClientError::Objects(e.to_string()))?
            .ok_or_else(|| ClientError::Objects(format!("{name}: no such object")))
    }

    pub async fn init(&self, session: &str) -> Result<WsUsage> {
        let req = WsInit {
            session_id: session.into(),
        };
        self.call(WorkspaceOp::Init, &req, false).await
    }

    /// Writes a file of any size (inline when it fits one message, else via the object store).
    pub async fn write(&self, session: &str, path: &str, data: &[u8]) -> Result<WsEntry> {
        let mut req = WsWrite {
            session_id: session.into(),
            path: path.into(),
            content: String::new(),
            encoding: ContentEncoding::Utf8,
            append: false,
            requested_by: None,
            object: None,
        };
        if data.len() as u64 <= INLINE_MAX_BYTES {
            (req.content, req.encoding) = crate::files::wire_content(data);
            self.call(WorkspaceOp::Write, &req, false).await
        } else {
            req.object = Some(self.upload(data).await?);
            self.call(WorkspaceOp::Write, &req, true).await
        }
    }

    /// Reads a whole file of any size.
    pub async fn read(&self, session: &str, path: &str) -> Result<Vec<u8>> {
        let req = WsRead {
            session_id: session.into(),
            path: path.into(),
            ..Default::default()
        };
        let mut attempts = 0;
        loop {
            let file: WsFile = self.call(WorkspaceOp::Read, &req, true).await?;
            let Some(object) = &file.object else {
                return messages::decode_content(&file.content, file.encoding)
                    .map_err(ClientError::Reply);
            };
            match self.fetch(object).await {
                Ok(bytes) => return Ok(bytes),
                // Overwritten between the reply and the fetch: read the new version.
                Err(_) if attempts < 3 => attempts += 1,
                Err(e) => return Err(e),
            }
        }
    }

    /// Lists a directory (or the whole workspace), following every page.
    pub async fn list(
        &self,
        session: &str,
        prefix: Option<&str>,
        recursive: bool,
    ) -> Result<WsListing> {
        let mut req = WsList {
            session_id: session.into(),
            prefix: prefix.map(str::to_string),
            recursive,
            ..Default::default()
        };
        let mut all = WsListing::default();
        loop {
            let page: WsListing = self.call(WorkspaceOp::List, &req, false).await?;
            all.entries.extend(page.entries);
            match page.next {
                Some(next) => req.after = Some(next),
                None => return Ok(all),
            }
        }
    }

    pub async fn stat(&self, session: &str, path: &str) -> Result<WsEntry> {
        self.call(WorkspaceOp::Stat, &path_req(session, path, false), false)
            .await
    }

    pub async fn delete(&self, session: &str, path: &str, recursive: bool) -> Result<Ack> {
        self.call(
            WorkspaceOp::Delete,
            &path_req(session, path, recursive),
            false,
        )
        .await
    }

    /// The workspace (or the directory `prefix`) as tar bytes.
    pub async fn snapshot(&self, session: &str, prefix: Option<&str>) -> Result<Vec<u8>> {
        let req = WsSnapshot {
            session_id: session.into(),
            prefix: prefix.map(str::to_string),
        };
        let archive: WsArchive = self.call(WorkspaceOp::Snapshot, &req, true).await?;
        match (&archive.tar_base64, &archive.object) {
            (Some(b64), _) => messages::decode_base64(b64).map_err(ClientError::Reply),
            (None, Some(object)) => {
                let tar = self.fetch(object).await?;
                // Fetched: the staged copy is of no further use (the sweep would remove it).
                if let Ok(store) = self.objects().await {
                    let _ = store.delete(object).await;
                }
                Ok(tar)
            }
            (None, None) => Err(ClientError::Reply("snapshot without tar or object".into())),
        }
    }

    /// Unpacks `tar` into the workspace (all or nothing), removing `delete` paths too, and
    /// with `replace` every file the archive does not hold.
    pub async fn restore(
        &self,
        session: &str,
        tar: &[u8],
        replace: bool,
        delete: Vec<String>,
    ) -> Result<WsRestored> {
        let mut req = WsRestore {
            session_id: session.into(),
            tar_base64: None,
            object: None,
            replace,
            delete,
            requested_by: None,
        };
        if tar.len() as u64 <= INLINE_MAX_BYTES {
            req.tar_base64 = Some(messages::encode_base64(tar));
        } else {
            req.object = Some(self.upload(tar).await?);
        }
        self.call(WorkspaceOp::Restore, &req, true).await
    }

    pub async fn usage(&self, session: &str) -> Result<WsUsage> {
        let req = WsUsageRequest {
            session_id: session.into(),
        };
        self.call(WorkspaceOp::Usage, &req, false).await
    }

    /// Removes one workspace (`Some`), or sweeps those idle past the TTL (`None`).
    pub async fn cleanup(&self, session: Option<&str>) -> Result<WsCleaned> {
        let req = WsCleanup {
            session_id: session.map(str::to_string),
            older_than_hours: None,
        };
        self.call(WorkspaceOp::Cleanup, &req, true).await
    }
}

fn path_req(session: &str, path: &str, recursive: bool) -> WsPath {
    WsPath {
        session_id: session.into(),
        path: path.into(),
        recursive,
        requested_by: None,
    }
}
