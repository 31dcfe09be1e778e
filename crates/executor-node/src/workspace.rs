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
//! Snapshots and pushes go through `sandmesh_client::WorkspaceClient`, the one implementation
//! of the store's hand-off: archives above `messages::workspace::INLINE_MAX_BYTES` travel
//! through the workspace objects bucket, read back with direct gets (no consumer per read).

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::kv;
use messages::workspace::WsRestored;
use messages::Subjects;
use sandmesh_client::{ClientError, ErrorKind, WorkspaceClient};

/// What a container's `/workspace` holds, compared with the session's workspace in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// A new container: an empty workspace.
    Nothing,
    /// Something that matches no known revision (a failed or raced push): cleared before use.
    Unknown,
    /// The workspace of a session without a revision: unknown to the store, or not changed
    /// since revisions exist (its first change makes one).
    Absent,
    /// The store's workspace as of this revision (`messages::workspace::revision_key`).
    At(u64),
}

impl Held {
    /// Whether this is the store's workspace at `revision` (`None`: the session has none).
    pub fn matches(self, revision: Option<u64>) -> bool {
        match (self, revision) {
            (Held::At(held), Some(current)) => held == current,
            (Held::Absent, None) => true,
            _ => false,
        }
    }
}

/// Why the session's revision could not be read (the caller then fetches, which is safe).
#[derive(Debug, thiserror::Error)]
pub enum RevisionError {
    #[error("opening the workspace index bucket")]
    Bucket(#[source] async_nats::jetstream::context::KeyValueError),
    #[error("reading the workspace revision")]
    Read(#[source] kv::EntryError),
}

/// Why the session's workspace could not be brought in or its changes saved: the run's
/// result says so.
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    /// The store did not give the snapshot (refused, or did not answer): the run cannot start
    /// from the session's files.
    #[error("workspace snapshot: {0}")]
    Snapshot(#[source] ClientError),
    /// The store did not take the run's changes; its refusal keeps its kind.
    #[error("workspace push: {0}")]
    Push(#[source] ClientError),
}

impl WorkspaceError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            WorkspaceError::Snapshot(_) => ErrorKind::Unavailable,
            WorkspaceError::Push(e) => e.kind(),
        }
    }
}

/// A fetched workspace and what a container holds once it is unpacked.
pub struct Snapshot {
    pub tar: Vec<u8>,
    pub holds: Held,
}

#[derive(Clone)]
pub struct WorkspaceSync {
    ws: WorkspaceClient,
    subjects: Subjects,
    js: jetstream::Context,
    /// The index bucket, opened on first use (workspace-store creates it). Shared by the
    /// clones (each run has one): a clone of an unopened cell would open the bucket again on
    /// every run, a `STREAM.INFO` round trip each.
    index: Arc<tokio::sync::OnceCell<kv::Store>>,
}

impl WorkspaceSync {
    /// A sync whose store requests name `service` (the backend's) as their requester.
    pub fn new(
        client: async_nats::Client,
        subjects: Subjects,
        timeout: Duration,
        service: messages::ServiceName,
    ) -> Self {
        let ws = kit::mesh_client(client.clone(), subjects.clone())
            .with_timeout(timeout)
            .workspace()
            .requested_by(service.as_str());
        Self {
            ws,
            js: jetstream::new(client),
            subjects,
            index: Arc::default(),
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

    /// The session's workspace as a tar (an unknown session has an empty one).
    pub async fn snapshot(&self, session_id: &str) -> Result<Snapshot, WorkspaceError> {
        match self.ws.snapshot_at(session_id, None).await {
            // No revision yet: the first change of the session will make one.
            Ok((tar, revision)) => Ok(Snapshot {
                tar,
                holds: revision.map_or(Held::Absent, Held::At),
            }),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(Snapshot {
                tar: Vec::new(),
                holds: Held::Absent,
            }),
            Err(e) => Err(WorkspaceError::Snapshot(e)),
        }
    }

    /// Pushes the changed files (a tar) and removes deleted ones, in one step.
    pub async fn push(
        &self,
        session_id: &str,
        changes: Vec<u8>,
        deleted: Vec<String>,
    ) -> Result<WsRestored, WorkspaceError> {
        if changes.is_empty() && deleted.is_empty() {
            return Ok(WsRestored::default());
        }
        match self
            .ws
            .restore(session_id, &changes, false, deleted.clone())
            .await
        {
            Ok(r) => Ok(r),
            Err(e) if e.kind() == ErrorKind::NotFound => {
                // The first files of a session nobody initialised yet.
                let _ = self.ws.init(session_id).await;
                self.ws
                    .restore(session_id, &changes, false, deleted)
                    .await
                    .map_err(WorkspaceError::Push)
            }
            Err(e) => Err(WorkspaceError::Push(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_known_revision_matches() {
        assert!(Held::At(7).matches(Some(7)));
        assert!(!Held::At(7).matches(Some(8)));
        assert!(!Held::At(7).matches(None), "a removed workspace");
        assert!(Held::Absent.matches(None));
        assert!(
            !Held::Absent.matches(Some(1)),
            "the first change of a session"
        );
        assert!(!Held::Nothing.matches(None) && !Held::Unknown.matches(None));
    }

    #[test]
    fn a_snapshot_not_had_is_unavailable_and_a_refused_push_keeps_the_stores_kind() {
        let refused = |kind| ClientError::Service {
            subject: "sandbox.v1.workspace.restore".into(),
            body: messages::ErrorBody::new(kind, "over the workspace quota"),
        };
        let snapshot = WorkspaceError::Snapshot(refused(ErrorKind::Internal));
        assert_eq!(snapshot.kind(), ErrorKind::Unavailable);
        let push = WorkspaceError::Push(refused(ErrorKind::TooLarge));
        assert_eq!(push.kind(), ErrorKind::TooLarge);
        assert!(
            push.to_string().contains("over the workspace quota"),
            "{push}"
        );
        let silent = WorkspaceError::Push(ClientError::NoResponders {
            subject: "sandbox.v1.workspace.restore".into(),
        });
        assert_eq!(silent.kind(), ErrorKind::Unavailable);
    }
}
