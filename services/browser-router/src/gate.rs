//! Risk and confirmation of one browser action: every action is assessed by the risk-assessor
//! (`content_type: browser`, the action and its parameters); password, payment and card fields
//! and `evaluate` wait for a person's decision through the confirmation service, as code does.
//!
//! A caller that sent `Sandmesh-Notify` hears at once that its action waits, as an `exec`
//! caller does: an awaiting-confirmation notice on its reply subject (the export of
//! `browser.*` is a stream for that), naming the confirmation, before the action's reply.

use std::time::Duration;

use async_nats::HeaderMap;
use kit::{AuditScope, Auditor, RequestContext};
use messages::audit::BrowserAssessed;
use messages::browser::BrowserAction;
use messages::codec;
use messages::confirm::{ConfirmKind, ConfirmRequest, ConfirmState};
use messages::exec::{
    AwaitingConfirmation, NOTIFY_HEADER, STATUS_AWAITING_CONFIRMATION, STATUS_HEADER,
};
use messages::risk::{AssessRequest, ContentType, RiskLevel};
use messages::{Encoding, ErrorBody, ErrorKind};
use sandmesh_client::{ClientError, MeshClient};
use serde_json::json;

/// What the gate decided, for the reply.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    pub level: RiskLevel,
    /// The confirmation's id and final state, when a person was asked.
    pub confirmation: Option<(String, ConfirmState)>,
}

/// Why an action did not pass the gate.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error("risk assessment failed: {0}")]
    Assessment(#[source] ClientError),
    #[error("confirmation failed: {0}")]
    Confirmation(#[source] ClientError),
    /// A person (or the policy, or the timeout) did not approve.
    #[error(
        "{} refused: confirmation {id} was {state:?} ({why}); nothing was done",
        .action.as_str()
    )]
    Refused {
        action: BrowserAction,
        id: String,
        state: ConfirmState,
        why: String,
        level: RiskLevel,
    },
}

impl GateError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            GateError::Assessment(_) | GateError::Confirmation(_) => ErrorKind::Unavailable,
            GateError::Refused { .. } => ErrorKind::Denied,
        }
    }
}

impl From<GateError> for ErrorBody {
    /// A refusal names its confirmation, so the caller can look the decision up.
    fn from(e: GateError) -> Self {
        let body = ErrorBody::new(e.kind(), e.to_string());
        match e {
            GateError::Refused {
                id, state, level, ..
            } => body.with_details(
                json!({"confirmation_id": id, "confirmation": state, "risk_level": level}),
            ),
            _ => body,
        }
    }
}

#[derive(Clone)]
pub struct Gate {
    pub mesh: MeshClient,
    pub auditor: Auditor,
    pub confirm_timeout: Duration,
}

/// Whether a described form field (`describe`'s object) holds a secret or payment data.
pub fn sensitive_field(field: &serde_json::Value) -> bool {
    let get = |k: &str| {
        field
            .get(k)
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_ascii_lowercase()
    };
    let kind = get("type");
    let autocomplete = get("autocomplete");
    let words = format!(
        "{} {} {} {}",
        get("name"),
        get("id"),
        get("label"),
        autocomplete
    );
    kind == "password"
        || autocomplete.starts_with("cc-")
        || [
            "password", "passwd", "card", "cvv", "cvc", "iban", "payment",
        ]
        .iter()
        .any(|w| words.contains(w))
}

impl Gate {
    /// Assesses the action; when it needs a person (the assessor says so, the field is
    /// sensitive, or it is `evaluate`), asks and waits — telling a caller that asked for
    /// notices at once. Anything but approval is an error (403) that names the decision, and
    /// nothing is done.
    pub async fn pass(
        &self,
        action: BrowserAction,
        params: serde_json::Value,
        sensitive: bool,
        summary: String,
        scope: &AuditScope,
        ctx: &RequestContext,
    ) -> Result<Verdict, GateError> {
        let assess = AssessRequest {
            content: action.as_str().to_string(),
            content_type: ContentType::Browser,
            params: Some(params.clone()),
            mode: None,
            files: Vec::new(),
        };
        let risk = self
            .mesh
            .risk()
            .assess(&assess)
            .await
            .map_err(GateError::Assessment)?;
        let ask = risk.requires_confirmation || sensitive || action == BrowserAction::Evaluate;
        let assessed = BrowserAssessed {
            action,
            params: params.clone(),
            level: risk.level,
            reason: risk.reason.clone(),
            confirmation: ask,
        };
        self.auditor.emit(scope, assessed);
        let level = risk.level;
        if !ask {
            return Ok(Verdict {
                level,
                confirmation: None,
            });
        }
        // The action's own id: the confirmation is idempotent by it, so asking again (to wait,
        // after the notice) finds the same one.
        let action_id = scope.execution_id.clone().unwrap_or_else(messages::new_id);
        let mut request = ConfirmRequest {
            tenant: scope.tenant.clone(),
            execution_id: Some(action_id.clone()),
            session_id: scope.session_id.clone(),
            risk,
            summary,
            code_excerpt: serde_json::to_string_pretty(&params).unwrap_or_default(),
            files: Vec::new(),
            kind: ConfirmKind::BrowserAction,
            requested_by: scope.actor.clone(),
            timeout_ms: Some(self.confirm_timeout.as_millis() as u64),
            wait: true,
        };
        let confirm = self.mesh.confirm();
        if let Some(reply) = notice_subject(ctx) {
            request.wait = false;
            let opened = confirm
                .request(&request)
                .await
                .map_err(GateError::Confirmation)?;
            if !opened.state.is_final() {
                let notice = AwaitingConfirmation {
                    execution_id: action_id,
                    confirmation_id: opened.id,
                    expires_at: opened.expires_at,
                };
                self.notify(reply, &notice).await;
            }
            request.wait = true;
        }
        let decided = confirm
            .request(&request)
            .await
            .map_err(GateError::Confirmation)?;
        if decided.state != ConfirmState::Approved {
            return Err(GateError::Refused {
                action,
                id: decided.id,
                state: decided.state,
                why: decided.reason.unwrap_or_else(|| "no reason given".into()),
                level,
            });
        }
        Ok(Verdict {
            level,
            confirmation: Some((decided.id, decided.state)),
        })
    }

    /// Sends the awaiting-confirmation notice to `reply`, before the action's reply.
    async fn notify(&self, reply: String, notice: &AwaitingConfirmation) {
        let mut headers = HeaderMap::new();
        headers.insert(STATUS_HEADER, STATUS_AWAITING_CONFIRMATION);
        headers.insert(codec::CONTENT_TYPE, codec::JSON);
        let Ok(body) = Encoding::Json.encode(notice) else {
            return;
        };
        let sent = self
            .mesh
            .nats()
            .publish_with_headers(reply, headers, body.into())
            .await;
        if let Err(e) = sent {
            tracing::debug!(error = %e, "awaiting-confirmation notice not sent");
        }
    }
}

/// Where notices go: the request's reply subject, if the caller asked for notices
/// (`Sandmesh-Notify`; plain request-reply callers would take a notice for the reply).
fn notice_subject(ctx: &RequestContext) -> Option<String> {
    let asked = ctx
        .headers
        .as_ref()
        .is_some_and(|h| h.get(NOTIFY_HEADER).is_some());
    ctx.reply.clone().filter(|_| asked)
}

#[cfg(test)]
mod tests {
    use super::sensitive_field;
    use serde_json::json;

    #[test]
    fn secrets_and_payment_fields_are_sensitive() {
        assert!(sensitive_field(
            &json!({"tag": "input", "type": "password"})
        ));
        assert!(sensitive_field(
            &json!({"tag": "input", "autocomplete": "cc-number"})
        ));
        assert!(sensitive_field(
            &json!({"tag": "input", "name": "card_number"})
        ));
        assert!(sensitive_field(
            &json!({"tag": "input", "label": "Your Password"})
        ));
        assert!(!sensitive_field(
            &json!({"tag": "input", "type": "text", "name": "user"})
        ));
        assert!(!sensitive_field(&json!({"tag": "button"})));
    }
}
