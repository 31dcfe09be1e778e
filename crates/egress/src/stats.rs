//! What a proxy reports: per-container counters, readable at any time, and one event per
//! decision for the embedding service to audit (`sandbox.v1.audit.egress`).

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// One decision: a destination allowed or refused, and the rule that decided; the `details`
/// of an `egress` audit event, so its type lives with the audit events.
pub use messages::audit::EgressEvent;

/// Receives every decision; it runs on the proxy's tasks, so it should only hand the event on.
pub type Observer = Arc<dyn Fn(&EgressEvent) + Send + Sync>;

/// A proxy's counters at one moment (for heartbeats and the execution's result).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct EgressStats {
    pub allowed: u64,
    pub denied: u64,
    /// Bytes sent to upstreams.
    pub bytes_up: u64,
    /// Bytes received from upstreams.
    pub bytes_down: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    allowed: AtomicU64,
    denied: AtomicU64,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
}

impl Counters {
    pub(crate) fn decided(&self, allowed: bool) {
        let counter = if allowed { &self.allowed } else { &self.denied };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> EgressStats {
        EgressStats {
            allowed: self.allowed.load(Ordering::Relaxed),
            denied: self.denied.load(Ordering::Relaxed),
            bytes_up: self.bytes_up.load(Ordering::Relaxed),
            bytes_down: self.bytes_down.load(Ordering::Relaxed),
        }
    }
}

/// An upstream connection that adds what passes through it to the counters as it happens.
pub(crate) struct Counted<S> {
    inner: S,
    counters: Arc<Counters>,
}

impl<S> Counted<S> {
    pub(crate) fn new(inner: S, counters: Arc<Counters>) -> Self {
        Self { inner, counters }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.inner).poll_read(cx, buf);
        let read = (buf.filled().len() - before) as u64;
        self.counters.bytes_down.fetch_add(read, Ordering::Relaxed);
        poll
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = poll {
            self.counters
                .bytes_up
                .fetch_add(n as u64, Ordering::Relaxed);
        }
        poll
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_serializes_to_audit_details() {
        let event = EgressEvent {
            host: "pkgs.example.org".into(),
            port: 443,
            address: Some("151.101.0.223".parse().unwrap()),
            allowed: true,
            rule: "allowed by allow_domains pkgs.example.org".into(),
        };
        assert_eq!(
            serde_json::to_value(&event).unwrap(),
            serde_json::json!({
                "host": "pkgs.example.org",
                "port": 443,
                "address": "151.101.0.223",
                "allowed": true,
                "rule": "allowed by allow_domains pkgs.example.org",
            })
        );
    }
}
