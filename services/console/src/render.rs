//! HTML, rendered on the server. Everything shown comes from agents or people — code, reasons,
//! names, ids — so every value goes through [`esc`] (or [`Html::text`]); markup is only ever
//! written here, as literals. The page carries no inline script or style: the
//! Content-Security-Policy allows `'self'` only, a second wall should an escape be missed.

use std::fmt::Write as _;

use crate::escape::esc;
use crate::history::Row;
use messages::audit::{AuditDetails, ExecutionRejected};
use messages::confirm::{ConfirmKind, ConfirmScope, ConfirmState, Confirmation};
use messages::exec::Tier;
use messages::risk::{Finding, RiskLevel};
use messages::tenancy::scoped;

/// `2026-11-26 14:05:39 UTC` for Unix milliseconds.
pub fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil-from-days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// The page around `body`: header with who is logged in, navigation, and the script.
pub fn page(title: &str, user: Option<&str>, csrf: Option<&str>, body: &str) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{} · sandmesh console</title>\
         <link rel=\"stylesheet\" href=\"/static/console.css\">\
         <script src=\"/static/console.js\" defer></script></head><body>\
         <header class=\"top\"><span class=\"brand\">sandmesh console</span>",
        esc(title)
    );
    if let (Some(user), Some(csrf)) = (user, csrf) {
        let _ = write!(
            out,
            "<nav><a href=\"/\">Pending</a> <a href=\"/activity\">Activity</a></nav>\
             <span id=\"live\" class=\"live\">connecting…</span>\
             <form method=\"post\" action=\"/logout\" class=\"logout\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{}\">\
             <span class=\"who\">{}</span> <button>Log out</button></form>",
            esc(csrf),
            esc(user)
        );
    }
    let _ = write!(out, "</header><main>{body}</main></body></html>");
    out
}

pub fn login_form(error: Option<&str>) -> String {
    let mut body = String::from("<section class=\"login\"><h1>Operator login</h1>");
    if let Some(e) = error {
        let _ = write!(body, "<p class=\"error\" role=\"alert\">{}</p>", esc(e));
    }
    body.push_str(
        "<form method=\"post\" action=\"/login\">\
         <label>User <input name=\"user\" autocomplete=\"username\" required maxlength=\"64\"></label>\
         <label>Password <input name=\"password\" type=\"password\" autocomplete=\"current-password\" \
         required maxlength=\"256\"></label><button>Log in</button></form>\
         <p class=\"hint\">Your NATS operator credentials: <code>sandmesh creds --as operator</code>, \
         or <code>.sandmesh/creds/operator.json</code> of <code>sandmesh up</code>.</p></section>",
    );
    page("Log in", None, None, &body)
}

/// The pending queue (newest first) and the last decisions, as first served (the script keeps
/// them live).
pub fn pending_page(
    user: &str,
    csrf: &str,
    pending: &[Confirmation],
    decided: &[Confirmation],
) -> String {
    let mut body = String::new();
    let _ = write!(
        body,
        "<h1>Waiting for a decision <span id=\"count\" class=\"count\">{}</span></h1>\
         <div id=\"pending\" class=\"cards\">",
        pending.len()
    );
    for c in pending {
        body.push_str(&card(c, csrf));
    }
    body.push_str(
        "</div><p id=\"empty\" class=\"empty\">Nothing waits for a decision.</p>\
         <h2>Decided here and elsewhere</h2><div id=\"decided\" class=\"cards\">",
    );
    for c in decided {
        body.push_str(&card(c, csrf));
    }
    body.push_str("</div>");
    page("Pending", Some(user), Some(csrf), &body)
}

/// One confirmation as a card: pending ones carry the decision forms, decided ones say who,
/// when and how.
pub fn card(c: &Confirmation, csrf: &str) -> String {
    let id = esc(&c.id);
    let level = c.risk.level.as_str();
    let state = state_name(c.state);
    let mut out = String::new();
    let _ = write!(
        out,
        "<article class=\"card {state} level-{level}\" id=\"c-{id}\" data-id=\"{id}\" \
         data-state=\"{state}\" data-expires=\"{}\"><header><span class=\"level\">{level}</span>\
         <h3 class=\"summary\">{}</h3>",
        c.expires_at,
        esc(&c.summary)
    );
    if c.state == ConfirmState::Pending {
        out.push_str("<span class=\"left\"></span>");
    }
    out.push_str("</header><dl class=\"meta\">");
    let tenant = c.tenant.as_ref().map(|t| t.as_str().to_string());
    // Confirmations name the session as the agent did; its audit tail is kept under the
    // stored, tenant-scoped id.
    let session_link = c.session_id.as_ref().map(|s| {
        let stored = match &c.tenant {
            Some(t) => scoped(t, s),
            None => s.clone(),
        };
        format!(
            "<a href=\"/activity?session={}\">{}</a>",
            esc(&url_component(&stored)),
            esc(s)
        )
    });
    let rows: [(&str, Option<String>); 6] = [
        ("tenant", tenant.as_deref().map(esc)),
        ("session", session_link),
        ("execution", c.execution_id.as_deref().map(esc)),
        ("requested by", c.requested_by.as_deref().map(esc)),
        ("asked", Some(esc(&utc(c.created_at)))),
        ("confirmation", Some(id.clone())),
    ];
    for (name, value) in rows {
        let _ = write!(
            out,
            "<dt>{name}</dt><dd>{}</dd>",
            value.unwrap_or_else(|| "—".into())
        );
    }
    out.push_str("</dl>");
    // The scheduler's summary already carries the reason; others may not.
    if !c.risk.reason.is_empty() && !c.summary.contains(&c.risk.reason) {
        let _ = write!(out, "<p class=\"reason\">{}</p>", esc(&c.risk.reason));
    }
    out.push_str(&subject(c));
    out.push_str(&files(c));
    if !c.risk.findings.is_empty() {
        out.push_str("<ul class=\"findings\">");
        for f in &c.risk.findings {
            let line = f.line.map(|l| format!(", line {l}")).unwrap_or_default();
            let line = match &f.path {
                Some(path) => format!(" in {}{line}", esc(path)),
                None => line,
            };
            let _ = write!(
                out,
                "<li><code class=\"rule\">{}</code> <span class=\"sev\">{}{line}</span> {}</li>",
                esc(&f.rule),
                f.severity.as_str(),
                esc(&f.description)
            );
        }
        out.push_str("</ul>");
    }
    if c.state == ConfirmState::Pending {
        let csrf = esc(csrf);
        let _ = write!(
            out,
            "<div class=\"actions\"><form method=\"post\" action=\"/decide\" class=\"approve\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
             <input type=\"hidden\" name=\"id\" value=\"{id}\">\
             <button name=\"action\" value=\"approve\" class=\"ok\">Approve once</button>\
             <button name=\"action\" value=\"approve_session\" class=\"ok\">Approve for this session</button>\
             </form><form method=\"post\" action=\"/decide\" class=\"deny\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
             <input type=\"hidden\" name=\"id\" value=\"{id}\">\
             <input type=\"hidden\" name=\"action\" value=\"deny\">\
             <input name=\"reason\" required maxlength=\"{MAX_REASON}\" \
             placeholder=\"reason (sent back to the agent)\" aria-label=\"reason for denying\">\
             <button class=\"no\">Deny</button></form>\
             <p class=\"card-error error\" role=\"alert\" hidden></p></div>"
        );
    } else {
        let how = match (c.state, c.scope) {
            (ConfirmState::Approved, ConfirmScope::Session) => "Approved for this session",
            (ConfirmState::Approved, ConfirmScope::Once) => "Approved once",
            (ConfirmState::Denied, _) => "Denied",
            (ConfirmState::Timeout, _) => "Timed out",
            (ConfirmState::Pending, _) => "Pending",
        };
        let _ = write!(out, "<p class=\"verdict\"><b>{how}</b>");
        if let Some(by) = &c.by {
            let _ = write!(out, " by <span class=\"by\">{}</span>", esc(by));
        }
        if let Some(at) = c.decided_at {
            let _ = write!(out, " at {}", esc(&utc(at)));
        }
        if let Some(reason) = &c.reason {
            let _ = write!(out, ": <q class=\"why\">{}</q>", esc(reason));
        }
        out.push_str("</p>");
    }
    out.push_str("</article>");
    out
}

/// The longest reason a person may give (the agent reads it in its result).
pub const MAX_REASON: usize = 1000;

fn state_name(state: ConfirmState) -> &'static str {
    match state {
        ConfirmState::Pending => "pending",
        ConfirmState::Approved => "approved",
        ConfirmState::Denied => "denied",
        ConfirmState::Timeout => "timeout",
    }
}

/// What is asked: a browser action (its URL and element) or code with its risky spans marked.
fn subject(c: &Confirmation) -> String {
    if let Some(action) = browser_action(c) {
        return action;
    }
    format!(
        "<pre class=\"code\"><code>{}</code></pre>",
        crate::highlight::highlight(&c.code_excerpt, &findings_in(c, None))
    )
}

/// The findings in the code (`None`) or in one of its files.
fn findings_in(c: &Confirmation, path: Option<&str>) -> Vec<Finding> {
    let found = c.risk.findings.iter();
    found
        .filter(|f| f.path.as_deref() == path)
        .cloned()
        .collect()
}

/// The files sent with the code, which it may run: each with its size and digest, and its
/// text with the risky spans marked, so what is approved is what the person saw.
fn files(c: &Confirmation) -> String {
    let mut out = String::new();
    for file in &c.files {
        let _ = write!(
            out,
            "<section class=\"file\"><h4><code class=\"path\">{}</code> \
             <span class=\"size\">{} bytes</span> <span class=\"sha256\">sha256 {}</span></h4>",
            esc(&file.path),
            file.bytes,
            esc(&file.sha256)
        );
        if file.excerpt.is_empty() {
            out.push_str("<p class=\"binary\">not text: only its digest is shown</p>");
        } else {
            let marked =
                crate::highlight::highlight(&file.excerpt, &findings_in(c, Some(&file.path)));
            let _ = write!(out, "<pre class=\"code\"><code>{marked}</code></pre>");
        }
        out.push_str("</section>");
    }
    out
}

/// A browser action (its parameters as JSON: `url`, `selector`, `index`, `text`, `page`, …)
/// is shown as the action, with its URL and element.
fn browser_action(c: &Confirmation) -> Option<String> {
    if c.kind != ConfirmKind::BrowserAction {
        return None;
    }
    let params: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&c.code_excerpt).ok()?;
    let mut out = String::from("<dl class=\"browser\">");
    for (key, value) in &params {
        let shown = match value {
            serde_json::Value::Null => continue,
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let class = match key.as_str() {
            "url" => " class=\"url\"",
            "selector" | "index" => " class=\"element\"",
            _ => "",
        };
        let _ = write!(out, "<dt>{}</dt><dd{class}>{}</dd>", esc(key), esc(&shown));
    }
    out.push_str("</dl>");
    Some(out)
}

/// The status, tier and level columns as an event's own details fill them, for an event that
/// is not its execution's (a placement, a session's, a browser action's, …).
#[derive(Default)]
struct OwnColumns {
    status: String,
    tier: String,
    level: String,
}

impl OwnColumns {
    fn of(details: &AuditDetails) -> Self {
        let tier = |tier: Tier| Self {
            tier: tier.as_str().to_string(),
            ..Self::default()
        };
        let level = |level: RiskLevel| Self {
            level: level.as_str().to_string(),
            ..Self::default()
        };
        match details {
            AuditDetails::ExecutionPlaced(d) => tier(d.tier),
            AuditDetails::ExecutionStarted(d) => tier(d.tier),
            AuditDetails::SessionOpened(d) => tier(d.tier),
            AuditDetails::ConfirmationRequested(d) => level(d.level),
            AuditDetails::BrowserAssessed(d) => level(d.level),
            AuditDetails::ExecutionRejected(ExecutionRejected::Risk { level: l, .. }) => level(*l),
            // A shape no type reads (stored by another version): its common keys as stored.
            AuditDetails::Untyped(u) => {
                let stored = |key: &str| match u.details().get(key) {
                    Some(serde_json::Value::String(s)) => s.clone(),
                    Some(other) => other.to_string(),
                    None => String::new(),
                };
                Self {
                    status: stored("status"),
                    tier: stored("tier"),
                    level: stored("level"),
                }
            }
            _ => Self::default(),
        }
    }
}

/// An audit event as a table row: its execution's facts from their typed details, or else
/// what its own details say.
pub fn audit_row(row: &Row) -> String {
    let (e, facts) = (&row.event, &row.facts);
    let own = OwnColumns::of(&e.details);
    let typed = facts.is_known();
    let session = e
        .session_id
        .as_ref()
        .map(|s| {
            format!(
                "<a href=\"/activity?session={}\">{}</a>",
                esc(&url_component(s)),
                esc(s)
            )
        })
        .unwrap_or_default();
    let what = facts
        .received
        .as_ref()
        .map(|r| format!("{} ({} bytes)", r.language.as_str(), r.code_bytes))
        .unwrap_or_default();
    let status = match &facts.finished {
        Some(f) => f.status.as_str().to_string(),
        None if typed => String::new(),
        None => own.status,
    };
    let tier = match (&facts.finished, &facts.assessed) {
        (Some(f), _) => f.tier.as_str().to_string(),
        (None, Some(a)) => a.tier.as_str().to_string(),
        (None, None) if typed => String::new(),
        (None, None) => own.tier,
    };
    let level = match &facts.assessed {
        Some(a) => a.level.as_str().to_string(),
        None if typed => String::new(),
        None => own.level,
    };
    let timing = facts
        .finished
        .as_ref()
        .map(|f| format!("{} ms", f.timing.total_ms))
        .unwrap_or_default();
    format!(
        "<tr class=\"kind-{kind}\"><td>{}</td><td>{kind}</td><td>{}</td><td>{session}</td>\
         <td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
        esc(&utc(e.time)),
        esc(e.tenant.as_ref().map_or("", |t| t.as_str())),
        esc(e.execution_id.as_deref().unwrap_or("")),
        esc(&what),
        esc(&status),
        esc(&tier),
        esc(&level),
        esc(&timing),
        esc(e.user.as_deref().or(e.actor.as_deref()).unwrap_or("")),
        kind = e.kind().as_str(),
    )
}

/// The activity view: recent executions, or one session's audit tail.
pub fn activity_page(user: &str, csrf: &str, session: Option<&str>, events: &[Row]) -> String {
    let mut body = String::new();
    match session {
        Some(s) => {
            let _ = write!(
                body,
                "<h1>Session <code>{}</code></h1><p><a href=\"/activity\">all recent executions</a></p>",
                esc(s)
            );
        }
        None => body.push_str("<h1>Recent executions</h1>"),
    }
    let _ = write!(
        body,
        "<form method=\"get\" action=\"/activity\" class=\"find\"><input name=\"session\" \
         placeholder=\"session id\" value=\"{}\" aria-label=\"session id\"><button>Show session</button></form>",
        esc(session.unwrap_or(""))
    );
    if events.is_empty() {
        body.push_str("<p class=\"empty\">No events.</p>");
    } else {
        body.push_str(
            "<table class=\"audit\"><thead><tr><th>time</th><th>event</th><th>tenant</th>\
             <th>session</th><th>execution</th><th>what</th><th>status</th><th>tier</th><th>risk</th>\
             <th>took</th><th>who</th></tr></thead><tbody>",
        );
        for e in events {
            body.push_str(&audit_row(e));
        }
        body.push_str("</tbody></table>");
    }
    page("Activity", Some(user), Some(csrf), &body)
}

/// Percent-encodes everything but unreserved characters, for a query value.
pub fn url_component(text: &str) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use messages::risk::{RiskAssessment, RiskLevel};

    #[test]
    fn markup_in_values_is_inert() {
        assert_eq!(
            esc("<script>alert('x')</script>&\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;"
        );
        let c = Confirmation {
            id: "c1".into(),
            summary: "<img src=x onerror=alert(1)>".into(),
            code_excerpt: "</code><script>alert(1)</script>".into(),
            requested_by: Some("\"><script>".into()),
            reason: Some("<script>".into()),
            state: ConfirmState::Denied,
            ..Default::default()
        };
        let html = card(&c, "t\"oken");
        assert!(!html.contains("<script"), "{html}");
        assert!(!html.contains("<img"), "{html}");
    }

    #[test]
    fn files_are_shown_with_their_digest_and_marked_findings() {
        let finding = |path: Option<&str>, start, end| Finding {
            rule: "py.os_system".into(),
            severity: RiskLevel::Critical,
            description: "os.system() runs a shell command".into(),
            path: path.map(str::to_string),
            line: Some(1),
            start: Some(start),
            end: Some(end),
        };
        let c = Confirmation {
            code_excerpt: "import x".into(),
            files: vec![
                messages::confirm::ConfirmFile {
                    path: "code/x.py".into(),
                    bytes: 24,
                    sha256: "ab".repeat(32),
                    excerpt: "<b>\nos.system('id')".into(),
                },
                messages::confirm::ConfirmFile {
                    path: "bin/tool".into(),
                    bytes: 8,
                    sha256: "cd".repeat(32),
                    excerpt: String::new(),
                },
            ],
            risk: RiskAssessment {
                level: RiskLevel::Critical,
                findings: vec![finding(Some("code/x.py"), 4, 19)],
                ..Default::default()
            },
            ..Default::default()
        };
        let html = card(&c, "t");
        assert!(
            html.contains("<code class=\"path\">code/x.py</code>"),
            "{html}"
        );
        assert!(
            html.contains(&format!("sha256 {}", "ab".repeat(32))),
            "{html}"
        );
        assert!(html.contains("&lt;b&gt;"), "file text is escaped: {html}");
        assert!(html.contains(">os.system(&#39;id&#39;)</mark>"), "{html}");
        // The code itself has no finding: its span is not marked there.
        assert!(html.contains("<code>import x</code>"), "{html}");
        assert!(
            html.contains("not text: only its digest is shown"),
            "{html}"
        );
        assert!(html.contains(" in code/x.py, line 1"), "{html}");
    }

    #[test]
    fn browser_actions_show_url_and_element() {
        let c = Confirmation {
            summary: "browser fill in session s1".into(),
            kind: ConfirmKind::BrowserAction,
            code_excerpt:
                r##"{"url": "https://pay.example/<x>", "selector": "#card", "text": null}"##.into(),
            risk: RiskAssessment {
                level: RiskLevel::High,
                ..Default::default()
            },
            ..Default::default()
        };
        let html = card(&c, "t");
        assert!(html.contains("<dd class=\"url\">https://pay.example/&lt;x&gt;</dd>"));
        assert!(html.contains("<dd class=\"element\">#card</dd>"));
        assert!(!html.contains("null"), "{html}");
        // Code whose summary reads like a browser action is still shown as code.
        let code = Confirmation {
            kind: ConfirmKind::Code,
            ..c
        };
        assert!(card(&code, "t").contains("<pre class=\"code\">"));
    }

    #[test]
    fn times_are_utc() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(1_795_701_939_000), "2026-11-26 14:05:39 UTC");
    }

    use messages::audit::{AuditEvent, AuditKind, ExecutionFinished, ExecutionPlaced};
    use messages::exec::{ExecStatus, Timing};
    use serde_json::json;

    /// An event of details as stored, read as the console reads them.
    fn event(kind: AuditKind, details: serde_json::Value) -> AuditEvent {
        AuditEvent::example(AuditDetails::decode(kind, details))
    }

    #[test]
    fn an_execution_row_reads_typed_details() {
        let finished = AuditEvent::example(ExecutionFinished {
            status: ExecStatus::Timeout,
            exit_code: None,
            tier: Tier::Session,
            node: Some("a".into()),
            timing: Timing {
                total_ms: 1234,
                ..Timing::default()
            },
        });
        let row = Row::of(finished);
        assert!(row.facts.finished.is_some(), "{row:?}");
        let html = audit_row(&row);
        assert!(html.contains("<td>timeout</td><td>session</td>"), "{html}");
        assert!(html.contains("<td>1234 ms</td>"), "{html}");
    }

    #[test]
    fn an_event_outside_an_execution_fills_its_columns_from_its_own_details() {
        let placed = AuditEvent::example(ExecutionPlaced {
            tier: Tier::Ephemeral,
            node: Some("a".into()),
            reason: "least loaded".into(),
            strategy: "least_loaded".into(),
            session_restored: false,
        });
        let rejected = AuditEvent::example(ExecutionRejected::Risk {
            level: RiskLevel::Critical,
            reason: "deletes the root".into(),
        });
        for (e, shown) in [
            (placed, "<td></td><td>ephemeral</td><td></td>"),
            (rejected, "<td></td><td></td><td>critical</td>"),
        ] {
            let html = audit_row(&Row::of(e));
            assert!(html.contains(shown), "{html}");
        }
    }

    #[test]
    fn an_event_no_type_reads_is_still_listed_from_its_stored_details() {
        for (kind, details, shown) in [
            // A browser action's end of no shape a type reads, an older shape of an
            // execution's start, a placement without its reason, details that are not an
            // object.
            (
                AuditKind::Finished,
                json!({"action": "click", "ok": false, "status": "x<y"}),
                "<td>x&lt;y</td>",
            ),
            (
                AuditKind::RequestReceived,
                json!({"language": "python"}),
                "<td>request_received</td>",
            ),
            (
                AuditKind::Placed,
                json!({"node": "a", "tier": "session"}),
                "<td>session</td>",
            ),
            (
                AuditKind::RiskAssessed,
                json!([1, 2]),
                "<td>risk_assessed</td>",
            ),
        ] {
            let row = Row::of(event(kind, details));
            assert_eq!(row.facts, Default::default(), "{kind:?}");
            let html = audit_row(&row);
            assert!(html.contains(shown), "{kind:?}: {html}");
        }
    }
}
