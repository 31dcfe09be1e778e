//! The operations on confirmations — open, decide, expire, get, scan — each a few reads and
//! compare-and-set writes on the bucket, then the live event and the audit event. Stateless
//! and cloneable: the `Registry` runs them in tasks so it never waits on NATS itself.

use std::sync::Arc;
use std::time::Duration;

use async_nats::{Client, HeaderMap};
use kit::{AuditScope, Auditor};
use messages::audit::AuditKind;
use messages::confirm::{ConfirmDecide, ConfirmRequest, ConfirmScope, ConfirmState, Confirmation};
use messages::{ErrorBody, Subjects};
use serde_json::json;

use crate::policy::{AutoDecision, Grant, Policy, SessionGrants};
use crate::store::{Cas, ConfirmationStore, Versioned};
use crate::validate;

/// Compare-and-set retries on the session grants before giving up (each retry follows a
/// concurrent writer's success, so this only runs out under heavy contention).
const GRANT_ATTEMPTS: usize = 8;

/// A request's confirmation and whether this call created it (or found an earlier one).
#[derive(Debug, Clone)]
pub struct Opened {
    pub record: Confirmation,
    pub created: bool,
}

#[derive(Clone)]
pub struct Workflow {
    pub store: ConfirmationStore,
    pub policy: Arc<Policy>,
    pub client: Client,
    pub subjects: Subjects,
    pub auditor: Auditor,
}

impl Workflow {
    /// Finds the execution's confirmation or creates it, decided at once when policy or a
    /// session grant says so, pending otherwise.
    pub async fn open(
        &self,
        mut req: ConfirmRequest,
        trace_id: Option<String>,
    ) -> Result<Opened, ErrorBody> {
        validate::request(&mut req)?;
        let timeout = self.policy.timeout_for(req.timeout_ms)?;
        let mut id = messages::new_id();
        if let Some(execution_id) = &req.execution_id {
            id = self.store.claim_execution(execution_id, &id).await?;
        }
        if let Some(existing) = self.store.get(&id).await? {
            return Ok(Opened {
                record: existing.value,
                created: false,
            });
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
            requested_by: req.requested_by,
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
            let existing = self.store.get(&id).await?.ok_or_else(|| {
                ErrorBody::unavailable(format!("confirmation {id} vanished while created"))
            })?;
            return Ok(Opened {
                record: existing.value,
                created: false,
            });
        }
        let scope = audit_scope(&record, trace_id, record.requested_by.clone());
        self.auditor.emit(
            AuditKind::ConfirmationRequested,
            &scope,
            json!({ "id": record.id, "level": record.risk.level, "summary": record.summary,
                    "expires_at": record.expires_at }),
        );
        if record.state.is_final() {
            self.announce_decision(&record, scope.trace_id.clone())
                .await;
        } else {
            self.publish(self.subjects.confirm_pending(&record.id), &record)
                .await;
        }
        Ok(Opened {
            record,
            created: true,
        })
    }

    async fn session_decision(
        &self,
        record: &Confirmation,
    ) -> Result<Option<AutoDecision>, ErrorBody> {
        let Some(session_id) = &record.session_id else {
            return Ok(None);
        };
        let grants = self.store.grants(session_id).await?;
        Ok(grants.and_then(|g| g.value.covers(&record.risk)))
    }

    /// A person's decision. Only the first decision on a pending confirmation counts; any
    /// later one gets 409 with the first in `details.confirmation`.
    pub async fn decide(
        &self,
        decide: ConfirmDecide,
        trace_id: Option<String>,
    ) -> Result<Confirmation, ErrorBody> {
        validate::decide(&decide)?;
        let current = self.read(&decide.id).await?;
        if current.value.state.is_final() {
            return Err(already_decided(&current.value));
        }
        if decide.scope == ConfirmScope::Session && current.value.session_id.is_none() {
            return Err(ErrorBody::bad_request(format!(
                "scope session: confirmation {} belongs to no session",
                decide.id
            )));
        }
        let now = messages::now_ms();
        if now >= current.value.expires_at {
            // Too late: the timeout decided it, whether or not a sweep has written that yet.
            let expired = self.expire(&decide.id, trace_id).await?;
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

    /// Records the rules of a session-scoped approval as granted for that session.
    async fn grant_session(&self, record: &Confirmation) -> Result<(), ErrorBody> {
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
        Err(ErrorBody::unavailable(format!(
            "the approval of {} is stored, but the session grant could not be written \
             (too much contention); approve the next request again",
            record.id
        )))
    }

    /// Settles a pending confirmation that a session grant now covers; returns it if it did.
    pub async fn settle_by_grant(&self, id: &str) -> Result<Option<Confirmation>, ErrorBody> {
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

    /// Applies the timeout to a pending confirmation whose time is up, and returns the
    /// confirmation as it now stands (possibly still pending if its time is not up).
    pub async fn expire(
        &self,
        id: &str,
        trace_id: Option<String>,
    ) -> Result<Confirmation, ErrorBody> {
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

    pub async fn get(&self, id: &str) -> Result<Confirmation, ErrorBody> {
        validate::id("id", id)?;
        Ok(self.read(id).await?.value)
    }

    async fn read(&self, id: &str) -> Result<Versioned<Confirmation>, ErrorBody> {
        self.store
            .get(id)
            .await?
            .ok_or_else(|| ErrorBody::not_found(format!("no confirmation {id}")))
    }

    async fn announce_decision(&self, record: &Confirmation, trace_id: Option<String>) {
        let scope = audit_scope(record, trace_id, record.by.clone());
        self.auditor.emit(
            AuditKind::ConfirmationDecided,
            &scope,
            json!({ "id": record.id, "state": record.state, "by": record.by,
                    "reason": record.reason, "scope": record.scope,
                    "waited_ms": record.decided_at.unwrap_or(record.created_at)
                        .saturating_sub(record.created_at) }),
        );
        self.publish(self.subjects.confirm_decided(&record.id), record)
            .await;
    }

    /// Live events are core NATS (a UI that is not listening misses nothing it cannot `list`).
    /// Awaited in order, so a UI never sees `decided` before `pending` for one id.
    async fn publish(&self, subject: String, record: &Confirmation) {
        let Ok(payload) = serde_json::to_vec(record) else {
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

fn already_decided(record: &Confirmation) -> ErrorBody {
    ErrorBody::conflict(format!(
        "confirmation {} was already decided ({:?} by {})",
        record.id,
        record.state,
        record.by.as_deref().unwrap_or("?")
    ))
    .with_details(json!({ "confirmation": record }))
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
    }
}
