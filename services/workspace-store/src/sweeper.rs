//! `Sweeper`: every `interval`, removes workspaces untouched past the TTL. Every instance
//! runs one; a short-lived KV lock lets one of them do the work per round (the sweep is
//! idempotent, so an expired lock and two sweepers at once are harmless). The sweep runs in
//! a task and reports back, so the actor never blocks and never overlaps itself.

use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};

use crate::cleanup::Cleanup;
use crate::keys::SWEEP_LOCK_KEY;
use crate::workspaces::Workspaces;

pub enum SweeperMsg {
    Tick,
    Finished,
}

pub struct Sweeper;

pub struct SweeperArgs {
    pub store: Arc<Workspaces>,
    pub interval: Duration,
    /// Who holds the lock: `<instance_id>`, for diagnosis.
    pub holder: String,
}

pub struct SweeperState {
    args: SweeperArgs,
    /// A sweep is in flight; ticks meanwhile are skipped.
    running: bool,
}

async fn sweep_once(cleanup: &Cleanup, holder: &str, lock_ttl: Duration) {
    match cleanup
        .index()
        .try_lock(SWEEP_LOCK_KEY, holder, lock_ttl)
        .await
    {
        Ok(true) => {}
        Ok(false) => return,
        Err(e) => {
            tracing::warn!(error = %e, "sweep lock unavailable");
            return;
        }
    }
    match cleanup.sweep(cleanup.after()).await {
        Ok(removed) if !removed.is_empty() => {
            tracing::info!(count = removed.len(), "expired workspaces removed")
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "workspace sweep failed"),
    }
    if let Err(e) = cleanup.index().unlock(SWEEP_LOCK_KEY).await {
        tracing::debug!(error = %e, "sweep lock left to expire");
    }
}

impl Actor for Sweeper {
    type Msg = SweeperMsg;
    type State = SweeperState;
    type Arguments = SweeperArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<SweeperMsg>,
        args: SweeperArgs,
    ) -> Result<SweeperState, ActorProcessingErr> {
        myself.send_interval(args.interval, || SweeperMsg::Tick);
        Ok(SweeperState {
            args,
            running: false,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<SweeperMsg>,
        msg: SweeperMsg,
        state: &mut SweeperState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SweeperMsg::Tick if !state.running => {
                state.running = true;
                let store = state.args.store.clone();
                let holder = state.args.holder.clone();
                // The lock outlives a normal sweep; if a sweep takes longer, a second one
                // starting elsewhere only repeats idempotent work.
                let ttl = state.args.interval.max(Duration::from_secs(60));
                tokio::spawn(async move {
                    sweep_once(&store.cleanup, &holder, ttl).await;
                    let _ = myself.cast(SweeperMsg::Finished);
                });
            }
            SweeperMsg::Tick => {}
            SweeperMsg::Finished => state.running = false,
        }
        Ok(())
    }
}
