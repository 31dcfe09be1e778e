//! What a tool answers: text a model reads, plus the same facts as `structuredContent` for
//! programs. Every failure — a service's refusal, no service answering, a bad argument —
//! is a tool result with `isError: true` naming the error kind, never a JSON-RPC error: MCP
//! clients show a tool error's text to the model (which can then correct itself) but hide
//! protocol errors behind a generic message.

use messages::browser::{BrowserAction, BrowserResult};
use messages::exec::{AwaitingConfirmation, Decision, ExecResult, ExecStatus};
use messages::testrun::{TestReport, TestRunStatus};
use messages::workspace::WsEntry;
use rmcp::model::{CallToolResult, ContentBlock};
use sandmesh_client::ClientError;
use serde_json::json;

/// A failed call: `<kind>: <message>`, and `{error: {kind, message}}`.
pub fn client_error(e: &ClientError) -> CallToolResult {
    let message = match e.service_error() {
        Some(body) => body.message.clone(),
        None => e.to_string(),
    };
    error(e.kind().as_str(), &message)
}

/// A refusal of this server's own (a bad argument) or a failure with a known kind.
pub fn error(kind: &str, message: &str) -> CallToolResult {
    let mut result = CallToolResult::error(vec![ContentBlock::text(format!("{kind}: {message}"))]);
    result.structured_content = Some(json!({"error": {"kind": kind, "message": message}}));
    result
}

/// The execution is parked until a person decides: say so, with what the operator and the
/// model each do next. Not an error: nothing failed, and the model should tell its user.
pub fn awaiting(a: &AwaitingConfirmation, now_ms: u64) -> CallToolResult {
    let next = format!(
        "call get_result with execution_id {} to fetch its output",
        a.execution_id
    );
    awaiting_then(a, now_ms, &next)
}

/// Like [`awaiting`], for a run whose answer comes by calling `next`.
pub fn awaiting_then(a: &AwaitingConfirmation, now_ms: u64, next: &str) -> CallToolResult {
    let left = a.expires_at.saturating_sub(now_ms) / 1000;
    let text = format!(
        "awaiting approval: this code needs a person's approval before it runs, so it has \
         not run yet.\n\
         execution_id: {execution}\n\
         confirmation_id: {confirmation}\n\
         expires in {minutes}m {seconds}s (unix ms {expires}); unapproved by then, it is denied.\n\
         An operator approves it with `sandmesh confirm approve {confirmation}` or in the \
         operators' console (you cannot approve it yourself). Tell the user, then {next}.",
        execution = a.execution_id,
        confirmation = a.confirmation_id,
        minutes = left / 60,
        seconds = left % 60,
        expires = a.expires_at,
    );
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = Some(json!({
        "state": "awaiting_confirmation",
        "execution_id": a.execution_id,
        "confirmation_id": a.confirmation_id,
        "expires_at": a.expires_at,
    }));
    result
}

/// A browser action waits for a person: say so, with what the operator and the model each do
/// next. Not an error, as for [`awaiting`] code.
pub fn awaiting_action(
    action: BrowserAction,
    a: &AwaitingConfirmation,
    now_ms: u64,
) -> CallToolResult {
    let left = a.expires_at.saturating_sub(now_ms) / 1000;
    let text = format!(
        "awaiting approval: this browser {action} needs a person's approval, so it has not \
         been done yet.\n\
         confirmation_id: {confirmation}\n\
         expires in {minutes}m {seconds}s (unix ms {expires}); unapproved by then, it is denied \
         and nothing is done.\n\
         An operator approves it with `sandmesh confirm approve {confirmation}` or in the \
         operators' console (you cannot approve it yourself). Tell the user; once approved, the \
         action is done in the session's browser (look with browser_content or \
         browser_screenshot).",
        action = action.as_str(),
        confirmation = a.confirmation_id,
        minutes = left / 60,
        seconds = left % 60,
        expires = a.expires_at,
    );
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = Some(json!({
        "state": "awaiting_confirmation",
        "action": action.as_str(),
        "action_id": a.execution_id,
        "confirmation_id": a.confirmation_id,
        "expires_at": a.expires_at,
    }));
    result
}

/// The execution has not finished (it is queued or runs).
pub fn still_running(execution_id: &str) -> CallToolResult {
    let text = format!(
        "still running: execution {execution_id} has no result yet; call get_result again."
    );
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = Some(json!({"state": "running", "execution_id": execution_id}));
    result
}

/// A finished execution: status, exit code, both streams, the files it made. Anything but
/// `ok` (a non-zero exit, a timeout, a refusal) is a tool error, so the model notices.
pub fn exec_result(r: &ExecResult) -> CallToolResult {
    let mut text = format!("status: {}", r.status.as_str());
    if let Some(code) = r.exit_code {
        text.push_str(&format!(" (exit code {code})"));
    }
    text.push('\n');
    if let Some(e) = &r.error {
        text.push_str(&format!("error: {}: {}\n", e.kind, e.message));
    }
    for (name, stream, truncated) in [
        ("stdout", &r.stdout, r.stdout_truncated),
        ("stderr", &r.stderr, r.stderr_truncated),
    ] {
        match (stream.is_empty(), truncated) {
            (true, _) => text.push_str(&format!("{name}: (empty)\n")),
            (false, false) => text.push_str(&format!("{name}:\n{stream}\n")),
            (false, true) => {
                text.push_str(&format!("{name} (cut at the output limit):\n{stream}\n"))
            }
        }
    }
    for (name, files) in [
        ("files created", &r.files_created),
        ("files modified", &r.files_modified),
    ] {
        if !files.is_empty() {
            text.push_str(&format!("{name}: {}\n", files.join(", ")));
        }
    }
    for f in &r.files_refused {
        // Escaped: a name may hold a newline that would read as another line of the result.
        text.push_str(&format!("file not saved: {:?} ({})\n", f.path, f.reason));
    }
    let decision = match r.confirmation.decision {
        Decision::NotRequired => None,
        Decision::Approved => Some("approved"),
        Decision::Denied => Some("denied"),
        Decision::Timeout => Some("not decided in time (denied)"),
    };
    if let Some(decision) = decision {
        let by = r.confirmation.by.as_deref().unwrap_or("nobody");
        text.push_str(&format!("confirmation: {decision} by {by}"));
        if let Some(reason) = &r.confirmation.reason {
            text.push_str(&format!(": {reason}"));
        }
        text.push('\n');
    }
    if r.session_restored {
        text.push_str(
            "note: the session's sandbox was lost and restarted: its files are back, but \
             variables and processes from earlier calls are gone\n",
        );
    }
    text.push_str(&format!(
        "execution_id: {} · tier {} · risk {} · {} ms",
        r.execution_id,
        r.tier.as_str(),
        r.risk.level.as_str(),
        r.timing.total_ms
    ));
    let content = vec![ContentBlock::text(text)];
    let mut result = match r.status {
        ExecStatus::Ok => CallToolResult::success(content),
        _ => CallToolResult::error(content),
    };
    result.structured_content = serde_json::to_value(r).ok();
    result
}

/// A listing: one line per entry, directories with a trailing `/`.
pub fn listing(entries: &[WsEntry]) -> CallToolResult {
    let text = if entries.is_empty() {
        "(no files)".to_string()
    } else {
        entries
            .iter()
            .map(|e| match e.is_dir {
                true => format!("{}/", e.path),
                false => format!("{} ({} bytes)", e.path, e.size),
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let entries: Vec<_> = entries
        .iter()
        .map(
            |e| json!({"path": e.path, "size": e.size, "is_dir": e.is_dir, "modified": e.modified}),
        )
        .collect();
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = Some(json!({ "entries": entries }));
    result
}

/// A browser action's outcome: where the page is, and what the action returned.
pub fn browser(r: &BrowserResult) -> CallToolResult {
    let mut lines = Vec::new();
    if let Some(url) = &r.url {
        lines.push(format!("url: {url}"));
    }
    if let Some(title) = &r.title {
        lines.push(format!("title: {title}"));
    }
    if r.state_lost {
        lines.push(
            "note: this session's previous browser was lost; cookies, history and open pages \
             are gone"
                .into(),
        );
    }
    if let (Some(state), Some(id)) = (&r.confirmation, &r.confirmation_id) {
        lines.push(format!("confirmation {id}: {state:?}").to_lowercase());
    }
    if !r.elements.is_empty() {
        lines.push("elements (use the index with browser_click / browser_fill):".into());
        for e in &r.elements {
            let kind = match &e.input_type {
                Some(t) => format!("{}, type {t}", e.tag),
                None => e.tag.clone(),
            };
            lines.push(format!("[{}] {} {:?} ({kind})", e.index, e.role, e.name));
        }
    }
    if let Some(path) = &r.screenshot_path {
        lines.push(format!("screenshot saved in the session's files: {path}"));
    }
    if let Some(value) = &r.value {
        lines.push(format!("value: {value}"));
    }
    if let Some(content) = &r.content {
        lines.push(String::new());
        lines.push(content.clone());
    }
    let mut structured = serde_json::to_value(r).unwrap_or_default();
    // The image travels as image content; a second copy in base64 text would only cost tokens.
    if let Some(o) = structured.as_object_mut() {
        o.remove("screenshot_base64");
    }
    let mut result = CallToolResult::success(vec![ContentBlock::text(lines.join("\n"))]);
    result.structured_content = Some(structured);
    result
}

/// A test run's report: one line per test and the totals (as `sandmesh test` prints them),
/// and the output when there is no usable report; the report itself as structured content.
pub fn test_report(r: &TestReport) -> CallToolResult {
    let mut text = sandmesh_client::exec::report_table(r);
    if matches!(r.status, TestRunStatus::Error | TestRunStatus::Timeout) {
        for (name, stream) in [("stdout", &r.stdout), ("stderr", &r.stderr)] {
            if !stream.is_empty() {
                text.push_str(&format!("{name}:\n{}\n", tail(stream, OUTPUT_TAIL_BYTES)));
            }
        }
    }
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = Some(json!({
        "execution_id": r.execution_id,
        "status": r.status,
        "tests": r.tests,
        "totals": r.totals,
        "error": r.error,
    }));
    result
}

/// How much of a failed run's output the model is shown (the end says most).
const OUTPUT_TAIL_BYTES: usize = 4096;

/// The last `max` bytes of `text`, from a character boundary.
fn tail(text: &str, max: usize) -> &str {
    let mut start = text.len().saturating_sub(max);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

#[cfg(test)]
mod tests {
    use super::*;
    use messages::ErrorBody;

    fn text(r: &CallToolResult) -> &str {
        &r.content[0].as_text().expect("text content").text
    }

    #[test]
    fn a_finished_run_shows_its_streams_files_and_id() {
        let r = ExecResult {
            execution_id: "01J".into(),
            status: ExecStatus::Ok,
            exit_code: Some(0),
            stdout: "42\n".into(),
            files_created: vec!["out.txt".into()],
            files_refused: vec![messages::exec::RefusedFile {
                path: "a\nb".into(),
                reason: "control character '\\n' in path".into(),
            }],
            ..Default::default()
        };
        let shown = exec_result(&r);
        assert_eq!(shown.is_error, Some(false));
        let t = text(&shown);
        for part in [
            "status: ok (exit code 0)",
            "stdout:\n42\n",
            "stderr: (empty)",
            "files created: out.txt",
            "file not saved: \"a\\nb\" (control character '\\n' in path)",
            "execution_id: 01J",
        ] {
            assert!(t.contains(part), "{part:?} in {t}");
        }
        assert_eq!(shown.structured_content.unwrap()["stdout"], "42\n");
    }

    #[test]
    fn a_run_that_did_not_end_well_is_a_tool_error_with_its_cause() {
        let r = ExecResult {
            status: ExecStatus::Rejected,
            error: Some(ErrorBody::new(messages::ErrorKind::Denied, "too risky")),
            ..Default::default()
        };
        let shown = exec_result(&r);
        assert_eq!(shown.is_error, Some(true));
        assert!(text(&shown).contains("error: denied: too risky"));
    }

    #[test]
    fn a_parked_run_names_the_confirmation_and_how_it_is_approved() {
        let a = AwaitingConfirmation {
            execution_id: "e1".into(),
            confirmation_id: "c1".into(),
            expires_at: 300_000,
        };
        let shown = awaiting(&a, 1_000);
        assert_eq!(shown.is_error, Some(false));
        let t = text(&shown);
        assert!(t.contains("sandmesh confirm approve c1"), "{t}");
        assert!(t.contains("get_result with execution_id e1"), "{t}");
        assert!(t.contains("expires in 4m 59s"), "{t}");
        let s = shown.structured_content.unwrap();
        assert_eq!(s["state"], "awaiting_confirmation");
        assert_eq!(s["confirmation_id"], "c1");
    }

    #[test]
    fn a_test_report_shows_each_test_and_the_output_only_without_a_report() {
        let failed = TestReport {
            execution_id: "e2".into(),
            status: TestRunStatus::Failed,
            stdout: "pytest said much".into(),
            ..Default::default()
        };
        let t = text(&test_report(&failed)).to_string();
        assert!(t.starts_with("failed: 0 passed"), "{t}");
        assert!(!t.contains("pytest said much"), "{t}");
        let broken = TestReport {
            status: TestRunStatus::Error,
            stderr: format!("{}É the end", "x".repeat(OUTPUT_TAIL_BYTES)),
            ..failed
        };
        let shown = test_report(&broken);
        let t = text(&shown);
        assert!(t.contains("stderr:\n") && t.ends_with("É the end\n"), "{t}");
        assert_eq!(shown.structured_content.unwrap()["status"], "error");
    }

    #[test]
    fn a_browser_action_awaiting_approval_names_the_confirmation_and_how_to_approve() {
        let a = AwaitingConfirmation {
            execution_id: "01A".into(),
            confirmation_id: "01C".into(),
            expires_at: 121_000,
        };
        let shown = awaiting_action(BrowserAction::Fill, &a, 1_000);
        assert_eq!(shown.is_error, Some(false));
        let t = text(&shown);
        for part in [
            "browser fill needs a person's approval",
            "confirmation_id: 01C",
            "sandmesh confirm approve 01C",
            "expires in 2m 0s",
        ] {
            assert!(t.contains(part), "{part:?} in {t}");
        }
        let s = shown.structured_content.unwrap();
        assert_eq!(
            (&s["state"], &s["action"], &s["confirmation_id"]),
            (
                &json!("awaiting_confirmation"),
                &json!("fill"),
                &json!("01C")
            )
        );
    }

    #[test]
    fn a_service_refusal_keeps_its_kind_and_message() {
        let e = ClientError::Service {
            subject: "sandbox.v1.workspace.read".into(),
            body: ErrorBody::new(messages::ErrorKind::NotFound, "no such file: x"),
        };
        let shown = client_error(&e);
        assert_eq!(shown.is_error, Some(true));
        assert_eq!(text(&shown), "not_found: no such file: x");
        assert_eq!(
            shown.structured_content.unwrap()["error"]["kind"],
            "not_found"
        );
    }
}
