//! Errors of the workspace store and how each maps onto the wire (`ErrorBody`).

use messages::quota::{OverQuota, Quota};
use messages::tenancy::Tenant;
use messages::validate::ValidationError;
use messages::ErrorBody;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    /// A file where a directory is needed or the reverse, a non-empty directory, a session
    /// being cleaned up.
    #[error("{0}")]
    Conflict(String),
    #[error("quota exceeded: the workspace uses {used} bytes, this change needs {needed} more, the quota is {quota}")]
    Quota { used: u64, needed: u64, quota: u64 },
    /// The change would take the session's tenant over its `workspace_bytes` quota (all its
    /// workspaces together).
    #[error("tenant {tenant} is at its workspace quota: {used} bytes in use, this change needs {needed} more, the quota is {quota}")]
    TenantQuota {
        tenant: Tenant,
        used: u64,
        needed: u64,
        quota: u64,
    },
    #[error("{0}")]
    TooLarge(String),
    /// Another writer changed the same node first (retried internally where safe).
    #[error("{0} changed concurrently")]
    Raced(String),
    /// JetStream did not answer or refused: the caller may retry.
    #[error("storage unavailable: {0}")]
    Storage(String),
    #[error("{0}")]
    Internal(String),
}

impl StoreError {
    pub fn storage(what: &str, e: impl std::fmt::Display) -> Self {
        StoreError::Storage(format!("{what}: {e}"))
    }

    /// The store failed (JetStream, a bug), not the request: worth a line in the log.
    pub fn is_the_stores(&self) -> bool {
        matches!(self, StoreError::Storage(_) | StoreError::Internal(_))
    }
}

impl From<StoreError> for ErrorBody {
    fn from(e: StoreError) -> Self {
        let message = e.to_string();
        match e {
            StoreError::Invalid(v) => v.into(),
            StoreError::BadRequest(_) => ErrorBody::bad_request(message),
            StoreError::NotFound(_) => ErrorBody::not_found(message),
            StoreError::Conflict(_) | StoreError::Raced(_) => ErrorBody::conflict(message),
            StoreError::Quota {
                used,
                needed,
                quota,
            } => ErrorBody::too_large(message).with_details(serde_json::json!({
                "reason": "quota", "used_bytes": used, "needed_bytes": needed, "quota_bytes": quota
            })),
            StoreError::TenantQuota {
                tenant,
                used,
                quota,
                ..
            } => OverQuota {
                tenant,
                quota: Quota::WorkspaceBytes,
                limit: quota,
                used,
            }
            .into(),
            StoreError::TooLarge(_) => ErrorBody::too_large(message),
            StoreError::Storage(_) => ErrorBody::unavailable(message),
            StoreError::Internal(_) => ErrorBody::internal(message),
        }
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;
