//! [`ProcError`]: why a call on a session's background processes ([`crate::procs`]) failed,
//! carried to the node as the backend's own error, which answers with its kind.

use executor_node::BackendError;
use messages::executor::RunShapeError;
use messages::validate::ValidationError;
use messages::{ErrorBody, ErrorKind};
use sandbox_protocol::FrameError;

use crate::egress::EgressSetupError;

/// Why a call on a session's processes failed: the table's rules, the proc host's failures,
/// and the ways a call does not reach the session's container.
#[derive(Debug, thiserror::Error)]
pub enum ProcError {
    /// A malformed input or terminal size (or, for a sync, a session id no run takes).
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    #[error("no process {proc_id} in this session")]
    NoProc { proc_id: String },
    /// An input that overtook one before it: the caller sends `next` first.
    #[error("input seq {seq} arrived before {next}")]
    InputOutOfOrder { seq: u64, next: u64 },
    #[error(
        "the process's stdin is closed, or it was started without (start it with stdin or a \
         pty)"
    )]
    StdinClosed,
    #[error("the process has ended")]
    Ended,
    #[error("the process's input backlog is full; retry")]
    InputBacklog,
    #[error("the process has no terminal")]
    NoTerminal,
    /// Every process the session may hold is running.
    #[error("the session runs {max} processes already")]
    TooMany { max: usize },
    #[error("the session's container is not ready; retry")]
    NotReady,
    #[error("cannot open the process's egress: {0}")]
    Egress(#[source] EgressSetupError),
    #[error("cannot start a process in the session's container: {0}")]
    Exec(#[source] bollard::errors::Error),
    #[error("the process host is not attached")]
    NotAttached,
    #[error("encoding the process's spec: {0}")]
    Spec(#[source] serde_json::Error),
    #[error("the process host is gone: {0}")]
    HostGone(#[source] std::io::Error),
    #[error("the process host: {0}")]
    HostStream(#[source] bollard::errors::Error),
    #[error("the process host ended before starting the program: {log}")]
    HostEnded { log: String },
    #[error("garbage from the process host: {0}")]
    Garbage(#[source] FrameError),
    #[error("the process host sent no pid")]
    NoPid,
    #[error("the process host did not start the program")]
    StartTimeout,
    /// The program could not be started (no such command, a bad directory): the caller's.
    #[error("the process did not start: {why}")]
    DidNotStart { why: String },
    /// A sync reached the table instead of the session actor that runs it (a bug).
    #[error("a sync is the session's to run")]
    SyncMisrouted,
    /// The run of nothing a sync needs could not be made for the session (a bug: its id was
    /// checked when the session was made).
    #[error("the session's sync run: {0}")]
    SyncRun(#[source] RunShapeError),
    #[error("the docker backend is starting")]
    BackendStarting,
    #[error("the session has no container on this node (closed, or idle)")]
    NoSession,
    /// The actor that would answer stopped before it did.
    #[error("the session's container went before answering")]
    SessionGone,
}

impl BackendError for ProcError {
    fn kind(&self) -> ErrorKind {
        use ProcError as E;
        match self {
            E::Invalid(ValidationError::Invalid { .. }) | E::DidNotStart { .. } => {
                ErrorKind::BadRequest
            }
            E::Invalid(ValidationError::TooLarge { .. }) => ErrorKind::TooLarge,
            E::NoProc { .. } | E::NoSession => ErrorKind::NotFound,
            E::InputOutOfOrder { .. } | E::StdinClosed | E::Ended | E::NoTerminal => {
                ErrorKind::Conflict
            }
            E::InputBacklog | E::TooMany { .. } => ErrorKind::Overloaded,
            E::NotReady
            | E::Egress(_)
            | E::Exec(_)
            | E::HostGone(_)
            | E::HostStream(_)
            | E::HostEnded { .. }
            | E::BackendStarting
            | E::SessionGone => ErrorKind::Unavailable,
            E::StartTimeout => ErrorKind::Timeout,
            E::NotAttached
            | E::Spec(_)
            | E::Garbage(_)
            | E::NoPid
            | E::SyncMisrouted
            | E::SyncRun(_) => ErrorKind::Internal,
        }
    }

    /// A malformed field and an input out of order say where in their details.
    fn body(&self) -> ErrorBody {
        match self {
            ProcError::Invalid(e) => e.clone().into(),
            ProcError::InputOutOfOrder { next, .. } => {
                ErrorBody::new(self.kind(), self.to_string())
                    .with_details(serde_json::json!({ "next_seq": next }))
            }
            e => ErrorBody::new(e.kind(), e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_failure_of_a_process_call_has_its_kind() {
        let io = || std::io::Error::other("broken pipe");
        let docker = || bollard::errors::Error::DockerResponseServerError {
            status_code: 409,
            message: "container is not running".into(),
        };
        let shape = RunShapeError::SessionMismatch {
            request: None,
            kind: Some("s1".into()),
        };
        let egress = EgressSetupError::Directory {
            path: "/run/sandmesh-egress/x".into(),
            source: io(),
        };
        for (e, kind) in [
            (
                ValidationError::invalid("data", "not base64").into(),
                ErrorKind::BadRequest,
            ),
            (
                ProcError::DidNotStart {
                    why: "no such file".into(),
                },
                ErrorKind::BadRequest,
            ),
            (
                ValidationError::TooLarge {
                    field: "data".into(),
                    size: 2,
                    limit: 1,
                }
                .into(),
                ErrorKind::TooLarge,
            ),
            (
                ProcError::NoProc {
                    proc_id: "p1".into(),
                },
                ErrorKind::NotFound,
            ),
            (ProcError::NoSession, ErrorKind::NotFound),
            (
                ProcError::InputOutOfOrder { seq: 3, next: 1 },
                ErrorKind::Conflict,
            ),
            (ProcError::StdinClosed, ErrorKind::Conflict),
            (ProcError::Ended, ErrorKind::Conflict),
            (ProcError::NoTerminal, ErrorKind::Conflict),
            (ProcError::InputBacklog, ErrorKind::Overloaded),
            (ProcError::TooMany { max: 32 }, ErrorKind::Overloaded),
            (ProcError::NotReady, ErrorKind::Unavailable),
            (ProcError::Egress(egress), ErrorKind::Unavailable),
            (ProcError::Exec(docker()), ErrorKind::Unavailable),
            (ProcError::HostGone(io()), ErrorKind::Unavailable),
            (ProcError::HostStream(docker()), ErrorKind::Unavailable),
            (
                ProcError::HostEnded {
                    log: "exec failed".into(),
                },
                ErrorKind::Unavailable,
            ),
            (ProcError::BackendStarting, ErrorKind::Unavailable),
            (ProcError::SessionGone, ErrorKind::Unavailable),
            (ProcError::StartTimeout, ErrorKind::Timeout),
            (ProcError::NotAttached, ErrorKind::Internal),
            (
                ProcError::Spec(serde_json::from_str::<u8>("x").unwrap_err()),
                ErrorKind::Internal,
            ),
            (
                ProcError::Garbage(FrameError::UnknownKind(0x7f)),
                ErrorKind::Internal,
            ),
            (ProcError::NoPid, ErrorKind::Internal),
            (ProcError::SyncMisrouted, ErrorKind::Internal),
            (ProcError::SyncRun(shape), ErrorKind::Internal),
        ] {
            let body = e.body();
            assert_eq!(
                (e.kind(), body.kind, body.code),
                (kind, kind, kind.code()),
                "{e}"
            );
        }
    }

    #[test]
    fn a_malformed_field_and_an_input_out_of_order_say_where() {
        let bad = ValidationError::invalid("cols", "must be 1..=1000");
        assert_eq!(ProcError::from(bad.clone()).body(), ErrorBody::from(bad));
        let early = ProcError::InputOutOfOrder { seq: 3, next: 1 }.body();
        assert_eq!(early.details, Some(serde_json::json!({ "next_seq": 1 })));
        assert_eq!(early.message, "input seq 3 arrived before 1");
    }
}
