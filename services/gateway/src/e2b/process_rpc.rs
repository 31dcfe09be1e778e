//! `process.Process/*`: each method to the module that serves it. Above the process modules,
//! so none of them imports another back to reach a sibling.

use axum::extract::Request;

use super::connect::{self, Shape};
use super::process::{self, StartRequest};
use super::{process_streams, processes, E2bError, E2bReply, Sandbox};
use crate::api::App;

/// One `process.Process` call.
pub async fn serve(app: &App, method: &str, req: Request) -> E2bReply {
    let sandbox = Sandbox::from_headers(app, req.headers()).await?;
    match method {
        "Start" => start(app, sandbox, req).await,
        "Connect" => process_streams::connect(sandbox, req).await,
        "List" => processes::list(sandbox, req).await,
        "SendInput" => processes::send_input(sandbox, req).await,
        "SendSignal" => processes::send_signal(sandbox, req).await,
        "Update" => processes::update(sandbox, req).await,
        "StreamInput" => Err(E2bError::unsupported(
            "process.Process/StreamInput (a client stream; send input with SendInput)",
        )),
        other => Err(E2bError::unsupported(&format!("process.Process/{other}"))),
    }
}

/// Every command is a session process, as every command is envd's: `commands.run` waits on
/// its stream, `background=True` keeps the handle — the two send the same `Start`.
async fn start(app: &App, sandbox: Sandbox, req: Request) -> E2bReply {
    let wait = process::wait(app, req.headers());
    let keepalive = process::keepalive(req.headers());
    let start: StartRequest = connect::request(req, Shape::ServerStream).await?;
    process_streams::start(sandbox, start, wait, keepalive)
}
