//! Request bodies as the handlers read them: with a deadline between bytes on every route (a
//! client that stops sending gets 408 instead of holding a request, and an upload, open), under
//! a cap where one applies, and paced for parsers that would otherwise read ahead without end.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;
use futures::{Stream, StreamExt};

use crate::config::Limits;
use crate::problem::Problem;

/// Why a request body could not be read whole.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("the request body sent nothing for {0:?}")]
    Stalled(Duration),
    #[error("the content is larger than {0} bytes")]
    TooLarge(u64),
    /// The connection failed or the client went away.
    #[error("reading the request body failed")]
    Read(#[source] axum::Error),
    /// Not multipart/form-data as RFC 7578 has it (a boundary that never comes, a part with
    /// broken headers, …).
    #[error("the form is malformed")]
    Form(#[source] multer::Error),
}

impl BodyError {
    /// The `BodyError` somewhere in `e`'s chain (the body's own errors travel boxed through
    /// axum and parsers), or `e` as a read failure.
    pub fn find<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a BodyError> {
        let mut cause = Some(e);
        while let Some(c) = cause {
            if let Some(found) = c.downcast_ref::<BodyError>() {
                return Some(found);
            }
            cause = c.source();
        }
        None
    }

    /// The body's own error (stalled, too large) when it caused this one.
    fn inner(e: &(dyn std::error::Error + 'static)) -> Option<Self> {
        match Self::find(e)? {
            BodyError::Stalled(idle) => Some(BodyError::Stalled(*idle)),
            BodyError::TooLarge(cap) => Some(BodyError::TooLarge(*cap)),
            _ => None,
        }
    }

    pub fn of_read(e: axum::Error) -> Self {
        Self::inner(&e).unwrap_or(BodyError::Read(e))
    }

    pub fn of_form(e: multer::Error) -> Self {
        Self::inner(&e).unwrap_or(BodyError::Form(e))
    }
}

impl From<&BodyError> for Problem {
    fn from(e: &BodyError) -> Self {
        match e {
            BodyError::Stalled(_) => Problem::new(
                StatusCode::REQUEST_TIMEOUT,
                sandmesh_client::ErrorKind::Timeout.as_str(),
                format!("{e}; nothing of it was kept"),
            ),
            BodyError::TooLarge(_) => Problem::too_large(e.to_string()),
            BodyError::Read(_) | BodyError::Form(_) => Problem::bad_request(kit::error_chain(e)),
        }
    }
}

/// Middleware for every route: the body fails with [`BodyError::Stalled`] when the client
/// sends nothing for `body_idle_timeout` while a handler waits for it. Time the handler spends
/// elsewhere (waiting for the store) does not count.
pub async fn idle_timeout(State(limits): State<Limits>, req: Request, next: Next) -> Response {
    let idle = limits.body_idle_timeout;
    let (parts, body) = req.into_parts();
    let timed = futures::stream::unfold(Some(body.into_data_stream()), move |body| async move {
        let mut body = body?;
        match tokio::time::timeout(idle, body.next()).await {
            Ok(Some(Ok(bytes))) => Some((Ok(bytes), Some(body))),
            Ok(Some(Err(e))) => Some((Err(axum::BoxError::from(e)), None)),
            Ok(None) => None,
            Err(_) => Some((Err(BodyError::Stalled(idle).into()), None)),
        }
    })
    .fuse();
    next.run(Request::from_parts(parts, Body::from_stream(timed)))
        .await
}

/// A raw body's bytes, capped (see [`capped`]).
pub fn raw(body: Body, cap: Option<u64>) -> impl Stream<Item = Result<Bytes, BodyError>> + Send {
    capped(
        body.into_data_stream()
            .map(|item| item.map_err(BodyError::of_read)),
        cap,
    )
}

/// The bytes of `content`, failing with [`BodyError::TooLarge`] past `cap` (no cap: `None`);
/// nothing after the first error.
pub fn capped(
    content: impl Stream<Item = Result<Bytes, BodyError>> + Send,
    cap: Option<u64>,
) -> impl Stream<Item = Result<Bytes, BodyError>> + Send {
    let mut seen = 0u64;
    let mut over = false;
    content
        .map(move |item| {
            let bytes = item?;
            seen += bytes.len() as u64;
            match cap {
                Some(cap) if seen > cap => Err(BodyError::TooLarge(cap)),
                _ => Ok(bytes),
            }
        })
        .take_while(move |item| {
            let go = !over;
            over |= item.is_err();
            futures::future::ready(go)
        })
}

/// Hands a parser at most [`Paced::BUDGET`] bytes per poll. The multipart parser reads its
/// input until it would block, so a fast client on a fast link could otherwise make it buffer
/// the whole body; paced, it holds about one budget whatever the body's size.
pub struct Paced<S> {
    inner: S,
    given: usize,
}

impl<S> Paced<S> {
    pub const BUDGET: usize = 1 << 20;

    pub fn new(inner: S) -> Self {
        Self { inner, given: 0 }
    }
}

impl<S: Stream<Item = Result<Bytes, E>> + Unpin, E> Stream for Paced<S> {
    type Item = Result<Bytes, E>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.given >= Self::BUDGET {
            // Yield as if the socket were empty; polled again at once.
            self.given = 0;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let polled = self.inner.poll_next_unpin(cx);
        match &polled {
            Poll::Ready(Some(Ok(bytes))) => self.given += bytes.len(),
            Poll::Pending => self.given = 0,
            _ => {}
        }
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_cap_ends_the_content_with_one_error() {
        let items = (0..5).map(|_| Ok(Bytes::from_static(b"0123456789")));
        let got: Vec<_> = capped(futures::stream::iter(items), Some(25))
            .collect()
            .await;
        assert_eq!(got.len(), 3, "{got:?}");
        assert!(matches!(got[2], Err(BodyError::TooLarge(25))), "{got:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_body_is_told_apart_from_other_failures() {
        let stalled: axum::Error = axum::Error::new(BodyError::Stalled(Duration::from_secs(1)));
        assert!(matches!(BodyError::of_read(stalled), BodyError::Stalled(_)));
        let other = axum::Error::new(std::io::Error::other("reset"));
        assert!(matches!(BodyError::of_read(other), BodyError::Read(_)));
        assert_eq!(
            Problem::from(&BodyError::Stalled(Duration::from_secs(1))).status,
            408
        );
    }
}
