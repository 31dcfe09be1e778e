//! The live stream (`GET /events`): Server-Sent Events carrying each change as HTML the server
//! rendered. A stream starts with every pending card and a `sync` listing them, so a page that
//! (re)connects — after a restart of the console, a lost connection, or falling behind — is
//! whole again without a reload.
//!
//! Events: `card` `{id, state: pending|decided, html}`, `sync` `{pending: [id]}`, `audit`
//! `{session, kind, html}` (a table row for the activity view), `resync` (start over).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{stream, Stream, StreamExt};
use messages::confirm::{ConfirmState, Confirmation};
use tokio::sync::broadcast;

use crate::app::{pending, refuse, App};
use crate::logins::FeedEvent;
use crate::render;

/// How long a page waits before reconnecting its stream.
const RETRY: Duration = Duration::from_secs(1);

pub async fn events(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    let Some((_, login)) = app.login_of(&headers).await else {
        return refuse(StatusCode::UNAUTHORIZED, "not logged in");
    };
    // Subscribed before listing, so nothing decided in between is missed.
    let feed = login.feed.subscribe();
    let list = match pending(&login).await {
        Ok(list) => list,
        Err(e) => {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("cannot list confirmations: {e}"),
            )
                .into_response()
        }
    };
    let csrf = login.csrf.clone();
    let ids: Vec<&str> = list.iter().map(|c| c.id.as_str()).collect();
    let mut first = vec![Event::default().retry(RETRY).comment("live")];
    first.extend(list.iter().map(|c| card_event(c, &csrf)));
    first.push(
        Event::default()
            .event("sync")
            .data(serde_json::json!({ "pending": ids }).to_string()),
    );
    let live = live_events(feed, csrf);
    let stream = stream::iter(first)
        .chain(live)
        .take_until(app.shutdown.clone().cancelled_owned())
        .map(Ok::<_, Infallible>);
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

/// The login's events as SSE events. A page that falls behind, or whose operator connection
/// to NATS was re-established, is sent away to reconnect: its new stream starts with the
/// whole pending list again.
fn live_events(
    feed: broadcast::Receiver<FeedEvent>,
    csrf: String,
) -> impl Stream<Item = Event> + Send {
    stream::unfold((feed, csrf), |(mut feed, csrf)| async move {
        let event = match feed.recv().await {
            Ok(FeedEvent::Confirmation(c)) => card_event(&c, &csrf),
            Ok(FeedEvent::Audit(e)) => {
                let row = crate::history::Row::of(*e);
                Event::default().event("audit").data(
                    serde_json::json!({
                        "session": row.event.session_id,
                        "kind": row.event.kind().as_str(),
                        "html": render::audit_row(&row),
                    })
                    .to_string(),
                )
            }
            Ok(FeedEvent::Resync) => Event::default().event("resync").data("reconnected"),
            Err(broadcast::error::RecvError::Lagged(_)) => {
                Event::default().event("resync").data("behind")
            }
            Err(broadcast::error::RecvError::Closed) => return None,
        };
        Some((event, (feed, csrf)))
    })
}

fn card_event(c: &Confirmation, csrf: &str) -> Event {
    let state = match c.state {
        ConfirmState::Pending => "pending",
        _ => "decided",
    };
    Event::default().event("card").data(
        serde_json::json!({ "id": c.id, "state": state, "html": render::card(c, csrf) })
            .to_string(),
    )
}
