//! `ContainerSync`: an agent's read of a session's workspace sees what the session's running
//! background processes wrote. The store holds what the session's runs pushed; a process
//! writes in the container between runs. So before an agent's `read`, `stat`, `list`, `write`
//! or `delete` the store asks the node holding the session (its record in the sessions bucket) to sync
//! (`executor.docker.<node>.proc`, `ProcCall::Sync`): a node whose session runs no process
//! answers at once, otherwise once a run of the session carried the container's changes here.
//!
//! Only agents' reads wait for it: the services read a workspace on a run's path (the executor's
//! snapshot), where a sync would wait for the very run asking. A sync that fails or takes
//! longer than [`SYNC_WITHIN`] is logged, and the read answers what the store holds.

use std::time::Duration;

use async_nats::jetstream::{self, kv};
use messages::exec::Tier;
use messages::executor::Backend;
use messages::proc::{ProcCall, ProcReply};
use messages::session::{SessionRecord, SessionState};
use messages::Subjects;
use sandmesh_client::{ExecutorClient, MeshClient};
use tokio::sync::OnceCell;

/// How long a request waits for its session's sync (a run of the session ahead of it included).
pub const SYNC_WITHIN: Duration = Duration::from_secs(20);

pub struct ContainerSync {
    executors: ExecutorClient,
    js: jetstream::Context,
    bucket: String,
    /// The sessions bucket, opened on first use (the scheduler creates it).
    sessions: OnceCell<kv::Store>,
}

impl ContainerSync {
    pub fn new(client: async_nats::Client, js: jetstream::Context, subjects: &Subjects) -> Self {
        let mesh = MeshClient::new(client, subjects.clone());
        Self {
            executors: mesh.executors(),
            js,
            bucket: subjects.sessions_bucket(),
            sessions: OnceCell::new(),
        }
    }

    /// Brings `session`'s (scoped id) workspace up to its container's, when it has one whose
    /// processes may have written since its last run.
    pub async fn before_read(&self, session: &str) {
        let Some(node) = self.node_of(session).await else {
            return;
        };
        let call = ProcCall::Sync {
            session_id: session.to_string(),
        };
        let synced = self
            .executors
            .proc(Backend::Docker, &node, &call, SYNC_WITHIN)
            .await;
        match synced {
            Ok(ProcReply::Synced { ran }) => {
                tracing::debug!(session, ran, "workspace synced from its container");
            }
            Ok(other) => tracing::warn!(session, ?other, "a sync answered something else"),
            // A session closed meanwhile has no container (404): nothing to carry.
            Err(e) => tracing::debug!(session, error = %e, "workspace not synced before a read"),
        }
    }

    /// The node of `session`'s live container, from its record.
    async fn node_of(&self, session: &str) -> Option<String> {
        let sessions = self
            .sessions
            .get_or_try_init(|| self.js.get_key_value(self.bucket.clone()))
            .await
            .map_err(|e| tracing::debug!(error = %e, "no sessions bucket to sync by"))
            .ok()?;
        let entry = sessions.entry(session).await.ok()??;
        if entry.operation != kv::Operation::Put {
            return None;
        }
        let record: SessionRecord = serde_json::from_slice(&entry.value).ok()?;
        (record.state == SessionState::Active && record.tier == Tier::Session)
            .then_some(record.node)
            .flatten()
    }
}
