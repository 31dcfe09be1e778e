//! One page target and the actions on it that both the browser-router and the AIO agent
//! perform. Elements are named by a JavaScript expression the caller builds (its values as
//! [`crate::js_literal`]s), so each caller keeps its own way of naming them.

use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};

use crate::{CdpError, Connection};

/// How often [`Page::wait_until`] looks again.
const POLL: Duration = Duration::from_millis(50);

/// A screenshot's encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageFormat {
    Png,
    /// With its quality, 0–100.
    Jpeg(Option<u8>),
}

/// The text `field` of `method`'s answer; an answer without it is a [`CdpError::Missing`].
fn text_field<'a>(
    answer: &'a Value,
    method: &str,
    field: &'static str,
) -> Result<&'a str, CdpError> {
    answer[field].as_str().ok_or_else(|| CdpError::Missing {
        method: method.into(),
        field,
    })
}

/// One page target, driven over CDP: either its own socket (`/devtools/page/<id>`) or a
/// session attached on a browser's socket.
pub struct Page {
    conn: Connection,
    /// The attached session's id, sent with each command (`None` on a page's own socket).
    session: Option<String>,
    target: String,
}

impl Page {
    /// The first page Chromium at `addr` (`host:port`) lists (a new blank one when it has
    /// none), on its own socket. `limit` bounds each command.
    pub async fn first(addr: &str, limit: Duration) -> Result<Self, CdpError> {
        let list = crate::get_json(addr, "/json/list", limit).await?;
        let listed = list
            .as_array()
            .and_then(|targets| targets.iter().find(|t| t["type"] == "page"))
            .cloned();
        let page = match listed {
            Some(page) => page,
            None => {
                let made = crate::request(addr, "PUT", "/json/new?about:blank", limit).await?;
                serde_json::from_slice(&made).map_err(|source| CdpError::Json {
                    what: format!("/json/new of {addr}"),
                    source,
                })?
            }
        };
        let target = page["id"].as_str().ok_or(CdpError::NoPage)?;
        Self::attach(addr, target, limit).await
    }

    /// The page target `target` (an id from `/json/list`) at `addr`, on its own socket.
    pub async fn attach(addr: &str, target: &str, limit: Duration) -> Result<Self, CdpError> {
        let conn = Connection::open(&format!("ws://{addr}/devtools/page/{target}"), limit).await?;
        Ok(Self {
            conn,
            session: None,
            target: target.to_string(),
        })
    }

    /// A new page at `url`, attached as a session of the browser connection `browser`
    /// (which the page then owns).
    pub async fn create(mut browser: Connection, url: &str) -> Result<Self, CdpError> {
        let method = "Target.createTarget";
        let made = browser.call(method, json!({ "url": url })).await?;
        let target = text_field(&made, method, "targetId")?.to_string();
        let method = "Target.attachToTarget";
        let params = json!({ "targetId": target, "flatten": true });
        let attached = browser.call(method, params).await?;
        let session = text_field(&attached, method, "sessionId")?.to_string();
        Ok(Self {
            conn: browser,
            session: Some(session),
            target,
        })
    }

    /// The target id this page is.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// Whether the page's socket failed or closed.
    pub fn is_closed(&self) -> bool {
        self.conn.is_closed()
    }

    /// See [`Connection::keep_events`].
    pub fn keep_events(&mut self) {
        self.conn.keep_events();
    }

    /// See [`Connection::drain_events`].
    pub fn drain_events(&mut self) -> impl Iterator<Item = Value> + '_ {
        self.conn.drain_events()
    }

    /// See [`Connection::next_event`].
    pub async fn next_event(&mut self) -> Result<Value, CdpError> {
        self.conn.next_event().await
    }

    /// Sends one command to the page and waits for its answer.
    pub async fn call(&mut self, method: &str, params: Value) -> Result<Value, CdpError> {
        self.conn
            .call_in(self.session.as_deref(), method, params)
            .await
    }

    /// Evaluates `expression` in the page (promises awaited) and returns its value; a
    /// script that throws is [`CdpError::Script`].
    pub async fn evaluate(&mut self, expression: &str) -> Result<Value, CdpError> {
        let result = self
            .call(
                "Runtime.evaluate",
                json!({
                    "expression": expression,
                    "returnByValue": true,
                    "awaitPromise": true,
                    "userGesture": true,
                }),
            )
            .await?;
        if let Some(details) = result.get("exceptionDetails") {
            let text = details["exception"]["description"]
                .as_str()
                .or_else(|| details["text"].as_str())
                .unwrap_or("exception")
                .to_string();
            return Err(CdpError::Script(text));
        }
        Ok(result["result"]["value"].clone())
    }

    /// Polls `expression` until it is truthy (its value) or `limit` passes (`None`). A
    /// script error or a refused evaluation is "not yet": between two documents there is
    /// no context to evaluate in.
    pub async fn wait_until(
        &mut self,
        expression: &str,
        limit: Duration,
    ) -> Result<Option<Value>, CdpError> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            match self.evaluate(expression).await {
                Ok(v) if !v.is_null() && v != false && v != 0 && v != "" => return Ok(Some(v)),
                Ok(_) | Err(CdpError::Script(_) | CdpError::Protocol { .. }) => {}
                Err(e) => return Err(e),
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(None);
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Makes the page `width` × `height` CSS pixels at scale 1 (so screenshots have a known
    /// size).
    pub async fn set_viewport(&mut self, width: u32, height: u32) -> Result<(), CdpError> {
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": false}),
        )
        .await?;
        Ok(())
    }

    /// The page's URL and title, as the document says.
    pub async fn location(&mut self) -> Result<(String, String), CdpError> {
        let v = self.evaluate("[location.href, document.title]").await?;
        let field = |i: usize| v[i].as_str().unwrap_or_default().to_string();
        Ok((field(0), field(1)))
    }

    /// Scrolls the element `element` (a JavaScript expression for an element or `null`) to
    /// the middle of the view and returns the centre of its box; `None` when there is no
    /// such element.
    pub async fn element_center(&mut self, element: &str) -> Result<Option<(f64, f64)>, CdpError> {
        let point = self
            .evaluate(&format!(
                "(() => {{ const el = {element}; if (!el) return null; \
                 el.scrollIntoView({{block: 'center', inline: 'center'}}); \
                 const r = el.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; }})()"
            ))
            .await?;
        Ok(point[0].as_f64().zip(point[1].as_f64()))
    }

    /// One mouse event (`mouseMoved`, `mousePressed`, `mouseReleased`) at `(x, y)`.
    pub async fn mouse(
        &mut self,
        kind: &str,
        (x, y): (f64, f64),
        button: &str,
        count: u32,
    ) -> Result<(), CdpError> {
        self.call(
            "Input.dispatchMouseEvent",
            json!({"type": kind, "x": x, "y": y, "button": button, "clickCount": count}),
        )
        .await?;
        Ok(())
    }

    /// A click as a person makes it: the pointer moves there, presses and releases.
    pub async fn click_at(
        &mut self,
        point: (f64, f64),
        button: &str,
        count: u32,
    ) -> Result<(), CdpError> {
        self.mouse("mouseMoved", point, "none", 0).await?;
        self.mouse("mousePressed", point, button, count).await?;
        self.mouse("mouseReleased", point, button, count).await
    }

    /// `text` into whatever has the focus, as typed input (`beforeinput` and `input` fire).
    pub async fn insert_text(&mut self, text: &str) -> Result<(), CdpError> {
        self.call("Input.insertText", json!({ "text": text }))
            .await?;
        Ok(())
    }

    /// Presses and releases `key` ([`crate::key_event`]'s names) on whatever has the focus,
    /// with `modifiers` ([`crate::modifier_bit`]s) held.
    pub async fn press_key(&mut self, key: &str, modifiers: u32) -> Result<(), CdpError> {
        let mut event = crate::key_event(key).ok_or_else(|| CdpError::UnknownKey(key.into()))?;
        event["modifiers"] = json!(modifiers);
        let text = event["text"].as_str().unwrap_or("").to_string();
        // With a modifier other than Shift held, a key types nothing (Ctrl+A selects, it does
        // not type "a").
        let silent = text.is_empty() || modifiers & !8 != 0;
        event["type"] = json!(if silent { "rawKeyDown" } else { "keyDown" });
        if modifiers & !8 != 0 {
            event["text"] = json!("");
        }
        self.call("Input.dispatchKeyEvent", event.clone()).await?;
        event["type"] = json!("keyUp");
        event["text"] = json!("");
        self.call("Input.dispatchKeyEvent", event).await?;
        Ok(())
    }

    /// The page as an image (`full_page`: the whole document, not only the viewport).
    pub async fn screenshot(
        &mut self,
        format: ImageFormat,
        full_page: bool,
    ) -> Result<Vec<u8>, CdpError> {
        let mut params = match format {
            ImageFormat::Png => json!({"format": "png"}),
            ImageFormat::Jpeg(_) => json!({"format": "jpeg"}),
        };
        if let ImageFormat::Jpeg(Some(quality)) = format {
            params["quality"] = json!(quality);
        }
        params["captureBeyondViewport"] = json!(full_page);
        if full_page {
            let metrics = self.call("Page.getLayoutMetrics", json!({})).await?;
            let size = &metrics["cssContentSize"];
            params["clip"] = json!({"x": 0, "y": 0, "width": size["width"],
                                    "height": size["height"], "scale": 1});
        }
        let method = "Page.captureScreenshot";
        let result = self.call(method, params).await?;
        let data = text_field(&result, method, "data")?;
        base64::engine::general_purpose::STANDARD
            .decode(data)
            .map_err(|e| CdpError::Protocol {
                method: method.into(),
                message: format!("data is not base64: {e}"),
            })
    }

    /// The page's visible text.
    pub async fn text(&mut self) -> Result<String, CdpError> {
        let v = self
            .evaluate("document.body ? document.body.innerText : ''")
            .await?;
        Ok(v.as_str().unwrap_or_default().to_string())
    }

    /// The page's HTML, its doctype included.
    pub async fn html(&mut self) -> Result<String, CdpError> {
        let v = self
            .evaluate(
                "(document.doctype ? new XMLSerializer().serializeToString(document.doctype) : '') \
                 + (document.documentElement ? document.documentElement.outerHTML : '')",
            )
            .await?;
        Ok(v.as_str().unwrap_or_default().to_string())
    }
}
