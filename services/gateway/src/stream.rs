//! An execution's live events — a notice when it waits for a person, its output chunks in
//! order, then its result — as one ordered channel ([`events`]), and `Accept:
//! text/event-stream` on execute relaying them as Server-Sent Events. Events, in order:
//!
//! - `awaiting_confirmation` (an [`AwaitingConfirmation`]): a person must decide first;
//! - `output` (an [`OutputChunk`], `id` = its `seq`): chunks in `seq` order;
//! - `result` (an [`ExecResult`]) or `error` (a [`Problem`]): always the last event.
//!
//! The E2B facade relays the same channel in E2B's shapes (`crate::e2b`).

use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::IntoResponse;
use futures::channel::mpsc;
use futures::{SinkExt, StreamExt};
use messages::exec::{AwaitingConfirmation, ExecRequest, ExecResult, OutputChunk};
use sandmesh_client::{ClientError, MeshClient};

use crate::problem::{Problem, Reply};

/// The result travels on another subject than the chunks and may overtake the last of them:
/// this long, at most, is waited for the `eof` chunk before the result is sent.
const DRAIN: Duration = Duration::from_secs(2);
/// Events a slow reader may fall behind before the execution waits for it.
const BACKLOG: usize = 256;

/// One thing an execution tells its caller while it runs.
#[derive(Debug)]
pub enum ExecEvent {
    /// Parked until a person decides.
    Awaiting(AwaitingConfirmation),
    Output(OutputChunk),
    /// Always the last event (boxed: a result is much larger than a chunk).
    Done(Box<Result<ExecResult, ClientError>>),
}

/// Subscribes to the output before the execution starts (chunks are not stored), then runs it
/// and sends everything it says, in order, ending with [`ExecEvent::Done`]. Dropping the
/// receiver stops the relay (the execution itself goes on to its result).
pub async fn events(
    mesh: MeshClient,
    mut req: ExecRequest,
    timeout: Duration,
) -> Result<mpsc::Receiver<ExecEvent>, ClientError> {
    let id = req
        .execution_id
        .get_or_insert_with(messages::new_id)
        .clone();
    req.stream_output = true;
    let exec = mesh.exec();
    let mut chunks = exec.output(&id).await?;
    let (mut events, reader) = mpsc::channel::<ExecEvent>(BACKLOG);
    tokio::spawn(async move {
        let mut notices = events.clone();
        let run = exec.exec_notified(&req, timeout, move |notice| {
            // A full backlog drops the notice, never the result: the reader is that far behind.
            let _ = notices.try_send(ExecEvent::Awaiting(notice));
        });
        tokio::pin!(run);
        let mut ended = false;
        let outcome = loop {
            tokio::select! {
                outcome = &mut run => break outcome,
                chunk = chunks.next(), if !ended => match chunk {
                    Some(Ok(chunk)) => {
                        ended = chunk.eof;
                        if events.send(ExecEvent::Output(chunk)).await.is_err() {
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
                    if events.send(ExecEvent::Output(chunk)).await.is_err() || eof {
                        return;
                    }
                }
            });
            let _ = drained.await;
        }
        let _ = events.send(ExecEvent::Done(Box::new(outcome))).await;
    });
    Ok(reader)
}

fn sse(event: ExecEvent) -> Event {
    let event = match event {
        ExecEvent::Awaiting(notice) => Event::default()
            .event("awaiting_confirmation")
            .json_data(notice),
        ExecEvent::Output(chunk) => Event::default()
            .event("output")
            .id(chunk.seq.to_string())
            .json_data(chunk),
        ExecEvent::Done(outcome) => match *outcome {
            Ok(result) => Event::default().event("result").json_data(&result),
            Err(e) => Event::default().event("error").json_data(Problem::from(e)),
        },
    };
    event.expect("an event serialises")
}

/// The execution's events as Server-Sent Events.
pub async fn execute(mesh: MeshClient, req: ExecRequest, timeout: Duration) -> Reply {
    let events = events(mesh, req, timeout).await?;
    Ok(Sse::new(events.map(|e| Ok::<_, Infallible>(sse(e))))
        .keep_alive(KeepAlive::default())
        .into_response())
}
