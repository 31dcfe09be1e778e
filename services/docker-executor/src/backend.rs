//! [`DockerBackend`]: the Docker backend of `executor_node`. It takes tiers `ephemeral` and
//! `session` (pooled, isolated and session runs; network policies on containers of their
//! own) and hands each admitted run to its [`Containers`] actor.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use executor_node::{Admitted, Backend, BackendError, ExecutorError, Gauges, NodeState};
use futures::future::BoxFuture;
use futures::FutureExt;
use messages::executor::{ExecutorRun, RunKind};
use messages::proc::{ProcCall, ProcReply};
use messages::{ErrorKind, ServiceName};
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef};

use crate::containers::{Containers, ContainersArgs, ContainersMsg};
use crate::execution::Runner;
use crate::gauges::ContainerGauges;
use crate::janitor::DockerSweeper;
use crate::proc_error::ProcError;

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

/// A pooled run runs in a warm container, made before anyone asked: it has no egress socket.
#[derive(Debug, thiserror::Error)]
#[error("a run with a network policy needs run kind isolated or session")]
pub struct PooledWithNetwork;

impl BackendError for PooledWithNetwork {
    fn kind(&self) -> ErrorKind {
        ErrorKind::BadRequest
    }
}

/// The Docker backend runs every kind of run; of a run with a network policy it checks the
/// policy, and that the run has a container of its own.
fn check_network(run: &ExecutorRun) -> Result<(), ExecutorError> {
    if let Some(policy) = &run.network {
        policy.validate()?;
        if run.kind() == &RunKind::Pooled {
            return Err(PooledWithNetwork.into());
        }
    }
    Ok(())
}

impl Backend for DockerBackend {
    type Sweeper = DockerSweeper;
    const KIND: messages::executor::Backend = messages::executor::Backend::Docker;
    const SERVICE: ServiceName = ServiceName::DockerExecutor;
    const SESSIONS: bool = true;

    fn accepts(&self, run: &ExecutorRun) -> Result<(), ExecutorError> {
        check_network(run)
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

    fn proc(&self, call: ProcCall) -> BoxFuture<'static, Result<ProcReply, ExecutorError>> {
        let containers = self.containers.clone();
        async move {
            let containers = containers.ok_or(ProcError::BackendStarting)?;
            match ractor::call!(containers, ContainersMsg::Proc, Box::new(call)) {
                Ok(answer) => answer,
                // Stopped before answering, or it dropped the call (the session went).
                Err(_) => Err(ProcError::SessionGone.into()),
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
            let warm_target = gauges.warm_target.load(Ordering::Relaxed);
            let sessions = gauges.sessions.load(Ordering::Relaxed);
            // The Prometheus gauges are refreshed with each beat: the figures the scheduler sees.
            metrics.warm_pool_size.get_or_create(&at).set(warm as i64);
            metrics
                .sessions_active
                .get_or_create(&at)
                .set(sessions as i64);
            m.insert("warm_pool_size".into(), warm as f64);
            m.insert("warm_pool_target".into(), warm_target as f64);
            m.insert("active_sessions".into(), sessions as f64);
        })
    }
}

#[cfg(test)]
mod tests {
    use messages::exec::Language;
    use messages::network::NetworkPolicy;

    use super::*;

    #[test]
    fn a_network_policy_needs_a_container_of_its_own() {
        let run = |kind| {
            let request = test_support::executor_conformance::ephemeral(Language::Python, "");
            let mut run = ExecutorRun::new("e1".into(), request.request().clone(), kind).unwrap();
            run.network = Some(NetworkPolicy::default());
            run
        };
        let isolated = RunKind::Isolated {
            session_grade: false,
        };
        assert!(check_network(&run(isolated)).is_ok());
        let e = check_network(&run(RunKind::Pooled)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::BadRequest, "{e:?}");
        assert_eq!(e.to_string(), PooledWithNetwork.to_string());
        let mut hostile = run(RunKind::Isolated {
            session_grade: true,
        });
        hostile.network = Some(NetworkPolicy {
            allow_cidrs: vec!["not a cidr".into()],
            ..Default::default()
        });
        let e = check_network(&hostile).unwrap_err();
        assert!(matches!(e, ExecutorError::Invalid(_)), "{e:?}");
        assert_eq!(e.kind(), ErrorKind::BadRequest);
    }
}
