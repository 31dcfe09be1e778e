//! `Confirmations`: the scheduler's side of the confirmation service. It opens a confirmation
//! without waiting for the decision (`wait: false`: the pending record, its id and expiry, comes
//! back at once) and reads one back by id; the decision itself arrives as the
//! `confirm.decided.<id>` event (see [`crate::resumer`]).

use std::time::Duration;

use messages::confirm::{ConfirmKind, ConfirmRequest, ConfirmState, Confirmation};
use messages::exec::{ConfirmationOutcome, Decision, Timing};
use messages::risk::RiskAssessment;
use messages::{ErrorKind, ServiceName};
use sandmesh_client::ConfirmClient;

use crate::error::SchedulerError;
use crate::execution::Execution;

/// Pause between attempts to reach a confirmation service that is (re)starting.
const RETRY: Duration = Duration::from_millis(250);

/// The scheduler's policy on top of the client's [`ConfirmClient`]: what it asks a person
/// about an execution, and how long it waits for a confirmation service to come up.
#[derive(Clone)]
pub struct Confirmations {
    client: ConfirmClient,
    /// How long a person has to decide.
    timeout: Duration,
}

impl Confirmations {
    pub fn new(client: ConfirmClient, timeout: Duration) -> Self {
        Self { client, timeout }
    }

    /// Opens (or finds: it is idempotent per execution id) the execution's confirmation. A
    /// confirmation service that is not up (yet) is waited for, at most the decision timeout.
    pub async fn request(&self, exec: &Execution) -> Result<Confirmation, SchedulerError> {
        let req = &exec.request;
        let ask = ConfirmRequest {
            tenant: exec.tenant.clone(),
            execution_id: Some(exec.id.clone()),
            session_id: req.session_id.clone(),
            risk: exec.risk.clone(),
            summary: summary(
                exec.reviewed_language().as_str(),
                exec.reviewed_code().len(),
                &exec.risk,
            ),
            code_excerpt: excerpt(exec.reviewed_code(), 2048),
            kind: ConfirmKind::Code,
            requested_by: req.requested_by.clone(),
            timeout_ms: Some(Timing::ms(self.timeout)),
            wait: false,
        };
        let deadline = tokio::time::Instant::now() + self.timeout;
        loop {
            let reply = self.client.request(&ask).await;
            let retry = matches!(&reply, Err(e) if e.kind() == ErrorKind::Unavailable);
            if !retry || tokio::time::Instant::now() + RETRY >= deadline {
                return reply.map_err(SchedulerError::calling(ServiceName::Confirmation));
            }
            tokio::time::sleep(RETRY).await;
        }
    }

    pub async fn get(&self, id: &str) -> sandmesh_client::Result<Confirmation> {
        self.client.get(id).await
    }
}

/// The decision a final confirmation carries; `None` while it is pending.
pub fn outcome(c: &Confirmation) -> Option<ConfirmationOutcome> {
    let decision = match c.state {
        ConfirmState::Pending => return None,
        ConfirmState::Approved => Decision::Approved,
        ConfirmState::Denied => Decision::Denied,
        ConfirmState::Timeout => Decision::Timeout,
    };
    Some(ConfirmationOutcome {
        decision,
        by: c.by.clone(),
        reason: c.reason.clone(),
    })
}

/// The decision for a confirmation nobody decided in time (or that cannot be read any more).
pub fn expired(why: &str) -> ConfirmationOutcome {
    ConfirmationOutcome {
        decision: Decision::Timeout,
        by: None,
        reason: Some(why.to_string()),
    }
}

fn summary(language: &str, bytes: usize, risk: &RiskAssessment) -> String {
    format!(
        "{language} code ({bytes} bytes), risk {}: {}",
        risk.level.as_str(),
        risk.reason
    )
}

/// At most `max` bytes of `code`, cut at a character boundary.
fn excerpt(code: &str, max: usize) -> String {
    if code.len() <= max {
        return code.to_string();
    }
    let mut end = max;
    while !code.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &code[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excerpts_cut_at_character_boundaries() {
        assert_eq!(excerpt("abc", 10), "abc");
        assert_eq!(excerpt("ééé", 3), "é…");
    }

    #[test]
    fn only_final_confirmations_carry_a_decision() {
        let mut c = Confirmation::default();
        assert_eq!(outcome(&c), None);
        c.state = ConfirmState::Timeout;
        assert_eq!(outcome(&c).unwrap().decision, Decision::Timeout);
        c.state = ConfirmState::Approved;
        c.by = Some("alice".into());
        let o = outcome(&c).unwrap();
        assert_eq!(
            (o.decision, o.by.as_deref()),
            (Decision::Approved, Some("alice"))
        );
    }
}
