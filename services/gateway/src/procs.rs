//! A session's background processes over HTTP (`sandbox.v1.proc.*` on the key's tenant
//! connection): start, list, read output (a long poll with `wait_ms`), write input, kill; and a
//! terminal over a WebSocket (`/api/v1/sessions/{id}/procs/{proc_id}/ws`).
//!
//! The WebSocket speaks JSON text messages: in, `{type: "input", data}`, `{type: "resize",
//! cols, rows}`, `{type: "ping"}`; out, `{type: "output", seq, data}` (the process's output
//! from its first kept chunk, then live), `{type: "exit", exit_code, signal, state}` (then the
//! socket closes) and `{type: "pong"}`. Output that is not UTF-8 comes as `data_base64`.
//! The upgrade is hyper's; the frames are async-tungstenite's (already in the tree through
//! the CDP client), so no second WebSocket stack is added.

use std::sync::Arc;
use std::time::Duration;

use async_tungstenite::tungstenite::handshake::derive_accept_key;
use async_tungstenite::tungstenite::protocol::Role;
use async_tungstenite::tungstenite::Message;
use async_tungstenite::WebSocketStream;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use futures::StreamExt;
use hyper_util::rt::TokioIo;
use messages::exec::ContentEncoding;
use messages::proc::{
    ProcChunk, ProcEvent, ProcInfo, ProcInput, ProcInputAck, ProcList, ProcOutput,
    ProcOutputRequest, ProcSignalKind, ProcStart, ProcStarted, ProcState, MAX_WAIT_MS,
};
use sandmesh_client::MeshClient;
use serde::{Deserialize, Serialize};

use crate::api::{Agent, App, Body as JsonBody, Params, QueryOf};
use crate::problem::{Errors, Problem, Reply};

/// Starts a background process in the session (`cmd` or `argv`, `cwd`, `env`, `stdin`,
/// `pty: {cols, rows}`, `tag`, `timeout_ms`). It is assessed as shell code; one that needs a
/// person's approval answers once decided.
#[utoipa::path(
    post,
    path = "/api/v1/sessions/{id}/processes",
    operation_id = "start_process",
    params(("id" = String, Path, description = "the session id", pattern = r"^[A-Za-z0-9_-]{1,64}$")),
    request_body = ProcStart,
    responses((status = 201, description = "the process", body = ProcStarted), Errors)
)]
pub async fn start(
    State(app): State<Arc<App>>,
    agent: Agent,
    Params(id): Params<String>,
    JsonBody(mut body): JsonBody<serde_json::Value>,
) -> Reply {
    let object = body
        .as_object_mut()
        .ok_or_else(|| Problem::bad_request("the body: expected a JSON object"))?;
    object.insert("session_id".into(), serde_json::Value::String(id));
    let start: ProcStart =
        messages::Encoding::decode_json_value(body).map_err(|e| Problem::of_body(&e))?;
    let started = agent
        .mesh
        .procs()
        .start(&start, Some(app.limits.exec_timeout))
        .await?;
    Ok((StatusCode::CREATED, Json(started)).into_response())
}

/// The session's processes, oldest first.
#[utoipa::path(
    get,
    path = "/api/v1/sessions/{id}/processes",
    operation_id = "list_processes",
    params(("id" = String, Path, description = "the session id", pattern = r"^[A-Za-z0-9_-]{1,64}$")),
    responses((status = 200, description = "the processes", body = ProcList), Errors)
)]
pub async fn list(agent: Agent, Params(id): Params<String>) -> Reply {
    let procs = agent.mesh.procs().list(&id).await?;
    Ok(Json(ProcList { procs }).into_response())
}

#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct OutputQuery {
    /// The first chunk wanted (0: the oldest kept).
    #[serde(default)]
    pub from_seq: u64,
    /// With nothing new from `from_seq` yet, wait this long for it (at most 30000).
    #[serde(default)]
    pub wait_ms: u64,
}

/// The process's kept output from `from_seq` (a page: continue from `next_seq`); with
/// `wait_ms`, a long poll for output not there yet.
#[utoipa::path(
    get,
    path = "/api/v1/sessions/{id}/processes/{proc_id}/output",
    operation_id = "process_output",
    params(
        ("id" = String, Path, description = "the session id", pattern = r"^[A-Za-z0-9_-]{1,64}$"),
        ("proc_id" = String, Path, description = "the process id", pattern = r"^[A-Za-z0-9_-]{1,64}$"),
        OutputQuery,
    ),
    responses((status = 200, description = "its output", body = ProcOutput), Errors)
)]
pub async fn output(
    agent: Agent,
    Params((id, proc_id)): Params<(String, String)>,
    QueryOf(q): QueryOf<OutputQuery>,
) -> Reply {
    if q.wait_ms > MAX_WAIT_MS {
        return Err(Problem::bad_request(format!(
            "wait_ms: at most {MAX_WAIT_MS}"
        )));
    }
    let req = ProcOutputRequest {
        session_id: id,
        proc_id: proc_id.clone(),
        from_seq: q.from_seq,
        max_bytes: None,
    };
    let procs = agent.mesh.procs();
    let first = procs.output(&req).await?;
    if q.wait_ms == 0 || !first.chunks.is_empty() || first.state != ProcState::Running {
        return Ok(Json(first).into_response());
    }
    // Subscribed before looking again, so nothing between the two reads is missed.
    let mut events = procs.events(&proc_id).await?;
    let again = procs.output(&req).await?;
    if !again.chunks.is_empty() || again.state != ProcState::Running {
        return Ok(Json(again).into_response());
    }
    let _ = tokio::time::timeout(Duration::from_millis(q.wait_ms), events.next()).await;
    Ok(Json(procs.output(&req).await?).into_response())
}

/// `POST …/input`'s body.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InputBody {
    #[serde(default)]
    pub data: String,
    #[serde(default)]
    pub encoding: ContentEncoding,
    /// Close stdin after `data`.
    #[serde(default)]
    pub eof: bool,
    #[serde(default)]
    pub seq: Option<u64>,
}

/// Writes to the process's stdin (or terminal).
#[utoipa::path(
    post,
    path = "/api/v1/sessions/{id}/processes/{proc_id}/input",
    operation_id = "process_input",
    params(
        ("id" = String, Path, description = "the session id", pattern = r"^[A-Za-z0-9_-]{1,64}$"),
        ("proc_id" = String, Path, description = "the process id", pattern = r"^[A-Za-z0-9_-]{1,64}$"),
    ),
    request_body = InputBody,
    responses((status = 200, description = "written", body = ProcInputAck), Errors)
)]
pub async fn input(
    agent: Agent,
    Params((id, proc_id)): Params<(String, String)>,
    JsonBody(body): JsonBody<InputBody>,
) -> Reply {
    let req = ProcInput {
        session_id: id,
        proc_id,
        data: body.data,
        encoding: body.encoding,
        eof: body.eof,
        seq: body.seq,
    };
    Ok(Json(agent.mesh.procs().input(&req).await?).into_response())
}

/// Kills the process (SIGKILL to its group); answers it as it is then.
#[utoipa::path(
    delete,
    path = "/api/v1/sessions/{id}/processes/{proc_id}",
    operation_id = "kill_process",
    params(
        ("id" = String, Path, description = "the session id", pattern = r"^[A-Za-z0-9_-]{1,64}$"),
        ("proc_id" = String, Path, description = "the process id", pattern = r"^[A-Za-z0-9_-]{1,64}$"),
    ),
    responses((status = 200, description = "signalled", body = ProcInfo), Errors)
)]
pub async fn kill(agent: Agent, Params((id, proc_id)): Params<(String, String)>) -> Reply {
    let info = agent
        .mesh
        .procs()
        .signal(&id, &proc_id, ProcSignalKind::Kill)
        .await?;
    Ok(Json(info).into_response())
}

// === the terminal ===

/// What a terminal's client sends.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ClientFrame {
    Input { data: String },
    Resize { cols: u16, rows: u16 },
    Ping,
}

/// What the terminal sends its client.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ServerFrame {
    Output {
        seq: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        data: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        data_base64: Option<String>,
    },
    Exit {
        state: ProcState,
        exit_code: Option<i32>,
        signal: Option<i32>,
    },
    Pong,
    Error {
        message: String,
    },
}

impl ServerFrame {
    fn output(chunk: &ProcChunk) -> Self {
        let (data, data_base64) = match chunk.encoding {
            ContentEncoding::Utf8 => (Some(chunk.data.clone()), None),
            _ => (None, Some(chunk.data.clone())),
        };
        ServerFrame::Output {
            seq: chunk.seq,
            data,
            data_base64,
        }
    }

    fn exit(info: &ProcInfo) -> Self {
        ServerFrame::Exit {
            state: info.state,
            exit_code: info.exit_code,
            signal: info.signal,
        }
    }

    fn message(&self) -> Message {
        Message::text(serde_json::to_string(self).expect("a frame serialises"))
    }
}

/// The largest message a terminal's client may send.
const MAX_CLIENT_MESSAGE: usize = 256 * 1024;

/// `GET /api/v1/sessions/{id}/procs/{proc_id}/ws`: a WebSocket to the process (a terminal when
/// it was started with `pty`).
pub async fn terminal(
    agent: Agent,
    Params((id, proc_id)): Params<(String, String)>,
    req: Request,
) -> Reply {
    let key = req
        .headers()
        .get(header::SEC_WEBSOCKET_KEY)
        .and_then(|k| k.to_str().ok())
        .map(str::to_string);
    let upgrade = req
        .headers()
        .get(header::UPGRADE)
        .and_then(|u| u.to_str().ok())
        .is_some_and(|u| u.eq_ignore_ascii_case("websocket"));
    let (Some(key), true) = (key, upgrade) else {
        return Err(Problem::bad_request(
            "a WebSocket upgrade is expected (Upgrade: websocket, Sec-WebSocket-Key)",
        ));
    };
    // The process must exist for this tenant before anything is upgraded.
    let procs = agent.mesh.procs();
    let known = procs.list(&id).await?;
    if !known.iter().any(|p| p.proc_id == proc_id) {
        return Err(Problem::not_found(format!(
            "no process {proc_id} in session {id}"
        )));
    }
    let on_upgrade = hyper::upgrade::on(req);
    let mesh = agent.mesh.clone();
    tokio::spawn(async move {
        let Ok(upgraded) = on_upgrade.await else {
            return;
        };
        let config = async_tungstenite::tungstenite::protocol::WebSocketConfig::default()
            .max_message_size(Some(MAX_CLIENT_MESSAGE))
            .max_frame_size(Some(MAX_CLIENT_MESSAGE));
        let socket = WebSocketStream::from_raw_socket(
            async_tungstenite::tokio::TokioAdapter::new(TokioIo::new(upgraded)),
            Role::Server,
            Some(config),
        )
        .await;
        if let Err(e) = serve_terminal(socket, mesh, id, proc_id).await {
            tracing::debug!(error = %e, "terminal ended");
        }
    });
    let mut response = StatusCode::SWITCHING_PROTOCOLS.into_response();
    let headers = response.headers_mut();
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    let accept = derive_accept_key(key.as_bytes());
    headers.insert(
        header::SEC_WEBSOCKET_ACCEPT,
        HeaderValue::from_str(&accept).map_err(|_| Problem::bad_request("Sec-WebSocket-Key"))?,
    );
    Ok(response)
}

type Socket =
    WebSocketStream<async_tungstenite::tokio::TokioAdapter<TokioIo<hyper::upgrade::Upgraded>>>;

async fn serve_terminal(
    mut socket: Socket,
    mesh: MeshClient,
    session: String,
    proc_id: String,
) -> Result<(), async_tungstenite::tungstenite::Error> {
    let procs = mesh.procs();
    // Live events first, then what came before them: seqs join the two without a gap.
    let mut events = match procs.events(&proc_id).await {
        Ok(events) => events,
        Err(e) => return say_error(&mut socket, &e.to_string()).await,
    };
    let mut next_seq = 0;
    loop {
        let req = ProcOutputRequest {
            session_id: session.clone(),
            proc_id: proc_id.clone(),
            from_seq: next_seq,
            max_bytes: None,
        };
        let page = match procs.output(&req).await {
            Ok(page) => page,
            Err(e) => return say_error(&mut socket, &e.to_string()).await,
        };
        for chunk in &page.chunks {
            socket.send(ServerFrame::output(chunk).message()).await?;
        }
        let done = page.chunks.is_empty() || page.next_seq == next_seq;
        next_seq = page.next_seq;
        if done {
            break;
        }
    }
    loop {
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(ProcEvent::Output(chunk))) if chunk.seq >= next_seq => {
                    next_seq = chunk.seq + 1;
                    socket.send(ServerFrame::output(&chunk).message()).await?;
                }
                Some(Ok(ProcEvent::Output(_))) => {}
                Some(Ok(ProcEvent::Ended(info))) => {
                    socket.send(ServerFrame::exit(&info).message()).await?;
                    return socket.close(None).await;
                }
                Some(Err(e)) => return say_error(&mut socket, &e.to_string()).await,
                None => return socket.close(None).await,
            },
            message = socket.next() => {
                let text = match message {
                    Some(Ok(Message::Text(text))) => text,
                    Some(Ok(Message::Close(_))) | None => return Ok(()),
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => return Err(e),
                };
                let frame = match serde_json::from_str::<ClientFrame>(&text) {
                    Ok(frame) => frame,
                    Err(e) => {
                        socket.send(ServerFrame::Error { message: format!("not a terminal message: {e}") }.message()).await?;
                        continue;
                    }
                };
                let answered = match frame {
                    ClientFrame::Ping => {
                        socket.send(ServerFrame::Pong.message()).await?;
                        Ok(())
                    }
                    ClientFrame::Resize { cols, rows } => {
                        procs.resize(&session, &proc_id, cols, rows).await.map(|_| ())
                    }
                    ClientFrame::Input { data } => {
                        let input = ProcInput {
                            session_id: session.clone(),
                            proc_id: proc_id.clone(),
                            data,
                            encoding: ContentEncoding::Utf8,
                            eof: false,
                            // One client, each input answered before the next: arrival order.
                            seq: None,
                        };
                        procs.input(&input).await.map(|_| ())
                    }
                };
                if let Err(e) = answered {
                    let message = e.service_error().map_or_else(|| e.to_string(), |b| b.message.clone());
                    socket.send(ServerFrame::Error { message }.message()).await?;
                }
            }
        }
    }
}

async fn say_error(
    socket: &mut Socket,
    message: &str,
) -> Result<(), async_tungstenite::tungstenite::Error> {
    let frame = ServerFrame::Error {
        message: message.to_string(),
    };
    socket.send(frame.message()).await?;
    socket.close(None).await
}
