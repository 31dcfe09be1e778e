//! Input checks for `confirm.*`: ids that become KV keys and subject tokens, bounded texts.
//! Everything refused gets a 400 naming the field.

use messages::confirm::{ConfirmDecide, ConfirmRequest};
use messages::validate::ValidationError;

/// `summary`, `reason`: a paragraph, not a document.
pub const MAX_TEXT_BYTES: usize = 4096;
/// `by`, `requested_by`: a name.
pub const MAX_NAME_BYTES: usize = 256;
/// `code_excerpt` is cut to this (it is an excerpt for a person to read; the full code stays
/// with the execution).
pub const MAX_EXCERPT_BYTES: usize = 16 * 1024;
pub const MAX_FINDINGS: usize = 256;
/// Files shown with the code (an execution carries at most 64 by default).
pub const MAX_FILES: usize = 256;
/// A file's `excerpt` is cut to this (its digest identifies the whole file).
pub const MAX_FILE_EXCERPT_BYTES: usize = 4 * 1024;
/// A file's `path`: a workspace path.
pub const MAX_PATH_BYTES: usize = 1024;
pub const MAX_RULE_BYTES: usize = 128;
const TRUNCATED: &str = "\n… (excerpt truncated)";

fn bad(field: &str, message: String) -> ValidationError {
    ValidationError::invalid(field, message)
}

pub fn id(field: &str, value: &str) -> Result<(), ValidationError> {
    messages::tenancy::validate_scoped_id(field, value)
}

fn text(field: &str, value: &str, max: usize) -> Result<(), ValidationError> {
    if value.len() > max {
        return Err(bad(field, format!("{} bytes; at most {max}", value.len())));
    }
    Ok(())
}

/// A name: non-empty, bounded, printable (it shows up in logs, audit and terminals).
fn name(field: &str, value: &str) -> Result<(), ValidationError> {
    if value.trim().is_empty() {
        return Err(bad(field, "must not be empty".into()));
    }
    text(field, value, MAX_NAME_BYTES)?;
    if value.chars().any(char::is_control) {
        return Err(bad(field, "must not contain control characters".into()));
    }
    Ok(())
}

/// Checks a request, cutting an over-long code excerpt rather than refusing it.
pub fn request(req: &mut ConfirmRequest) -> Result<(), ValidationError> {
    if let Some(v) = &req.execution_id {
        id("execution_id", v)?;
    }
    if let Some(v) = &req.session_id {
        id("session_id", v)?;
    }
    if let Some(v) = &req.requested_by {
        name("requested_by", v)?;
    }
    text("summary", &req.summary, MAX_TEXT_BYTES)?;
    if req.risk.findings.len() > MAX_FINDINGS {
        return Err(bad(
            "risk.findings",
            format!(
                "{} findings; at most {MAX_FINDINGS}",
                req.risk.findings.len()
            ),
        ));
    }
    for f in &req.risk.findings {
        if f.rule.is_empty() || f.rule.len() > MAX_RULE_BYTES {
            return Err(bad(
                "risk.findings.rule",
                format!("must be 1..={MAX_RULE_BYTES} bytes"),
            ));
        }
        text("risk.findings.description", &f.description, MAX_TEXT_BYTES)?;
    }
    text("risk.reason", &req.risk.reason, MAX_TEXT_BYTES)?;
    cut(&mut req.code_excerpt, MAX_EXCERPT_BYTES);
    if req.files.len() > MAX_FILES {
        let n = req.files.len();
        return Err(bad("files", format!("{n} files; at most {MAX_FILES}")));
    }
    for f in &mut req.files {
        name("files.path", &f.path)?;
        text("files.path", &f.path, MAX_PATH_BYTES)?;
        let hex = f.sha256.len() == 64 && f.sha256.bytes().all(|b| b.is_ascii_hexdigit());
        if !hex {
            return Err(bad("files.sha256", "must be 64 hex digits".into()));
        }
        cut(&mut f.excerpt, MAX_FILE_EXCERPT_BYTES);
    }
    Ok(())
}

/// Cuts an over-long excerpt to `max` bytes, saying so at its end.
fn cut(excerpt: &mut String, max: usize) {
    if excerpt.len() <= max {
        return;
    }
    let mut at = max - TRUNCATED.len();
    while !excerpt.is_char_boundary(at) {
        at -= 1;
    }
    excerpt.truncate(at);
    excerpt.push_str(TRUNCATED);
}

pub fn decide(d: &ConfirmDecide) -> Result<(), ValidationError> {
    id("id", &d.id)?;
    name("by", &d.by)?;
    if let Some(reason) = &d.reason {
        text("reason", reason, MAX_TEXT_BYTES)?;
    }
    if d.scope == messages::confirm::ConfirmScope::Session && !d.approve {
        return Err(bad(
            "scope",
            "session scope applies to approvals; a denial is for this request only".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use messages::confirm::ConfirmScope;

    use super::*;

    /// The field a refusal names.
    fn field(checked: Result<(), ValidationError>) -> String {
        match checked {
            Err(ValidationError::Invalid { field, .. }) => field,
            other => panic!("not refused as invalid: {other:?}"),
        }
    }

    #[test]
    fn ids_that_cannot_be_keys_are_refused() {
        let mut r = ConfirmRequest {
            execution_id: Some("a.b".into()),
            ..Default::default()
        };
        assert_eq!(field(request(&mut r)), "execution_id");
        let d = ConfirmDecide {
            by_account: None,
            id: "*".into(),
            approve: true,
            by: "alice".into(),
            reason: None,
            scope: ConfirmScope::Once,
        };
        assert_eq!(field(decide(&d)), "id");
    }

    #[test]
    fn names_and_texts_are_bounded() {
        let d = ConfirmDecide {
            by_account: None,
            id: "01J".into(),
            approve: true,
            by: " ".into(),
            reason: None,
            scope: ConfirmScope::Once,
        };
        assert_eq!(field(decide(&d)), "by");
        let mut r = ConfirmRequest {
            summary: "x".repeat(MAX_TEXT_BYTES + 1),
            ..Default::default()
        };
        assert_eq!(field(request(&mut r)), "summary");
    }

    #[test]
    fn a_long_excerpt_is_cut_on_a_character_boundary() {
        let mut r = ConfirmRequest {
            code_excerpt: "é".repeat(MAX_EXCERPT_BYTES),
            ..Default::default()
        };
        request(&mut r).unwrap();
        assert!(r.code_excerpt.len() <= MAX_EXCERPT_BYTES);
        assert!(r.code_excerpt.ends_with("(excerpt truncated)"));
    }

    #[test]
    fn a_session_scoped_denial_is_refused() {
        let d = ConfirmDecide {
            by_account: None,
            id: "01J".into(),
            approve: false,
            by: "alice".into(),
            reason: None,
            scope: ConfirmScope::Session,
        };
        assert_eq!(field(decide(&d)), "scope");
    }
}
