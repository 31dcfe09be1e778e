//! `SessionReaper`: sessions end by themselves. Every sweep it closes the sessions whose TTL
//! ran out or that went unused for their idle time (a background process still running is
//! use: its node is asked before an idle close) — through the same close as
//! `sessions.close` (container, AIO instance, browser) — and removes the records of sessions
//! closed longer ago than the retention time. The KV table is the only state: every scheduler
//! instance sweeps, and a session closed by two at once is closed (and audited) once.

use kit::{AuditScope, CancellationToken};
use messages::session::{CloseReason, SessionRecord};

use crate::config::SessionSettings;
use crate::session_api::SessionApi;
use crate::sessions::retained_long_enough;

pub struct SessionReaper {
    sessions: SessionApi,
    settings: SessionSettings,
}

impl SessionReaper {
    pub fn new(sessions: SessionApi, settings: SessionSettings) -> Self {
        Self { sessions, settings }
    }

    /// Sweeps every `settings.sweep` until `stop`.
    pub async fn run(self, stop: CancellationToken) {
        let mut tick = tokio::time::interval(self.settings.sweep);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = self.sweep() => {}
            }
        }
    }

    async fn sweep(&self) {
        let records = match self.sessions.table().list(None, None).await {
            Ok(records) => records,
            Err(e) => {
                tracing::warn!(error = %e, "sessions not swept");
                return;
            }
        };
        let now = messages::now_ms();
        let idle = self.settings.idle.as_millis() as u64;
        for record in records {
            if let Some(reason) = record.lapsed(now, idle) {
                // A running background process is use, up to the session's TTL.
                if reason == CloseReason::Idle && self.sessions.held_by_processes(&record).await {
                    continue;
                }
                self.close(record, reason).await;
            } else if retained_long_enough(&record, self.settings.retention, now) {
                self.forget(&record.session_id).await;
            }
        }
    }

    async fn close(&self, record: SessionRecord, reason: CloseReason) {
        let id = record.session_id;
        let scope = AuditScope {
            session_id: Some(id.clone()),
            tenant: record.tenant,
            ..Default::default()
        };
        tracing::debug!(session_id = %id, reason = reason.as_str(), "session lapsed: closing");
        if let Err(e) = self.sessions.close_stored(&id, reason, &scope).await {
            tracing::warn!(session_id = %id, error = %e, "lapsed session not closed; next sweep");
        }
    }

    async fn forget(&self, id: &str) {
        let retention = self.settings.retention;
        if let Err(e) = self.sessions.table().forget_closed(id, retention).await {
            tracing::warn!(session_id = %id, error = %e, "closed session kept; next sweep");
        }
    }
}
