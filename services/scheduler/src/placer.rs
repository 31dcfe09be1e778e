//! `Placer`: which executor node takes a run, and waiting for a free slot. It asks the
//! `Registry` actor (through the [`RegistryHandle`], so a restarted registry is found) and, while
//! every known node is full, sleeps on the registry's `slots` [`Notify`] — woken by heartbeats,
//! finished runs and nodes leaving — instead of polling.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use kit::{AuditScope, Auditor};
use messages::audit::ExecutionPlaced;
use messages::executor::ExecutorRun;
use ractor::rpc::CallResult;
use tokio::sync::{broadcast, Notify};
use tokio::time::Instant;

use crate::error::RegistryGone;
use crate::placement::{Decision, NodeView, Requirements, Strategy};
use crate::registry::{RegistryHandle, RegistryMsg};

/// How long one question to the registry may take; it answers from memory.
const REGISTRY_CALL: Duration = Duration::from_secs(5);

/// Tries per execution when the chosen node turns out to be gone (no responders).
pub const PLACEMENT_ATTEMPTS: usize = 3;

/// A run's node stopped sending heartbeats while it ran ([`Placer::unless_gone`]).
#[derive(Debug, thiserror::Error)]
#[error("executor node {node} stopped sending heartbeats while it ran the execution")]
pub struct NodeGone {
    pub node: String,
}

/// Work counted on a node — by a pick, or a session's run sent to its node — for as long as
/// it is held: dropped, it tells the registry the work ended, however it ended (answered,
/// failed, its task cancelled mid-flight), so no path leaves a slot counted forever. It moves
/// with the run it places (`ExecutorRunner::run_watched` takes it).
#[must_use = "dropped, a placement gives its slot back at once"]
pub struct Placement {
    decision: Decision,
    registry: RegistryHandle,
}

impl Placement {
    pub fn node(&self) -> &str {
        &self.decision.node
    }

    /// Where the work goes and why, for the `placed` audit event.
    pub fn decision(&self) -> &Decision {
        &self.decision
    }
}

impl Drop for Placement {
    fn drop(&mut self) {
        let node = std::mem::take(&mut self.decision.node);
        // A registry that stopped counts nothing; its successor starts from the heartbeats.
        let _ = self.registry.get().cast(RegistryMsg::Finished { node });
    }
}

#[derive(Clone)]
pub struct Placer {
    registry: RegistryHandle,
    slots: Arc<Notify>,
    /// The registry's announcements of nodes gone (see [`Self::unless_gone`]).
    removed: broadcast::Sender<String>,
    /// Named in the `placed` audit event.
    strategy: Strategy,
    auditor: Auditor,
}

impl Placer {
    pub fn new(
        registry: RegistryHandle,
        slots: Arc<Notify>,
        removed: broadcast::Sender<String>,
        strategy: Strategy,
        auditor: Auditor,
    ) -> Self {
        Self {
            registry,
            slots,
            removed,
            strategy,
            auditor,
        }
    }

    /// Runs `call` (a run on `node`), ending it as lost as soon as the node's heartbeat is
    /// gone: a run on a node that died has no answer coming, and without this its caller
    /// waited for the whole execution deadline. (A node that only lost its connection may
    /// still finish the run: `ExecutorRunner::run_watched` asks it before the run is lost.)
    pub async fn unless_gone<T>(
        &self,
        node: Option<&str>,
        call: impl Future<Output = T>,
    ) -> Result<T, NodeGone> {
        let Some(node) = node else {
            return Ok(call.await);
        };
        tokio::select! {
            call = call => Ok(call),
            () = self.gone(node) => Err(NodeGone { node: node.to_string() }),
        }
    }

    /// Resolves once the registry announces `node` gone (its heartbeat expired or was
    /// deleted); never while the registry is not running.
    async fn gone(&self, node: &str) {
        let mut removed = self.removed.subscribe();
        loop {
            match removed.recv().await {
                Ok(gone) if gone == node => return,
                Ok(_) => {}
                // Announcements were missed: look the node up instead.
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    if let Ok(false) = self.is_alive(node).await {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
            }
        }
    }

    /// Audits where `run` goes and why (`None`: the executor queue group).
    pub fn audit_placed(&self, scope: &AuditScope, run: &ExecutorRun, d: Option<&Decision>) {
        let placed = ExecutionPlaced {
            tier: run.tier(),
            node: d.map(|d| d.node.clone()),
            reason: d
                .map_or("executor queue group", |d| d.reason.as_str())
                .to_string(),
            strategy: self.strategy.as_str().to_string(),
            session_restored: run.session_restored,
        };
        self.auditor.emit(scope, placed);
    }

    async fn ask<T>(
        &self,
        msg: impl FnOnce(ractor::RpcReplyPort<T>) -> RegistryMsg,
    ) -> Result<T, RegistryGone>
    where
        T: Send + 'static,
    {
        match self.registry.get().call(msg, Some(REGISTRY_CALL)).await {
            Ok(CallResult::Success(v)) => Ok(v),
            Ok(CallResult::Timeout) => Err(RegistryGone::TimedOut),
            Ok(CallResult::SenderError) => Err(RegistryGone::Stopped),
            Err(e) => Err(RegistryGone::Unreachable(e.map(drop))),
        }
    }

    /// Chooses a node (counting the work on it at once, until the placement is dropped),
    /// skipping `exclude`.
    pub async fn pick(
        &self,
        needs: &Requirements,
        exclude: &[String],
    ) -> Result<Option<Placement>, RegistryGone> {
        let exclude = exclude.to_vec();
        let decision = self
            .ask(|reply| RegistryMsg::Pick {
                req: needs.clone(),
                exclude,
                reply,
            })
            .await?;
        Ok(decision.map(|decision| Placement {
            decision,
            registry: self.registry.clone(),
        }))
    }

    /// Like [`Self::pick`], but while executors are known and all of them are full, waits (up
    /// to `limit`) for a slot instead of sending work they would refuse with 429. `None` means
    /// no executor is known outside `exclude` (the queue group is the fallback) or the wait
    /// ran out.
    pub async fn pick_waiting(
        &self,
        needs: &Requirements,
        exclude: &[String],
        limit: Duration,
    ) -> Result<Option<Placement>, RegistryGone> {
        let deadline = Instant::now() + limit;
        loop {
            // Registered before looking, so a slot freed between the look and the wait wakes us.
            let freed = self.slots.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if let Some(placement) = self.pick(needs, exclude).await? {
                return Ok(Some(placement));
            }
            let known = self.nodes().await?;
            if known
                .iter()
                .all(|n| exclude.contains(&n.id) || !n.offers(needs.backend))
            {
                return Ok(None);
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                return Ok(None);
            }
        }
    }

    pub async fn nodes(&self) -> Result<Vec<NodeView>, RegistryGone> {
        self.ask(RegistryMsg::Nodes).await
    }

    pub async fn is_alive(&self, node: &str) -> Result<bool, RegistryGone> {
        let node = node.to_string();
        self.ask(|reply| RegistryMsg::IsAlive { node, reply }).await
    }

    /// Work sent to `node` without a pick (session affinity) counts there like a pick.
    pub fn dispatched(&self, node: &str) -> Placement {
        let _ = self.registry.get().cast(RegistryMsg::Dispatched {
            node: node.to_string(),
        });
        Placement {
            decision: Decision {
                node: node.to_string(),
                score: 1.0,
                reason: "session affinity".into(),
            },
            registry: self.registry.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::SchedulerError;
    use crate::executor_runner::ExecutorRunner;
    use crate::registry::{Registry, RegistryArgs};
    use messages::exec::ExecRequest;
    use messages::executor::Backend;
    use messages::heartbeat::Heartbeat;
    use ractor::Actor;

    /// A client that never connects: nothing here needs a server, and a request through it
    /// stays in flight until its task is dropped.
    async fn offline() -> async_nats::Client {
        async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .connect("127.0.0.1:1")
            .await
            .unwrap()
    }

    async fn placer_with_one_slot() -> (Placer, ractor::ActorRef<RegistryMsg>) {
        let slots = Arc::new(Notify::new());
        let (on_lost, _) = tokio::sync::mpsc::unbounded_channel();
        let (removed, _) = broadcast::channel(4);
        let args = RegistryArgs {
            strategy: Strategy::LeastLoaded,
            on_lost,
            slots: slots.clone(),
            removed: removed.clone(),
            metrics: Arc::default(),
        };
        let (registry, _) = Actor::spawn(None, Registry, args).await.unwrap();
        registry
            .cast(RegistryMsg::Upsert(Box::new(Heartbeat {
                instance_id: "a".into(),
                capacity: 1,
                ..Default::default()
            })))
            .unwrap();
        // Nothing is audited here; the client never needs a server.
        let client = offline().await;
        let subjects = messages::Subjects::default();
        let auditor = Auditor::new(async_nats::jetstream::new(client), subjects, "t", "t");
        let handle = RegistryHandle::new(registry.clone());
        let placer = Placer::new(handle, slots, removed, Strategy::LeastLoaded, auditor);
        (placer, registry)
    }

    /// A run on `a` ends lost when `a` is removed, and not when another node is. (On a paused
    /// clock the first wait ends only once everything else is idle: the removal of `b` has
    /// been handled by then.)
    #[tokio::test(start_paused = true)]
    async fn a_run_ends_lost_when_its_node_is_removed_and_not_for_another() {
        let (placer, registry) = placer_with_one_slot().await;
        let run = placer.unless_gone(Some("a"), std::future::pending());
        tokio::pin!(run);
        assert!(tokio::time::timeout(Duration::from_secs(1), &mut run)
            .await
            .is_err());
        let b = Heartbeat {
            instance_id: "b".into(),
            capacity: 1,
            ..Default::default()
        };
        registry.cast(RegistryMsg::Upsert(Box::new(b))).unwrap();
        registry
            .cast(RegistryMsg::Remove { node: "b".into() })
            .unwrap();
        assert!(
            tokio::time::timeout(Duration::from_secs(1), &mut run)
                .await
                .is_err(),
            "another node's removal does not end the run"
        );
        registry
            .cast(RegistryMsg::Remove { node: "a".into() })
            .unwrap();
        let call: Result<(), NodeGone> = tokio::time::timeout(Duration::from_secs(1), run)
            .await
            .expect("the run ends when its node is gone");
        let why = call.expect_err("the run did not end lost").to_string();
        assert!(why.contains("node a stopped"), "{why}");
    }

    /// On a paused clock no time passes while the waiter sleeps on the `Notify`: it is woken by
    /// the finished run, not by a timer (a polling loop would advance the clock).
    #[tokio::test(start_paused = true)]
    async fn a_waiting_pick_is_woken_by_a_finished_run_not_by_polling() {
        let (placer, registry) = placer_with_one_slot().await;
        let needs = Requirements::default();
        let taken = placer
            .pick(&needs, &[])
            .await
            .unwrap()
            .expect("the one slot");
        let started = Instant::now();
        let waiting = tokio::spawn({
            let placer = placer.clone();
            async move {
                placer
                    .pick_waiting(&needs, &[], Duration::from_secs(3600))
                    .await
            }
        });
        // Let the waiter find every node full and go to sleep.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!waiting.is_finished(), "no slot is free yet");
        drop(taken);
        let placement = waiting.await.unwrap().unwrap();
        assert_eq!(placement.as_ref().map(Placement::node), Some("a"));
        assert_eq!(started.elapsed(), Duration::ZERO, "woken, not polled");
        registry.stop(None);
    }

    #[tokio::test]
    async fn a_wait_ends_when_the_only_nodes_left_are_excluded() {
        let (placer, registry) = placer_with_one_slot().await;
        let picked = placer
            .pick_waiting(
                &Requirements::default(),
                &["a".into()],
                Duration::from_secs(3600),
            )
            .await
            .unwrap();
        assert!(picked.is_none());
        registry.kill();
        let gone = placer.pick(&Requirements::default(), &[]).await;
        assert!(gone.is_err(), "a dead registry is an error, not 'no node'");
    }

    /// Whether the one slot of `a` is free now: a pick takes it (and gives it back).
    async fn slot_free(placer: &Placer) -> bool {
        placer
            .pick(&Requirements::default(), &[])
            .await
            .unwrap()
            .is_some()
    }

    /// A placement gives its slot back on every way its work ends: answered, failed, or its
    /// task dropped while the run was in flight on the executor (the placement moved into
    /// `ExecutorRunner::run_watched`, as the dispatcher and the session affinity hand it).
    /// Each check asks the registry after the drop's message, so it sees its effect.
    #[tokio::test]
    async fn a_placement_is_given_back_on_every_path() {
        let (placer, registry) = placer_with_one_slot().await;
        let held = |placer: &Placer| {
            let placer = placer.clone();
            async move { placer.pick(&Requirements::default(), &[]).await.unwrap() }
        };

        // Answered, and failed: the work's function returns, its placement with it.
        let answered = |p: Placement| -> Result<String, SchedulerError> { Ok(p.node().into()) };
        let taken = held(&placer).await.expect("the one slot");
        assert!(!slot_free(&placer).await, "held while its work runs");
        assert_eq!(answered(taken).unwrap(), "a");
        assert!(slot_free(&placer).await, "given back after an answer");
        let failed = |p: Placement| -> Result<String, SchedulerError> {
            Err(SchedulerError::NoNodeForSession {
                id: p.node().into(),
            })
        };
        assert!(failed(held(&placer).await.unwrap()).is_err());
        assert!(slot_free(&placer).await, "given back after an error");

        // Session affinity counts a run on its node without a pick: the same guard.
        let affine = placer.dispatched("a");
        assert!(
            !slot_free(&placer).await,
            "a session's run counts on its node"
        );
        drop(affine);
        assert!(
            slot_free(&placer).await,
            "given back when the session's run ended"
        );

        // Cancelled mid-flight: the run is sent and no reply can come; the task is dropped.
        let mesh = sandmesh_client::MeshClient::new(offline().await, messages::Subjects::default());
        let runner = ExecutorRunner::new(mesh.executors(), placer.auditor.clone());
        let run = ExecutorRun::new(
            "e1".into(),
            ExecRequest::default(),
            messages::executor::RunKind::Pooled,
        )
        .unwrap();
        let placement = held(&placer).await.unwrap();
        let in_flight = tokio::spawn({
            let placer = placer.clone();
            async move {
                let deadline = Duration::from_secs(3600);
                let scope = AuditScope::default();
                runner
                    .run_watched(
                        &placer,
                        Backend::Docker,
                        Some(placement),
                        &run,
                        deadline,
                        &scope,
                    )
                    .await
            }
        });
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!in_flight.is_finished(), "no executor answers");
        assert!(!slot_free(&placer).await, "held while the run is in flight");
        in_flight.abort();
        let ended = in_flight.await;
        assert!(
            ended.is_err_and(|e| e.is_cancelled()),
            "the run was still in flight"
        );
        assert!(
            slot_free(&placer).await,
            "given back when the task was dropped"
        );
        registry.stop(None);
    }
}
