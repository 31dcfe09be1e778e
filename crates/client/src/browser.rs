//! The browser-router: one browser per session, one action per call.

use std::time::Duration;

use messages::browser::{BrowserRequest, BrowserResult};
use messages::exec::AwaitingConfirmation;

use crate::{MeshClient, Result};

/// An action may wait for a person's decision (a password field, `evaluate`): the router's
/// default confirmation timeout is 120 s.
pub const BROWSER_TIMEOUT: Duration = Duration::from_secs(180);

#[derive(Debug, Clone)]
pub struct BrowserClient {
    mesh: MeshClient,
}

impl BrowserClient {
    pub fn new(mesh: MeshClient) -> Self {
        Self { mesh }
    }

    /// Runs `req`'s command in `req.session_id`'s browser (started on the first action).
    pub async fn act(&self, req: &BrowserRequest) -> Result<BrowserResult> {
        let timeout = self.mesh.timeout().max(BROWSER_TIMEOUT);
        self.mesh
            .request_timeout(self.subject(req), &req.payload(), timeout)
            .await
    }

    /// [`Self::act`], and when the action waits for a person's approval, `on_wait` hears of
    /// it at once (the router's notice: confirmation id, expiry, the action's id) while the
    /// call goes on waiting ([`MeshClient::request_notified`]).
    pub async fn act_notified(
        &self,
        req: &BrowserRequest,
        on_wait: impl FnMut(AwaitingConfirmation) + Send + 'static,
    ) -> Result<BrowserResult> {
        let timeout = self.mesh.timeout().max(BROWSER_TIMEOUT);
        self.mesh
            .request_notified(self.subject(req), &req.payload(), timeout, on_wait)
            .await
    }

    /// `browser.<action>`: the action travels in the subject, its fields in the payload.
    fn subject(&self, req: &BrowserRequest) -> String {
        self.mesh.subjects().browser(req.command.action().as_str())
    }
}
