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

    /// Chooses a node (counting the work on it at once), skipping `exclude`.
    pub async fn pick(
        &self,
        needs: &Requirements,
        exclude: &[String],
    ) -> Result<Option<Decision>, RegistryGone> {
        let exclude = exclude.to_vec();
        self.ask(|reply| RegistryMsg::Pick {
            req: needs.clone(),
            exclude,
            reply,
        })
        .await
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
    ) -> Result<Option<Decision>, RegistryGone> {
        let deadline = Instant::now() + limit;
        loop {
            // Registered before looking, so a slot freed between the look and the wait wakes us.
            let freed = self.slots.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if let Some(decision) = self.pick(needs, exclude).await? {
                return Ok(Some(decision));
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
    pub fn dispatched(&self, node: &str) {
        let _ = self.registry.get().cast(RegistryMsg::Dispatched {
            node: node.to_string(),
        });
    }

    /// The work counted on `node` (by a pick or [`Self::dispatched`]) ended.
    pub fn release(&self, node: Option<&str>) {
        if let Some(node) = node {
            let _ = self
                .registry
                .get()
                .cast(RegistryMsg::Finished { node: node.into() });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{Registry, RegistryArgs};
    use messages::heartbeat::Heartbeat;
    use ractor::Actor;

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
        let client = async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .connect("127.0.0.1:1")
            .await
            .unwrap();
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
        placer.release(Some(&taken.node));
        let decision = waiting.await.unwrap().unwrap();
        assert_eq!(decision.map(|d| d.node).as_deref(), Some("a"));
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
        assert_eq!(picked, None);
        registry.kill();
        let gone = placer.pick(&Requirements::default(), &[]).await;
        assert!(gone.is_err(), "a dead registry is an error, not 'no node'");
    }
}
