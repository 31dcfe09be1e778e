//! The aio-pool: AIO sandbox instances bound to sessions.

use std::time::Duration;

use messages::browser::{
    AioAcquire, AioExec, AioExecResult, AioLease, AioRelease, AioReleased, AioStats,
    AioStatsRequest,
};

use crate::{MeshClient, Result};

/// How much longer than the command's own timeout a caller waits for `aio.exec`.
const EXEC_MARGIN: Duration = Duration::from_secs(15);

#[derive(Debug, Clone)]
pub struct AioClient {
    mesh: MeshClient,
}

impl AioClient {
    pub fn new(mesh: MeshClient) -> Self {
        Self { mesh }
    }

    /// The session's instance (bound now if it had none; may wait for capacity, then 429).
    pub async fn acquire(&self, req: &AioAcquire) -> Result<AioLease> {
        self.mesh
            .request(self.mesh.subjects().aio("acquire"), req)
            .await
    }

    /// Destroys the session's instance.
    pub async fn release(&self, req: &AioRelease) -> Result<AioReleased> {
        self.mesh
            .request(self.mesh.subjects().aio("release"), req)
            .await
    }

    /// Runs a shell command in the session's instance, assessed as shell code and, when the
    /// risk asks for it, held for a person's decision first (like `exec`); waits for the
    /// command's timeout plus a margin (or the client's timeout, when longer). A command the
    /// operator denies or the assessor rejects is an error of kind `Denied`.
    pub async fn exec(&self, req: &AioExec) -> Result<AioExecResult> {
        self.exec_on(self.mesh.subjects().aio("exec"), req).await
    }

    /// The aio-pool's own exec, without assessment: for the services' account only (the
    /// scheduler, once it assessed the command, and the pool's tests). Tenants cannot reach it.
    pub async fn exec_instance(&self, req: &AioExec) -> Result<AioExecResult> {
        self.exec_on(self.mesh.subjects().aio_instance_exec(), req)
            .await
    }

    async fn exec_on(&self, subject: String, req: &AioExec) -> Result<AioExecResult> {
        let timeout = req
            .timeout_ms
            .map(|ms| Duration::from_millis(ms) + EXEC_MARGIN)
            .unwrap_or_default()
            .max(self.mesh.timeout());
        self.mesh.request_timeout(subject, req, timeout).await
    }

    pub async fn stats(&self) -> Result<AioStats> {
        self.mesh
            .request(self.mesh.subjects().aio("stats"), &AioStatsRequest {})
            .await
    }
}
