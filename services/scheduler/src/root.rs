//! `Root` actor: the scheduler's supervisor. It owns the `Registry` actor: when the registry
//! dies it is restarted, preloaded again from KV `sandbox_nodes`, and the shared
//! [`RegistryHandle`] is pointed at it. Past [`MAX_RESTARTS`] within [`RESTART_WINDOW`] the root
//! stops with an error, and `run()` (which watches the root) fails: placement never silently
//! degrades to "no node known".
//!
//! ```text
//! Root ──spawn_linked──▶ Registry   (restarted on death; preloaded from KV)
//! ```

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use async_nats::jetstream::kv;
use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};

use crate::registry::{self, Registry, RegistryArgs, RegistryHandle, RegistryMsg};

/// Restarts allowed within [`RESTART_WINDOW`] before the root gives up.
pub const MAX_RESTARTS: usize = 5;
pub const RESTART_WINDOW: Duration = Duration::from_secs(60);

/// The root takes no requests; it only supervises.
pub enum RootMsg {}

pub struct Root;

pub struct RootArgs {
    pub registry: RegistryArgs,
    /// The registry's actor name (unique per scheduler instance).
    pub registry_name: String,
    /// Heartbeats to preload a (re)started registry from.
    pub nodes: kv::Store,
    /// Filled with the first registry in `pre_start`, swapped on every restart.
    pub handle: tokio::sync::oneshot::Sender<RegistryHandle>,
}

pub struct RootState {
    args: RegistryArgs,
    name: String,
    nodes: kv::Store,
    handle: RegistryHandle,
    /// When the recent restarts happened, to tell a crash loop from a rare failure.
    restarts: VecDeque<Instant>,
}

impl Root {
    async fn start_registry(
        myself: &ActorRef<RootMsg>,
        name: &str,
        args: &RegistryArgs,
        nodes: &kv::Store,
    ) -> Result<ActorRef<RegistryMsg>, ActorProcessingErr> {
        let (registry, _) = Actor::spawn_linked(
            Some(name.to_string()),
            Registry,
            args.clone(),
            myself.get_cell(),
        )
        .await?;
        match registry::preload(nodes, &registry).await {
            Ok(n) => tracing::info!(executors = n, "runtime registry loaded"),
            Err(e) => {
                tracing::warn!(error = %e, "runtime registry not preloaded; the watch fills it")
            }
        }
        Ok(registry)
    }
}

impl Actor for Root {
    type Msg = RootMsg;
    type State = RootState;
    type Arguments = RootArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: RootArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let registry =
            Self::start_registry(&myself, &args.registry_name, &args.registry, &args.nodes).await?;
        let handle = RegistryHandle::new(registry);
        let _ = args.handle.send(handle.clone());
        Ok(RootState {
            args: args.registry,
            name: args.registry_name,
            nodes: args.nodes,
            handle,
            restarts: VecDeque::new(),
        })
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let why = match &event {
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                if cell.get_id() != state.handle.get().get_id() {
                    return Ok(());
                }
                format!("stopped ({})", reason.as_deref().unwrap_or("no reason"))
            }
            SupervisionEvent::ActorFailed(cell, error) => {
                if cell.get_id() != state.handle.get().get_id() {
                    return Ok(());
                }
                format!("failed: {error}")
            }
            _ => return Ok(()),
        };
        let now = Instant::now();
        state
            .restarts
            .retain(|at| now.duration_since(*at) < RESTART_WINDOW);
        if state.restarts.len() >= MAX_RESTARTS {
            return Err(format!(
                "the registry actor {why}, after {MAX_RESTARTS} restarts within {RESTART_WINDOW:?}"
            )
            .into());
        }
        state.restarts.push_back(now);
        tracing::error!(reason = %why, "the registry actor died; restarting it");
        let registry =
            Self::start_registry(&myself, &state.name, &state.args, &state.nodes).await?;
        state.handle.set(registry);
        // Waiters re-check against the new table.
        state.args.slots.notify_waiters();
        Ok(())
    }
}
