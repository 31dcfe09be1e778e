//! `GET /v1/browser/page/console` and `POST /v1/browser/page/console/export`: the current
//! page's console, kept between calls.
//!
//! A listener task holds its own CDP connection to the page the page actions use
//! ([`Console::follow`], called whenever an action connects), with `Runtime` and `Log`
//! enabled: `console.*` calls, uncaught exceptions and the browser's own log entries (failed
//! loads, violations) go into a ring bounded in entries and bytes, oldest dropped first.
//! Enabling `Runtime` replays the messages the page logged before the listener attached, so
//! a page opened by a client over CDP is covered from its start. When the actions move to
//! another page (the first one closed), the listener follows; entries already kept stay.
//!
//! A read first asks the listener for a round trip on its own connection: events reach each
//! CDP session in order, so everything the page logged before the read is in the ring when
//! the read looks.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cdp::Page;
use hyper::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::api::Envelope;
use crate::files::error_chain;
use crate::page::{page, PageError};
use crate::reply::{error, json, Reply};
use crate::Agent;

/// Entries kept at most, and their text's bytes.
const MAX_ENTRIES: usize = 1000;
const MAX_BYTES: usize = 1 << 20;
/// One entry's text is cut here (a page logging megabytes keeps the rest of the ring).
const MAX_TEXT_BYTES: usize = 8 << 10;
/// Bound of the listener's own commands, and of a read's wait for its round trip.
const LISTENER_LIMIT: Duration = Duration::from_secs(10);

/// One console message.
#[derive(Debug, Clone, Serialize)]
pub struct ConsoleEntry {
    /// `log`, `info`, `warning`, `error`, `debug`, ... (`console.warn` is `warning`, CDP's
    /// name).
    #[serde(rename = "type")]
    pub kind: String,
    pub text: String,
    /// `console`, `exception`, or the browser's log source (`network`, `violation`, ...).
    pub source: String,
    pub url: Option<String>,
    pub line: Option<u64>,
    /// Milliseconds since the Unix epoch.
    pub timestamp: f64,
}

#[derive(Debug, Deserialize)]
pub struct ExportConsoleLogsRequest {
    pub save_path: String,
    #[serde(default)]
    pub clear: bool,
}

/// The ring and the listener filling it.
pub struct Console {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    entries: VecDeque<ConsoleEntry>,
    /// Text bytes of `entries`, for the byte bound.
    bytes: usize,
    listener: Option<Listener>,
}

/// The task attached to one page; a finished one is replaced on the next `follow`.
struct Listener {
    target: String,
    task: JoinHandle<()>,
    /// Round-trip requests: answered once the events before them are in the ring.
    sync: mpsc::Sender<oneshot::Sender<()>>,
}

impl Console {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State::default()),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves a ring that is still a valid ring.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes sure a listener is attached to `target` (a page id of Chromium on `port`).
    pub fn follow(self: &Arc<Self>, port: u16, target: &str) {
        let mut state = self.state();
        if let Some(listener) = &state.listener {
            if listener.target == target && !listener.task.is_finished() {
                return;
            }
            listener.task.abort();
        }
        let (sync, requests) = mpsc::channel(16);
        let task = tokio::spawn(listen(self.clone(), port, target.to_string(), requests));
        state.listener = Some(Listener {
            target: target.to_string(),
            task,
            sync,
        });
    }

    /// Waits (bounded) until what the page logged so far is in the ring; without a live
    /// listener there is nothing to wait for.
    async fn settle(&self) {
        let Some(sync) = self.state().listener.as_ref().map(|l| l.sync.clone()) else {
            return;
        };
        let (done, settled) = oneshot::channel();
        if sync.send(done).await.is_ok() {
            tokio::time::timeout(LISTENER_LIMIT, settled).await.ok();
        }
    }

    fn push(&self, mut entry: ConsoleEntry) {
        if entry.text.len() > MAX_TEXT_BYTES {
            let mut cut = MAX_TEXT_BYTES;
            while !entry.text.is_char_boundary(cut) {
                cut -= 1;
            }
            entry.text.truncate(cut);
        }
        let mut state = self.state();
        state.bytes += entry.text.len();
        state.entries.push_back(entry);
        while state.entries.len() > MAX_ENTRIES || state.bytes > MAX_BYTES {
            match state.entries.pop_front() {
                Some(old) => state.bytes -= old.text.len(),
                None => break,
            }
        }
    }

    /// The entries kept, oldest first; `clear` empties the ring.
    pub fn entries(&self, clear: bool) -> Vec<ConsoleEntry> {
        let mut state = self.state();
        let entries = state.entries.iter().cloned().collect();
        if clear {
            state.entries.clear();
            state.bytes = 0;
        }
        entries
    }
}

/// Until the page's socket closes (the page or Chromium went away) or the task is aborted.
async fn listen(
    console: Arc<Console>,
    port: u16,
    target: String,
    mut syncs: mpsc::Receiver<oneshot::Sender<()>>,
) {
    let Ok(mut page) = Page::attach(&format!("127.0.0.1:{port}"), &target, LISTENER_LIMIT).await
    else {
        return;
    };
    page.keep_events();
    for domain in ["Runtime.enable", "Log.enable"] {
        if page.call(domain, json!({})).await.is_err() {
            return;
        }
    }
    let keep = |page: &mut Page| {
        page.drain_events()
            .filter_map(|e| entry(&e))
            .for_each(|e| console.push(e))
    };
    keep(&mut page);
    loop {
        tokio::select! {
            event = page.next_event() => match event {
                Ok(event) => {
                    if let Some(entry) = entry(&event) {
                        console.push(entry);
                    }
                }
                Err(_) => return,
            },
            Some(done) = syncs.recv() => {
                if page.evaluate("0").await.is_err() {
                    return;
                }
                keep(&mut page);
                done.send(()).ok();
            }
        }
    }
}

/// The entry a CDP event stands for, if it is a console one.
fn entry(event: &Value) -> Option<ConsoleEntry> {
    let params = &event["params"];
    match event["method"].as_str()? {
        "Runtime.consoleAPICalled" => {
            let frame = &params["stackTrace"]["callFrames"][0];
            let text = params["args"]
                .as_array()
                .map(|args| args.iter().map(argument).collect::<Vec<_>>().join(" "))
                .unwrap_or_default();
            Some(ConsoleEntry {
                kind: params["type"].as_str().unwrap_or("log").to_string(),
                text,
                source: "console".into(),
                url: frame["url"]
                    .as_str()
                    .filter(|u| !u.is_empty())
                    .map(Into::into),
                line: frame["lineNumber"].as_u64(),
                timestamp: params["timestamp"].as_f64().unwrap_or_default(),
            })
        }
        "Runtime.exceptionThrown" => {
            let details = &params["exceptionDetails"];
            let text = details["exception"]["description"]
                .as_str()
                .or_else(|| details["text"].as_str())
                .unwrap_or("exception");
            Some(ConsoleEntry {
                kind: "error".into(),
                text: text.to_string(),
                source: "exception".into(),
                url: details["url"].as_str().map(Into::into),
                line: details["lineNumber"].as_u64(),
                timestamp: params["timestamp"].as_f64().unwrap_or_default(),
            })
        }
        "Log.entryAdded" => {
            let entry = &params["entry"];
            Some(ConsoleEntry {
                kind: entry["level"].as_str().unwrap_or("info").to_string(),
                text: entry["text"].as_str().unwrap_or_default().to_string(),
                source: entry["source"].as_str().unwrap_or("other").to_string(),
                url: entry["url"].as_str().map(Into::into),
                line: entry["lineNumber"].as_u64(),
                timestamp: entry["timestamp"].as_f64().unwrap_or_default(),
            })
        }
        _ => None,
    }
}

/// One `console.*` argument as text: strings as they are, other values as JSON, objects by
/// the description CDP gives (`Array(3)`, `HTMLDivElement`, ...).
fn argument(arg: &Value) -> String {
    match (&arg["value"], arg["description"].as_str()) {
        (Value::String(s), _) => s.clone(),
        (Value::Null, Some(description)) => description.to_string(),
        (Value::Null, None) => arg["type"].as_str().unwrap_or("undefined").to_string(),
        (value, _) => value.to_string(),
    }
}

/// `GET /v1/browser/page/console?clear=`: the listener is attached first, so the first call
/// already returns what the page logged.
pub async fn get(agent: &Agent, clear: bool) -> Reply {
    match attached(agent).await {
        Ok(()) => json(StatusCode::OK, &Envelope::ok(agent.console.entries(clear))),
        Err(e) => error(e.status(), error_chain(&e)),
    }
}

/// `POST /v1/browser/page/console/export`: the entries as a JSON array in a workspace file.
pub async fn export(agent: &Agent, req: ExportConsoleLogsRequest) -> Reply {
    let written = async {
        attached(agent).await?;
        let path = agent.workspace.resolve(&req.save_path)?;
        let entries = agent.console.entries(req.clear);
        let bytes = serde_json::to_vec_pretty(&entries).expect("entries encode");
        agent.workspace.write_bytes(&path, &bytes, false)?;
        Ok::<_, PageError>(json!({"path": path.display().to_string(), "count": entries.len()}))
    };
    match written.await {
        Ok(data) => json(StatusCode::OK, &Envelope::ok(data)),
        Err(e) => error(e.status(), error_chain(&e)),
    }
}

/// Attaches the listener to the current page and waits for what it logged so far.
async fn attached(agent: &Agent) -> Result<(), PageError> {
    page(agent).await?;
    agent.console.settle().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_read_as_a_person_reads_them() {
        assert_eq!(argument(&json!({"type": "string", "value": "hi"})), "hi");
        assert_eq!(argument(&json!({"type": "number", "value": 42})), "42");
        assert_eq!(
            argument(&json!({"type": "object", "description": "Array(3)"})),
            "Array(3)"
        );
        assert_eq!(argument(&json!({"type": "undefined"})), "undefined");
    }

    #[test]
    fn the_ring_keeps_the_newest_within_its_bounds() {
        let console = Console::new();
        let entry = |text: String| ConsoleEntry {
            kind: "log".into(),
            text,
            source: "console".into(),
            url: None,
            line: None,
            timestamp: 0.0,
        };
        for i in 0..MAX_ENTRIES + 5 {
            console.push(entry(format!("{i}")));
        }
        let kept = console.entries(false);
        assert_eq!(kept.len(), MAX_ENTRIES);
        assert_eq!(kept[0].text, "5");
        console.push(entry("x".repeat(MAX_TEXT_BYTES * 4)));
        assert_eq!(
            console.entries(true).last().unwrap().text.len(),
            MAX_TEXT_BYTES
        );
        for _ in 0..(MAX_BYTES / MAX_TEXT_BYTES) + 10 {
            console.push(entry("y".repeat(MAX_TEXT_BYTES)));
        }
        let kept = console.entries(false);
        assert!(kept.iter().map(|e| e.text.len()).sum::<usize>() <= MAX_BYTES);
        assert!(console.entries(true).len() > 1);
        assert!(console.entries(false).is_empty());
    }
}
