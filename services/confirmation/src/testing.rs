//! `Book`: an in-memory [`Workflow`] on tokio's clock, for unit tests of the actors with paused
//! time (minutes of expiry in microseconds). Every request is pending (no policy), decisions
//! are first-wins like the bucket's compare-and-set, and every write is fed to the watching
//! registry as the KV watch would. The bucket itself is covered by the tests over a real
//! nats-server in `tests/`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use kit::{CancellationToken, RequestContext};
use messages::confirm::{
    ConfirmDecide, ConfirmListReply, ConfirmRequest, ConfirmState, Confirmation,
};
use messages::Encoding;
use tokio::time::Instant;

use crate::error::ConfirmError;
use crate::store::StoreError;
use crate::watch::{Observation, Observer};
use crate::workflow::Workflow;

/// The timeout of a request without `timeout_ms`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Clone)]
pub struct Book(Arc<Mutex<Pages>>);

struct Pages {
    origin: Instant,
    origin_ms: u64,
    records: BTreeMap<String, Confirmation>,
    revision: u64,
    watcher: Option<Observer>,
    /// Timeouts cannot be written (NATS unreachable).
    unavailable: bool,
    /// How many times `expire` was called.
    expire_calls: usize,
}

impl Book {
    pub fn new() -> Self {
        Self(Arc::new(Mutex::new(Pages {
            origin: Instant::now(),
            origin_ms: 1_000_000,
            records: BTreeMap::new(),
            revision: 0,
            watcher: None,
            unavailable: false,
            expire_calls: 0,
        })))
    }

    fn pages(&self) -> MutexGuard<'_, Pages> {
        self.0.lock().unwrap()
    }

    pub fn state(&self, id: &str) -> Option<ConfirmState> {
        self.pages().records.get(id).map(|c| c.state)
    }

    pub fn set_unavailable(&self, unavailable: bool) {
        self.pages().unavailable = unavailable;
    }

    pub fn expire_calls(&self) -> usize {
        self.pages().expire_calls
    }
}

impl Pages {
    fn now_ms(&self) -> u64 {
        self.origin_ms + self.origin.elapsed().as_millis() as u64
    }

    fn write(&mut self, record: Confirmation) {
        self.revision += 1;
        self.records.insert(record.id.clone(), record.clone());
        if let Some(observe) = &self.watcher {
            observe(Observation {
                revision: self.revision,
                record: Some(record),
            });
        }
    }

    fn read(&self, id: &str) -> Result<Confirmation, ConfirmError> {
        self.records
            .get(id)
            .cloned()
            .ok_or_else(|| ConfirmError::NotFound { id: id.to_string() })
    }
}

impl Workflow for Book {
    fn now_ms(&self) -> u64 {
        self.pages().now_ms()
    }

    async fn open(
        &self,
        req: ConfirmRequest,
        _trace_id: Option<String>,
    ) -> Result<Confirmation, ConfirmError> {
        let mut pages = self.pages();
        let existing = pages
            .records
            .values()
            .find(|c| req.execution_id.is_some() && c.execution_id == req.execution_id);
        if let Some(existing) = existing {
            return Ok(existing.clone());
        }
        let now = pages.now_ms();
        let timeout = req.timeout_ms.unwrap_or(DEFAULT_TIMEOUT.as_millis() as u64);
        let record = Confirmation {
            id: messages::new_id(),
            execution_id: req.execution_id,
            created_at: now,
            expires_at: now + timeout,
            ..Default::default()
        };
        pages.write(record.clone());
        Ok(record)
    }

    async fn decide(
        &self,
        decide: ConfirmDecide,
        _trace_id: Option<String>,
    ) -> Result<Confirmation, ConfirmError> {
        let mut pages = self.pages();
        let mut record = pages.read(&decide.id)?;
        if record.state.is_final() || pages.now_ms() >= record.expires_at {
            return Err(ConfirmError::AlreadyDecided(Box::new(record)));
        }
        record.state = if decide.approve {
            ConfirmState::Approved
        } else {
            ConfirmState::Denied
        };
        record.by = Some(decide.by);
        record.decided_at = Some(pages.now_ms());
        pages.write(record.clone());
        Ok(record)
    }

    async fn get(&self, id: &str) -> Result<Confirmation, ConfirmError> {
        self.pages().read(id)
    }

    async fn expire(&self, id: &str) -> Result<Confirmation, ConfirmError> {
        let mut pages = self.pages();
        pages.expire_calls += 1;
        if pages.unavailable {
            return Err(ConfirmError::Store(StoreError::Unavailable {
                op: "read",
                source: Box::new(std::io::Error::other("the bucket is unreachable")),
            }));
        }
        let mut record = pages.read(id)?;
        let now = pages.now_ms();
        if record.state.is_final() || now < record.expires_at {
            return Ok(record);
        }
        record.state = ConfirmState::Timeout;
        record.by = Some("policy:timeout".into());
        record.decided_at = Some(now);
        pages.write(record.clone());
        Ok(record)
    }

    async fn settle_by_grant(&self, _id: &str) -> Result<Option<Confirmation>, ConfirmError> {
        Ok(None)
    }

    fn audience(&self, _caller: &messages::tenancy::Caller) -> crate::audience::Audience {
        crate::audience::Audience::Everyone
    }

    async fn scan(&self, query: &crate::listing::Query) -> Result<ConfirmListReply, ConfirmError> {
        let confirmations = self
            .pages()
            .records
            .values()
            .filter(|c| Some(c.state) == query.list.state)
            .cloned()
            .collect();
        Ok(ConfirmListReply { confirmations })
    }

    async fn last_revision(&self) -> Result<u64, ConfirmError> {
        Ok(self.pages().revision)
    }

    /// Replays the current records, then feeds every write (the KV watch's contract).
    fn watch(&self, observe: Observer, _stop: CancellationToken) {
        let mut pages = self.pages();
        for (revision, record) in pages.records.values().enumerate() {
            observe(Observation {
                revision: revision as u64 + 1,
                record: Some(record.clone()),
            });
        }
        observe(Observation {
            revision: pages.revision,
            record: None,
        });
        pages.watcher = Some(observe);
    }
}

pub fn ctx() -> RequestContext {
    RequestContext {
        subject: "test".into(),
        encoding: Encoding::Json,
        headers: None,
        trace_id: None,
        caller: messages::tenancy::Caller::Internal,
        reply: None,
    }
}

/// A request for a new execution, waiting or not, timing out after `timeout`.
pub fn request(wait: bool, timeout: Duration) -> ConfirmRequest {
    ConfirmRequest {
        execution_id: Some(messages::new_id()),
        timeout_ms: Some(timeout.as_millis() as u64),
        wait,
        ..Default::default()
    }
}
