//! What every handler of the console shares: the [`App`] state, the login a request's cookie
//! names, the pending list both the page and its event stream start from, and the plain
//! refusal.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use messages::confirm::{ConfirmList, ConfirmState, Confirmation};
use tokio_util::sync::CancellationToken;

use crate::history::History;
use crate::logins::{Login, Logins, Token};

/// The login cookie.
pub const COOKIE: &str = "sandmesh_console";
/// The confirmation service lists at most this many.
const MAX_LISTED: u32 = 1000;

/// What every handler shares.
pub struct App {
    pub logins: Logins,
    pub history: History,
    /// `Host` values a loopback console answers to; `None`: any (bound to a public address).
    pub hosts: Option<Vec<String>>,
    /// Origins allowed to post besides `http://<Host>`.
    pub extra_origins: Vec<String>,
    pub session_ttl: Duration,
    /// Ends the event streams when the console stops (graceful shutdown waits for them).
    pub shutdown: CancellationToken,
}

impl App {
    /// The `Host` names a console bound to `addr` answers to.
    pub fn hosts_for(addr: SocketAddr, extra_origins: &[String]) -> Option<Vec<String>> {
        if !addr.ip().is_loopback() {
            return None;
        }
        let port = addr.port();
        let mut hosts = vec![
            format!("127.0.0.1:{port}"),
            format!("localhost:{port}"),
            format!("[::1]:{port}"),
        ];
        hosts.extend(
            extra_origins
                .iter()
                .filter_map(|o| o.split_once("://").map(|(_, h)| h.to_string())),
        );
        Some(hosts)
    }

    pub(crate) async fn login_of(&self, headers: &HeaderMap) -> Option<(Token, Arc<Login>)> {
        let token = cookie_token(headers)?;
        let login = self.logins.find(&token).await?;
        Some((token, login))
    }
}

pub fn refuse(status: StatusCode, why: &'static str) -> Response {
    (status, why).into_response()
}

fn cookie_token(headers: &HeaderMap) -> Option<Token> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .and_then(|(_, value)| Token::parse(value))
}

/// The pending confirmations this operator may see, oldest first: a stream's first events,
/// each put on top of the page, leave the newest on top.
pub async fn pending(login: &Login) -> Result<Vec<Confirmation>, sandmesh_client::ClientError> {
    let filter = ConfirmList {
        state: Some(ConfirmState::Pending),
        limit: Some(MAX_LISTED),
        ..Default::default()
    };
    let mut list = login.mesh.confirm().list(&filter).await?;
    list.sort_by_key(|c| c.created_at);
    Ok(list)
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    #[test]
    fn the_cookie_is_found_among_others() {
        let t = Token::generate();
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_str(&format!("a=b; {COOKIE}={}; c=d", t.to_hex())).unwrap(),
        );
        assert_eq!(cookie_token(&h), Some(t));
        let mut bad = HeaderMap::new();
        bad.insert(
            header::COOKIE,
            HeaderValue::from_static("sandmesh_console=zz"),
        );
        assert_eq!(cookie_token(&bad), None);
    }

    #[test]
    fn loopback_consoles_answer_to_loopback_names_only() {
        let hosts = App::hosts_for("127.0.0.1:4280".parse().unwrap(), &[]).unwrap();
        assert!(hosts.contains(&"localhost:4280".to_string()));
        assert!(!hosts.iter().any(|h| h.contains("evil")));
        assert_eq!(App::hosts_for("0.0.0.0:4280".parse().unwrap(), &[]), None);
    }
}
