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
            tracing::error!(
                reason = %why,
                "the confirmation registry died {} times within {RESTART_WINDOW:?}; giving up",
                MAX_RESTARTS + 1
            );
            return Err(format!("registry died too often, last: {why}").into());
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
