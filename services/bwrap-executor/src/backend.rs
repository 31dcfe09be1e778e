//! [`BwrapBackend`]: the bwrap backend of `executor_node`. It takes tier `ephemeral` without
//! a session and without a network policy only (a sandbox is single-use, keeps no workspace
//! and has no network), in any template, and runs each admitted run on the node's task
//! tracker in a sandbox of its own, on its template's image tree. It has no actors of its own
//! and no sessions.

use std::collections::BTreeMap;
use std::sync::Arc;

use executor_node::{Admitted, Backend, BackendError, ExecutorError, Gauges, NodeState};
use futures::future::BoxFuture;
use futures::FutureExt;
use messages::executor::{ExecutorRun, RunKind};
use messages::{ErrorKind, ServiceName};
use ractor::{ActorCell, ActorProcessingErr};

use crate::execution::Runner;
use crate::janitor::BwrapSweeper;

pub struct BwrapBackend {
    pub runner: Runner,
    pub node: Arc<NodeState>,
}

/// A run a sandbox cannot take: it is single-use, keeps no workspace and has no network.
#[derive(Debug, thiserror::Error)]
pub enum Unsupported {
    #[error("the bwrap executor runs tier ephemeral without a session, not {0:?}")]
    Kind(RunKind),
    #[error(
        "the bwrap executor has no network: a run with a network policy needs the docker \
         executor"
    )]
    Network,
}

impl BackendError for Unsupported {
    fn kind(&self) -> ErrorKind {
        match self {
            Unsupported::Kind(_) | Unsupported::Network => ErrorKind::BadRequest,
        }
    }
}

/// What a sandbox can run: tier `ephemeral` without a session (sessions live in Docker
/// containers) and without a network policy (so do runs with egress).
fn check_kind(run: &ExecutorRun) -> Result<(), Unsupported> {
    match run.kind() {
        RunKind::Pooled
        | RunKind::Isolated {
            session_grade: false,
        } => {}
        kind @ (RunKind::Isolated {
            session_grade: true,
        }
        | RunKind::Session { .. }) => return Err(Unsupported::Kind(kind.clone())),
    }
    if run.network.is_some() {
        return Err(Unsupported::Network);
    }
    Ok(())
}

impl Backend for BwrapBackend {
    type Sweeper = BwrapSweeper;
    const KIND: messages::executor::Backend = messages::executor::Backend::Bwrap;
    const SERVICE: ServiceName = ServiceName::BwrapExecutor;
    const SESSIONS: bool = false;

    fn accepts(&self, run: &ExecutorRun) -> Result<(), ExecutorError> {
        Ok(check_kind(run)?)
    }

    async fn start(&mut self, _node: ActorCell) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    fn execute(&mut self, mut run: Admitted) -> Result<(), ActorProcessingErr> {
        let runner = self.runner.clone();
        let node = self.node.clone();
        self.node.tasks.spawn(async move {
            // A template's image may be built and exported first (minutes): off the actor.
            let answer = match runner.tree(&run.job).await {
                Ok((rootfs, ran)) => {
                    run.ran = ran;
                    Ok(runner.execute(&node, &run.job, &rootfs).await)
                }
                Err(e) => Err(e),
            };
            run.answer(answer);
        });
        Ok(())
    }

    fn close(&self, _session_id: String) -> BoxFuture<'static, bool> {
        futures::future::ready(false).boxed()
    }

    fn close_all(&self) -> BoxFuture<'static, ()> {
        futures::future::ready(()).boxed()
    }

    async fn stop(&mut self) {}

    fn gauges(&self) -> Gauges {
        Arc::new(|_: &mut BTreeMap<String, f64>| {})
    }
}

#[cfg(test)]
mod tests {
    use messages::exec::{ExecRequest, Language};
    use messages::network::NetworkPolicy;

    use super::*;

    fn run(kind: RunKind) -> ExecutorRun {
        let request = ExecRequest {
            language: Language::Python,
            session_id: kind.session_id().map(Into::into),
            ..Default::default()
        };
        ExecutorRun::new("e1".into(), request, kind).unwrap()
    }

    #[test]
    fn only_sessionless_ephemeral_runs_without_network_are_taken() {
        let ephemeral_isolated = || {
            run(RunKind::Isolated {
                session_grade: false,
            })
        };
        assert!(check_kind(&run(RunKind::Pooled)).is_ok());
        assert!(check_kind(&ephemeral_isolated()).is_ok());
        let mut with_network = ephemeral_isolated();
        with_network.network = Some(NetworkPolicy::default());
        let session = run(RunKind::Session {
            session_id: "s1".into(),
        });
        let session_grade = run(RunKind::Isolated {
            session_grade: true,
        });
        for r in [&session, &session_grade] {
            let e = check_kind(r).unwrap_err();
            assert!(
                matches!(e, Unsupported::Kind(ref k) if k == r.kind()),
                "{e:?}"
            );
        }
        let e = check_kind(&with_network).unwrap_err();
        assert!(matches!(e, Unsupported::Network), "{e:?}");
        for e in [
            Unsupported::Kind(session.kind().clone()),
            Unsupported::Network,
        ] {
            assert_eq!(e.kind(), ErrorKind::BadRequest, "{e}");
        }
    }
}
