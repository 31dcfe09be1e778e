//! `Confirmations`: the scheduler's side of the confirmation service. It opens a confirmation
//! without waiting for the decision (`wait: false`: the pending record, its id and expiry, comes
//! back at once) and reads one back by id; the decision itself arrives as the
//! `confirm.decided.<id>` event (see [`crate::resumer`]).

use std::time::Duration;

use messages::confirm::{ConfirmFile, ConfirmKind, ConfirmRequest, ConfirmState, Confirmation};
use messages::exec::{ConfirmationOutcome, Decision, FileSpec, Timing};
use messages::risk::RiskAssessment;
use messages::{ErrorKind, ServiceName};
use sandmesh_client::ConfirmClient;
use sha2::{Digest, Sha256};

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
        let files = exec.reviewed_files();
        let ask = ConfirmRequest {
            tenant: exec.tenant.clone(),
            execution_id: Some(exec.id.clone()),
            session_id: req.session_id.clone(),
            risk: exec.risk.clone(),
            summary: summary(
                exec.reviewed_language().as_str(),
                exec.reviewed_code().len(),
                &files,
                &exec.risk,
            ),
            code_excerpt: excerpt(exec.reviewed_code(), EXCERPT_BYTES),
            files: files.iter().map(shown).collect(),
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

/// How much of the code, and of each text file, a person is shown.
pub(crate) const EXCERPT_BYTES: usize = 2048;

fn summary(language: &str, bytes: usize, files: &[FileSpec], risk: &RiskAssessment) -> String {
    // The summary is one paragraph: a few paths by name, the rest counted (all are in `files`).
    const NAMED: usize = 4;
    let mut paths: Vec<&str> = files.iter().take(NAMED).map(|f| f.path.as_str()).collect();
    let more = format!("{} more", files.len().saturating_sub(NAMED));
    if files.len() > NAMED {
        paths.push(&more);
    }
    let with = match files.len() {
        0 => String::new(),
        1 => format!(" with 1 file ({})", paths.join(", ")),
        n => format!(" with {n} files ({})", paths.join(", ")),
    };
    format!(
        "{language} code ({bytes} bytes){with}, risk {}: {}",
        risk.level.as_str(),
        risk.reason
    )
}

/// A file as the person deciding sees it: path, size, digest of the bytes the executor will
/// write, and the start of its text. (The request was validated: its content decodes.)
fn shown(file: &FileSpec) -> ConfirmFile {
    let bytes = file.bytes().unwrap_or_default();
    let excerpt = std::str::from_utf8(&bytes)
        .map(|text| excerpt(text, EXCERPT_BYTES))
        .unwrap_or_default();
    ConfirmFile {
        path: file.path.clone(),
        bytes: bytes.len() as u64,
        sha256: hex::encode(Sha256::digest(&bytes)),
        excerpt,
    }
}

/// At most `max` bytes of `code`, cut at a character boundary.
pub(crate) fn excerpt(code: &str, max: usize) -> String {
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
    fn a_person_sees_each_file_with_its_size_digest_and_text() {
        let text = FileSpec {
            path: "code/x.py".into(),
            content: "import pty\n".into(),
            encoding: Default::default(),
        };
        let binary = FileSpec {
            path: "bin/tool".into(),
            // Bytes that are not UTF-8.
            content: "//4A".into(),
            encoding: messages::exec::ContentEncoding::Base64,
        };
        let shown_text = shown(&text);
        assert_eq!(
            (shown_text.bytes, shown_text.excerpt.as_str()),
            (11, "import pty\n")
        );
        assert_eq!(
            shown_text.sha256,
            hex::encode(Sha256::digest(b"import pty\n"))
        );
        let shown_binary = shown(&binary);
        assert_eq!((shown_binary.bytes, shown_binary.excerpt.as_str()), (3, ""));
        let files: Vec<FileSpec> = (0..6).map(|_| text.clone()).collect();
        let s = summary("python", 8, &files, &RiskAssessment::default());
        assert!(s.contains("with 6 files (code/x.py, "), "{s}");
        assert!(s.contains("2 more"), "{s}");
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
