//! Bounded retries of JetStream calls that failed for a passing reason.
//!
//! On a NATS cluster, a call can fail while nothing is wrong with the work: the server the
//! client talked to was killed and the client is reconnecting, a stream or the JetStream meta
//! group is electing a new leader ("no responders", a `503 JetStream not ready`, a request
//! that times out), or an ack was lost on the way. Every JetStream call whose repetition is
//! harmless (a publish deduplicated on `Nats-Msg-Id`, a KV read, a KV put of the same value, a
//! job's ack) goes through [`retry`], so such a moment costs a few seconds, never the work.
//! What counts as passing is decided by the error's kind (walking its `source()` chain), never
//! by its message; errors that would recur (a wrong revision, a key that exists, bad input)
//! are returned at once.

use std::error::Error;
use std::future::Future;
use std::time::Duration;

use async_nats::jetstream::{self, context, kv, stream};
use tokio::time::Instant;

/// How long to keep trying, and how far apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// No new attempt starts after this much time from the first.
    pub budget: Duration,
    pub first_delay: Duration,
    pub max_delay: Duration,
}

impl RetryPolicy {
    /// Long enough for a stream or meta leader election after a node loss (typically 2–10 s
    /// on a loaded machine), short enough that a caller learns of a real outage.
    pub const JETSTREAM: Self = Self {
        budget: Duration::from_secs(45),
        first_delay: Duration::from_millis(100),
        max_delay: Duration::from_secs(2),
    };

    /// For acks: a lost ack only means a redelivery, which finds the stored result, so an ack
    /// is not worth holding the work's slot long.
    pub const ACK: Self = Self {
        budget: Duration::from_secs(5),
        first_delay: Duration::from_millis(100),
        max_delay: Duration::from_secs(1),
    };

    /// The pause after `attempt` failed attempts (1-based): doubling, capped.
    fn delay(&self, attempt: u32) -> Duration {
        let factor = 1u32 << attempt.saturating_sub(1).min(16);
        self.first_delay.saturating_mul(factor).min(self.max_delay)
    }
}

/// Runs `op` until it succeeds, fails with an error that is not [transient](is_transient), or
/// the policy's budget is spent; then returns its last outcome. `what` names the call in the
/// log line each retry writes.
pub async fn retry<T, E, F, Fut>(what: &str, policy: RetryPolicy, mut op: F) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: Error + 'static,
{
    let deadline = Instant::now() + policy.budget;
    let mut attempt = 1;
    loop {
        let error = match op().await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        let delay = policy.delay(attempt);
        if !is_transient(&error) || Instant::now() + delay >= deadline {
            return Err(error);
        }
        tracing::info!(what, attempt, error = %crate::error_chain(&error), "NATS call failed for a passing reason; retrying");
        tokio::time::sleep(delay).await;
        attempt += 1;
    }
}

/// An error in a `Box` (async-nats returns some that way, e.g. from `double_ack`) as an
/// [`Error`] with that cause, so [`retry`] can look into it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Boxed(#[source] pub crate::BoxError);

/// Whether `error` is the kind of failure a cluster produces while it heals: a lost or
/// re-established connection, a timeout, no responders, or a JetStream API error saying the
/// cluster is not ready. The first error in the `source()` chain that is one of async-nats'
/// kinds decides; anything else is not transient.
pub fn is_transient(error: &(dyn Error + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(verdict) = verdict(e) {
            return verdict;
        }
        current = e.source();
    }
    false
}

/// `Some(verdict)` when `e` is a kind this module knows, `None` to look at its cause.
fn verdict(e: &(dyn Error + 'static)) -> Option<bool> {
    if let Some(e) = e.downcast_ref::<jetstream::Error>() {
        return Some(api_error_is_transient(e));
    }
    if let Some(e) = e.downcast_ref::<context::PublishError>() {
        use context::PublishErrorKind::*;
        return match e.kind() {
            // No responders on a stream subject: the stream has no leader right now.
            TimedOut | BrokenPipe | StreamNotFound | MaxAckPending => Some(true),
            WrongLastMessageId | WrongLastSequence | MaxPayloadExceeded => Some(false),
            Other => None,
        };
    }
    if let Some(e) = e.downcast_ref::<context::RequestError>() {
        use context::RequestErrorKind::*;
        return match e.kind() {
            NoResponders | TimedOut => Some(true),
            InvalidSubject => Some(false),
            Other => None,
        };
    }
    if let Some(e) = e.downcast_ref::<async_nats::RequestError>() {
        use async_nats::RequestErrorKind::*;
        return match e.kind() {
            NoResponders | TimedOut => Some(true),
            InvalidSubject | MaxPayloadExceeded => Some(false),
            Other => None,
        };
    }
    if e.downcast_ref::<async_nats::PublishError>().is_some()
        || e.downcast_ref::<async_nats::SubscribeError>().is_some()
    {
        // Core NATS only fails these when the connection is gone: it comes back.
        return Some(true);
    }
    if let Some(e) = e.downcast_ref::<std::io::Error>() {
        use std::io::ErrorKind::*;
        // `Other`: async-nats reports a reply subscription dropped by a reconnect that way
        // (`double_ack`); the budget bounds it should it mean something lasting.
        return Some(matches!(
            e.kind(),
            TimedOut | BrokenPipe | ConnectionReset | ConnectionAborted | NotConnected | Other
        ));
    }
    if let Some(e) = e.downcast_ref::<stream::DirectGetError>() {
        use stream::DirectGetErrorKind::*;
        return match e.kind() {
            TimedOut | Request => Some(true),
            ErrorResponse(status, _) => Some(status.as_u16() >= 500 || status.as_u16() == 408),
            NotFound | InvalidSubject => Some(false),
            Other => None,
        };
    }
    if let Some(e) = e.downcast_ref::<kv::EntryError>() {
        return match e.kind() {
            kv::EntryErrorKind::TimedOut => Some(true),
            kv::EntryErrorKind::InvalidKey => Some(false),
            kv::EntryErrorKind::Other => None,
        };
    }
    if let Some(e) = e.downcast_ref::<kv::UpdateError>() {
        return match e.kind() {
            kv::UpdateErrorKind::TimedOut => Some(true),
            kv::UpdateErrorKind::InvalidKey | kv::UpdateErrorKind::WrongLastRevision => Some(false),
            kv::UpdateErrorKind::Other => None,
        };
    }
    if let Some(e) = e.downcast_ref::<kv::CreateError>() {
        return match e.kind() {
            kv::CreateErrorKind::AlreadyExists | kv::CreateErrorKind::InvalidKey => Some(false),
            _ => None,
        };
    }
    if let Some(e) = e.downcast_ref::<context::CreateStreamError>() {
        use context::CreateStreamErrorKind::*;
        return match e.kind() {
            JetStreamUnavailable | TimedOut => Some(true),
            JetStream(api) => Some(api_error_is_transient(&api)),
            Response => None,
            _ => Some(false),
        };
    }
    if let Some(e) = e.downcast_ref::<context::CreateKeyValueError>() {
        use context::CreateKeyValueErrorKind::*;
        return match e.kind() {
            TimedOut => Some(true),
            JetStream | BucketCreate => None,
            _ => Some(false),
        };
    }
    if let Some(e) = e.downcast_ref::<kv::PutError>() {
        return match e.kind() {
            kv::PutErrorKind::InvalidKey => Some(false),
            // A put whose publish or ack failed without a cause we know: the connection.
            _ => Some(e.source().is_none_or(is_transient)),
        };
    }
    None
}

/// JetStream API errors a healing cluster answers with: 503 (not ready, no leader, no
/// quorum), 408 (request timeout), and the codes naming a leader or cluster state.
fn api_error_is_transient(e: &jetstream::Error) -> bool {
    const CLUSTER_NOT_ACTIVE: u64 = 10006;
    const CLUSTER_NOT_AVAIL: u64 = 10008;
    const CLUSTER_NOT_LEADER: u64 = 10009;
    const CLUSTER_PEER_NOT_MEMBER: u64 = 10040;
    const STREAM_NOT_LEADER: u64 = 10093;
    const JETSTREAM_NOT_ENABLED_FOR_ACCOUNT: u64 = 10039;
    matches!(e.code(), 503 | 408)
        || matches!(
            e.error_code().0,
            CLUSTER_NOT_ACTIVE
                | CLUSTER_NOT_AVAIL
                | CLUSTER_NOT_LEADER
                | CLUSTER_PEER_NOT_MEMBER
                | STREAM_NOT_LEADER
                // Answered by a restarted server before its JetStream has caught up.
                | JETSTREAM_NOT_ENABLED_FOR_ACCOUNT
        )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn publish_error(kind: context::PublishErrorKind) -> context::PublishError {
        context::PublishError::new(kind)
    }

    #[test]
    fn passing_failures_are_told_from_lasting_ones() {
        use context::PublishErrorKind::*;
        assert!(is_transient(&publish_error(TimedOut)));
        assert!(is_transient(&publish_error(StreamNotFound)));
        assert!(!is_transient(&publish_error(WrongLastSequence)));
        assert!(!is_transient(&publish_error(MaxPayloadExceeded)));
        assert!(!is_transient(&kv::EntryError::new(
            kv::EntryErrorKind::InvalidKey
        )));
        assert!(is_transient(&kv::EntryError::new(
            kv::EntryErrorKind::TimedOut
        )));
        assert!(!is_transient(&kv::CreateError::new(
            kv::CreateErrorKind::AlreadyExists
        )));
        assert!(!is_transient(&std::fmt::Error));
    }

    #[test]
    fn the_first_known_cause_decides() {
        // A KV put that failed because its publish timed out.
        let put = kv::PutError::with_source(
            kv::PutErrorKind::Publish,
            publish_error(context::PublishErrorKind::TimedOut),
        );
        assert!(is_transient(&put));
        let put = kv::PutError::with_source(
            kv::PutErrorKind::Publish,
            publish_error(context::PublishErrorKind::WrongLastSequence),
        );
        assert!(!is_transient(&put));
        let boxed = Boxed(Box::new(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "double ack response timed out",
        )));
        assert!(is_transient(&boxed));
    }

    #[test]
    fn delays_double_up_to_the_cap() {
        let p = RetryPolicy::JETSTREAM;
        assert_eq!(p.delay(1), Duration::from_millis(100));
        assert_eq!(p.delay(2), Duration::from_millis(200));
        assert_eq!(p.delay(40), p.max_delay);
    }

    #[tokio::test(start_paused = true)]
    async fn transient_failures_are_retried_until_success() {
        let calls = AtomicU32::new(0);
        let got = retry("test", RetryPolicy::JETSTREAM, || {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            async move {
                if n < 3 {
                    Err(publish_error(context::PublishErrorKind::TimedOut))
                } else {
                    Ok(n)
                }
            }
        })
        .await
        .unwrap();
        assert_eq!(got, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn lasting_failures_return_at_once() {
        let calls = AtomicU32::new(0);
        let e = retry("test", RetryPolicy::JETSTREAM, || {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err::<(), _>(publish_error(context::PublishErrorKind::WrongLastSequence)) }
        })
        .await
        .unwrap_err();
        assert_eq!(e.kind(), context::PublishErrorKind::WrongLastSequence);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_budget_bounds_the_retries() {
        let started = Instant::now();
        let calls = AtomicU32::new(0);
        let policy = RetryPolicy::ACK;
        let e = retry("test", policy, || {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err::<(), _>(publish_error(context::PublishErrorKind::TimedOut)) }
        })
        .await
        .unwrap_err();
        assert_eq!(e.kind(), context::PublishErrorKind::TimedOut);
        assert!(started.elapsed() <= policy.budget);
        assert!(calls.load(Ordering::SeqCst) > 1);
    }
}
