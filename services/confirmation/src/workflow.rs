//! The operations on confirmations — open, decide, expire, get, scan — each a few reads and
//! compare-and-set writes on the bucket, then the live event and the audit event. Stateless
//! and cloneable: the `Registry` runs them in tasks so it never waits on NATS itself.
//!
//! This service owns the audit events `confirmation_requested` (a new confirmation, decided
//! at once or not) and `confirmation_decided` (by a person, a policy, a session grant or the
//! timeout), emitted here exactly once per confirmation by the instance whose write won.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_nats::{Client, HeaderMap};
use kit::{AuditScope, Auditor, CancellationToken};
use messages::audit::{ConfirmationDecided, ConfirmationRequested};
use messages::confirm::{
    ConfirmDecide, ConfirmListReply, ConfirmRequest, ConfirmScope, ConfirmState, Confirmation,
    Unscope,
};
use messages::tenancy::Caller;
use messages::Subjects;

use crate::audience::{Audience, OperatorScopes};
use crate::error::ConfirmError;
use crate::listing::Query;
use crate::policy::{AutoDecision, Grant, Policy, SessionGrants};
use crate::store::{Cas, ConfirmationStore, Versioned};
use crate::{listing, validate, watch};

/// Compare-and-set retries on the session grants before giving up (each retry follows a
/// concurrent writer's success, so this only runs out under heavy contention).
const GRANT_ATTEMPTS: usize = 8;

/// What the `Registry` has done to confirmations. [`KvWorkflow`] does it on the bucket; the
/// registry's unit tests use an in-memory one, so expiry runs on paused time.
pub trait Workflow: Clone + Send + Sync + 'static {
    /// Unix milliseconds, the clock `expires_at` is on.
    fn now_ms(&self) -> u64;

    /// Finds the execution's confirmation or creates it, decided at once when policy or a
    /// session grant says so, pending otherwise.
    fn open(
        &self,
        req: ConfirmRequest,
        trace_id: Option<String>,
    ) -> impl Future<Output = Result<Confirmation, ConfirmError>> + Send;

    /// A person's decision. Only the first decision on a pending confirmation counts; any
    /// later one gets 409 with the first in `details.confirmation`.
    fn decide(
        &self,
        decide: ConfirmDecide,
        trace_id: Option<String>,
    ) -> impl Future<Output = Result<Confirmation, ConfirmError>> + Send;

    fn get(&self, id: &str) -> impl Future<Output = Result<Confirmation, ConfirmError>> + Send;

    /// Applies the timeout to a pending confirmation whose time is up, and returns the
    /// confirmation as it now stands (still pending if its time is not up).
    fn expire(&self, id: &str) -> impl Future<Output = Result<Confirmation, ConfirmError>> + Send;

    /// Settles a pending confirmation that a session grant now covers; returns it if it did.
    fn settle_by_grant(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<Option<Confirmation>, ConfirmError>> + Send;

    /// Decided confirmations matching `query` (pending ones come from the registry's replica).
    fn scan(
        &self,
        query: &Query,
    ) -> impl Future<Output = Result<ConfirmListReply, ConfirmError>> + Send;

    /// What `caller` may see.
    fn audience(&self, caller: &Caller) -> Audience;

    /// The latest revision: a replica that has applied it has seen every earlier write.
    fn last_revision(&self) -> impl Future<Output = Result<u64, ConfirmError>> + Send;

    /// Feeds every change, starting with the current state, to `observe` until `stop`.
    fn watch(&self, observe: watch::Observer, stop: CancellationToken);
}

/// The workflow on the `sandbox_confirmations` bucket: a few reads and compare-and-set writes
/// per operation, then the live event and the audit event.
#[derive(Clone)]
pub struct KvWorkflow {
    pub store: ConfirmationStore,
    pub policy: Arc<Policy>,
    pub client: Client,
    pub subjects: Subjects,
    pub auditor: Auditor,
    pub scopes: Arc<OperatorScopes>,
    /// Counted beside the audit events, so also once per confirmation.
    pub metrics: Arc<kit::metrics::Metrics>,
}

impl Workflow for KvWorkflow {
    fn now_ms(&self) -> u64 {
        messages::now_ms()
    }

    async fn open(
        &self,
        mut req: ConfirmRequest,
        trace_id: Option<String>,
    ) -> Result<Confirmation, ConfirmError> {
        validate::request(&mut req)?;
        let timeout = self.policy.timeout_for(req.timeout_ms)?;
        let mut id = messages::new_id();
        if let Some(execution_id) = &req.execution_id {
            id = self.store.claim_execution(execution_id, &id).await?;
        }
        if let Some(existing) = self.store.get(&id).await? {
            return Ok(existing.value);
        }
        let now = messages::now_ms();
        let mut record = Confirmation {
            id: id.clone(),
            state: ConfirmState::Pending,
            execution_id: req.execution_id,
            session_id: req.session_id,
            risk: req.risk,
            summary: req.summary,
            code_excerpt: req.code_excerpt,
            files: req.files,
            kind: req.kind,
            requested_by: req.requested_by,
            tenant: req.tenant,
            created_at: now,
            expires_at: now + timeout.as_millis() as u64,
            ..Default::default()
        };
        let automatic = match self.policy.automatic(&record.risk) {
            Some(d) => Some(d),
            None => self.session_decision(&record).await?,
        };
        if let Some(decision) = &automatic {
            settle(&mut record, decision, now);
        }
        if self.store.create(&record).await?.is_none() {
            // A concurrent request for the same execution created it first.
            let existing = self
                .store
                .get(&id)
                .await?
                .ok_or_else(|| ConfirmError::Vanished { id: id.clone() })?;
            return Ok(existing.value);
        }
        // This service owns the `confirmation_*` audit events (the scheduler emits none).
        let scope = audit_scope(&record, trace_id, record.requested_by.clone());
        self.metrics.confirmations_requested.inc();
        let requested = ConfirmationRequested {
            id: record.id.clone(),
            level: record.risk.level,
            summary: record.summary.clone(),
            expires_at: record.expires_at,
        };
        self.auditor.emit(&scope, requested);
        if record.state.is_final() {
            self.announce_decision(&record, scope.trace_id.clone())
                .await;
        } else {
            self.publish(
                self.subjects
                    .confirm_pending(record.tenant.as_ref(), &record.id),
                &record,
            )
            .await;
        }
        Ok(record)
    }

    async fn decide(
        &self,
        decide: ConfirmDecide,
        trace_id: Option<String>,
    ) -> Result<Confirmation, ConfirmError> {
        validate::decide(&decide)?;
        let current = self.read(&decide.id).await?;
        if current.value.state.is_final() {
            return Err(already_decided(&current.value));
        }
        if decide.scope == ConfirmScope::Session && current.value.session_id.is_none() {
            return Err(ConfirmError::NoSession { id: decide.id });
        }
        let now = messages::now_ms();
        if now >= current.value.expires_at {
            // Too late: the timeout decided it, whether or not a sweep has written that yet.
            let expired = self.record_timeout(&decide.id, trace_id).await?;
            return Err(already_decided(&expired));
        }
        let mut record = current.value.clone();
        let decision = AutoDecision {
            state: if decide.approve {
                ConfirmState::Approved
            } else {
                ConfirmState::Denied
            },
            by: decide.by.clone(),
            reason: decide.reason.clone().unwrap_or_default(),
        };
        settle(&mut record, &decision, now);
        record.scope = decide.scope;
        record.by_account = decide.by_account.clone();
        match self.store.replace(&record, current.revision).await? {
            Cas::Written(_) => {
                if record.scope == ConfirmScope::Session && decide.approve {
                    self.grant_session(&record).await?;
                }
                self.announce_decision(&record, trace_id).await;
                Ok(record)
            }
            Cas::Conflict => Err(already_decided(&self.read(&decide.id).await?.value)),
        }
    }

    async fn get(&self, id: &str) -> Result<Confirmation, ConfirmError> {
        validate::id("id", id)?;
        Ok(self.read(id).await?.value)
    }

    async fn expire(&self, id: &str) -> Result<Confirmation, ConfirmError> {
        self.record_timeout(id, None).await
    }

    async fn settle_by_grant(&self, id: &str) -> Result<Option<Confirmation>, ConfirmError> {
        let current = self.read(id).await?;
        if current.value.state.is_final() {
            return Ok(None);
        }
        let Some(decision) = self.session_decision(&current.value).await? else {
            return Ok(None);
        };
        let mut record = current.value;
        settle(&mut record, &decision, messages::now_ms());
        match self.store.replace(&record, current.revision).await? {
            Cas::Written(_) => {
                self.announce_decision(&record, None).await;
                Ok(Some(record))
            }
            Cas::Conflict => Ok(None),
        }
    }

    async fn scan(&self, query: &Query) -> Result<ConfirmListReply, ConfirmError> {
        Ok(listing::scan(&self.store, query).await?)
    }

    fn audience(&self, caller: &Caller) -> Audience {
        Audience::of(caller, &self.scopes)
    }

    async fn last_revision(&self) -> Result<u64, ConfirmError> {
        Ok(self.store.last_revision().await?)
    }

    fn watch(&self, observe: watch::Observer, stop: CancellationToken) {
        watch::spawn(self.store.kv().clone(), observe, stop);
    }
}

impl KvWorkflow {
    async fn session_decision(
        &self,
        record: &Confirmation,
    ) -> Result<Option<AutoDecision>, ConfirmError> {
        let Some(session_id) = &record.session_id else {
            return Ok(None);
        };
        let grants = self.store.grants(session_id).await?;
        Ok(grants.and_then(|g| g.value.covers(&record.risk)))
    }

    /// Records the rules of a session-scoped approval as granted for that session.
    async fn grant_session(&self, record: &Confirmation) -> Result<(), ConfirmError> {
        let Some(session_id) = &record.session_id else {
            return Ok(());
        };
        let grant = Grant {
            by: record.by.clone().unwrap_or_default(),
            confirmation_id: record.id.clone(),
            granted_at: record.decided_at.unwrap_or_else(messages::now_ms),
        };
        for _ in 0..GRANT_ATTEMPTS {
            let current = self.store.grants(session_id).await?;
            let (mut grants, revision) = match current {
                Some(v) => (v.value, Some(v.revision)),
                None => (
                    SessionGrants {
                        session_id: session_id.clone(),
                        ..Default::default()
                    },
                    None,
                ),
            };
            if !grants.grant(&record.risk, &grant) {
                return Ok(());
            }
            if let Cas::Written(_) = self.store.write_grants(&grants, revision).await? {
                return Ok(());
            }
        }
        Err(ConfirmError::GrantContention {
            id: record.id.clone(),
        })
    }

    /// [`Workflow::expire`], with the trace of the request that found the time up.
    async fn record_timeout(
        &self,
        id: &str,
        trace_id: Option<String>,
    ) -> Result<Confirmation, ConfirmError> {
        let current = self.read(id).await?;
        let now = messages::now_ms();
        if current.value.state.is_final() || now < current.value.expires_at {
            return Ok(current.value);
        }
        let mut record = current.value.clone();
        let waited = Duration::from_millis(record.expires_at - record.created_at);
        settle(&mut record, &self.policy.on_timeout(waited), now);
        match self.store.replace(&record, current.revision).await? {
            Cas::Written(_) => {
                self.announce_decision(&record, trace_id).await;
                Ok(record)
            }
            // Another instance's sweep or a person got there first: theirs stands.
            Cas::Conflict => Ok(self.read(id).await?.value),
        }
    }

    async fn read(&self, id: &str) -> Result<Versioned<Confirmation>, ConfirmError> {
        self.store
            .get(id)
            .await?
            .ok_or_else(|| ConfirmError::NotFound { id: id.to_string() })
    }

    async fn announce_decision(&self, record: &Confirmation, trace_id: Option<String>) {
        let scope = audit_scope(record, trace_id, record.by.clone());
        let decision = match record.state {
            ConfirmState::Approved => "approved",
            ConfirmState::Denied => "denied",
            ConfirmState::Timeout => "expired",
            ConfirmState::Pending => "pending",
        };
        let label = kit::metrics::DecisionLabel { decision };
        self.metrics
            .confirmations_decided
            .get_or_create(&label)
            .inc();
        let decided = ConfirmationDecided {
            id: record.id.clone(),
            state: record.state,
            by: record.by.clone(),
            reason: record.reason.clone(),
            scope: record.scope,
            waited_ms: record
                .decided_at
                .unwrap_or(record.created_at)
                .saturating_sub(record.created_at),
        };
        self.auditor.emit(&scope, decided);
        self.publish(
            self.subjects
                .confirm_decided(record.tenant.as_ref(), &record.id),
            record,
        )
        .await;
    }

    /// Live events are core NATS (a UI that is not listening misses nothing it cannot `list`).
    /// Awaited in order, so a UI never sees `decided` before `pending` for one id. A tenant's
    /// agents import its events, so they name the execution and session as its agent did
    /// (`tenant` says whose); a service that needs the stored form scopes them again.
    async fn publish(&self, subject: String, record: &Confirmation) {
        let named = record.clone().named();
        let Ok(payload) = serde_json::to_vec(&named) else {
            return;
        };
        let mut headers = HeaderMap::new();
        headers.insert(messages::codec::CONTENT_TYPE, messages::codec::JSON);
        if let Err(e) = self
            .client
            .publish_with_headers(subject, headers, payload.into())
            .await
        {
            tracing::warn!(error = %e, "confirmation event not published");
        }
    }
}

fn settle(record: &mut Confirmation, decision: &AutoDecision, now: u64) {
    record.state = decision.state;
    record.by = Some(decision.by.clone());
    record.reason = (!decision.reason.is_empty()).then(|| decision.reason.clone());
    record.decided_at = Some(now);
}

/// The refusal of a later decision: the first one stands, and the caller is shown it.
fn already_decided(record: &Confirmation) -> ConfirmError {
    ConfirmError::AlreadyDecided(Box::new(record.clone()))
}

fn audit_scope(
    record: &Confirmation,
    trace_id: Option<String>,
    actor: Option<String>,
) -> AuditScope {
    AuditScope {
        execution_id: record.execution_id.clone(),
        session_id: record.session_id.clone(),
        trace_id,
        actor,
        tenant: record.tenant.clone(),
        // A person's decision names the operator the server authenticated.
        account: record.by_account.clone(),
        user: record.by_account.as_ref().and(record.by.clone()),
    }
}
