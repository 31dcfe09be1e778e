//! Logged-in operators. NATS does the authentication: a login is a NATS connection opened with
//! the user's own operator credentials, kept for as long as the login lasts, so every decision
//! sent over it reaches the confirmation service stamped (`Nats-Request-Info`) as that
//! operator, and its feed carries only what that operator's account imports and its
//! permissions allow. The console keeps no password store of its own.
//!
//! The browser holds a [`Token`] (256 random bits, an `HttpOnly`, `SameSite=Strict` cookie).
//! The server keys logins by the token's SHA-256, derives the CSRF token from it, and — when a
//! state directory is configured — writes each login to a file so that a restarted console
//! picks its operators' pages up again: the password in that file is sealed with a key derived
//! from the token, which only the browser has, so the file alone logs nobody in.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use messages::audit::AuditEvent;
use messages::confirm::Confirmation;
use messages::{Encoding, Subjects};
use sandmesh_auth::Scope;
use sandmesh_client::MeshClient;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::broadcast;

use crate::config::Operators;

/// How long connecting as the operator may take before a login fails.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one request over an operator's connection may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Events a slow page may fall behind before it is told to resynchronise.
const FEED_BACKLOG: usize = 4096;

/// The browser's secret: 32 random bytes, hex in the cookie.
#[derive(Clone, PartialEq, Eq)]
pub struct Token([u8; 32]);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(…)")
    }
}

impl Token {
    pub fn generate() -> Self {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).expect("the OS random number generator");
        Self(bytes)
    }

    /// A token as the cookie carries it; anything else is no token.
    pub fn parse(hex_text: &str) -> Option<Self> {
        let bytes = hex::decode(hex_text).ok()?;
        Some(Self(bytes.try_into().ok()?))
    }

    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    fn derive(&self, purpose: &[u8]) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(purpose);
        h.update(self.0);
        h.finalize().into()
    }

    /// The server's name for the login (never the token itself, so neither memory nor the
    /// state file holds what a browser presents).
    fn key(&self) -> String {
        hex::encode(self.derive(b"sandmesh-console login key\0"))
    }

    /// The login's CSRF token: unguessable without the cookie, which another site cannot read.
    pub fn csrf(&self) -> String {
        hex::encode(self.derive(b"sandmesh-console csrf\0"))
    }

    /// XOR with a SHA-256 keystream of the token (a PRF in counter mode): the sealed password
    /// means nothing without the token.
    fn seal(&self, data: &[u8]) -> Vec<u8> {
        data.chunks(32)
            .enumerate()
            .flat_map(|(block, chunk)| {
                let mut purpose = b"sandmesh-console seal\0".to_vec();
                purpose.extend_from_slice(&(block as u64).to_be_bytes());
                let pad = self.derive(&purpose);
                chunk
                    .iter()
                    .zip(pad)
                    .map(|(a, b)| a ^ b)
                    .collect::<Vec<_>>()
            })
            .collect()
    }
}

/// Compares secrets in time independent of where they differ.
pub fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// Why a login failed.
#[derive(Debug, thiserror::Error)]
pub enum LoginError {
    #[error("wrong user or password")]
    Refused,
    #[error("{0:?} is not an operator")]
    NotOperator(String),
    #[error("cannot reach NATS at {url}")]
    Unreachable {
        url: String,
        #[source]
        source: async_nats::ConnectError,
    },
    #[error("cannot follow the events of {user:?}")]
    Feed {
        user: String,
        #[source]
        source: async_nats::SubscribeError,
    },
}

/// What a page is told as it happens: a confirmation after a change, an audit event, or that
/// events may have been missed (NATS reconnected: core NATS keeps nothing for a subscriber
/// while it is away), so the page should start over from the pending list.
#[derive(Debug, Clone)]
pub enum FeedEvent {
    Confirmation(Box<Confirmation>),
    Audit(Box<AuditEvent>),
    Resync,
}

/// One logged-in operator, shared by its browser tabs.
pub struct Login {
    pub user: String,
    pub scope: Scope,
    pub csrf: String,
    /// Unix milliseconds.
    pub expires_at: u64,
    /// The operator's own connection: decisions and listings go over it.
    pub mesh: MeshClient,
    /// Confirmation and audit events of the operator's scope, for every open page.
    pub feed: broadcast::Sender<FeedEvent>,
    feed_task: tokio::task::JoinHandle<()>,
}

impl Drop for Login {
    fn drop(&mut self) {
        // The subscriptions end with the task; the connection with its last handle.
        self.feed_task.abort();
    }
}

/// A login as written to the state file.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Stored {
    user: String,
    /// Hex of the password sealed with the token.
    sealed: String,
    expires_at: u64,
}

/// Every login of this console.
pub struct Logins {
    live: Mutex<HashMap<String, Arc<Login>>>,
    stored: Mutex<BTreeMap<String, Stored>>,
    /// The state file, when logins outlive the process.
    file: Option<PathBuf>,
    /// NATS without credentials: each login brings its own.
    nats_url: String,
    subjects: Subjects,
    operators: Operators,
    ttl: Duration,
}

/// The logins a previous run saved; none (operators log in again) when the file is missing
/// or unreadable.
fn load(file: &PathBuf) -> BTreeMap<String, Stored> {
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return BTreeMap::new(),
        Err(e) => {
            tracing::warn!(file = %file.display(), error = %e, "cannot read the saved logins");
            return BTreeMap::new();
        }
    };
    serde_json::from_str(&text).unwrap_or_else(|e| {
        tracing::warn!(file = %file.display(), error = %e, "the saved logins are unreadable");
        BTreeMap::new()
    })
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Logins {
    pub fn new(
        nats_url: &str,
        subjects: Subjects,
        operators: Operators,
        ttl: Duration,
        state_dir: Option<PathBuf>,
    ) -> Self {
        let file = state_dir.map(|d| d.join("console-logins.json"));
        let stored = file.as_ref().map(load).unwrap_or_default();
        Self {
            live: Mutex::default(),
            stored: Mutex::new(stored),
            file,
            nats_url: sandmesh_auth::split_url(nats_url).0,
            subjects,
            operators,
            ttl,
        }
    }

    /// Checks the credentials with NATS and opens the login.
    pub async fn login(&self, user: &str, password: &str) -> Result<Token, LoginError> {
        let scope = self
            .operators
            .scope_of(user)
            .ok_or_else(|| LoginError::NotOperator(user.to_string()))?;
        let token = Token::generate();
        let expires_at = now_ms() + self.ttl.as_millis() as u64;
        let login = self.open(&token, user, password, scope, expires_at).await?;
        self.live
            .lock()
            .expect("logins lock")
            .insert(token.key(), Arc::new(login));
        let sealed = hex::encode(token.seal(password.as_bytes()));
        self.stored.lock().expect("logins lock").insert(
            token.key(),
            Stored {
                user: user.to_string(),
                sealed,
                expires_at,
            },
        );
        self.persist();
        Ok(token)
    }

    /// The login of this token, reopened from the state file after a restart of the console.
    pub async fn find(&self, token: &Token) -> Option<Arc<Login>> {
        let key = token.key();
        let now = now_ms();
        let live = self.live.lock().expect("logins lock").get(&key).cloned();
        if let Some(login) = live {
            if login.expires_at > now {
                return Some(login);
            }
            self.logout(token);
            return None;
        }
        let stored = self
            .stored
            .lock()
            .expect("logins lock")
            .get(&key)
            .cloned()?;
        if stored.expires_at <= now {
            self.logout(token);
            return None;
        }
        let password = String::from_utf8(token.seal(&hex::decode(&stored.sealed).ok()?)).ok()?;
        let scope = self.operators.scope_of(&stored.user)?;
        match self
            .open(token, &stored.user, &password, scope, stored.expires_at)
            .await
        {
            Ok(login) => {
                let login = Arc::new(login);
                let mut live = self.live.lock().expect("logins lock");
                // Two requests may have reopened it at once: the first one in stays.
                Some(live.entry(key).or_insert(login).clone())
            }
            Err(e) => {
                tracing::warn!(user = %stored.user, error = %kit::error_chain(&e), "cannot reopen a login");
                if matches!(e, LoginError::Refused | LoginError::NotOperator(_)) {
                    self.logout(token);
                }
                None
            }
        }
    }

    pub fn logout(&self, token: &Token) {
        let key = token.key();
        self.live.lock().expect("logins lock").remove(&key);
        let removed = self.stored.lock().expect("logins lock").remove(&key);
        if removed.is_some() {
            self.persist();
        }
    }

    /// Ends the logins whose time is up.
    pub fn sweep(&self) {
        let now = now_ms();
        self.live
            .lock()
            .expect("logins lock")
            .retain(|_, l| l.expires_at > now);
        let before = self.stored.lock().expect("logins lock").len();
        self.stored
            .lock()
            .expect("logins lock")
            .retain(|_, s| s.expires_at > now);
        if self.stored.lock().expect("logins lock").len() != before {
            self.persist();
        }
    }

    /// How many operators have the console open.
    pub fn live_count(&self) -> usize {
        self.live.lock().expect("logins lock").len()
    }

    fn persist(&self) {
        let Some(file) = &self.file else { return };
        let text = {
            let stored = self.stored.lock().expect("logins lock");
            serde_json::to_string(&*stored).expect("logins serialise")
        };
        if let Some(dir) = file.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        if let Err(e) = sandmesh_auth::write_private(file, &text) {
            tracing::warn!(error = %kit::error_chain(&e), "cannot save the console's logins");
        }
    }

    /// Connects as the operator and starts following the events in its scope.
    async fn open(
        &self,
        token: &Token,
        user: &str,
        password: &str,
        scope: Scope,
        expires_at: u64,
    ) -> Result<Login, LoginError> {
        let (feed, _) = broadcast::channel(FEED_BACKLOG);
        let on_event = feed.clone();
        let connect = async_nats::ConnectOptions::with_user_and_password(
            user.to_string(),
            password.to_string(),
        )
        .name(format!("sandmesh-console ({user})"))
        // The only inboxes an operator may subscribe to: its own.
        .custom_inbox_prefix(sandmesh_auth::inbox_prefix(user))
        .event_callback(move |event| {
            let feed = on_event.clone();
            async move {
                if matches!(event, async_nats::Event::Connected) {
                    // Also on the first connect, when no page listens yet: harmless.
                    let _ = feed.send(FeedEvent::Resync);
                }
            }
        })
        .connection_timeout(CONNECT_TIMEOUT)
        .connect(self.nats_url.as_str());
        let client = match connect.await {
            Ok(c) => c,
            Err(e) if e.kind() == async_nats::ConnectErrorKind::AuthorizationViolation => {
                return Err(LoginError::Refused)
            }
            Err(source) => {
                return Err(LoginError::Unreachable {
                    url: self.nats_url.clone(),
                    source,
                })
            }
        };
        let feed_task = self.follow(&client, &scope, feed.clone(), user).await?;
        let mesh = MeshClient::new(client, self.subjects.clone())
            .with_encoding(Encoding::Json)
            .with_timeout(REQUEST_TIMEOUT);
        Ok(Login {
            user: user.to_string(),
            scope,
            csrf: token.csrf(),
            expires_at,
            mesh,
            feed,
            feed_task,
        })
    }

    /// Subscribes (as the operator: the server allows only the scope's subjects) to the
    /// confirmation and audit events and relays them to the login's pages. The read loop only
    /// decodes and relays, so NATS never sees a slow consumer here.
    async fn follow(
        &self,
        client: &async_nats::Client,
        scope: &Scope,
        feed: broadcast::Sender<FeedEvent>,
        user: &str,
    ) -> Result<tokio::task::JoinHandle<()>, LoginError> {
        let s = &self.subjects;
        let subjects = match scope {
            Scope::All => vec![s.confirm_events_all(), s.audit_all()],
            Scope::Tenants(set) => set
                .iter()
                .flat_map(|t| [s.confirm_events_of(Some(t)), s.audit_of(Some(t))])
                .collect(),
        };
        let mut streams = Vec::new();
        for subject in subjects {
            let sub = client
                .subscribe(subject)
                .await
                .map_err(|source| LoginError::Feed {
                    user: user.to_string(),
                    source,
                })?;
            streams.push(sub);
        }
        let audit_prefix = format!("{}.", s.pattern("audit"));
        let mut all = futures::stream::select_all(streams);
        Ok(tokio::spawn(async move {
            while let Some(msg) = all.next().await {
                let subject = msg.subject.to_string();
                let event = if subject.starts_with(&audit_prefix) {
                    sandmesh_client::decode_reply::<AuditEvent>(
                        &subject,
                        msg.headers.as_ref(),
                        &msg.payload,
                    )
                    .map(|e| FeedEvent::Audit(Box::new(e)))
                } else {
                    sandmesh_client::decode_reply::<Confirmation>(
                        &subject,
                        msg.headers.as_ref(),
                        &msg.payload,
                    )
                    .map(|c| FeedEvent::Confirmation(Box::new(c)))
                };
                match event {
                    // No page open: nobody to tell.
                    Ok(event) => {
                        let _ = feed.send(event);
                    }
                    Err(e) => tracing::warn!(%subject, error = %e, "unreadable event"),
                }
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_derive_distinct_secrets() {
        let t = Token::generate();
        assert_eq!(Token::parse(&t.to_hex()), Some(t.clone()));
        assert_eq!(Token::parse("abc"), None);
        assert_eq!(Token::parse(&"zz".repeat(32)), None);
        assert_ne!(t.csrf(), t.key());
        assert_ne!(Token::generate().csrf(), t.csrf());
    }

    #[test]
    fn sealing_needs_the_token() {
        let t = Token::generate();
        let secret = b"0123456789abcdef0123456789abcdef-and-more";
        let sealed = t.seal(secret);
        assert_ne!(&sealed[..], &secret[..]);
        assert_eq!(t.seal(&sealed), secret);
        assert_ne!(Token::generate().seal(&sealed), secret);
    }

    #[test]
    fn a_damaged_state_file_means_logging_in_again() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("console-logins.json"), "{not json").unwrap();
        let logins = Logins::new(
            "nats://127.0.0.1:1",
            Subjects::default(),
            Operators::anyone(),
            Duration::from_secs(60),
            Some(dir.path().to_path_buf()),
        );
        assert!(logins.stored.lock().unwrap().is_empty());
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "abcd"));
    }
}
