//! The session's workspace around an execution: pulled from workspace-store as a tar when the
//! container does not hold the current revision (`workspace.snapshot`), changes pushed back
//! after (`workspace.restore` with `replace: false` and the files the code deleted in
//! `delete`: one all-or-nothing step).
//!
//! Whether a container's copy is current is learnt without a workspace-store request: the
//! session's revision is the entry revision of one KV key
//! (`messages::workspace::revision_key`), read directly from the index bucket. The store puts
//! that key after every change has landed and before it answers, so a write the client saw
//! answered is seen by the next run's read (the read goes to the stream's leader, not a
//! cache). A change still in flight during the read is either in the snapshot already or
//! bumps the revision after it, which only costs one more fetch later.
//!
//! Archives small enough travel inline (base64); larger ones go through the workspace
//! objects bucket, named in the `object` field, with the store's conventions: uploads under
//! `upload/<id>`, and a fetched snapshot object is deleted by its reader.

use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::kv;
use async_nats::jetstream::object_store::ObjectMetadata;
use kit::Caller;
use messages::subjects::WorkspaceOp;
use messages::workspace::{
    upload_name, WsArchive, WsInit, WsRestore, WsRestored, WsSnapshot, INLINE_MAX_BYTES,
    OBJECT_CHUNK_SIZE,
};
use messages::{ErrorBody, ErrorKind, Subjects};

use crate::lease::Held;

const REQUESTED_BY: &str = crate::janitor::SERVICE_NAME;

/// Why the session's revision could not be read (the caller then fetches, which is safe).
#[derive(Debug, thiserror::Error)]
pub enum RevisionError {
    #[error("opening the workspace index bucket")]
    Bucket(#[source] async_nats::jetstream::context::KeyValueError),
    #[error("reading the workspace revision")]
    Read(#[source] kv::EntryError),
}

/// A fetched workspace and what a container holds once it is unpacked.
pub struct Snapshot {
    pub tar: Vec<u8>,
    pub holds: Held,
}

#[derive(Clone)]
pub struct WorkspaceSync {
    caller: Caller,
    subjects: Subjects,
    js: jetstream::Context,
    /// The index bucket, opened on first use (workspace-store creates it).
    index: tokio::sync::OnceCell<kv::Store>,
}

impl WorkspaceSync {
    pub fn new(client: async_nats::Client, subjects: Subjects, timeout: Duration) -> Self {
        Self {
            caller: Caller::new(client.clone(), timeout),
            js: jetstream::new(client),
            subjects,
            index: tokio::sync::OnceCell::new(),
        }
    }

    /// The session's current workspace revision (`None`: it has none).
    pub async fn revision(&self, session_id: &str) -> Result<Option<u64>, RevisionError> {
        let bucket = self.subjects.workspace_index_bucket();
        let index = self
            .index
            .get_or_try_init(|| self.js.get_key_value(bucket))
            .await
            .map_err(RevisionError::Bucket)?;
        let entry = index
            .entry(messages::workspace::revision_key(session_id))
            .await
            .map_err(RevisionError::Read)?;
        Ok(entry
            .filter(|e| e.operation == kv::Operation::Put)
            .map(|e| e.revision))
    }

    fn unavailable(what: &str, e: impl std::fmt::Display) -> ErrorBody {
        ErrorBody::unavailable(format!("workspace {what}: {e}"))
    }

    async fn objects(&self) -> Result<jetstream::object_store::ObjectStore, ErrorBody> {
        self.js
            .get_object_store(self.subjects.workspace_objects_bucket())
            .await
            .map_err(|e| Self::unavailable("object store", e))
    }

    /// The session's workspace as a tar (an unknown session has an empty one).
    pub async fn snapshot(&self, session_id: &str) -> Result<Snapshot, ErrorBody> {
        let req = WsSnapshot {
            session_id: session_id.to_string(),
            prefix: None,
        };
        let archive: WsArchive = match self
            .caller
            .call(self.subjects.workspace(WorkspaceOp::Snapshot), &req)
            .await
        {
            Ok(a) => a,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Ok(Snapshot {
                    tar: Vec::new(),
                    holds: Held::Absent,
                })
            }
            Err(e) => return Err(Self::unavailable("snapshot", e)),
        };
        // No revision yet: the first change of the session will make one.
        let holds = archive.revision.map_or(Held::Absent, Held::At);
        if let Some(b64) = archive.tar_base64 {
            return messages::decode_base64(&b64)
                .map(|tar| Snapshot { tar, holds })
                .map_err(|e| Self::unavailable("snapshot", e));
        }
        let Some(name) = archive.object else {
            return Ok(Snapshot {
                tar: Vec::new(),
                holds,
            });
        };
        let bucket = self.subjects.workspace_objects_bucket();
        let tar = kit::objects::read_all(&self.js, &bucket, &name)
            .await
            .map_err(|e| Self::unavailable("snapshot object", e))?
            .ok_or_else(|| Self::unavailable("snapshot object", format!("{name} is gone")))?;
        // Staged for this one read; the store's sweep would remove it later anyway.
        if let Ok(store) = self.objects().await {
            let _ = store.delete(&name).await;
        }
        Ok(Snapshot { tar, holds })
    }

    /// Pushes the changed files (a tar) and removes deleted ones, in one step.
    pub async fn push(
        &self,
        session_id: &str,
        changes: Vec<u8>,
        deleted: Vec<String>,
    ) -> Result<WsRestored, ErrorBody> {
        if changes.is_empty() && deleted.is_empty() {
            return Ok(WsRestored::default());
        }
        let mut req = WsRestore {
            session_id: session_id.to_string(),
            tar_base64: None,
            object: None,
            replace: false,
            delete: deleted,
            requested_by: Some(REQUESTED_BY.into()),
        };
        if changes.len() as u64 <= INLINE_MAX_BYTES {
            if !changes.is_empty() {
                req.tar_base64 = Some(messages::encode_base64(&changes));
            }
        } else {
            let name = upload_name();
            let meta = ObjectMetadata {
                name: name.clone(),
                chunk_size: Some(OBJECT_CHUNK_SIZE),
                ..Default::default()
            };
            self.objects()
                .await?
                .put(meta, &mut changes.as_slice())
                .await
                .map_err(|e| Self::unavailable("upload", e))?;
            req.object = Some(name);
        }
        let subject = self.subjects.workspace(WorkspaceOp::Restore);
        match self.caller.call(subject.clone(), &req).await {
            Ok(r) => Ok(r),
            Err(e) if e.kind() == ErrorKind::NotFound => {
                // The first files of a session nobody initialised yet.
                let init = WsInit {
                    session_id: session_id.to_string(),
                };
                let _: Result<serde_json::Value, _> = self
                    .caller
                    .call(self.subjects.workspace(WorkspaceOp::Init), &init)
                    .await;
                self.caller
                    .call(subject, &req)
                    .await
                    .map_err(|e| e.into_body())
            }
            Err(e) => Err(e.into_body()),
        }
    }
}
