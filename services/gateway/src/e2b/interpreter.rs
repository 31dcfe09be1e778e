//! The code interpreter's `POST /execute`: a cell of the session's kernel, answered as JSON
//! lines — `stdout` / `stderr` as the output comes, then the cell's typed outputs as `result`
//! lines (keyed by E2B's names for their MIME types, the cell's value `is_main_result`), and
//! an `error` line (name, value, traceback) when the cell raised. The body simply ends.
//!
//! A cell that waits for a person's approval says so at once on stderr (`awaiting approval
//! <confirmation id>`); a denial ends with `error{name: "Denied"}`.

use std::collections::BTreeMap;

use axum::body::Body;
use axum::http::{header, HeaderValue};
use axum::response::Response;
use base64::Engine;
use bytes::Bytes;
use futures::{stream, SinkExt, StreamExt};
use messages::exec::{
    ExecRequest, ExecResult, ExecStatus, Language, OutputKind, OutputStream, RichOutput,
};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{awaiting_line, E2bError, E2bReply, Sandbox};
use crate::api::{App, Body as JsonBody};
use crate::problem::Problem;
use crate::stream::ExecEvent;

#[derive(Debug, Deserialize)]
pub struct ExecuteRequest {
    pub code: String,
    #[serde(default)]
    pub context_id: Option<String>,
    #[serde(default)]
    pub language: Option<String>,
    #[serde(default)]
    pub env_vars: Option<BTreeMap<String, String>>,
}

fn language(name: Option<&str>) -> Result<Language, E2bError> {
    match name.map(str::to_ascii_lowercase).as_deref() {
        None | Some("python") | Some("py") => Ok(Language::Python),
        Some("js") | Some("javascript") => Ok(Language::Javascript),
        Some(other) => Err(E2bError::unsupported(&format!(
            "a {other} kernel (python and javascript run)"
        ))),
    }
}

pub async fn execute(
    axum::extract::State(app): axum::extract::State<std::sync::Arc<App>>,
    sandbox: Sandbox,
    body: Result<JsonBody<ExecuteRequest>, Problem>,
) -> E2bReply {
    let JsonBody(cell) = body?;
    if cell.context_id.is_some() {
        return Err(E2bError::unsupported(
            "code contexts other than the default",
        ));
    }
    let req = ExecRequest {
        session_id: Some(sandbox.id.clone()),
        language: language(cell.language.as_deref())?,
        code: cell.code,
        env: cell.env_vars.unwrap_or_default(),
        kernel: true,
        requested_by: Some(format!("e2b key {}", sandbox.agent.caller.key_id)),
        ..Default::default()
    };
    let mesh = sandbox.agent.mesh.clone();
    let mut events = crate::stream::events(mesh, req, app.limits.exec_timeout).await?;
    // A failure before anything ran (no such session, over a quota, …) is the response's
    // status; from the first sign of life on, everything is a line of the body.
    let first = match events.next().await {
        Some(ExecEvent::Done(outcome)) => match *outcome {
            Err(e) => return Err(e.into()),
            ok => Some(ExecEvent::Done(Box::new(ok))),
        },
        other => other,
    };
    let workspace = sandbox.agent.mesh.workspace();
    let session = sandbox.id;
    let (mut lines, body) = futures::channel::mpsc::channel::<Bytes>(BACKLOG);
    tokio::spawn(async move {
        let mut logs = Logs::default();
        let mut events = stream::iter(first).chain(events);
        while let Some(event) = events.next().await {
            let text = match event {
                ExecEvent::Output(chunk) => logs.add(chunk.stream, &chunk.data),
                ExecEvent::Awaiting(notice) => {
                    log("stderr", &awaiting_line(&notice.confirmation_id))
                }
                ExecEvent::Done(outcome) => {
                    let mut text = logs.flush();
                    text.push_str(&match *outcome {
                        Ok(result) => finished(&result, &workspace, &session).await,
                        Err(e) => {
                            let p = Problem::from(e);
                            error_line(&p.kind, &p.detail, "")
                        }
                    });
                    text
                }
            };
            // A failed send: the caller went away, and the cell goes on to its result.
            if !text.is_empty() && lines.send(Bytes::from(text)).await.is_err() {
                return;
            }
        }
    });
    let mut response = Response::new(Body::from_stream(
        body.map(Ok::<_, std::convert::Infallible>),
    ));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    Ok(response)
}

/// Lines a slow reader may fall behind before the relay waits for it.
const BACKLOG: usize = 64;

/// The cell's output cut into whole lines, as a notebook's stream messages come (the kernel's
/// writes arrive as they were made: `print` writes its text and its newline apart).
#[derive(Default)]
struct Logs {
    stdout: String,
    stderr: String,
}

impl Logs {
    /// The `stdout` / `stderr` line for the complete lines `data` finishes.
    fn add(&mut self, stream: OutputStream, data: &str) -> String {
        let (kind, pending) = match stream {
            OutputStream::Stdout => ("stdout", &mut self.stdout),
            OutputStream::Stderr => ("stderr", &mut self.stderr),
        };
        pending.push_str(data);
        match pending.rfind('\n') {
            Some(end) => {
                let rest = pending.split_off(end + 1);
                let whole = std::mem::replace(pending, rest);
                log(kind, &whole)
            }
            None => String::new(),
        }
    }

    /// What is left without a newline, at the cell's end.
    fn flush(&mut self) -> String {
        let mut out = String::new();
        for (kind, pending) in [("stdout", &mut self.stdout), ("stderr", &mut self.stderr)] {
            if !pending.is_empty() {
                out.push_str(&log(kind, &std::mem::take(pending)));
            }
        }
        out
    }
}

fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

fn line(value: Value) -> String {
    let mut text = value.to_string();
    text.push('\n');
    text
}

fn log(kind: &str, text: &str) -> String {
    line(json!({"type": kind, "text": text, "timestamp": now_ns() as u64}))
}

fn error_line(name: &str, value: &str, traceback: &str) -> String {
    line(json!({"type": "error", "name": name, "value": value, "traceback": traceback}))
}

/// The lines of a finished cell: its results, then its error if it failed.
async fn finished(
    result: &ExecResult,
    workspace: &sandmesh_client::WorkspaceClient,
    session: &str,
) -> String {
    let mut out = String::new();
    if result.state_lost {
        out.push_str(&log(
            "stderr",
            "the kernel was restarted before this cell: earlier variables are gone\n",
        ));
    }
    for group in results(&result.outputs, workspace, session).await {
        out.push_str(&line(Value::Object(group)));
    }
    let reason = || {
        result
            .confirmation
            .reason
            .clone()
            .or_else(|| result.error.as_ref().map(|e| e.message.clone()))
            .unwrap_or_default()
    };
    match (&result.cell_error, result.status) {
        (Some(e), _) => {
            // Jupyter's entries may end with their newline or not; one newline each.
            let traceback: String = e
                .traceback
                .iter()
                .map(|l| format!("{}\n", l.trim_end_matches('\n')))
                .collect();
            out.push_str(&error_line(&e.name, &e.value, &traceback))
        }
        (None, ExecStatus::Ok) => {}
        (None, ExecStatus::Denied) => out.push_str(&error_line("Denied", &reason(), "")),
        (None, status) => out.push_str(&error_line(
            status_name(status),
            &reason(),
            result.stderr.trim_end(),
        )),
    }
    out
}

fn status_name(status: ExecStatus) -> &'static str {
    match status {
        ExecStatus::Timeout => "TimeoutError",
        ExecStatus::Oom => "MemoryError",
        ExecStatus::Rejected => "Rejected",
        _ => "ExecutionError",
    }
}

/// E2B's name for a MIME type of a result; others go under `extra`.
fn key_of(mime: &str) -> Option<&'static str> {
    Some(match mime {
        "text/plain" => "text",
        "text/html" => "html",
        "text/markdown" => "markdown",
        "image/svg+xml" => "svg",
        "image/png" => "png",
        "image/jpeg" => "jpeg",
        "application/pdf" => "pdf",
        "text/latex" => "latex",
        "application/json" => "json",
        "application/javascript" => "javascript",
        _ => return None,
    })
}

/// The cell's outputs as E2B's results: consecutive outputs of one kind are one result (one
/// MIME bundle, as the kernel sends a bundle's types one after another) until a type repeats.
async fn results(
    outputs: &[RichOutput],
    workspace: &sandmesh_client::WorkspaceClient,
    session: &str,
) -> Vec<Map<String, Value>> {
    let mut groups: Vec<(OutputKind, Map<String, Value>)> = Vec::new();
    for output in outputs {
        let Some(value) = content(output, workspace, session).await else {
            continue;
        };
        let key = key_of(&output.mime_type);
        let fresh = match groups.last() {
            Some((kind, group)) => {
                *kind != output.kind
                    || key.is_some_and(|k| group.contains_key(k))
                    || key.is_none() && has_extra(group, &output.mime_type)
            }
            None => true,
        };
        if fresh {
            let mut group = Map::new();
            group.insert("type".into(), "result".into());
            group.insert(
                "is_main_result".into(),
                (output.kind == OutputKind::Result).into(),
            );
            groups.push((output.kind, group));
        }
        let (_, group) = groups.last_mut().expect("a group");
        match key {
            Some(key) => {
                group.insert(key.into(), value);
            }
            None => {
                let extra = group
                    .entry("extra")
                    .or_insert_with(|| Value::Object(Map::new()));
                if let Value::Object(extra) = extra {
                    extra.insert(output.mime_type.clone(), value);
                }
            }
        }
    }
    groups.into_iter().map(|(_, g)| g).collect()
}

fn has_extra(group: &Map<String, Value>, mime: &str) -> bool {
    group
        .get("extra")
        .and_then(Value::as_object)
        .is_some_and(|e| e.contains_key(mime))
}

/// An output's value as E2B carries it: base64 for images and PDFs, parsed JSON for JSON,
/// text otherwise. A large output the kernel left in the workspace is read from there.
async fn content(
    output: &RichOutput,
    workspace: &sandmesh_client::WorkspaceClient,
    session: &str,
) -> Option<Value> {
    let binary = matches!(
        output.mime_type.as_str(),
        "image/png" | "image/jpeg" | "application/pdf"
    );
    let b64 = base64::engine::general_purpose::STANDARD;
    let text = match (&output.content, &output.path) {
        (Some(content), _) => {
            let is_b64 = output.encoding == messages::exec::ContentEncoding::Base64;
            match (binary, is_b64) {
                (false, true) => String::from_utf8_lossy(&b64.decode(content).ok()?).into_owned(),
                (true, false) => b64.encode(content),
                _ => content.clone(),
            }
        }
        (None, Some(path)) => {
            let bytes = workspace.read(session, path).await.ok()?;
            match binary {
                true => b64.encode(bytes),
                false => String::from_utf8_lossy(&bytes).into_owned(),
            }
        }
        (None, None) => return None,
    };
    if output.mime_type == "application/json" {
        return Some(serde_json::from_str(&text).unwrap_or(Value::String(text)));
    }
    Some(Value::String(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_goes_out_in_whole_lines() {
        let mut logs = Logs::default();
        assert_eq!(logs.add(OutputStream::Stdout, "set"), "");
        let line: Value = serde_json::from_str(&logs.add(OutputStream::Stdout, "\nne")).unwrap();
        assert_eq!(
            (&line["type"], &line["text"]),
            (&json!("stdout"), &json!("set\n"))
        );
        let rest: Value = serde_json::from_str(&logs.flush()).unwrap();
        assert_eq!(rest["text"], "ne");
        assert_eq!(logs.flush(), "");
    }
}
