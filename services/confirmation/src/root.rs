//! `Root`: the instance's supervisor. It spawns the `Registry` linked to itself, forwards every
//! request to the registry alive now, and restarts the registry when it dies (the new one
//! reloads its state from the bucket). A registry that keeps dying is not restarted forever:
//! after [`MAX_RESTARTS`] within [`RESTART_WINDOW`] the root stops with an error, so `run()`
//! fails and the heartbeat stops rather than report an instance that cannot decide anything.

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::time::Instant;

use crate::registry::{Gauges, Registry, RegistryArgs, RegistryMsg};
use crate::workflow::Workflow;

pub const MAX_RESTARTS: usize = 3;
pub const RESTART_WINDOW: Duration = Duration::from_secs(60);
/// How long the root waits for its registry to stop (the registry awaits its own tasks).
const STOP_GRACE: Duration = Duration::from_secs(10);

/// The name prefix of an instance's registry actors: `<prefix><unique suffix>`, unique so that
/// instances sharing a process (tests, `sandmesh up`) never clash, and findable for debugging.
pub fn registry_name_prefix(instance_id: &str) -> String {
    format!("{}.registry.{instance_id}.", crate::SERVICE_NAME)
}

/// Why the root stopped: the registry died once more than it is restarted.
#[derive(Debug, thiserror::Error)]
#[error("the registry died {} times within {RESTART_WINDOW:?}; last: {last}", MAX_RESTARTS + 1)]
pub struct GaveUp {
    pub last: String,
}

pub struct Root<W>(PhantomData<fn() -> W>);

impl<W> Default for Root<W> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

pub struct RootArgs<W> {
    pub workflow: W,
    pub gauges: Arc<Gauges>,
    pub instance_id: String,
}

pub struct RootState<W> {
    /// What every registry incarnation starts from.
    args: RootArgs<W>,
    /// The registry alive now; requests go here.
    registry: ActorRef<RegistryMsg>,
    /// When the registry was restarted, within the window.
    restarts: VecDeque<Instant>,
}

async fn spawn_registry<W: Workflow>(
    root: &ActorRef<RegistryMsg>,
    args: &RootArgs<W>,
) -> Result<ActorRef<RegistryMsg>, ActorProcessingErr> {
    let name = format!(
        "{}{}",
        registry_name_prefix(&args.instance_id),
        messages::new_id()
    );
    let registry_args = RegistryArgs {
        workflow: args.workflow.clone(),
        gauges: args.gauges.clone(),
    };
    let (registry, _) = Actor::spawn_linked(
        Some(name),
        Registry::<W>::default(),
        registry_args,
        root.get_cell(),
    )
    .await?;
    Ok(registry)
}

impl<W: Workflow> Actor for Root<W> {
    /// The root speaks the registry's protocol: it only forwards.
    type Msg = RegistryMsg;
    type State = RootState<W>;
    type Arguments = RootArgs<W>;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: RootArgs<W>,
    ) -> Result<Self::State, ActorProcessingErr> {
        let registry = spawn_registry(&myself, &args).await?;
        Ok(RootState {
            args,
            registry,
            restarts: VecDeque::new(),
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // If the registry just died, the message (and its reply port) is dropped: the caller
        // gets a retryable 503 and the restarted registry serves the retry.
        let _ = state.registry.cast(msg);
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let (who, why) = match &event {
            SupervisionEvent::ActorTerminated(who, _, reason) => {
                (who, reason.clone().unwrap_or_else(|| "stopped".into()))
            }
            SupervisionEvent::ActorFailed(who, error) => (who, error.to_string()),
            _ => return Ok(()),
        };
        if who.get_id() != state.registry.get_id() {
            return Ok(());
        }
        let now = Instant::now();
        state
            .restarts
            .retain(|at| now.duration_since(*at) < RESTART_WINDOW);
        if state.restarts.len() >= MAX_RESTARTS {
            let gave_up = GaveUp { last: why };
            tracing::error!(error = %gave_up, "the confirmation registry is not restarted again");
            return Err(gave_up.into());
        }
        tracing::error!(reason = %why, "the confirmation registry died; restarting it");
        state.restarts.push_back(now);
        state.registry = spawn_registry(&myself, &state.args).await?;
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let _ = state.registry.stop_and_wait(None, Some(STOP_GRACE)).await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use messages::confirm::{ConfirmDecide, ConfirmScope, ConfirmState};
    use ractor::{call_t, ActorCell};
    use tokio::time::sleep;

    use super::*;
    use crate::testing::{ctx, request, Book};

    const CALL_MS: u64 = 3_600_000;
    const MINUTE: Duration = Duration::from_secs(60);

    fn the_registry(root: &ActorRef<RegistryMsg>) -> ActorCell {
        let children = root.get_children();
        assert_eq!(children.len(), 1, "one registry under the root");
        children.into_iter().next().unwrap()
    }

    /// Kills the registry and returns once the root has restarted it.
    async fn kill_registry(root: &ActorRef<RegistryMsg>) {
        let dead = the_registry(root);
        dead.kill();
        test_support::eventually("a new registry", Duration::from_secs(5), || {
            let children = root.get_children();
            let restarted = children.len() == 1 && children[0].get_id() != dead.get_id();
            async move { restarted.then_some(()) }
        })
        .await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_killed_registry_is_restarted_with_the_pending_ones_it_had() {
        let book = Book::new();
        let args = RootArgs {
            workflow: book.clone(),
            gauges: Arc::new(Gauges::default()),
            instance_id: "t".into(),
        };
        let (root, _) = Actor::spawn(None, Root::default(), args).await.unwrap();
        let open = |timeout| {
            let root = root.clone();
            async move {
                call_t!(
                    root,
                    RegistryMsg::Request,
                    CALL_MS,
                    ctx(),
                    request(false, timeout)
                )
                .unwrap()
                .unwrap()
            }
        };
        let expiring = open(MINUTE).await;
        let decided_later = open(MINUTE * 10).await;

        kill_registry(&root).await;

        // The new registry decides, and expires on time what its predecessor was timing.
        let decide = ConfirmDecide {
            by_account: None,
            id: decided_later.id.clone(),
            approve: true,
            by: "alice".into(),
            reason: None,
            scope: ConfirmScope::Once,
        };
        let decided = call_t!(root, RegistryMsg::Decide, CALL_MS, ctx(), decide)
            .unwrap()
            .unwrap();
        assert_eq!(decided.state, ConfirmState::Approved);
        sleep(MINUTE - Duration::from_millis(100)).await;
        assert_eq!(book.state(&expiring.id), Some(ConfirmState::Pending));
        sleep(Duration::from_millis(200)).await;
        assert_eq!(book.state(&expiring.id), Some(ConfirmState::Timeout));
    }

    #[tokio::test(start_paused = true)]
    async fn the_root_stops_when_the_registry_keeps_dying() {
        let args = RootArgs {
            workflow: Book::new(),
            gauges: Arc::new(Gauges::default()),
            instance_id: "t".into(),
        };
        let (root, root_task) = Actor::spawn(None, Root::default(), args).await.unwrap();
        for _ in 0..MAX_RESTARTS {
            kill_registry(&root).await;
        }
        assert!(!root_task.is_finished());
        the_registry(&root).kill();
        tokio::time::timeout(Duration::from_secs(5), root_task)
            .await
            .expect("the root stops after one death too many")
            .unwrap();
    }
}
