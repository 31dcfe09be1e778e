//! Internal: what the scheduler sends an executor. Clients have no permission on these subjects.

use serde::{Deserialize, Serialize};

use crate::exec::{ExecRequest, Tier};

/// `executor.docker.run` (any node, tier `ephemeral`) or `executor.docker.<node>.run` (the
/// node holding the session's container). Limits and timeout in `request` are already
/// validated and clamped by the scheduler; the executor clamps again to its own ceilings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutorRun {
    pub execution_id: String,
    pub tier: Tier,
    pub request: ExecRequest,
    /// Set when the session's previous node was lost: the executor restores the workspace
    /// into a fresh container and the result says process state was lost.
    #[serde(default)]
    pub session_restored: bool,
}

/// `executor.docker.<node>.close`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecutorClose {
    pub session_id: String,
}

/// `executor.docker.<node>.drain`: stop taking new work, finish what runs, close sessions.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ExecutorDrain {}
