//! `Accept: text/event-stream` on execute: the execution's output as it happens, then its
//! result. Events, in order:
//!
//! - `awaiting_confirmation` (an [`AwaitingConfirmation`]): a person must decide first;
//! - `output` (an [`OutputChunk`], `id` = its `seq`): chunks in `seq` order;
//! - `result` (an [`ExecResult`]) or `error` (a [`Problem`]): always the last event.

use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::IntoResponse;
use futures::channel::mpsc;
use futures::{SinkExt, StreamExt};
use messages::exec::{AwaitingConfirmation, ExecRequest, OutputChunk};
use sandmesh_client::MeshClient;

use crate::api::Reply;
use crate::problem::Problem;

/// The result travels on another subject than the chunks and may overtake the last of them:
/// this long, at most, is waited for the `eof` chunk before the result is sent.
const DRAIN: Duration = Duration::from_secs(2);
/// Events a slow reader may fall behind before the execution waits for it.
const BACKLOG: usize = 256;

fn output(chunk: &OutputChunk) -> Event {
    Event::default()
        .event("output")
        .id(chunk.seq.to_string())
        .json_data(chunk)
        .expect("a chunk serialises")
}

fn awaiting(notice: &AwaitingConfirmation) -> Event {
    Event::default()
        .event("awaiting_confirmation")
        .json_data(notice)
        .expect("a notice serialises")
}

/// Subscribes to the output before the execution starts (chunks are not stored), then runs it
/// and relays everything as events.
pub async fn execute(mesh: MeshClient, mut req: ExecRequest, timeout: Duration) -> Reply {
    let id = req
        .execution_id
        .get_or_insert_with(messages::new_id)
        .clone();
    req.stream_output = true;
    let exec = mesh.exec();
    let mut chunks = exec.output(&id).await?;
    let (mut events, reader) = mpsc::channel::<Event>(BACKLOG);
    tokio::spawn(async move {
        let mut notices = events.clone();
        let run = exec.exec_notified(&req, timeout, move |notice| {
            // A full backlog drops the notice, never the result: the reader is that far behind.
            let _ = notices.try_send(awaiting(&notice));
        });
        tokio::pin!(run);
        let mut ended = false;
        let outcome = loop {
            tokio::select! {
                outcome = &mut run => break outcome,
                chunk = chunks.next(), if !ended => match chunk {
                    Some(Ok(chunk)) => {
                        ended = chunk.eof;
                        if events.send(output(&chunk)).await.is_err() {
                            return; // The client went away; dropping `run` ends the wait.
                        }
                    }
                    _ => ended = true,
                },
            }
        };
        if !ended {
            let drained = tokio::time::timeout(DRAIN, async {
                while let Some(Ok(chunk)) = chunks.next().await {
                    let eof = chunk.eof;
                    if events.send(output(&chunk)).await.is_err() || eof {
                        return;
                    }
                }
            });
            let _ = drained.await;
        }
        let last = match outcome {
            Ok(result) => Event::default().event("result").json_data(&result),
            Err(e) => Event::default().event("error").json_data(Problem::from(e)),
        };
        let _ = events.send(last.expect("a result serialises")).await;
    });
    Ok(Sse::new(reader.map(Ok::<_, Infallible>))
        .keep_alive(KeepAlive::default())
        .into_response())
}
