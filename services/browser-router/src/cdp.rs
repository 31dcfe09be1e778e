//! One Chromium over CDP (chromiumoxide): the connection, its handler task, the session's one
//! page, and each action as CDP commands and small page scripts.
//!
//! The handler task keeps polling through errors it can survive (unknown events are skipped by
//! `ignore_invalid_messages`); a WebSocket error or close ends it, which marks the browser
//! dead. A killed container does not always close the socket (its address just vanishes), so
//! [`Chromium::is_alive`] also dials the DevTools port with a short bound.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chromiumoxide::cdp::browser_protocol::browser::{
    SetDownloadBehaviorBehavior, SetDownloadBehaviorParams,
};
use chromiumoxide::cdp::browser_protocol::input::InsertTextParams;
use chromiumoxide::cdp::browser_protocol::page::CaptureScreenshotFormat;
use chromiumoxide::cdp::js_protocol::runtime::EvaluateParams;
use chromiumoxide::error::CdpError;
use chromiumoxide::handler::viewport::Viewport;
use chromiumoxide::handler::HandlerConfig;
use chromiumoxide::layout::Point;
use chromiumoxide::page::ScreenshotParams;
use chromiumoxide::{Browser, Page};
use futures::StreamExt;
use messages::browser::BrowserElement;
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;

/// The viewport every page gets (so screenshots have a known size).
pub const VIEWPORT: (u32, u32) = (1280, 800);
/// `elements` lists at most this many.
const MAX_ELEMENTS: usize = 500;
const ELEMENTS_JS: &str = include_str!("elements.js");
/// The longest an action waits for the page it started loading.
const SETTLE_LIMIT: Duration = Duration::from_secs(10);

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

/// A live connection to one browser and the session's page in it.
pub struct Chromium {
    _browser: Browser,
    page: Page,
    cdp_url: String,
    alive: Arc<AtomicBool>,
    handler: JoinHandle<()>,
}

impl Drop for Chromium {
    fn drop(&mut self) {
        self.handler.abort();
    }
}

/// Whether DevTools answers at `cdp_url` (connects, and drops the connection).
pub async fn probe(cdp_url: &str) -> Result<(), CdpError> {
    let (browser, mut handler) = Browser::connect(cdp_url).await?;
    let task = tokio::spawn(async move { while handler.next().await.is_some() {} });
    let version = browser.version().await.map(|_| ());
    task.abort();
    version
}

impl Chromium {
    pub async fn connect(cdp_url: &str) -> Result<Self, CdpError> {
        let config = HandlerConfig {
            // A certificate error is a refusal, not something to click through.
            ignore_https_errors: false,
            ignore_invalid_messages: true,
            viewport: Some(Viewport {
                width: VIEWPORT.0,
                height: VIEWPORT.1,
                ..Default::default()
            }),
            ..Default::default()
        };
        let (browser, mut handler) = Browser::connect_with_config(cdp_url, config).await?;
        let alive = Arc::new(AtomicBool::new(true));
        let flag = alive.clone();
        let handler = tokio::spawn(async move {
            while let Some(event) = handler.next().await {
                match event {
                    Ok(()) => {}
                    Err(CdpError::Ws(e)) => {
                        tracing::info!(error = %e, "CDP socket failed; the browser is dead");
                        break;
                    }
                    Err(e) => tracing::debug!(error = %e, "CDP handler error; continuing"),
                }
            }
            flag.store(false, Ordering::Release);
        });
        // Downloads land nowhere: a page cannot write files into the container or the host.
        browser
            .execute(
                SetDownloadBehaviorParams::builder()
                    .behavior(SetDownloadBehaviorBehavior::Deny)
                    .build()
                    .map_err(CdpError::msg)?,
            )
            .await?;
        let page = browser.new_page("about:blank").await?;
        Ok(Self {
            _browser: browser,
            page,
            cdp_url: cdp_url.to_string(),
            alive,
            handler,
        })
    }

    /// The handler still runs and the DevTools port still accepts a connection.
    pub async fn is_alive(&self) -> bool {
        if !self.alive.load(Ordering::Acquire) {
            return false;
        }
        let addr = self.cdp_url.trim_start_matches("http://").to_string();
        matches!(
            tokio::time::timeout(
                Duration::from_millis(500),
                tokio::net::TcpStream::connect(addr)
            )
            .await,
            Ok(Ok(_))
        )
    }

    /// The page's URL and title, as the document says.
    pub async fn location(&self) -> (Option<String>, Option<String>) {
        match self
            .eval::<(String, String)>("[location.href, document.title]".into())
            .await
        {
            Ok((href, title)) => (Some(href), Some(title)),
            Err(_) => (None, None),
        }
    }

    /// Runs `expression` in the page and decodes its (JSON) value.
    async fn eval<T: DeserializeOwned>(&self, expression: String) -> Result<T, ActionError> {
        let params = EvaluateParams::builder()
            .expression(expression)
            .return_by_value(true)
            .await_promise(true)
            .build()
            .map_err(CdpError::msg)?;
        let reply = self.page.execute(params).await?.result;
        if let Some(e) = reply.exception_details {
            let text = e.exception.and_then(|x| x.description).unwrap_or(e.text);
            return Err(ActionError::Script(text));
        }
        let value = reply.result.value.unwrap_or(serde_json::Value::Null);
        serde_json::from_value(value).map_err(ActionError::Decode)
    }

    /// Loads `url` and waits (at most `limit`) until the new document has loaded.
    ///
    /// Not through `Page.navigate`: chromiumoxide queues every `Page.navigate` behind the
    /// previous one until its page loads, so one that never loads (a download, which the
    /// browser refuses) would block every later navigation of the page. The old document is
    /// marked instead, and the new one is there when the mark is gone.
    pub async fn navigate(&self, url: &str, limit: Duration) -> Result<(), ActionError> {
        let mark = js_string(&messages::new_id());
        let target = js_string(url);
        self.eval::<serde_json::Value>(format!(
            "window.__sandmesh_nav = {mark}; location.href = {target}; null"
        ))
        .await?;
        let deadline = Instant::now() + limit;
        loop {
            // Between documents the evaluation fails: that is "not yet".
            let state = self
                .eval::<(bool, String)>(format!(
                    "[window.__sandmesh_nav !== {mark} || location.href === {target}, document.readyState]"
                ))
                .await;
            if let Ok((true, ready)) = &state {
                if ready == "complete" {
                    break;
                }
            }
            if Instant::now() >= deadline {
                return Err(ActionError::NoLoad {
                    url: url.to_string(),
                    within: limit,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
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

    pub async fn back(&self) -> Result<(), ActionError> {
        self.eval::<serde_json::Value>("history.back()".into())
            .await?;
        self.settle().await
    }

    /// After an input that may start a navigation: give it a moment to start, then wait until
    /// the document has loaded (at once when nothing navigates), at most [`SETTLE_LIMIT`].
    /// The document is asked directly: chromiumoxide's frame tracking never sees a page come
    /// back from the back/forward cache as loaded.
    async fn settle(&self) -> Result<(), ActionError> {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let deadline = Instant::now() + SETTLE_LIMIT;
        // Between documents the evaluation fails: that is "not yet".
        while Instant::now() < deadline {
            if let Ok(true) = self
                .eval::<bool>("document.readyState === 'complete'".into())
                .await
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    pub async fn elements(&self) -> Result<Vec<BrowserElement>, ActionError> {
        self.eval(format!("({ELEMENTS_JS})({MAX_ELEMENTS})")).await
    }

    /// What the element at `selector` is (for the risk assessment of a fill or click).
    pub async fn describe(&self, selector: &str) -> Result<serde_json::Value, ActionError> {
        let s = js_string(selector);
        let found: Option<serde_json::Value> = self
            .eval(format!(
                "(() => {{ const e = document.querySelector({s}); if (!e) return null; \
                 const label = e.labels ? Array.from(e.labels).map(l => l.innerText).join(' ') : ''; \
                 return {{ tag: e.tagName.toLowerCase(), type: e.getAttribute('type'), \
                 name: e.getAttribute('name'), id: e.id || null, \
                 autocomplete: e.getAttribute('autocomplete'), label: label || null }}; }})()"
            ))
            .await?;
        found.ok_or_else(|| ActionError::NoElement(selector.to_string()))
    }

    pub async fn click(&self, selector: &str) -> Result<(), ActionError> {
        let s = js_string(selector);
        let point: Option<(f64, f64)> = self
            .eval(format!(
                "(() => {{ const e = document.querySelector({s}); if (!e) return null; \
                 e.scrollIntoView({{block: 'center', inline: 'center'}}); \
                 const r = e.getBoundingClientRect(); \
                 return [r.left + r.width / 2, r.top + r.height / 2]; }})()"
            ))
            .await?;
        let (x, y) = point.ok_or_else(|| ActionError::NoElement(selector.to_string()))?;
        self.page.click(Point { x, y }).await?;
        self.settle().await
    }

    /// Focuses the element (emptying it first when `clear`) and inserts `text` as typed input.
    pub async fn fill(&self, selector: &str, text: &str, clear: bool) -> Result<(), ActionError> {
        let s = js_string(selector);
        let focused: bool = self
            .eval(format!(
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
        self.page.execute(InsertTextParams::new(text)).await?;
        Ok(())
    }

    /// Presses `key` on whatever has the focus.
    pub async fn press_key(&self, key: &str) -> Result<(), ActionError> {
        self.page.find_element("html").await?.press_key(key).await?;
        self.settle().await
    }

    /// Scrolls by (dx, dy) pixels; `dy` defaults to one screen. Returns the new offsets.
    pub async fn scroll(&self, dx: i64, dy: Option<i64>) -> Result<serde_json::Value, ActionError> {
        let dy = dy.map_or("window.innerHeight".to_string(), |d| d.to_string());
        self.eval(format!(
            "(() => {{ window.scrollBy({dx}, {dy}); return {{x: window.scrollX, y: window.scrollY}}; }})()"
        ))
        .await
    }

    /// Until the page's text contains `text`, or `selector` matches, polling every 100 ms.
    pub async fn wait_for(
        &self,
        text: Option<&str>,
        selector: Option<&str>,
        limit: Duration,
    ) -> Result<(), ActionError> {
        let check = match (text, selector) {
            (Some(t), _) => format!(
                "!!document.body && document.body.innerText.includes({})",
                js_string(t)
            ),
            (None, Some(s)) => format!("!!document.querySelector({})", js_string(s)),
            (None, None) => return Ok(()),
        };
        let deadline = Instant::now() + limit;
        loop {
            // A navigation in between destroys the context: that is "not yet", not an error.
            if let Ok(true) = self.eval::<bool>(check.clone()).await {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(ActionError::WaitTimeout(limit));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn screenshot(&self, full_page: bool) -> Result<Vec<u8>, ActionError> {
        let params = ScreenshotParams::builder()
            .format(CaptureScreenshotFormat::Png)
            .full_page(full_page)
            .build();
        Ok(self.page.screenshot(params).await?)
    }

    pub async fn text(&self) -> Result<String, ActionError> {
        self.eval("document.body ? document.body.innerText : ''".into())
            .await
    }

    pub async fn html(&self) -> Result<String, ActionError> {
        Ok(self.page.content().await?)
    }

    pub async fn evaluate(&self, script: &str) -> Result<serde_json::Value, ActionError> {
        self.eval(script.to_string()).await
    }
}

/// `s` as a JavaScript string literal (JSON's quoting is valid JavaScript).
fn js_string(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

#[cfg(test)]
mod tests {
    use super::js_string;

    #[test]
    fn hostile_selectors_stay_one_string_literal() {
        let s = js_string("a'); alert(1); ('\"\n</script>");
        assert!(s.starts_with('"') && s.ends_with('"'));
        let back: String = serde_json::from_str(&s).unwrap();
        assert_eq!(back, "a'); alert(1); ('\"\n</script>");
    }
}
