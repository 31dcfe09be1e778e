//! [`BrowserError`]: why a browser request was not done, kept as a value with its cause while
//! it travels from the router or the session to the endpoint, where the wire's [`ErrorBody`] is
//! made from it once (`kit::actor_handler`). Each part's own rules keep their own error
//! ([`ActionError`] the page's, [`GateError`] the gate's, [`NavigationRefused`] the URL
//! guard's); this one says which step failed.

use std::time::Duration;

use cdp::CdpError;
use messages::browser::{BrowserAction, BrowserRequestError, BrowserResult};
use messages::quota::OverQuota;
use messages::validate::ValidationError;
use messages::{ErrorBody, ErrorKind};
use ractor::RpcReplyPort;
use sandmesh_client::ClientError;

use crate::chromium::ActionError;
use crate::container::StartError;
use crate::gate::GateError;
use crate::guard::NavigationRefused;

/// Where a request's answer goes.
pub type Reply = RpcReplyPort<Result<BrowserResult, BrowserError>>;

#[derive(Debug, thiserror::Error)]
pub enum BrowserError {
    /// The subject's last token names no action.
    #[error("unknown browser action {token:?}; known: {}", known_actions())]
    UnknownAction { token: String },
    #[error("{0}")]
    SessionId(#[source] ValidationError),
    /// The payload is not a request for its action (a field missing or too large).
    #[error(transparent)]
    Request(#[from] BrowserRequestError),
    #[error(
        "the aio browser backend needs aio-pool, which this mesh does not run yet; send \
         backend \"external\" to use the session's own browser"
    )]
    AioBackend,
    /// This instance runs as many browsers as it may.
    #[error("{max} browser sessions are open on this instance; close one or retry later")]
    TooManyBrowsers { max: usize },
    /// The tenant holds its `browsers` quota.
    #[error(transparent)]
    OverQuota(#[from] OverQuota),
    #[error("cannot start the session's actor: {0}")]
    SessionActor(#[source] ractor::SpawnErr),
    /// The session's actor is stopping (closed, idle): the next request starts a new one.
    #[error("the session's browser is closing; retry")]
    Closing,
    /// Boxed: it is the largest cause, and every answer would carry its size.
    #[error("cannot start a browser: {0}")]
    Start(#[source] Box<StartError>),
    #[error("cannot connect to the browser: {0}")]
    Connect(#[source] CdpError),
    #[error("cannot bind the browser's egress proxy: {}{}", .0, cause_of(.0))]
    EgressBind(#[source] egress::EgressError),
    #[error("egress socket permissions: {0}")]
    EgressPermissions(#[source] std::io::Error),
    #[error("navigation refused: {0}")]
    NavigationRefused(#[source] NavigationRefused),
    /// A redirect landed where the first URL's check never looked.
    #[error("navigation was redirected to {landed}, which is refused: {source}")]
    Redirected {
        landed: String,
        #[source]
        source: NavigationRefused,
    },
    #[error("describing the target timed out")]
    DescribeTimedOut,
    #[error(transparent)]
    Action(#[from] ActionError),
    #[error(transparent)]
    Gate(#[from] GateError),
    #[error("{} took longer than {limit:?}", .action.as_str())]
    ActionTimedOut {
        action: BrowserAction,
        limit: Duration,
    },
    /// The browser was found dead after the action failed (`cause`).
    #[error(
        "the browser died during {}; its page state is lost and the next action starts a new \
         one ({cause})",
        .action.as_str()
    )]
    BrowserDied {
        action: BrowserAction,
        #[source]
        cause: Box<BrowserError>,
    },
    #[error("the script's value is {size} bytes serialized; at most {max}")]
    ValueTooLarge { size: usize, max: usize },
    #[error("screenshot encoding: {0}")]
    ScreenshotEncoding(#[source] base64::DecodeError),
    #[error("cannot store the screenshot in the workspace: {0}")]
    ScreenshotStore(#[source] ClientError),
}

fn known_actions() -> String {
    let known: Vec<_> = BrowserAction::ALL.iter().map(|a| a.as_str()).collect();
    known.join(", ")
}

/// `: <its cause>`, when the error has one.
fn cause_of(e: &dyn std::error::Error) -> String {
    e.source().map(|c| format!(": {c}")).unwrap_or_default()
}

impl BrowserError {
    /// The kind the caller is answered with (and the audit records).
    pub fn kind(&self) -> ErrorKind {
        use BrowserError as E;
        match self {
            E::UnknownAction { .. } => ErrorKind::NotFound,
            E::SessionId(_) => ErrorKind::BadRequest,
            E::Request(BrowserRequestError::Missing { .. }) => ErrorKind::BadRequest,
            E::Request(BrowserRequestError::TooLarge { .. }) | E::ValueTooLarge { .. } => {
                ErrorKind::TooLarge
            }
            E::TooManyBrowsers { .. } | E::OverQuota(_) => ErrorKind::Overloaded,
            E::AioBackend
            | E::Closing
            | E::Start(_)
            | E::Connect(_)
            | E::BrowserDied { .. }
            | E::ScreenshotStore(_) => ErrorKind::Unavailable,
            E::SessionActor(_)
            | E::EgressBind(_)
            | E::EgressPermissions(_)
            | E::ScreenshotEncoding(_) => ErrorKind::Internal,
            E::NavigationRefused(_) | E::Redirected { .. } => ErrorKind::Denied,
            E::DescribeTimedOut | E::ActionTimedOut { .. } => ErrorKind::Timeout,
            E::Action(e) => e.kind(),
            E::Gate(e) => e.kind(),
        }
    }
}

impl From<BrowserError> for ErrorBody {
    /// Its kind and its message; a refusal whose wire form has details keeps them.
    fn from(e: BrowserError) -> Self {
        match e {
            BrowserError::Request(e) => e.into(),
            BrowserError::OverQuota(e) => e.into(),
            BrowserError::Gate(e) => e.into(),
            e @ BrowserError::AioBackend => ErrorBody::new(e.kind(), e.to_string())
                .with_details(serde_json::json!({"backend": "aio"})),
            e => ErrorBody::new(e.kind(), e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use base64::Engine;
    use messages::confirm::ConfirmState;
    use messages::risk::RiskLevel;

    use super::*;

    /// The body an error is answered with: its kind's code, its own message.
    fn answered(e: BrowserError) -> ErrorBody {
        let (kind, message) = (e.kind(), e.to_string());
        let body = ErrorBody::from(e);
        assert_eq!((body.kind, body.code), (kind, kind.code()), "{message}");
        assert_eq!(body.message, message);
        body
    }

    #[test]
    fn every_step_is_answered_with_its_kind() {
        let died = BrowserError::BrowserDied {
            action: BrowserAction::Click,
            cause: Box::new(ActionError::NoElement("#go".into()).into()),
        };
        let not_base64 = base64::engine::general_purpose::STANDARD
            .decode("!")
            .unwrap_err();
        for (e, kind) in [
            (
                BrowserError::UnknownAction {
                    token: "fly".into(),
                },
                ErrorKind::NotFound,
            ),
            (
                BrowserError::SessionId(ValidationError::invalid("session_id", "bad")),
                ErrorKind::BadRequest,
            ),
            (BrowserError::Closing, ErrorKind::Unavailable),
            (
                BrowserError::TooManyBrowsers { max: 4 },
                ErrorKind::Overloaded,
            ),
            (
                BrowserError::EgressPermissions(std::io::Error::other("read-only")),
                ErrorKind::Internal,
            ),
            (BrowserError::DescribeTimedOut, ErrorKind::Timeout),
            (
                BrowserError::ActionTimedOut {
                    action: BrowserAction::Navigate,
                    limit: Duration::from_secs(30),
                },
                ErrorKind::Timeout,
            ),
            (died, ErrorKind::Unavailable),
            (
                BrowserError::ValueTooLarge { size: 2, max: 1 },
                ErrorKind::TooLarge,
            ),
            (
                BrowserError::ScreenshotEncoding(not_base64),
                ErrorKind::Internal,
            ),
            (
                ActionError::NoElement("#go".into()).into(),
                ErrorKind::BadRequest,
            ),
            (
                ActionError::WaitTimeout(Duration::from_secs(1)).into(),
                ErrorKind::Timeout,
            ),
            (
                ActionError::Navigation {
                    url: "https://example.org/".into(),
                    reason: "net::ERR_FAILED".into(),
                }
                .into(),
                ErrorKind::Unavailable,
            ),
        ] {
            assert_eq!(answered(e).kind, kind);
        }
    }

    #[test]
    fn refusals_keep_their_details() {
        let aio = answered(BrowserError::AioBackend);
        assert_eq!(aio.details, Some(serde_json::json!({"backend": "aio"})));
        let refused = answered(
            GateError::Refused {
                action: BrowserAction::Evaluate,
                id: "c1".into(),
                state: ConfirmState::Denied,
                why: "no".into(),
                level: RiskLevel::High,
            }
            .into(),
        );
        assert_eq!(refused.kind, ErrorKind::Denied);
        let details = refused.details.expect("the confirmation is named");
        assert_eq!(details["confirmation_id"], "c1");
        let missing = BrowserRequestError::Missing {
            action: BrowserAction::Navigate,
            field: "url",
        };
        assert_eq!(
            answered(missing.clone().into()),
            ErrorBody::from(missing),
            "a malformed request is answered as the protocol answers it"
        );
    }
}
