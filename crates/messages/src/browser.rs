//! Browser actions (browser-router) and AIO sandbox pool calls (aio-pool).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BrowserAction {
    Navigate,
    Back,
    Click,
    Fill,
    Type,
    PressKey,
    Scroll,
    WaitFor,
    Elements,
    Screenshot,
    Content,
    Evaluate,
    Close,
}

impl BrowserAction {
    pub const ALL: &'static [BrowserAction] = &[
        BrowserAction::Navigate,
        BrowserAction::Back,
        BrowserAction::Click,
        BrowserAction::Fill,
        BrowserAction::Type,
        BrowserAction::PressKey,
        BrowserAction::Scroll,
        BrowserAction::WaitFor,
        BrowserAction::Elements,
        BrowserAction::Screenshot,
        BrowserAction::Content,
        BrowserAction::Evaluate,
        BrowserAction::Close,
    ];

    /// The last token of `sandbox.v1.browser.<action>`.
    pub const fn as_str(self) -> &'static str {
        match self {
            BrowserAction::Navigate => "navigate",
            BrowserAction::Back => "back",
            BrowserAction::Click => "click",
            BrowserAction::Fill => "fill",
            BrowserAction::Type => "type",
            BrowserAction::PressKey => "press_key",
            BrowserAction::Scroll => "scroll",
            BrowserAction::WaitFor => "wait_for",
            BrowserAction::Elements => "elements",
            BrowserAction::Screenshot => "screenshot",
            BrowserAction::Content => "content",
            BrowserAction::Evaluate => "evaluate",
            BrowserAction::Close => "close",
        }
    }

    pub fn parse(token: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|a| a.as_str() == token)
    }
}

/// Which browser serves a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BrowserBackend {
    /// The session's own hardened Chromium container.
    #[default]
    External,
    /// The browser of the session's AIO sandbox (aio-pool).
    Aio,
}

impl BrowserBackend {
    /// Work that needs the session's files or is research goes to the AIO
    /// browser; an explicit `backend` in the request wins.
    pub fn route(req: &BrowserRequest) -> Self {
        match req.backend {
            Some(b) => b,
            None if req.needs_file_access || req.is_research => BrowserBackend::Aio,
            None => BrowserBackend::External,
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            BrowserBackend::External => "external",
            BrowserBackend::Aio => "aio",
        }
    }
}

/// What `content` returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContentFormat {
    /// The page's visible text (`document.body.innerText`).
    #[default]
    Text,
    /// The serialized DOM.
    Html,
}

/// `sandbox.v1.browser.<action>`: one action in a session's browser, with the fields that
/// action needs and no others (the model is mini-redis's `Command`: each variant parses its
/// own fields). On the wire the action is the subject's last token and the body is one flat
/// [`BrowserPayload`]; [`BrowserRequest::parse`] turns the two into a request or says which
/// field is missing or too large.
#[derive(Debug, Clone, PartialEq)]
pub struct BrowserRequest {
    pub session_id: String,
    pub command: BrowserCommand,
    /// Route to the session's AIO browser instead of the external one.
    pub needs_file_access: bool,
    pub is_research: bool,
    /// Overrides the routing above.
    pub backend: Option<BrowserBackend>,
    pub timeout_ms: Option<u64>,
    pub requested_by: Option<String>,
}

/// What an action does, with its own required fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BrowserCommand {
    Navigate {
        url: String,
    },
    Back,
    Click {
        target: Target,
    },
    /// Clears the field, then types `text`.
    Fill {
        target: Target,
        text: String,
    },
    /// Types `text` after what the field holds.
    Type {
        target: Target,
        text: String,
    },
    /// On the focused element. A key name as in the DOM's `KeyboardEvent.key`: `Enter`,
    /// `Tab`, `ArrowDown`, `a`.
    PressKey {
        key: String,
    },
    /// Pixels; `dy` absent: one screen down.
    Scroll {
        dx: i64,
        dy: Option<i64>,
    },
    WaitFor(WaitFor),
    Elements,
    Screenshot {
        full_page: bool,
        /// Also return the screenshot as base64 in the reply (refused above the size cap).
        inline: bool,
    },
    Content {
        format: ContentFormat,
    },
    Evaluate {
        script: String,
    },
    Close,
}

/// The element an action targets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// An index from the last `elements` reply of the current page.
    Index(u32),
    /// A CSS selector (not blank).
    Selector(String),
}

/// What `wait_for` waits for; every wait is bounded by the action's timeout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitFor {
    /// Only time passing.
    Delay { ms: u64 },
    /// `text` on the page (inside `selector`, when given), for at most `within_ms`.
    Text {
        text: String,
        selector: Option<String>,
        within_ms: Option<u64>,
    },
    /// An element matching `selector`, for at most `within_ms`.
    Selector {
        selector: String,
        within_ms: Option<u64>,
    },
}

/// The most a field of a browser request may hold, in bytes.
pub const MAX_URL_BYTES: usize = 8 * 1024;
pub const MAX_SELECTOR_BYTES: usize = 1024;
pub const MAX_TEXT_BYTES: usize = 64 * 1024;
pub const MAX_SCRIPT_BYTES: usize = 64 * 1024;
pub const MAX_KEY_BYTES: usize = 32;

/// Why a payload is not a request for its action.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BrowserRequestError {
    #[error("{} needs {field}", action.as_str())]
    Missing {
        action: BrowserAction,
        field: &'static str,
    },
    #[error("{field} is {size} bytes; at most {limit}")]
    TooLarge {
        field: &'static str,
        size: usize,
        limit: usize,
    },
}

impl From<BrowserRequestError> for crate::ErrorBody {
    fn from(e: BrowserRequestError) -> Self {
        match e {
            BrowserRequestError::Missing { .. } => crate::ErrorBody::bad_request(e.to_string()),
            BrowserRequestError::TooLarge { .. } => crate::ErrorBody::too_large(e.to_string()),
        }
    }
}

impl BrowserRequest {
    /// `command` in `session_id`'s browser, routed by default.
    pub fn new(session_id: impl Into<String>, command: BrowserCommand) -> Self {
        Self {
            session_id: session_id.into(),
            command,
            needs_file_access: false,
            is_research: false,
            backend: None,
            timeout_ms: None,
            requested_by: None,
        }
    }

    /// The request `payload` makes for `action`: the sizes first (a field too large is
    /// refused whatever the action), then the action's own fields (an empty string is a
    /// missing field).
    pub fn parse(
        action: BrowserAction,
        payload: BrowserPayload,
    ) -> Result<Self, BrowserRequestError> {
        payload.check_sizes()?;
        let BrowserPayload {
            session_id,
            url,
            selector,
            index,
            text,
            key,
            script,
            dx,
            dy,
            ms,
            full_page,
            inline,
            format,
            needs_file_access,
            is_research,
            backend,
            timeout_ms,
            requested_by,
        } = payload;
        let need = |value: Option<String>, field| {
            value
                .filter(|v| !v.is_empty())
                .ok_or(BrowserRequestError::Missing { action, field })
        };
        let target = |selector: Option<String>| match (index, selector) {
            (Some(i), _) => Ok(Target::Index(i)),
            (None, Some(s)) if !s.trim().is_empty() => Ok(Target::Selector(s)),
            _ => Err(BrowserRequestError::Missing {
                action,
                field: "index (from elements) or selector",
            }),
        };
        let command = match action {
            BrowserAction::Navigate => BrowserCommand::Navigate {
                url: need(url, "url")?,
            },
            BrowserAction::Back => BrowserCommand::Back,
            BrowserAction::Click => BrowserCommand::Click {
                target: target(selector)?,
            },
            BrowserAction::Fill => BrowserCommand::Fill {
                target: target(selector)?,
                text: need(text, "text")?,
            },
            BrowserAction::Type => BrowserCommand::Type {
                target: target(selector)?,
                text: need(text, "text")?,
            },
            BrowserAction::PressKey => BrowserCommand::PressKey {
                key: need(key, "key")?,
            },
            BrowserAction::Scroll => BrowserCommand::Scroll {
                dx: dx.unwrap_or(0),
                dy,
            },
            BrowserAction::WaitFor => BrowserCommand::WaitFor(match (text, selector, ms) {
                (Some(text), selector, within_ms) => WaitFor::Text {
                    text,
                    selector,
                    within_ms,
                },
                (None, Some(selector), within_ms) => WaitFor::Selector {
                    selector,
                    within_ms,
                },
                (None, None, Some(ms)) => WaitFor::Delay { ms },
                (None, None, None) => {
                    return Err(BrowserRequestError::Missing {
                        action,
                        field: "text, selector or ms",
                    })
                }
            }),
            BrowserAction::Elements => BrowserCommand::Elements,
            BrowserAction::Screenshot => BrowserCommand::Screenshot { full_page, inline },
            BrowserAction::Content => BrowserCommand::Content { format },
            BrowserAction::Evaluate => BrowserCommand::Evaluate {
                script: need(script, "script")?,
            },
            BrowserAction::Close => BrowserCommand::Close,
        };
        Ok(Self {
            session_id,
            command,
            needs_file_access,
            is_research,
            backend,
            timeout_ms,
            requested_by,
        })
    }

    /// The wire body of this request (its action goes in the subject).
    pub fn payload(&self) -> BrowserPayload {
        let mut p = BrowserPayload {
            session_id: self.session_id.clone(),
            needs_file_access: self.needs_file_access,
            is_research: self.is_research,
            backend: self.backend,
            timeout_ms: self.timeout_ms,
            requested_by: self.requested_by.clone(),
            ..Default::default()
        };
        let mut aim = |target: &Target| match target {
            Target::Index(i) => p.index = Some(*i),
            Target::Selector(s) => p.selector = Some(s.clone()),
        };
        match &self.command {
            BrowserCommand::Navigate { url } => p.url = Some(url.clone()),
            BrowserCommand::Back | BrowserCommand::Elements | BrowserCommand::Close => {}
            BrowserCommand::Click { target } => aim(target),
            BrowserCommand::Fill { target, text } | BrowserCommand::Type { target, text } => {
                aim(target);
                p.text = Some(text.clone());
            }
            BrowserCommand::PressKey { key } => p.key = Some(key.clone()),
            BrowserCommand::Scroll { dx, dy } => {
                // Zero is what an absent `dx` means: sent as given only when it moves.
                p.dx = (*dx != 0).then_some(*dx);
                p.dy = *dy;
            }
            BrowserCommand::WaitFor(WaitFor::Delay { ms }) => p.ms = Some(*ms),
            BrowserCommand::WaitFor(WaitFor::Text {
                text,
                selector,
                within_ms,
            }) => {
                p.text = Some(text.clone());
                p.selector = selector.clone();
                p.ms = *within_ms;
            }
            BrowserCommand::WaitFor(WaitFor::Selector {
                selector,
                within_ms,
            }) => {
                p.selector = Some(selector.clone());
                p.ms = *within_ms;
            }
            BrowserCommand::Screenshot { full_page, inline } => {
                (p.full_page, p.inline) = (*full_page, *inline);
            }
            BrowserCommand::Content { format } => p.format = *format,
            BrowserCommand::Evaluate { script } => p.script = Some(script.clone()),
        }
        p
    }
}

impl BrowserCommand {
    /// Its action: the subject's last token.
    pub const fn action(&self) -> BrowserAction {
        match self {
            BrowserCommand::Navigate { .. } => BrowserAction::Navigate,
            BrowserCommand::Back => BrowserAction::Back,
            BrowserCommand::Click { .. } => BrowserAction::Click,
            BrowserCommand::Fill { .. } => BrowserAction::Fill,
            BrowserCommand::Type { .. } => BrowserAction::Type,
            BrowserCommand::PressKey { .. } => BrowserAction::PressKey,
            BrowserCommand::Scroll { .. } => BrowserAction::Scroll,
            BrowserCommand::WaitFor(_) => BrowserAction::WaitFor,
            BrowserCommand::Elements => BrowserAction::Elements,
            BrowserCommand::Screenshot { .. } => BrowserAction::Screenshot,
            BrowserCommand::Content { .. } => BrowserAction::Content,
            BrowserCommand::Evaluate { .. } => BrowserAction::Evaluate,
            BrowserCommand::Close => BrowserAction::Close,
        }
    }
}

impl Target {
    /// The CSS selector of the element: an index is the mark `elements` left on it.
    pub fn selector(&self) -> String {
        match self {
            Target::Index(i) => format!("[data-sandmesh-index=\"{i}\"]"),
            Target::Selector(s) => s.clone(),
        }
    }
}

/// The body of `sandbox.v1.browser.<action>` as it travels: every action's fields in one
/// flat object, all optional (`navigate` url; `click` index | selector; `fill`/`type`
/// (index | selector) + text; `press_key` key; `scroll` dx/dy; `wait_for` text | selector |
/// ms; `screenshot` full_page, inline; `content` format; `evaluate` script). Only
/// [`BrowserRequest::parse`] reads it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BrowserPayload {
    pub session_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dx: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dy: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ms: Option<u64>,
    #[serde(default)]
    pub full_page: bool,
    #[serde(default)]
    pub inline: bool,
    #[serde(default)]
    pub format: ContentFormat,
    #[serde(default)]
    pub needs_file_access: bool,
    #[serde(default)]
    pub is_research: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<BrowserBackend>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
}

impl BrowserPayload {
    fn check_sizes(&self) -> Result<(), BrowserRequestError> {
        let limits: [(&'static str, &Option<String>, usize); 5] = [
            ("url", &self.url, MAX_URL_BYTES),
            ("selector", &self.selector, MAX_SELECTOR_BYTES),
            ("text", &self.text, MAX_TEXT_BYTES),
            ("script", &self.script, MAX_SCRIPT_BYTES),
            ("key", &self.key, MAX_KEY_BYTES),
        ];
        for (field, value, limit) in limits {
            match value {
                Some(v) if v.len() > limit => {
                    return Err(BrowserRequestError::TooLarge {
                        field,
                        size: v.len(),
                        limit,
                    })
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// One interactive element of the page, as `elements` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct BrowserElement {
    /// Valid for the page it was listed on, until the next navigation.
    pub index: u32,
    pub tag: String,
    /// ARIA role, explicit or implied by the tag (`link`, `button`, `textbox`, ...).
    pub role: String,
    /// Accessible name: label, aria-label, text, placeholder, title or name attribute.
    #[serde(default)]
    pub name: String,
    /// `type` of an input (`password`, `email`, `submit`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_type: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct BrowserResult {
    pub ok: bool,
    /// The page's URL and title after the action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub elements: Vec<BrowserElement>,
    /// Workspace path of a screenshot (under `artifacts/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub screenshot_path: Option<String>,
    /// The PNG itself, base64, when `inline` was asked and it is under the cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub screenshot_base64: Option<String>,
    #[serde(default)]
    pub backend: BrowserBackend,
    /// The session's previous browser died (crash, killed container): this action ran on a
    /// new one, and cookies, history and open pages were lost.
    #[serde(default)]
    pub state_lost: bool,
    /// The risk assessor's level for this action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub risk_level: Option<crate::risk::RiskLevel>,
    /// Set when the action needed a person's decision: its final state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmation: Option<crate::confirm::ConfirmState>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmation_id: Option<String>,
}

/// `sandbox.v1.aio.acquire`: bind an AIO instance to a session (idempotent per session).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AioAcquire {
    pub session_id: String,
    /// Also start the instance's browser and return its CDP URL in the lease.
    #[serde(default)]
    pub browser: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AioLease {
    pub session_id: String,
    pub instance_id: String,
    /// Base URL of the instance's HTTP API: `http+unix://` and the percent-encoded host path
    /// of its control socket (instances have no network).
    pub base_url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cdp_url: Option<String>,
}

/// `sandbox.v1.aio.release`: destroys the session's instance (it never passes to another
/// session).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AioRelease {
    pub session_id: String,
    /// When given, must be the session's instance (a release naming another is refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
}

/// `sandbox.v1.aio.release` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AioReleased {
    pub session_id: String,
    pub instance_id: String,
}

/// `sandbox.v1.aio.exec`: run a shell command in the session's AIO instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AioExec {
    pub session_id: String,
    pub command: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// When given, must be the session's instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
}

/// `sandbox.v1.aio.exec` answer.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct AioExecResult {
    pub session_id: String,
    pub instance_id: String,
    /// `ok` (exit 0), `error` (non-zero exit), `timeout`.
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub exec_ms: u64,
    /// The instance reached `max_use_count` with this execution and was retired; the
    /// session's next acquire gets a fresh one.
    #[serde(default)]
    pub retired: bool,
}

/// `sandbox.v1.aio.stats` request (`{}`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AioStatsRequest {}

/// `sandbox.v1.aio.stats` answer (also in the heartbeat's metrics).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct AioStats {
    pub total: u32,
    pub warm: u32,
    pub bound: u32,
    pub max: u32,
    #[serde(default)]
    pub creating: u32,
    #[serde(default)]
    pub retiring: u32,
    /// Acquires waiting for capacity.
    #[serde(default)]
    pub waiting: u32,
    #[serde(default)]
    pub min: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(action: BrowserAction, json: &str) -> Result<BrowserRequest, BrowserRequestError> {
        BrowserRequest::parse(action, serde_json::from_str(json).unwrap())
    }

    fn missing(action: BrowserAction, json: &str) -> &'static str {
        match parse(action, json) {
            Err(BrowserRequestError::Missing { action: a, field }) if a == action => field,
            other => panic!("{action:?} {json}: {other:?}"),
        }
    }

    #[test]
    fn each_action_names_the_field_it_misses() {
        use BrowserAction as A;
        assert_eq!(missing(A::Navigate, r#"{"session_id":"s"}"#), "url");
        assert_eq!(
            missing(A::Navigate, r#"{"session_id":"s","url":""}"#),
            "url"
        );
        let target = "index (from elements) or selector";
        assert_eq!(missing(A::Click, r#"{"session_id":"s"}"#), target);
        assert_eq!(
            missing(A::Click, r#"{"session_id":"s","selector":"  "}"#),
            target
        );
        assert_eq!(missing(A::Fill, r#"{"session_id":"s","text":"x"}"#), target);
        assert_eq!(missing(A::Fill, r#"{"session_id":"s","index":1}"#), "text");
        assert_eq!(
            missing(A::Type, r##"{"session_id":"s","selector":"#q"}"##),
            "text"
        );
        assert_eq!(missing(A::PressKey, r#"{"session_id":"s"}"#), "key");
        assert_eq!(
            missing(A::Evaluate, r#"{"session_id":"s","url":"x"}"#),
            "script"
        );
        assert_eq!(
            missing(A::WaitFor, r#"{"session_id":"s"}"#),
            "text, selector or ms"
        );
        // The message a client sees, as before the types: "<action> needs <field>".
        let e = parse(A::Navigate, r#"{"session_id":"s"}"#).unwrap_err();
        assert_eq!(crate::ErrorBody::from(e.clone()).code, 400);
        assert_eq!(e.to_string(), "navigate needs url");
    }

    #[test]
    fn actions_without_fields_take_any_payload_and_fields_of_others_are_ignored() {
        for action in [
            BrowserAction::Back,
            BrowserAction::Elements,
            BrowserAction::Close,
            BrowserAction::Scroll,
            BrowserAction::Screenshot,
            BrowserAction::Content,
        ] {
            let r = parse(action, r#"{"session_id":"s","script":"x"}"#).unwrap();
            assert_eq!(r.command.action(), action);
            assert_eq!(r.payload().script, None, "{action:?} keeps no script");
        }
        let click = parse(
            BrowserAction::Click,
            r##"{"session_id":"s","index":4,"selector":"#a"}"##,
        );
        assert_eq!(
            click.unwrap().command,
            BrowserCommand::Click {
                target: Target::Index(4)
            },
            "an index wins over a selector"
        );
    }

    #[test]
    fn an_oversized_field_is_too_large_whatever_the_action() {
        let long = "k".repeat(MAX_KEY_BYTES + 1);
        let json = format!(r#"{{"session_id":"s","key":"{long}"}}"#);
        for action in [BrowserAction::PressKey, BrowserAction::Back] {
            let e = parse(action, &json).unwrap_err();
            assert!(
                matches!(e, BrowserRequestError::TooLarge { field: "key", .. }),
                "{e:?}"
            );
            assert_eq!(crate::ErrorBody::from(e).code, 413);
        }
        let url = format!("https://example.org/{}", "a".repeat(MAX_URL_BYTES));
        let payload = BrowserPayload {
            url: Some(url),
            ..Default::default()
        };
        assert!(matches!(
            BrowserRequest::parse(BrowserAction::Navigate, payload),
            Err(BrowserRequestError::TooLarge { field: "url", .. })
        ));
    }

    #[test]
    fn a_request_survives_its_wire_form() {
        let requests = [
            BrowserCommand::Scroll { dx: 0, dy: None },
            BrowserCommand::WaitFor(WaitFor::Selector {
                selector: "#x".into(),
                within_ms: Some(5),
            }),
            BrowserCommand::Fill {
                target: Target::Selector("input".into()),
                text: "hi".into(),
            },
        ];
        for command in requests {
            let req = BrowserRequest {
                requested_by: Some("cli".into()),
                ..BrowserRequest::new("s1", command)
            };
            let bytes = crate::Encoding::MsgPack.encode(&req.payload()).unwrap();
            let payload = crate::Encoding::MsgPack.decode(&bytes).unwrap();
            assert_eq!(
                BrowserRequest::parse(req.command.action(), payload).unwrap(),
                req
            );
        }
    }
}
