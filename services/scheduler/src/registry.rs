//! `Registry` actor: the runtime registry. It owns the table of live executor
//! nodes, fed by a watch on KV `sandbox_nodes` (a put is a live or updated node; a delete or a
//! TTL purge is a node gone), and answers placement questions with the configured strategy.
//!
//! Every heartbeat and every finished run signals `slots`, the `Notify` on which the
//! [`crate::placer::Placer`] waits for a free slot. The actor is supervised by
//! [`crate::root::Root`]; everyone else reaches it through a [`RegistryHandle`], which the root
//! points at the replacement when it restarts one.
//!
//! ```text
//! watch task (KV sandbox_nodes, docker-executor.> and bwrap-executor.>) ──Upsert/Remove──▶ Registry ──lost node id──▶ on_lost
//! Placer ──Pick/IsAlive/Nodes/Dispatched/Finished──▶ Registry ──notify──▶ slots
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_nats::jetstream::kv;
use futures::{StreamExt, TryStreamExt};
use messages::executor::Backend;
use messages::heartbeat::Heartbeat;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::{broadcast, mpsc, Notify};
use tokio_util::sync::CancellationToken;

use crate::error::StoreError;
use crate::placement::{self, Decision, NodeView, Requirements, Strategy};

/// The heartbeat service name of docker executors; their instance id is the node id.
pub const EXECUTOR_SERVICE: &str = messages::ServiceName::DockerExecutor.as_str();

/// Every executor service whose nodes placement knows (each node says in its heartbeat which
/// backends it offers).
pub const EXECUTOR_SERVICES: [&str; 2] = [
    EXECUTOR_SERVICE,
    messages::ServiceName::BwrapExecutor.as_str(),
];

/// The node a heartbeat key of an executor service names.
fn executor_node(key: &str) -> Option<&str> {
    EXECUTOR_SERVICES
        .iter()
        .find_map(|service| key.strip_prefix(service)?.strip_prefix('.'))
}

pub enum RegistryMsg {
    /// A heartbeat arrived (from the KV watch).
    /// Boxed: a heartbeat is large, and every message (and every send error carrying one)
    /// would be as large.
    Upsert(Box<Heartbeat>),
    /// A node's key was deleted or expired.
    Remove {
        node: String,
    },
    /// The watch restarted: forget everything; the replayed history refills the table.
    Reset,
    /// Chooses a node for new work, skipping `exclude`, and counts the work on it at once (so
    /// concurrent picks see each other); the `Placement` made of it sends `Finished` when dropped.
    Pick {
        req: Requirements,
        exclude: Vec<String>,
        reply: RpcReplyPort<Option<Decision>>,
    },
    IsAlive {
        node: String,
        reply: RpcReplyPort<bool>,
    },
    Nodes(RpcReplyPort<Vec<NodeView>>),
    /// This scheduler sent work to `node`.
    Dispatched {
        node: String,
    },
    /// That work ended.
    Finished {
        node: String,
    },
}

pub struct Registry;

#[derive(Clone)]
pub struct RegistryArgs {
    pub strategy: Strategy,
    /// Receives the id of every node that disappears, so its sessions can be marked lost.
    pub on_lost: mpsc::UnboundedSender<String>,
    /// Signalled whenever a slot may have freed up (a heartbeat, a finished run, a node gone).
    pub slots: Arc<Notify>,
    /// The id of every node that disappears, for the runs in flight there (a `Reset` sends
    /// none: a node missing only while the table is rebuilt is not gone).
    pub removed: broadcast::Sender<String>,
    /// Where `sandbox_runtime_nodes_healthy` is kept: this table is what knows it.
    pub metrics: Arc<kit::metrics::Metrics>,
}

struct NodeEntry {
    heartbeat: Heartbeat,
    /// Work this scheduler sent since the node's last heartbeat: heartbeats are seconds apart
    /// and a burst placed on stale load would all land on one node.
    sent_since_beat: u32,
    /// Work this scheduler has running there now.
    running: u32,
}

pub struct RegistryState {
    strategy: Strategy,
    on_lost: mpsc::UnboundedSender<String>,
    slots: Arc<Notify>,
    removed: broadcast::Sender<String>,
    metrics: Arc<kit::metrics::Metrics>,
    nodes: BTreeMap<String, NodeEntry>,
    /// Round-robin position.
    cursor: usize,
}

impl RegistryState {
    /// Sets `sandbox_runtime_nodes_healthy` from the table, per backend.
    fn count_nodes(&self) {
        for backend in Backend::ALL {
            let healthy = self
                .nodes
                .values()
                .filter(|e| e.heartbeat.offers(backend))
                .count();
            let label = kit::metrics::BackendLabel {
                backend: backend.as_str(),
            };
            self.metrics
                .runtime_nodes_healthy
                .get_or_create(&label)
                .set(healthy as i64);
        }
    }

    fn views(&self, exclude: &BTreeSet<&str>) -> Vec<NodeView> {
        self.nodes
            .iter()
            .filter(|(id, _)| !exclude.contains(id.as_str()))
            .map(|(id, e)| NodeView {
                id: id.clone(),
                capacity: e.heartbeat.capacity,
                load: e
                    .heartbeat
                    .load
                    .saturating_add(e.sent_since_beat)
                    .max(e.running),
                resources: e.heartbeat.resources,
                backends: Backend::ALL
                    .into_iter()
                    .filter(|b| e.heartbeat.offers(*b))
                    .collect(),
                held: e.heartbeat.tenants.clone(),
            })
            .collect()
    }
}

impl Actor for Registry {
    type Msg = RegistryMsg;
    type State = RegistryState;
    type Arguments = RegistryArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: RegistryArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(RegistryState {
            strategy: args.strategy,
            on_lost: args.on_lost,
            slots: args.slots,
            removed: args.removed,
            metrics: args.metrics,
            nodes: BTreeMap::new(),
            cursor: 0,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            RegistryMsg::Upsert(hb) => {
                let hb = *hb;
                let id = hb.instance_id.clone();
                match state.nodes.get_mut(&id) {
                    Some(e) => {
                        e.heartbeat = hb;
                        e.sent_since_beat = 0;
                    }
                    None => {
                        tracing::info!(node = %id, capacity = hb.capacity, "executor node joined");
                        if state.strategy == Strategy::ResourceAware && hb.resources.is_none() {
                            tracing::warn!(node = %id, "executor reports no CPU or memory; resource-aware placement scores it by load alone");
                        }
                        state.nodes.insert(
                            id,
                            NodeEntry {
                                heartbeat: hb,
                                sent_since_beat: 0,
                                running: 0,
                            },
                        );
                    }
                }
                state.count_nodes();
                state.slots.notify_waiters();
            }
            RegistryMsg::Remove { node } => {
                if state.nodes.remove(&node).is_some() {
                    state.count_nodes();
                    tracing::warn!(node = %node, "executor node gone");
                    let _ = state.removed.send(node.clone());
                    let _ = state.on_lost.send(node);
                    // Waiters that only had this node left must stop waiting for it.
                    state.slots.notify_waiters();
                }
            }
            RegistryMsg::Reset => {
                state.nodes.clear();
                state.count_nodes();
            }
            RegistryMsg::Pick {
                req,
                exclude,
                reply,
            } => {
                let exclude: BTreeSet<&str> = exclude.iter().map(String::as_str).collect();
                let views = state.views(&exclude);
                let decision = placement::choose(state.strategy, &views, &req, &mut state.cursor);
                if let Some(e) = decision.as_ref().and_then(|d| state.nodes.get_mut(&d.node)) {
                    e.sent_since_beat = e.sent_since_beat.saturating_add(1);
                    e.running = e.running.saturating_add(1);
                }
                let _ = reply.send(decision);
            }
            RegistryMsg::IsAlive { node, reply } => {
                let _ = reply.send(state.nodes.contains_key(&node));
            }
            RegistryMsg::Nodes(reply) => {
                let _ = reply.send(state.views(&BTreeSet::new()));
            }
            RegistryMsg::Dispatched { node } => {
                if let Some(e) = state.nodes.get_mut(&node) {
                    e.sent_since_beat = e.sent_since_beat.saturating_add(1);
                    e.running = e.running.saturating_add(1);
                }
            }
            RegistryMsg::Finished { node } => {
                if let Some(e) = state.nodes.get_mut(&node) {
                    e.running = e.running.saturating_sub(1);
                    // Work that ended before the node's next heartbeat is no longer load: its
                    // slot is free now, not a heartbeat later.
                    e.sent_since_beat = e.sent_since_beat.saturating_sub(1);
                }
                state.slots.notify_waiters();
            }
        }
        Ok(())
    }
}

/// The registry actor now running. The root swaps in the replacement when it restarts one, so
/// holders never keep talking to a dead actor.
#[derive(Clone)]
pub struct RegistryHandle(Arc<RwLock<ActorRef<RegistryMsg>>>);

impl RegistryHandle {
    pub fn new(registry: ActorRef<RegistryMsg>) -> Self {
        Self(Arc::new(RwLock::new(registry)))
    }

    pub fn get(&self) -> ActorRef<RegistryMsg> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn set(&self, registry: ActorRef<RegistryMsg>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = registry;
    }
}

/// The registry actor's name, so an operator (or a test) can find it in ractor's registry.
pub fn actor_name(instance_id: &str) -> String {
    format!("scheduler-registry-{instance_id}")
}

/// Loads the executors alive now, so placement works from the first request on (the watch
/// below delivers them too, but asynchronously).
pub async fn preload(
    nodes: &kv::Store,
    registry: &ActorRef<RegistryMsg>,
) -> Result<usize, StoreError> {
    let keys: Vec<String> = nodes
        .keys()
        .await
        .map_err(StoreError::during("listing executor heartbeats"))?
        .try_collect()
        .await
        .map_err(StoreError::during("listing executor heartbeats"))?;
    let mut loaded = 0;
    for key in keys.iter().filter(|k| executor_node(k).is_some()) {
        if let Ok(Some(entry)) = nodes.entry(key.as_str()).await {
            if let Some(msg) = to_msg(&entry.key, &entry.operation, &entry.value) {
                loaded += 1;
                // A registry that died meanwhile is restarted and preloaded again.
                let _ = registry.cast(msg);
            }
        }
    }
    Ok(loaded)
}

/// Feeds the registry from KV `sandbox_nodes` until `stop`. The watch replays the latest
/// heartbeat of every executor, then follows changes; when it breaks (a NATS reconnect), it is
/// re-opened and the table rebuilt.
pub fn spawn_watch(
    nodes: kv::Store,
    registry: RegistryHandle,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let filters = EXECUTOR_SERVICES.map(|service| format!("{service}.>"));
        let mut reopened = false;
        while !stop.is_cancelled() {
            // Raced with `stop`: with NATS gone, opening a watch waits for a reconnect.
            let opened = tokio::select! {
                _ = stop.cancelled() => break,
                w = nodes.watch_many_with_history(&filters) => w,
            };
            let mut watch = match opened {
                Ok(w) => w,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot watch executor heartbeats; retrying");
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    }
                }
            };
            // A re-opened watch replays every live key: start from a clean table so nodes
            // that vanished while it was broken are forgotten.
            if reopened {
                let _ = registry.get().cast(RegistryMsg::Reset);
            }
            reopened = true;
            loop {
                let entry = tokio::select! {
                    _ = stop.cancelled() => return,
                    e = watch.next() => e,
                };
                match entry {
                    Some(Ok(entry)) => {
                        if let Some(msg) = to_msg(&entry.key, &entry.operation, &entry.value) {
                            // While a dead registry is being replaced the cast fails; the
                            // replacement is preloaded from the KV, so nothing is missed.
                            let _ = registry.get().cast(msg);
                        }
                    }
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "executor heartbeat watch failed; re-opening");
                        break;
                    }
                    None => break,
                }
            }
        }
    })
}

fn to_msg(key: &str, operation: &kv::Operation, value: &[u8]) -> Option<RegistryMsg> {
    let node = executor_node(key)?;
    match operation {
        kv::Operation::Put => match serde_json::from_slice::<Heartbeat>(value) {
            Ok(hb) if hb.instance_id == node => Some(RegistryMsg::Upsert(Box::new(hb))),
            Ok(hb) => {
                tracing::warn!(key, instance = %hb.instance_id, "heartbeat key and instance disagree; ignored");
                None
            }
            Err(e) => {
                tracing::warn!(key, error = %e, "unreadable heartbeat ignored");
                None
            }
        },
        kv::Operation::Delete | kv::Operation::Purge => Some(RegistryMsg::Remove {
            node: node.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hb(id: &str, capacity: u32, load: u32) -> Heartbeat {
        Heartbeat {
            service: EXECUTOR_SERVICE.into(),
            instance_id: id.into(),
            capacity,
            load,
            ..Default::default()
        }
    }

    async fn pick(r: &ActorRef<RegistryMsg>, exclude: &[&str]) -> Option<String> {
        let exclude = exclude.iter().map(|s| s.to_string()).collect();
        ractor::call!(r, |reply| RegistryMsg::Pick {
            req: Requirements::default(),
            exclude,
            reply
        })
        .unwrap()
        .map(|d| d.node)
    }

    #[tokio::test]
    async fn picked_work_counts_until_it_finishes() {
        let (tx, mut lost) = mpsc::unbounded_channel();
        let (r, _h) = Actor::spawn(
            None,
            Registry,
            RegistryArgs {
                strategy: Strategy::LeastLoaded,
                on_lost: tx,
                slots: Arc::new(Notify::new()),
                removed: broadcast::channel(1).0,
                metrics: Arc::default(),
            },
        )
        .await
        .unwrap();
        r.cast(RegistryMsg::Upsert(Box::new(hb("a", 4, 0))))
            .unwrap();
        r.cast(RegistryMsg::Upsert(Box::new(hb("b", 4, 0))))
            .unwrap();
        let first = pick(&r, &[]).await.unwrap();
        r.cast(RegistryMsg::Dispatched {
            node: first.clone(),
        })
        .unwrap();
        let second = pick(&r, &[]).await.unwrap();
        assert_ne!(first, second, "the second pick must see the first dispatch");
        assert_eq!(pick(&r, &["a", "b"]).await, None);

        r.cast(RegistryMsg::Remove { node: "a".into() }).unwrap();
        assert_eq!(lost.recv().await.as_deref(), Some("a"));
        assert_eq!(pick(&r, &[]).await.as_deref(), Some("b"));
        let alive = ractor::call!(r, |reply| RegistryMsg::IsAlive {
            node: "a".into(),
            reply
        })
        .unwrap();
        assert!(!alive);
        r.stop(None);
    }

    #[test]
    fn only_matching_executor_keys_become_nodes() {
        let a = serde_json::to_vec(&hb("a", 1, 0)).unwrap();
        let entry = |key: &str, op: kv::Operation| to_msg(key, &op, &a);
        assert!(matches!(
            entry("docker-executor.a", kv::Operation::Put),
            Some(RegistryMsg::Upsert(_))
        ));
        assert!(entry("docker-executor.b", kv::Operation::Put).is_none());
        assert!(entry("scheduler.a", kv::Operation::Put).is_none());
        assert!(matches!(
            entry("docker-executor.a", kv::Operation::Purge),
            Some(RegistryMsg::Remove { .. })
        ));
    }

    #[tokio::test]
    async fn healthy_nodes_are_counted_per_backend_as_they_come_and_go() {
        let (tx, _lost) = mpsc::unbounded_channel();
        let metrics = Arc::new(kit::metrics::Metrics::default());
        let args = RegistryArgs {
            strategy: Strategy::ResourceAware,
            on_lost: tx,
            slots: Arc::new(Notify::new()),
            removed: broadcast::channel(1).0,
            metrics: metrics.clone(),
        };
        let (r, _h) = Actor::spawn(None, Registry, args).await.unwrap();
        let mut light = hb("light", 4, 0);
        light.backends = vec![Backend::Bwrap];
        for beat in [hb("a", 4, 0), hb("b", 4, 0), hb("a", 4, 1), light] {
            r.cast(RegistryMsg::Upsert(Box::new(beat))).unwrap();
        }
        r.cast(RegistryMsg::Remove { node: "b".into() }).unwrap();
        // A call after the casts: they have all been handled when it returns.
        ractor::call!(r, RegistryMsg::Nodes).unwrap();
        let healthy = |backend: Backend| {
            let label = kit::metrics::BackendLabel {
                backend: backend.as_str(),
            };
            metrics.runtime_nodes_healthy.get_or_create(&label).get()
        };
        assert_eq!((healthy(Backend::Docker), healthy(Backend::Bwrap)), (1, 1));
        r.cast(RegistryMsg::Reset).unwrap();
        ractor::call!(r, RegistryMsg::Nodes).unwrap();
        assert_eq!((healthy(Backend::Docker), healthy(Backend::Bwrap)), (0, 0));
        r.stop(None);
    }
}
