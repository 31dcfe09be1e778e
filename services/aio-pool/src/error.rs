//! [`PoolError`]: why an aio-pool call failed, kept as a value with its cause while it travels
//! from the pool and its instances to the endpoint; the wire's [`ErrorBody`] is made from it
//! there, once (`kit::actor_handler`).

use messages::quota::OverQuota;
use messages::validate::ValidationError;
use messages::{ErrorBody, ErrorKind};

use crate::aio_client::AioError;
use crate::state::AcquireError;

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// A malformed or oversized id.
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// The tenant holds its `aio_instances` quota.
    #[error(transparent)]
    OverQuota(#[from] OverQuota),
    /// No instance came free, none could start, or the pool is stopping.
    #[error(transparent)]
    Acquire(#[from] AcquireError),
    /// The caller named an instance this pool does not know.
    #[error("unknown AIO instance {name}")]
    UnknownInstance { name: String },
    #[error(
        "session {session} has no AIO instance: acquire one first (it was never acquired, or \
         was released, reclaimed after idle_timeout, retired after max_use_count, or lost)"
    )]
    NotBound { session: String },
    /// The caller named an instance that is not the session's (`?`: it named none).
    #[error("AIO instance {} is not bound to session {session}", .named.as_deref().unwrap_or("?"))]
    WrongInstance {
        session: String,
        named: Option<String>,
    },
    /// The internal exec subject was called by someone other than the scheduler.
    #[error("commands run through sandbox.v1.aio.exec, which assesses them first")]
    NotThroughScheduler,
    #[error("command is empty")]
    EmptyCommand,
    #[error("command is {len} bytes, at most {max}")]
    CommandTooLarge { len: usize, max: usize },
    #[error("timeout_ms must be between 1 and {max_ms}")]
    BadTimeout { max_ms: u128 },
    /// The state machine bound an instance whose actor is gone (a bug).
    #[error("bound instance has no actor")]
    NoActor,
    #[error("the AIO instance stopped while starting its browser")]
    BrowserStopped,
    /// The instance's own API failed at `what`.
    #[error("{what}: {}", crate::error_chain(.source))]
    Instance {
        what: &'static str,
        #[source]
        source: AioError,
    },
}

impl PoolError {
    /// The kind the caller is answered with.
    pub fn kind(&self) -> ErrorKind {
        use PoolError as E;
        match self {
            E::Invalid(ValidationError::Invalid { .. })
            | E::EmptyCommand
            | E::BadTimeout { .. } => ErrorKind::BadRequest,
            E::Invalid(ValidationError::TooLarge { .. }) | E::CommandTooLarge { .. } => {
                ErrorKind::TooLarge
            }
            E::OverQuota(_) | E::Acquire(AcquireError::Overloaded { .. }) => ErrorKind::Overloaded,
            E::Acquire(_) | E::BrowserStopped | E::Instance { .. } => ErrorKind::Unavailable,
            E::UnknownInstance { .. } | E::NotBound { .. } | E::WrongInstance { .. } => {
                ErrorKind::NotFound
            }
            E::NotThroughScheduler => ErrorKind::Denied,
            E::NoActor => ErrorKind::Internal,
        }
    }
}

impl From<PoolError> for ErrorBody {
    /// Ids and quotas keep the details their own wire form carries; every other refusal is
    /// its kind and its message.
    fn from(e: PoolError) -> Self {
        match e {
            PoolError::Invalid(e) => e.into(),
            PoolError::OverQuota(e) => e.into(),
            e => ErrorBody::new(e.kind(), e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use messages::quota::Quota;
    use messages::tenancy::Tenant;

    use super::*;

    fn answered(e: PoolError) -> (ErrorKind, u16, bool) {
        let kind = e.kind();
        let message = e.to_string();
        let body = ErrorBody::from(e);
        (
            body.kind,
            body.code,
            body.message == message && body.kind == kind,
        )
    }

    #[test]
    fn every_refusal_is_answered_with_its_kind_and_its_message() {
        let timeout = AioError::Timeout {
            addr: "unix:/run/aio.sock".into(),
            limit: Duration::from_secs(2),
        };
        for (e, kind) in [
            (PoolError::EmptyCommand, ErrorKind::BadRequest),
            (
                PoolError::BadTimeout { max_ms: 600_000 },
                ErrorKind::BadRequest,
            ),
            (
                PoolError::CommandTooLarge { len: 9, max: 8 },
                ErrorKind::TooLarge,
            ),
            (
                AcquireError::Overloaded {
                    waited: Duration::from_secs(1),
                    max: 2,
                }
                .into(),
                ErrorKind::Overloaded,
            ),
            (
                AcquireError::CreateFailed("no image".into()).into(),
                ErrorKind::Unavailable,
            ),
            (AcquireError::ShuttingDown.into(), ErrorKind::Unavailable),
            (PoolError::BrowserStopped, ErrorKind::Unavailable),
            (
                PoolError::UnknownInstance { name: "i".into() },
                ErrorKind::NotFound,
            ),
            (
                PoolError::NotBound {
                    session: "s".into(),
                },
                ErrorKind::NotFound,
            ),
            (
                PoolError::WrongInstance {
                    session: "s".into(),
                    named: None,
                },
                ErrorKind::NotFound,
            ),
            (PoolError::NotThroughScheduler, ErrorKind::Denied),
            (PoolError::NoActor, ErrorKind::Internal),
        ] {
            let shown = format!("{e:?}");
            assert_eq!(answered(e), (kind, kind.code(), true), "{shown}");
        }
        let failed = PoolError::Instance {
            what: "the AIO instance's browser",
            source: timeout,
        };
        assert_eq!(
            answered(failed),
            (ErrorKind::Unavailable, 503, true),
            "the instance's failure is a missing dependency"
        );
    }

    #[test]
    fn ids_and_quotas_keep_their_details() {
        let long = ValidationError::TooLarge {
            field: "session_id".into(),
            size: 500,
            limit: 64,
        };
        let body = ErrorBody::from(PoolError::from(long.clone()));
        assert_eq!(body, ErrorBody::from(long));
        assert_eq!(body.kind, ErrorKind::TooLarge);
        let over = OverQuota {
            tenant: Tenant::new("acme").unwrap(),
            quota: Quota::AioInstances,
            limit: 1,
            used: 1,
        };
        let body = ErrorBody::from(PoolError::from(over.clone()));
        assert_eq!(body, ErrorBody::from(over));
        assert!(body.details.is_some());
    }
}
