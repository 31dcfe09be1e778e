//! One Chromium over CDP (`sandmesh-cdp`): the browser's connection, the session's one page
//! in it (a session attached on the browser's socket), and each action as CDP commands and
//! small page scripts.
//!
//! A killed container does not always close the socket (its address just vanishes), so
//! [`Chromium::is_alive`] also dials the DevTools port with a short bound.

use std::time::Duration;

use cdp::{js_literal, CdpError, Connection, ImageFormat, Page};
use messages::browser::BrowserElement;
use messages::ErrorKind;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

/// The viewport every page gets (so screenshots have a known size).
pub const VIEWPORT: (u32, u32) = (1280, 800);
/// `elements` lists at most this many.
const MAX_ELEMENTS: usize = 500;
const ELEMENTS_JS: &str = include_str!("elements.js");
/// The longest an action waits for the page it started loading.
const SETTLE_LIMIT: Duration = Duration::from_secs(10);
/// Bound of one CDP command (an action's own bound covers the whole action).
const COMMAND_LIMIT: Duration = Duration::from_secs(30);
/// Bound of one readiness probe (the caller retries until its own deadline).
const PROBE_LIMIT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    #[error("CDP: {0}")]
    Cdp(#[from] CdpError),
    #[error("navigation to {url} failed: {reason}")]
    Navigation { url: String, reason: String },
    #[error("{url} loaded no page within {within:?} (a download, which is refused, or a server that does not answer)")]
    NoLoad { url: String, within: Duration },
    #[error("the page script threw: {0}")]
    Script(String),
    #[error("unexpected script result: {0}")]
    Decode(#[source] serde_json::Error),
    #[error("no element matches {0}; call elements again after a navigation")]
    NoElement(String),
    #[error("not found within {0:?}")]
    WaitTimeout(Duration),
}

impl ActionError {
    /// The kind the caller is answered with: the page's or the caller's mistake, a wait that
    /// ran out, or the browser misbehaving.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ActionError::NoElement(_)
            | ActionError::Script(_)
            | ActionError::Cdp(CdpError::UnknownKey(_)) => ErrorKind::BadRequest,
            ActionError::Navigation { .. } => ErrorKind::Unavailable,
            ActionError::WaitTimeout(_)
            | ActionError::NoLoad { .. }
            | ActionError::Cdp(CdpError::Timeout { .. }) => ErrorKind::Timeout,
            ActionError::Cdp(_) | ActionError::Decode(_) => ErrorKind::Internal,
        }
    }
}

/// A live connection to one browser and the session's page in it.
pub struct Chromium {
    page: Page,
    cdp_url: String,
}

/// Whether DevTools answers at `cdp_url` (connects, asks the version, and drops the
/// connection).
pub async fn probe(cdp_url: &str) -> Result<(), CdpError> {
    let mut browser = Connection::browser(cdp_url, PROBE_LIMIT).await?;
    browser
        .call("Browser.getVersion", json!({}))
        .await
        .map(|_| ())
}

impl Chromium {
    /// Connects to the browser at `cdp_url` (`unix:<path>` or `http://host:port`) and opens
    /// the session's page.
    pub async fn connect(cdp_url: &str) -> Result<Self, CdpError> {
        let mut browser = Connection::browser(cdp_url, COMMAND_LIMIT).await?;
        // Downloads land nowhere: a page cannot write files into the container or the host.
        browser
            .call("Browser.setDownloadBehavior", json!({"behavior": "deny"}))
            .await?;
        // A certificate error stays a refusal: nothing here tells Chromium to click through.
        let mut page = Page::create(browser, "about:blank").await?;
        page.set_viewport(VIEWPORT.0, VIEWPORT.1).await?;
        Ok(Self {
            page,
            cdp_url: cdp_url.to_string(),
        })
    }

    /// The page's socket still stands and the DevTools endpoint still accepts a connection.
    pub async fn is_alive(&self) -> bool {
        if self.page.is_closed() {
            return false;
        }
        let addr = self.cdp_url.trim_start_matches("http://");
        matches!(
            tokio::time::timeout(Duration::from_millis(500), cdp::dial(addr)).await,
            Ok(Ok(_))
        )
    }

    /// The page's URL and title, as the document says.
    pub async fn location(&mut self) -> (Option<String>, Option<String>) {
        match self.page.location().await {
            Ok((href, title)) => (Some(href), Some(title)),
            Err(_) => (None, None),
        }
    }

    /// Runs `expression` in the page and decodes its (JSON) value.
    async fn eval<T: DeserializeOwned>(&mut self, expression: &str) -> Result<T, ActionError> {
        let value = match self.page.evaluate(expression).await {
            Err(CdpError::Script(text)) => return Err(ActionError::Script(text)),
            other => other?,
        };
        serde_json::from_value(value).map_err(ActionError::Decode)
    }

    /// Loads `url` and waits (at most `limit`) until the new document has loaded.
    ///
    /// The old document is marked and the new one is there when the mark is gone, rather
    /// than following `Page.navigate`: a load that never makes a page (a download, which the
    /// browser refuses) then ends as [`ActionError::NoLoad`] within the action's bound, and a
    /// failed one shows as Chromium's error page.
    pub async fn navigate(&mut self, url: &str, limit: Duration) -> Result<(), ActionError> {
        let mark = js_literal(&messages::new_id());
        let target = js_literal(&url);
        self.page
            .evaluate(&format!(
                "window.__sandmesh_nav = {mark}; location.href = {target}; null"
            ))
            .await?;
        let loaded = self
            .page
            .wait_until(
                &format!(
                    "(window.__sandmesh_nav !== {mark} || location.href === {target}) && \
                     document.readyState === 'complete'"
                ),
                limit,
            )
            .await?;
        if loaded.is_none() {
            return Err(ActionError::NoLoad {
                url: url.to_string(),
                within: limit,
            });
        }
        // Chromium shows its own error page when a load fails (the proxy refused, nothing
        // listens): say which error it was.
        let (href, _) = self.location().await;
        if href
            .as_deref()
            .is_some_and(|h| h.starts_with("chrome-error:"))
        {
            let text = self.text().await.unwrap_or_default();
            let code = text
                .split_whitespace()
                .find(|w| w.starts_with("ERR_"))
                .unwrap_or("the load failed");
            return Err(ActionError::Navigation {
                url: url.to_string(),
                reason: code.to_string(),
            });
        }
        Ok(())
    }

    pub async fn back(&mut self) -> Result<(), ActionError> {
        self.page.evaluate("history.back()").await?;
        self.settle().await
    }

    /// After an input that may start a navigation: give it a moment to start, then wait until
    /// the document has loaded (at once when nothing navigates), at most [`SETTLE_LIMIT`].
    /// The document is asked directly: a page that comes back from the back/forward cache
    /// sends no load event.
    async fn settle(&mut self) -> Result<(), ActionError> {
        tokio::time::sleep(Duration::from_millis(150)).await;
        // Still loading after the bound is no error: the action itself was done.
        self.page
            .wait_until("document.readyState === 'complete'", SETTLE_LIMIT)
            .await?;
        Ok(())
    }

    pub async fn elements(&mut self) -> Result<Vec<BrowserElement>, ActionError> {
        self.eval(&format!("({ELEMENTS_JS})({MAX_ELEMENTS})")).await
    }

    /// What the element at `selector` is (for the risk assessment of a fill or click).
    pub async fn describe(&mut self, selector: &str) -> Result<Value, ActionError> {
        let s = js_literal(&selector);
        let found: Option<Value> = self
            .eval(&format!(
                "(() => {{ const e = document.querySelector({s}); if (!e) return null; \
                 const label = e.labels ? Array.from(e.labels).map(l => l.innerText).join(' ') : ''; \
                 return {{ tag: e.tagName.toLowerCase(), type: e.getAttribute('type'), \
                 name: e.getAttribute('name'), id: e.id || null, \
                 autocomplete: e.getAttribute('autocomplete'), label: label || null }}; }})()"
            ))
            .await?;
        found.ok_or_else(|| ActionError::NoElement(selector.to_string()))
    }

    pub async fn click(&mut self, selector: &str) -> Result<(), ActionError> {
        let element = format!("document.querySelector({})", js_literal(&selector));
        let point = self
            .page
            .element_center(&element)
            .await?
            .ok_or_else(|| ActionError::NoElement(selector.to_string()))?;
        self.page.click_at(point, "left", 1).await?;
        self.settle().await
    }

    /// Focuses the element (emptying it first when `clear`) and inserts `text` as typed input.
    pub async fn fill(
        &mut self,
        selector: &str,
        text: &str,
        clear: bool,
    ) -> Result<(), ActionError> {
        let s = js_literal(&selector);
        let focused: bool = self
            .eval(&format!(
                "(() => {{ const e = document.querySelector({s}); if (!e) return false; \
                 e.scrollIntoView({{block: 'center'}}); e.focus(); \
                 if ({clear}) {{ if ('value' in e) {{ e.value = ''; \
                 e.dispatchEvent(new Event('input', {{bubbles: true}})); }} \
                 else if (e.isContentEditable) e.textContent = ''; }} \
                 return true; }})()"
            ))
            .await?;
        if !focused {
            return Err(ActionError::NoElement(selector.to_string()));
        }
        self.page.insert_text(text).await?;
        Ok(())
    }

    /// Presses `key` on whatever has the focus.
    pub async fn press_key(&mut self, key: &str) -> Result<(), ActionError> {
        self.page.press_key(key, 0).await?;
        self.settle().await
    }

    /// Scrolls by (dx, dy) pixels; `dy` defaults to one screen. Returns the new offsets.
    pub async fn scroll(&mut self, dx: i64, dy: Option<i64>) -> Result<Value, ActionError> {
        let dy = dy.map_or("window.innerHeight".to_string(), |d| d.to_string());
        self.eval(&format!(
            "(() => {{ window.scrollBy({dx}, {dy}); return {{x: window.scrollX, y: window.scrollY}}; }})()"
        ))
        .await
    }

    /// Until the page's text contains `text`, or `selector` matches.
    pub async fn wait_for(
        &mut self,
        text: Option<&str>,
        selector: Option<&str>,
        limit: Duration,
    ) -> Result<(), ActionError> {
        let check = match (text, selector) {
            (Some(t), _) => format!(
                "!!document.body && document.body.innerText.includes({})",
                js_literal(&t)
            ),
            (None, Some(s)) => format!("!!document.querySelector({})", js_literal(&s)),
            (None, None) => return Ok(()),
        };
        match self.page.wait_until(&check, limit).await? {
            Some(_) => Ok(()),
            None => Err(ActionError::WaitTimeout(limit)),
        }
    }

    pub async fn screenshot(&mut self, full_page: bool) -> Result<Vec<u8>, ActionError> {
        Ok(self.page.screenshot(ImageFormat::Png, full_page).await?)
    }

    pub async fn text(&mut self) -> Result<String, ActionError> {
        Ok(self.page.text().await?)
    }

    pub async fn html(&mut self) -> Result<String, ActionError> {
        Ok(self.page.html().await?)
    }

    pub async fn evaluate(&mut self, script: &str) -> Result<Value, ActionError> {
        self.eval(script).await
    }
}
