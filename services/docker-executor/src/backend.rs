//! [`DockerBackend`]: the Docker backend of `executor_node`. It takes tiers `ephemeral` and
//! `session` (pooled, isolated and session runs; network policies on containers of their
//! own) and hands each admitted run to its [`Containers`] actor.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use executor_node::{Admitted, Backend, Gauges, NodeState};
use futures::future::BoxFuture;
use futures::FutureExt;
use messages::exec::Tier;
use messages::executor::{ExecutorRun, RunKind};
use messages::{ErrorBody, ServiceName};
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef};

use crate::containers::{Containers, ContainersArgs, ContainersMsg};
use crate::execution::Runner;
use crate::janitor::DockerSweeper;

/// What the heartbeat reports besides the node's own gauges.
#[derive(Debug, Default)]
pub struct ContainerGauges {
    /// Ready containers in the node's own warm pool.
    pub warm: AtomicUsize,
    /// Live session containers.
    pub sessions: AtomicUsize,
}

pub struct DockerBackend {
    pub runner: Runner,
    pub node: Arc<NodeState>,
    pub gauges: Arc<ContainerGauges>,
    /// Set by `start`, when the node's actor exists to supervise it.
    containers: Option<ActorRef<ContainersMsg>>,
}

impl DockerBackend {
    pub fn new(runner: Runner, node: Arc<NodeState>) -> Self {
        Self {
            runner,
            node,
            gauges: Arc::default(),
            containers: None,
        }
    }

    fn containers(&self) -> Result<&ActorRef<ContainersMsg>, ActorProcessingErr> {
        self.containers
            .as_ref()
            .ok_or_else(|| "the docker backend was not started".into())
    }
}

/// The tier, kind and session combinations the Docker backend runs.
fn check_kind(run: &ExecutorRun) -> Result<(), ErrorBody> {
    match (run.tier, run.kind) {
        // Tier `session` with an isolated run is strict mode's answer to non-SAFE code that
        // has no session: session-grade isolation in a container of its own.
        (Tier::Ephemeral | Tier::Session, RunKind::Isolated) => {}
        (Tier::Ephemeral, RunKind::Pooled) => {}
        (Tier::Session, RunKind::Pooled | RunKind::Session) if run.request.session_id.is_some() => {
        }
        (Tier::Session, _) => {
            return Err(ErrorBody::bad_request("tier session needs a session_id"));
        }
        (Tier::Ephemeral, RunKind::Session) => {
            return Err(ErrorBody::bad_request(
                "run kind session needs tier session",
            ));
        }
        (other, _) => {
            return Err(ErrorBody::bad_request(format!(
                "the docker executor runs tiers ephemeral and session, not {}",
                other.as_str()
            )));
        }
    }
    if let Some(policy) = &run.network {
        policy.validate().map_err(ErrorBody::from)?;
        if run.kind == RunKind::Pooled {
            // A warm container is made before anyone asked: it has no egress socket.
            return Err(ErrorBody::bad_request(
                "a run with a network policy needs run kind isolated or session",
            ));
        }
    }
    Ok(())
}

impl Backend for DockerBackend {
    type Sweeper = DockerSweeper;
    const KIND: messages::executor::Backend = messages::executor::Backend::Docker;
    const SERVICE: ServiceName = ServiceName::DockerExecutor;
    const SESSIONS: bool = true;

    fn accepts(&self, run: &ExecutorRun) -> Result<(), ErrorBody> {
        check_kind(run)
    }

    async fn start(&mut self, node: ActorCell) -> Result<(), ActorProcessingErr> {
        let args = ContainersArgs {
            runner: self.runner.clone(),
            node: self.node.clone(),
            gauges: self.gauges.clone(),
        };
        let (containers, _) = Actor::spawn_linked(None, Containers, args, node).await?;
        self.containers = Some(containers);
        Ok(())
    }

    fn execute(&mut self, run: Admitted) -> Result<(), ActorProcessingErr> {
        // Not delivered: the run is dropped with the message, which answers its caller, and
        // the actor's failure reaches the node as a supervision event.
        let _ = self.containers()?.cast(ContainersMsg::Run(Box::new(run)));
        Ok(())
    }

    fn close(&self, session_id: String) -> BoxFuture<'static, bool> {
        let containers = self.containers.clone();
        async move {
            let Some(containers) = containers else {
                return false;
            };
            ractor::call!(containers, ContainersMsg::Close, session_id).unwrap_or(false)
        }
        .boxed()
    }

    fn close_all(&self) -> BoxFuture<'static, ()> {
        let containers = self.containers.clone();
        async move {
            if let Some(containers) = containers {
                let _ = ractor::call!(containers, ContainersMsg::CloseAll);
            }
        }
        .boxed()
    }

    async fn stop(&mut self) {
        if let Some(containers) = self.containers.take() {
            let _ = containers
                .stop_and_wait(Some("shutdown".into()), Some(Duration::from_secs(60)))
                .await;
        }
    }

    fn gauges(&self) -> Gauges {
        let gauges = self.gauges.clone();
        let metrics = self.node.metrics.clone();
        let at = kit::metrics::NodeLabels {
            service: Self::SERVICE.as_str(),
            node: self.runner.sandboxes.spec.node_id.clone(),
        };
        Arc::new(move |m: &mut BTreeMap<String, f64>| {
            let warm = gauges.warm.load(Ordering::Relaxed);
            let sessions = gauges.sessions.load(Ordering::Relaxed);
            // The Prometheus gauges are refreshed with each beat: the figures the scheduler sees.
            metrics.warm_pool_size.get_or_create(&at).set(warm as i64);
            metrics
                .sessions_active
                .get_or_create(&at)
                .set(sessions as i64);
            m.insert("warm_pool_size".into(), warm as f64);
            m.insert("active_sessions".into(), sessions as f64);
        })
    }
}

#[cfg(test)]
mod tests {
    use messages::exec::Language;

    use super::*;

    fn run(tier: Tier, kind: RunKind, session: Option<&str>) -> ExecutorRun {
        let mut run = test_support::executor_conformance::ephemeral(Language::Python, "");
        (run.tier, run.kind) = (tier, kind);
        run.request.session_id = session.map(Into::into);
        run
    }

    #[test]
    fn only_consistent_tier_kind_and_session_combinations_are_taken() {
        let ok = [
            run(Tier::Ephemeral, RunKind::Pooled, None),
            run(Tier::Ephemeral, RunKind::Isolated, None),
            run(Tier::Session, RunKind::Isolated, None),
            run(Tier::Session, RunKind::Session, Some("s1")),
            run(Tier::Session, RunKind::Pooled, Some("s1")),
        ];
        for r in &ok {
            assert!(check_kind(r).is_ok(), "{:?} {:?}", r.tier, r.kind);
        }
        let refused = [
            run(Tier::Session, RunKind::Session, None),
            run(Tier::Ephemeral, RunKind::Session, Some("s1")),
            run(Tier::Aio, RunKind::Pooled, None),
            run(Tier::Reject, RunKind::Isolated, None),
        ];
        for r in &refused {
            let e = check_kind(r).unwrap_err();
            assert_eq!(e.code, 400, "{:?} {:?}: {e:?}", r.tier, r.kind);
        }
    }
}
