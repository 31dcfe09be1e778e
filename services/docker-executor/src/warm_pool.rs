//! `WarmPool`: pre-started hardened containers, each handed out exactly once (for one
//! ephemeral execution, or as a new session's container) and replenished in the background,
//! so no execution pays a cold container start while the pool has stock. A container joins
//! the pool only after its resident supervisor started each interpreter in it once and said
//! it is ready.
//!
//! Its size follows demand ([`crate::demand`], the rules, pure): after a burst of N takes it
//! holds N (capped), two starts at a time, and once the burst is forgotten the surplus goes.
//! This actor only counts takes, asks `Demand` for the next [`Step`] and does it.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kit::metrics::PoolLabels;
use messages::template::DEFAULT_TEMPLATE;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use executor_node::NodeState;

use crate::demand::{Demand, Sizing, Step};
use crate::docker::{ContainerKind, ContainerLimits, DockerError, Sandboxes};
use crate::gauges::ContainerGauges;
use crate::lease::ContainerLease;
use crate::resident::Resident;

const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// While the pool still has stock, a refill waits this long (or for the execution that took
/// a container to end, whichever comes first): starting a container is CPU-heavy for
/// dockerd, containerd and runc, and on a small host it would slow the very execution that
/// just took one. An empty pool refills at once.
const REFILL_DELAY: Duration = Duration::from_millis(300);
/// While a take is remembered (the target may fall) or the pool is above its target, it looks
/// again this often: each look removes a step's worth of surplus.
const TRIM_EVERY: Duration = Duration::from_secs(1);

pub enum WarmPoolMsg {
    /// A ready container, or `None` when the pool is empty (the caller starts one itself).
    Take(RpcReplyPort<Option<ContainerLease>>),
    /// A background start finished. A lease in a message the stopped pool never reads is
    /// dropped with it, which removes the container.
    /// Boxed: a lease is large beside the other variants.
    Started(Result<Box<ContainerLease>, DockerError>),
    /// Start containers until the pool is full (also sent when an execution that took a
    /// container ends). Ignored while a retry after failed starts is pending.
    Replenish,
    /// The backoff after failed starts is over.
    Retry,
    /// A periodic look at demand: forget old takes, remove surplus.
    Trim,
}

pub struct WarmPool;

pub struct WarmPoolArgs {
    /// Its containers run this image (`sandboxes.spec.image`).
    pub sandboxes: Sandboxes,
    /// The template it keeps warm (the metrics' label); `None`: the node's own image, whose
    /// stock is what the heartbeat reports.
    pub template: Option<String>,
    pub node: Arc<NodeState>,
    /// Where the node's own pool reports its stock for the heartbeat.
    pub gauges: Arc<ContainerGauges>,
    /// Its floor, cap and demand window.
    pub sizing: Sizing,
    /// What the pool's containers start with: the ceilings' defaults.
    pub limits: ContainerLimits,
}

pub struct WarmPoolState {
    args: WarmPoolArgs,
    ready: VecDeque<ContainerLease>,
    /// Starts in flight, counted so a burst of takes does not over-start.
    starting: usize,
    /// Grows while starts fail (no image, daemon down), so a broken host is not hammered.
    backoff: Duration,
    retry_pending: bool,
    /// Recent takes: the size the pool grows to.
    demand: Demand,
    /// A `Trim` is scheduled (one chain of them at most).
    trimming: bool,
}

impl WarmPoolState {
    fn publish_size(&self) {
        match &self.args.template {
            None => {
                let gauges = &self.args.gauges;
                gauges.warm.store(self.ready.len(), Ordering::Relaxed);
                gauges
                    .warm_target
                    .store(self.demand.target(), Ordering::Relaxed);
            }
            Some(template) => {
                let labels = PoolLabels {
                    service: crate::SERVICE_NAME,
                    template: template.clone(),
                };
                let gauge = self
                    .args
                    .node
                    .metrics
                    .template_warm_pool_size
                    .get_or_create(&labels);
                gauge.set(self.ready.len() as i64);
            }
        }
    }

    /// Brings the pool a step closer to its target: starts (two in flight at most) or removes
    /// surplus (two ready ones at most); keeps trimming while the target may still fall.
    fn adjust(&mut self, myself: &ActorRef<WarmPoolMsg>) {
        self.demand.forget(Instant::now());
        let Step { start, remove } = self.demand.step(self.ready.len(), self.starting);
        for _ in 0..start {
            self.start_one(myself);
        }
        // Dropped leases remove their containers, off this actor.
        self.ready.truncate(self.ready.len() - remove);
        // The target may have fallen even when nothing was removed.
        self.publish_size();
        let surplus = self.ready.len() + self.starting > self.demand.target();
        if !self.trimming && (self.demand.remembers() || surplus) {
            self.trimming = true;
            myself.send_after(TRIM_EVERY, || WarmPoolMsg::Trim);
        }
    }

    fn start_one(&mut self, myself: &ActorRef<WarmPoolMsg>) {
        self.starting += 1;
        let sandboxes = self.args.sandboxes.clone();
        let node = self.args.node.clone();
        let limits = self.args.limits;
        let myself = myself.clone();
        self.args.node.tasks.spawn(async move {
            let started = async {
                let mut lease = ContainerLease::start(
                    &sandboxes,
                    &node,
                    ContainerKind::Warm,
                    None,
                    limits,
                    None,
                    None,
                )
                .await?;
                let resident = Resident::start(&sandboxes.docker, &lease.name, true).await?;
                lease.resident = Some(Box::new(resident));
                Ok(lease)
            }
            .await;
            let _ = myself.cast(WarmPoolMsg::Started(started.map(Box::new)));
        });
    }
}

impl Actor for WarmPool {
    type Msg = WarmPoolMsg;
    type State = WarmPoolState;
    type Arguments = WarmPoolArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: WarmPoolArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        myself.cast(WarmPoolMsg::Replenish)?;
        let state = WarmPoolState {
            demand: Demand::new(args.sizing),
            args,
            ready: VecDeque::new(),
            starting: 0,
            backoff: Duration::from_millis(250),
            retry_pending: false,
            trimming: false,
        };
        state.publish_size();
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            WarmPoolMsg::Take(reply) => {
                state.demand.take(Instant::now());
                let container = state.ready.pop_front();
                state.publish_size();
                let m = &state.args.node.metrics;
                let counter = if container.is_some() {
                    &m.warm_pool_hits
                } else {
                    &m.warm_pool_misses
                };
                let labels = PoolLabels {
                    service: crate::SERVICE_NAME,
                    template: state
                        .args
                        .template
                        .clone()
                        .unwrap_or_else(|| DEFAULT_TEMPLATE.into()),
                };
                counter.get_or_create(&labels).inc();
                let _ = reply.send(container);
                if state.ready.is_empty() {
                    let _ = myself.cast(WarmPoolMsg::Replenish);
                } else {
                    myself.send_after(REFILL_DELAY, || WarmPoolMsg::Replenish);
                }
            }
            WarmPoolMsg::Started(Ok(container)) => {
                state.starting -= 1;
                state.backoff = Duration::from_millis(250);
                state.ready.push_back(*container);
                state.publish_size();
                // The next start, while the pool is below its target.
                if !state.retry_pending {
                    state.adjust(&myself);
                }
            }
            WarmPoolMsg::Started(Err(e)) => {
                state.starting -= 1;
                tracing::warn!(error = %e, retry_in = ?state.backoff, "could not start a warm container");
                if !state.retry_pending {
                    state.retry_pending = true;
                    myself.send_after(state.backoff, || WarmPoolMsg::Retry);
                    state.backoff = (state.backoff * 2).min(MAX_BACKOFF);
                }
            }
            WarmPoolMsg::Replenish => {
                if !state.retry_pending {
                    state.adjust(&myself);
                }
            }
            WarmPoolMsg::Retry => {
                state.retry_pending = false;
                state.adjust(&myself);
            }
            WarmPoolMsg::Trim => {
                state.trimming = false;
                // While failed starts back off, the retry's adjust resumes the trimming.
                if !state.retry_pending {
                    state.adjust(&myself);
                }
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // Dropped leases remove their containers (shutdown waits for the node's tasks).
        state.ready.clear();
        state.publish_size();
        Ok(())
    }
}
