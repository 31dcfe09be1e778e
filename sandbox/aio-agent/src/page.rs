//! `/v1/browser/page/*` and `/v1/browser/screenshot`: actions on the instance's current page
//! over CDP (`sandmesh-cdp`'s [`Page`]), one at a time. Elements are found by CSS selector or by the
//! index `/v1/browser/page/elements` lists (visible interactive elements, in document
//! order); values reach the page as JSON literals, never spliced into script text.
//!
//! Besides the single-element actions: `fill_form` fills several fields in one call (every
//! element is found before any is touched), `upload_file` sets a file input's files from the
//! workspace (`DOM.setFileInputFiles`; paths checked like the file API), and `markdown`
//! converts the rendered page in the page itself (`markdown.js`: the whole body, hidden
//! elements skipped; upstream picks the main content with Readability first). `console` and
//! `console/export` read the listener [`crate::console`] keeps; `record` is
//! [`crate::record`].

use std::time::Duration;

use bytes::Bytes;
use cdp::{js_literal, modifier_bit, CdpError, ImageFormat, Page};
use http_body_util::Full;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Response, StatusCode};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::api::Envelope;
use crate::browser::BrowserError;
use crate::files::{error_chain, io, FileError};
use crate::reply::{error, file_status, json, Reply};
use crate::Agent;

/// Bound of one CDP command (a navigation's wait has its own, from the request).
const COMMAND_LIMIT: Duration = Duration::from_secs(30);
/// Most fields one `fill_form` fills and files one `upload_file` sets.
const MAX_FORM_ITEMS: usize = 100;
const MAX_UPLOAD_FILES: usize = 100;

/// Not the browser-router's `fill`, on purpose: that one focuses a text field and inserts
/// the text as typed input (the action its risk assessment describes); this one serves `fill`
/// and `fill_form`, which set any kind of field (checkbox, select, text) to a value.
///
/// Sets one element to a value, as a person would: a checkbox or radio is clicked to the
/// wanted state (`true`/`false`, or its own value), a select picks the options whose value or
/// label matches (an array for `multiple`), anything else gets the text through the value
/// setter the page's framework watches, then `input` and `change`. Returns what it set;
/// throws for a file input (that is `upload_file`) or a missing option.
const FILL_JS: &str = r#"((el, v) => {
  if (el.tagName === 'INPUT' && el.type === 'file') throw new Error('a file input takes files: use upload_file');
  if (el.focus) el.focus();
  const fire = () => { el.dispatchEvent(new Event('input', {bubbles: true}));
    el.dispatchEvent(new Event('change', {bubbles: true})); };
  if (el.type === 'checkbox' || el.type === 'radio') {
    const on = typeof v === 'boolean' ? v : ['true', 'on', 'yes', el.value].includes(String(v));
    if (el.checked !== on) el.click();
    return el.checked;
  }
  if (el.tagName === 'SELECT') {
    const wanted = (Array.isArray(v) ? v : [v]).map(String);
    let hits = 0;
    for (const o of el.options) { const hit = wanted.includes(o.value) || wanted.includes(o.label);
      if (hit || el.multiple) o.selected = hit; if (hit) hits++; }
    if (!hits) throw new Error('no option matches ' + JSON.stringify(v));
    fire();
    return el.multiple ? [...el.selectedOptions].map((o) => o.value) : el.value;
  }
  const text = v === null || v === undefined ? '' : typeof v === 'string' ? v : JSON.stringify(v);
  if (el.isContentEditable) { el.textContent = text; } else {
    const d = Object.getOwnPropertyDescriptor(Object.getPrototypeOf(el), 'value');
    if (d && d.set) d.set.call(el, text); else el.value = text; }
  fire();
  return el.isContentEditable ? el.textContent : el.value;
})"#;

/// `(root, limit) => {markdown, truncated}`: the rendered DOM under `root` as Markdown.
const MARKDOWN_JS: &str = include_str!("markdown.js");

/// The visible interactive elements, the same list for `elements` and for `index`. Not the
/// browser-router's `elements.js`: this list answers upstream AIO's `/v1/browser/page/elements`
/// shape and is found again by position; the router's gives the mesh's `BrowserElement` fields
/// and tags the elements for its `{index}` targets.
const ELEMENTS_JS: &str = r#"(() => [...document.querySelectorAll(
  "a[href],button,input,select,textarea,summary,[role=button],[role=link],[role=checkbox],[onclick],[contenteditable=''],[contenteditable=true]"
)].filter((e) => { const r = e.getBoundingClientRect(); const s = getComputedStyle(e);
  return r.width > 0 && r.height > 0 && s.visibility !== 'hidden' && s.display !== 'none'; }))()"#;

#[derive(Debug, Deserialize)]
pub struct NavigateRequest {
    pub url: String,
    #[serde(default)]
    pub wait_until: Option<String>,
    #[serde(default)]
    pub timeout: Option<f64>,
}

/// Any request naming an element: by `selector` or by `index`, or a point.
#[derive(Debug, Deserialize, Default)]
pub struct Target {
    #[serde(default)]
    pub selector: Option<String>,
    #[serde(default)]
    pub index: Option<u32>,
    #[serde(default)]
    pub x: Option<f64>,
    #[serde(default)]
    pub y: Option<f64>,
}

#[derive(Debug, Deserialize)]
pub struct ClickRequest {
    #[serde(flatten)]
    pub target: Target,
    #[serde(default)]
    pub button: Option<String>,
    #[serde(default)]
    pub click_count: Option<u32>,
}

#[derive(Debug, Deserialize)]
pub struct FillRequest {
    #[serde(flatten)]
    pub target: Target,
    pub text: String,
}

/// `FormFillRequest`: upstream leaves the items' keys open; each here names its element like
/// the other actions (`selector` or `index`) and gives `value` (or `text`, as `fill` calls it).
#[derive(Debug, Deserialize)]
pub struct FormFillRequest {
    pub items: Vec<FormItem>,
}

#[derive(Debug, Deserialize)]
pub struct FormItem {
    #[serde(flatten)]
    pub target: Target,
    #[serde(alias = "text")]
    pub value: Value,
}

/// `UploadFileRequest`: workspace paths for the file input `selector`.
#[derive(Debug, Deserialize)]
pub struct UploadFileRequest {
    pub selector: String,
    pub files: Vec<String>,
}

#[derive(Debug, Deserialize)]
pub struct TextRequest {
    pub text: String,
}

#[derive(Debug, Deserialize)]
pub struct KeyRequest {
    pub key: String,
}

#[derive(Debug, Deserialize)]
pub struct HotKeyRequest {
    pub keys: Vec<String>,
}

#[derive(Debug, Deserialize)]
pub struct SelectOptionRequest {
    pub selector: String,
    #[serde(default)]
    pub value: Option<String>,
    #[serde(default)]
    pub label: Option<String>,
    #[serde(default)]
    pub index: Option<u32>,
}

#[derive(Debug, Deserialize)]
pub struct SelectorRequest {
    pub selector: String,
}

#[derive(Debug, Deserialize)]
pub struct ScrollRequest {
    #[serde(default)]
    pub direction: Option<String>,
    #[serde(default)]
    pub amount: Option<i64>,
}

#[derive(Debug, Deserialize)]
pub struct ScrollToRequest {
    #[serde(default)]
    pub x: i64,
    #[serde(default)]
    pub y: i64,
}

#[derive(Debug, Deserialize)]
pub struct EvaluateRequest {
    pub expression: String,
}

#[derive(Debug, Deserialize)]
pub struct FindTextRequest {
    pub keyword: String,
}

#[derive(Debug, Deserialize)]
pub struct WaitRequest {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub selector: Option<String>,
    #[serde(default)]
    pub state: Option<String>,
    #[serde(default)]
    pub url: Option<String>,
    #[serde(default)]
    pub url_pattern: Option<String>,
    #[serde(default)]
    pub expression: Option<String>,
    #[serde(default)]
    pub timeout: Option<f64>,
}

/// Why an action failed, and the status it is answered with.
#[derive(Debug, thiserror::Error)]
pub enum PageError {
    #[error(transparent)]
    Cdp(#[from] CdpError),
    #[error(transparent)]
    Browser(#[from] BrowserError),
    #[error("{0}")]
    Invalid(String),
    #[error("no element matches {0}")]
    NoElement(String),
    #[error("navigation failed: {0}")]
    Navigation(String),
    #[error("waited {0:?} in vain")]
    WaitTimeout(Duration),
    #[error(transparent)]
    File(#[from] FileError),
}

impl PageError {
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            PageError::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
            PageError::NoElement(_) => StatusCode::NOT_FOUND,
            PageError::Navigation(_) => StatusCode::BAD_GATEWAY,
            PageError::WaitTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            PageError::File(e) => file_status(e),
            PageError::Cdp(CdpError::Script(_) | CdpError::UnknownKey(_)) => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            PageError::Browser(_) => StatusCode::SERVICE_UNAVAILABLE,
            PageError::Cdp(_) => StatusCode::BAD_GATEWAY,
        }
    }
}

/// The page, after making sure Chromium runs; the console listener follows it. Actions hold
/// the agent's page lock.
pub(crate) async fn page(agent: &Agent) -> Result<Page, PageError> {
    agent.browser.version().await?;
    let page = Page::first(
        &format!("127.0.0.1:{}", agent.browser.port()),
        COMMAND_LIMIT,
    )
    .await?;
    agent.console.follow(agent.browser.port(), page.target());
    Ok(page)
}

fn seconds(value: Option<f64>, default: f64, max: Duration) -> Result<Duration, PageError> {
    let s = value.unwrap_or(default);
    if !(s.is_finite() && s >= 0.0) {
        return Err(PageError::Invalid(
            "timeout must be a non-negative number of seconds".into(),
        ));
    }
    Ok(Duration::from_secs_f64(s).min(max))
}

/// Polls `expression` until it is truthy or `limit` passes.
async fn wait_for(page: &mut Page, expression: &str, limit: Duration) -> Result<Value, PageError> {
    page.wait_until(expression, limit)
        .await?
        .ok_or(PageError::WaitTimeout(limit))
}

async fn wait_loaded(page: &mut Page, wait_until: &str, limit: Duration) -> Result<(), PageError> {
    let expression = match wait_until {
        "commit" => return Ok(()),
        "domcontentloaded" => "document.readyState !== 'loading'",
        _ => "document.readyState === 'complete'",
    };
    wait_for(page, expression, limit).await.map(|_| ())
}

async fn location(page: &mut Page) -> Result<Value, PageError> {
    Ok(page
        .evaluate("({url: location.href, title: document.title})")
        .await?)
}

/// Finds the element (scrolled into view) and returns the centre of its box.
async fn element_point(page: &mut Page, target: &Target) -> Result<(f64, f64), PageError> {
    if let (Some(x), Some(y)) = (target.x, target.y) {
        return Ok((x, y));
    }
    page.element_center(&element_js(target)?)
        .await?
        .ok_or_else(|| PageError::NoElement(describe(target)))
}

/// A JS expression for the element `target` names (or `null`).
fn element_js(target: &Target) -> Result<String, PageError> {
    match (&target.selector, target.index) {
        (Some(selector), _) => Ok(format!("document.querySelector({})", js_literal(selector))),
        (None, Some(index)) => Ok(format!("(({ELEMENTS_JS})[{index}] || null)")),
        (None, None) => Err(PageError::Invalid(
            "name the element by selector or index (or give x and y)".into(),
        )),
    }
}

fn describe(target: &Target) -> String {
    match (&target.selector, target.index) {
        (Some(s), _) => format!("selector {s:?}"),
        (None, Some(i)) => format!("index {i}"),
        (None, None) => "no element".into(),
    }
}

/// The action behind one route (`name` is the part after `/v1/browser/page/`).
pub enum Action {
    Navigate(NavigateRequest),
    Back,
    Forward,
    Reload,
    Click(ClickRequest),
    Fill(FillRequest),
    FillForm(FormFillRequest),
    UploadFile(UploadFileRequest),
    Type(TextRequest),
    PressKey(KeyRequest),
    HotKey(HotKeyRequest),
    Hover(Target),
    SelectOption(SelectOptionRequest),
    Check(SelectorRequest, bool),
    Scroll(ScrollRequest),
    ScrollTo(ScrollToRequest),
    ScrollToElement(SelectorRequest),
    Html,
    Text,
    Markdown,
    Elements,
    Evaluate(EvaluateRequest),
    FindText(FindTextRequest),
    Wait(WaitRequest),
}

/// Runs an action and answers `Response` with its data.
pub async fn act(agent: &Agent, action: Action) -> Reply {
    let _one_at_a_time = agent.page_lock.lock().await;
    match run(agent, action).await {
        Ok(data) => json(StatusCode::OK, &Envelope::ok(data)),
        Err(e) => error(e.status(), error_chain(&e)),
    }
}

async fn run(agent: &Agent, action: Action) -> Result<Value, PageError> {
    let max = agent.config.max_timeout;
    let mut page = page(agent).await?;
    let page = &mut page;
    match action {
        Action::Navigate(req) => {
            let allowed = ["http://", "https://", "about:", "data:", "file://"];
            if !allowed.iter().any(|p| req.url.starts_with(p)) {
                return Err(PageError::Invalid(format!(
                    "url must start with one of {allowed:?}"
                )));
            }
            let limit = seconds(req.timeout, 30.0, max)?;
            let result = page.call("Page.navigate", json!({"url": req.url})).await?;
            if let Some(text) = result["errorText"].as_str().filter(|t| !t.is_empty()) {
                return Err(PageError::Navigation(text.to_string()));
            }
            let wait_until = req.wait_until.as_deref().unwrap_or("load");
            wait_loaded(page, wait_until, limit).await?;
            location(page).await
        }
        Action::Back | Action::Forward => {
            let step: i64 = if matches!(action, Action::Back) { -1 } else { 1 };
            let history = page.call("Page.getNavigationHistory", json!({})).await?;
            let at = history["currentIndex"].as_i64().unwrap_or(0) + step;
            let entry = history["entries"]
                .as_array()
                .and_then(|e| usize::try_from(at).ok().and_then(|i| e.get(i)))
                .ok_or_else(|| PageError::Invalid("no page in that direction".into()))?;
            page.call(
                "Page.navigateToHistoryEntry",
                json!({"entryId": entry["id"]}),
            )
            .await?;
            wait_loaded(page, "load", COMMAND_LIMIT).await?;
            location(page).await
        }
        Action::Reload => {
            page.call("Page.reload", json!({})).await?;
            wait_loaded(page, "load", COMMAND_LIMIT).await?;
            location(page).await
        }
        Action::Click(req) => {
            let button = req.button.as_deref().unwrap_or("left");
            if !["left", "right", "middle"].contains(&button) {
                return Err(PageError::Invalid(format!("unknown button {button:?}")));
            }
            let count = req.click_count.unwrap_or(1).clamp(1, 3);
            let point = element_point(page, &req.target).await?;
            page.click_at(point, button, count).await?;
            Ok(json!({"x": point.0, "y": point.1}))
        }
        Action::Fill(req) => {
            let filled = page
                .evaluate(&format!(
                    "(() => {{ const el = {}; if (!el) return false; ({FILL_JS})(el, {}); return true; }})()",
                    element_js(&req.target)?,
                    js_literal(&req.text)
                ))
                .await?;
            if filled != true {
                return Err(PageError::NoElement(describe(&req.target)));
            }
            Ok(Value::Null)
        }
        Action::FillForm(req) => fill_form(page, &req).await,
        Action::UploadFile(req) => upload_file(agent, page, &req).await,
        Action::Type(req) => {
            page.insert_text(&req.text).await?;
            Ok(Value::Null)
        }
        Action::PressKey(req) => {
            page.press_key(&req.key, 0).await?;
            Ok(Value::Null)
        }
        Action::HotKey(req) => {
            let (modifiers, keys): (Vec<&String>, Vec<&String>) =
                req.keys.iter().partition(|k| modifier_bit(k).is_some());
            let bits = modifiers.iter().filter_map(|k| modifier_bit(k)).sum();
            let [key] = keys[..] else {
                return Err(PageError::Invalid(
                    "keys must be modifiers and exactly one other key".into(),
                ));
            };
            page.press_key(key, bits).await?;
            Ok(Value::Null)
        }
        Action::Hover(target) => {
            let point = element_point(page, &target).await?;
            page.mouse("mouseMoved", point, "none", 0).await?;
            Ok(json!({"x": point.0, "y": point.1}))
        }
        Action::SelectOption(req) => {
            let chosen = page
                .evaluate(&format!(
                    "(() => {{ const el = document.querySelector({}); if (!el || !el.options) return null; \
                     const v = {}, l = {}, i = {}; const o = [...el.options].findIndex((o, n) => \
                     (v !== null && o.value === v) || (l !== null && o.label === l) || n === i); \
                     if (o < 0) return null; el.selectedIndex = o; \
                     el.dispatchEvent(new Event('input', {{bubbles: true}})); \
                     el.dispatchEvent(new Event('change', {{bubbles: true}})); return el.value; }})()",
                    js_literal(&req.selector),
                    js_literal(&req.value),
                    js_literal(&req.label),
                    js_literal(&req.index)
                ))
                .await?;
            if chosen.is_null() {
                return Err(PageError::NoElement(format!(
                    "selector {:?} with that option",
                    req.selector
                )));
            }
            Ok(json!({"value": chosen}))
        }
        Action::Check(req, checked) => {
            let done = page
                .evaluate(&format!(
                    "(() => {{ const el = document.querySelector({}); if (!el) return false; \
                     if (el.checked !== {checked}) el.click(); return true; }})()",
                    js_literal(&req.selector)
                ))
                .await?;
            if done != true {
                return Err(PageError::NoElement(format!("selector {:?}", req.selector)));
            }
            Ok(Value::Null)
        }
        Action::Scroll(req) => {
            let amount = req.amount.unwrap_or(300);
            let (dx, dy) = match req.direction.as_deref().unwrap_or("down") {
                "down" => (0, amount),
                "up" => (0, -amount),
                "right" => (amount, 0),
                "left" => (-amount, 0),
                d => return Err(PageError::Invalid(format!("unknown direction {d:?}"))),
            };
            page.evaluate(&format!("window.scrollBy({dx}, {dy})")).await?;
            Ok(page.evaluate("({x: scrollX, y: scrollY})").await?)
        }
        Action::ScrollTo(req) => {
            page.evaluate(&format!("window.scrollTo({}, {})", req.x, req.y))
                .await?;
            Ok(page.evaluate("({x: scrollX, y: scrollY})").await?)
        }
        Action::ScrollToElement(req) => {
            let target = Target {
                selector: Some(req.selector),
                ..Default::default()
            };
            element_point(page, &target).await?;
            Ok(Value::Null)
        }
        Action::Html => Ok(page.html().await?.into()),
        Action::Text => Ok(page.text().await?.into()),
        Action::Markdown => {
            let converted = page
                .evaluate(&format!(
                    "({MARKDOWN_JS})(document.body || document.documentElement, {})",
                    agent.config.max_output_bytes
                ))
                .await?;
            let mut data = location(page).await?;
            data["markdown"] = converted["markdown"].clone();
            data["truncated"] = converted["truncated"].clone();
            Ok(data)
        }
        Action::Elements => Ok(page
            .evaluate(&format!(
                "({ELEMENTS_JS}).map((e, index) => ({{index, tag: e.tagName.toLowerCase(), \
                 type: e.type || null, text: (e.innerText || e.value || e.placeholder || '').slice(0, 200), \
                 href: e.href || null, id: e.id || null, name: e.name || null}}))"
            ))
            .await?),
        Action::Evaluate(req) => Ok(page.evaluate(&req.expression).await?),
        Action::FindText(req) => {
            if req.keyword.is_empty() {
                return Err(PageError::Invalid("keyword must not be empty".into()));
            }
            Ok(page
                .evaluate(&format!(
                    "(() => {{ const k = {}; const out = []; const w = document.createTreeWalker(\
                     document.body || document.documentElement, NodeFilter.SHOW_TEXT); \
                     while (w.nextNode() && out.length < 100) {{ const t = w.currentNode.textContent; \
                     const at = t.indexOf(k); if (at >= 0) out.push({{text: t.trim().slice(0, 200), \
                     tag: w.currentNode.parentElement ? w.currentNode.parentElement.tagName.toLowerCase() : null}}); }} \
                     return out; }})()",
                    js_literal(&req.keyword)
                ))
                .await?)
        }
        Action::Wait(req) => {
            let limit = seconds(req.timeout, 30.0, max)?;
            let expression = match req.kind.as_str() {
                "timeout" => {
                    tokio::time::sleep(limit).await;
                    return Ok(Value::Null);
                }
                "load" | "network_idle" => "document.readyState === 'complete'".to_string(),
                "selector" => {
                    let selector = req.selector.as_ref().ok_or_else(|| {
                        PageError::Invalid("`selector` is required for type selector".into())
                    })?;
                    let el = format!("document.querySelector({})", js_literal(selector));
                    match req.state.as_deref().unwrap_or("visible") {
                        "attached" => format!("!!{el}"),
                        "detached" => format!("!{el}"),
                        "hidden" => format!(
                            "(() => {{ const e = {el}; return !e || !(e.getClientRects().length); }})()"
                        ),
                        "visible" => format!(
                            "(() => {{ const e = {el}; return !!e && e.getClientRects().length > 0; }})()"
                        ),
                        s => return Err(PageError::Invalid(format!("unknown state {s:?}"))),
                    }
                }
                "url" => match (&req.url, &req.url_pattern) {
                    (Some(url), _) => format!("location.href === {}", js_literal(url)),
                    (None, Some(part)) => format!("location.href.includes({})", js_literal(part)),
                    (None, None) => {
                        return Err(PageError::Invalid(
                            "`url` or `url_pattern` is required for type url".into(),
                        ))
                    }
                },
                "function" => req.expression.clone().ok_or_else(|| {
                    PageError::Invalid("`expression` is required for type function".into())
                })?,
                other => {
                    return Err(PageError::Invalid(format!(
                        "wait type {other:?} is not served by this image"
                    )))
                }
            };
            wait_for(page, &expression, limit).await?;
            Ok(Value::Null)
        }
    }
}

/// Fills every item, after finding all their elements (a missing one fills nothing).
async fn fill_form(page: &mut Page, req: &FormFillRequest) -> Result<Value, PageError> {
    if req.items.is_empty() || req.items.len() > MAX_FORM_ITEMS {
        return Err(PageError::Invalid(format!(
            "items must hold 1 to {MAX_FORM_ITEMS} fields"
        )));
    }
    let elements = req
        .items
        .iter()
        .map(|item| element_js(&item.target))
        .collect::<Result<Vec<_>, _>>()?
        .join(", ");
    let values: Vec<&Value> = req.items.iter().map(|item| &item.value).collect();
    let result = page
        .evaluate(&format!(
            "(() => {{ const els = [{elements}]; const values = {}; \
             const missing = els.findIndex((e) => !e); if (missing >= 0) return {{missing}}; \
             return {{values: els.map((el, i) => ({FILL_JS})(el, values[i]))}}; }})()",
            js_literal(&values)
        ))
        .await?;
    if let Some(missing) = result["missing"].as_u64() {
        let item = &req.items[missing as usize];
        return Err(PageError::NoElement(format!(
            "{} (item {missing})",
            describe(&item.target)
        )));
    }
    Ok(json!({"filled": req.items.len(), "values": result["values"]}))
}

/// Sets the files of the file input `selector` to workspace files (each a regular file
/// inside the workspace; Chromium reads them itself, as the same user).
async fn upload_file(
    agent: &Agent,
    page: &mut Page,
    req: &UploadFileRequest,
) -> Result<Value, PageError> {
    if req.files.is_empty() || req.files.len() > MAX_UPLOAD_FILES {
        return Err(PageError::Invalid(format!(
            "files must name 1 to {MAX_UPLOAD_FILES} files"
        )));
    }
    let mut paths = Vec::with_capacity(req.files.len());
    for file in &req.files {
        let path = agent.workspace.resolve(file)?;
        let meta = std::fs::symlink_metadata(&path).map_err(io("stat", &path))?;
        if !meta.is_file() {
            return Err(PageError::Invalid(format!("{file} is not a regular file")));
        }
        paths.push(path.display().to_string());
    }
    let element = format!("document.querySelector({})", js_literal(&req.selector));
    let kind = page
        .evaluate(&format!(
            "(() => {{ const el = {element}; if (!el) return null; \
             return el.tagName === 'INPUT' && el.type === 'file' ? (el.multiple ? 'many' : 'one') : 'other'; }})()"
        ))
        .await?;
    match kind.as_str() {
        None => return Err(PageError::NoElement(format!("selector {:?}", req.selector))),
        Some("other") => {
            return Err(PageError::Invalid(format!(
                "selector {:?} is not a file input",
                req.selector
            )))
        }
        Some("one") if paths.len() > 1 => {
            return Err(PageError::Invalid(format!(
                "the file input {:?} takes one file (no `multiple`)",
                req.selector
            )))
        }
        Some(_) => {}
    }
    let handle = page
        .call("Runtime.evaluate", json!({"expression": element}))
        .await?;
    let object = handle["result"]["objectId"].clone();
    page.call(
        "DOM.setFileInputFiles",
        json!({"files": paths, "objectId": object}),
    )
    .await?;
    let names = page
        .evaluate(&format!("[...{element}.files].map((f) => f.name)"))
        .await?;
    Ok(json!({"files": names}))
}

/// `GET /v1/browser/screenshot` and `/v1/browser/page/screenshot`: the page as PNG or JPEG
/// (`full_page`: the whole document, not only the viewport).
pub async fn screenshot(
    agent: &Agent,
    format: &str,
    quality: Option<u8>,
    full_page: bool,
) -> Reply {
    let (format, mime) = match format {
        "png" => (ImageFormat::Png, "image/png"),
        "jpg" | "jpeg" => (ImageFormat::Jpeg(quality), "image/jpeg"),
        f => {
            return error(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("format {f:?} is not png, jpg or jpeg"),
            )
        }
    };
    let _one_at_a_time = agent.page_lock.lock().await;
    let shot = async {
        let mut page = page(agent).await?;
        Ok::<_, PageError>(page.screenshot(format, full_page).await?)
    };
    match shot.await {
        Ok(bytes) => {
            let mut res = Response::new(Full::new(Bytes::from(bytes)));
            res.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(mime));
            res
        }
        Err(e) => error(e.status(), error_chain(&e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_reach_the_page_as_string_literals() {
        let target = Target {
            selector: Some("a'); alert(1); ('".into()),
            ..Default::default()
        };
        assert_eq!(
            element_js(&target).unwrap(),
            r#"document.querySelector("a'); alert(1); ('")"#
        );
        assert!(matches!(
            element_js(&Target::default()),
            Err(PageError::Invalid(_))
        ));
    }
}
