//! `Janitor`: on start and then periodically, removes AIO containers and networks of this
//! mesh that nobody owns:
//! - this process's containers that no instance holds (a race or a bug);
//! - containers and control directories of other aio-pool processes of the same mesh whose
//!   heartbeat key is gone from `sandbox_nodes` (they crashed: `kill -9` runs no cleanup), and
//!   their bridges (earlier versions of the pool put instances on one).
//!
//! Other meshes (parallel test runs, other deployments on the same Docker host) are never
//! judged: their owners' heartbeats are in another bucket.

use std::time::Duration;

use async_nats::jetstream::kv;
use bollard::query_parameters::ListNetworksOptionsBuilder;
use bollard::Docker;
use containers::summary_name;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::docker::{remove_control_dir, remove_network, Registry, LABEL_MESH, LABEL_OWNER};

/// The service name aio-pools beat under (`aio-pool.<instance_id>`).
pub const SERVICE_NAME: &str = messages::ServiceName::AioPool.as_str();

/// A foreign container younger than this is left alone: its owner beats before it creates
/// anything, so this only covers the moment between a listing and the look-up.
const FOREIGN_MIN_AGE: Duration = Duration::from_secs(2);

pub enum JanitorMsg {
    Sweep,
    /// Sweeps now and answers with the number of containers removed.
    SweepNow(RpcReplyPort<usize>),
}

pub struct Janitor;

#[derive(Clone)]
pub struct JanitorArgs {
    pub docker: Docker,
    pub mesh: String,
    pub me: String,
    pub registry: Registry,
    /// Where every pool of this host keeps its control directories (one per pool).
    pub socket_dir: std::path::PathBuf,
    pub nodes_kv: kv::Store,
    pub interval: Duration,
}

async fn owner_alive(kv: &kv::Store, owner: &str) -> bool {
    let key = messages::heartbeat::heartbeat_key(SERVICE_NAME, owner);
    match kv.get(&key).await {
        Ok(value) => value.is_some(),
        // Unknown is not dead: never remove on a failed look-up.
        Err(e) => {
            tracing::debug!(owner, error = %e, "heartbeat look-up failed");
            true
        }
    }
}

/// One pass; returns how many containers were removed.
pub async fn sweep(args: &JanitorArgs) -> usize {
    let containers =
        match containers::list(&args.docker, &format!("{LABEL_MESH}={}", args.mesh)).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "janitor: listing AIO containers failed");
                return 0;
            }
        };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let mut removed = 0;
    let mut dead_owners = std::collections::HashSet::new();
    for c in containers {
        let Some(name) = summary_name(&c) else {
            continue;
        };
        let owner = c
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_OWNER))
            .cloned()
            .unwrap_or_default();
        let orphan = if owner == args.me {
            !args.registry.contains(&name)
        } else {
            let old_enough = now - c.created.unwrap_or(now) >= FOREIGN_MIN_AGE.as_secs() as i64;
            let dead = old_enough && !owner_alive(&args.nodes_kv, &owner).await;
            if dead {
                dead_owners.insert(owner);
            }
            dead
        };
        if orphan {
            tracing::info!(
                container = name,
                "janitor: removing an unowned AIO container"
            );
            containers::remove(&args.docker, &name).await;
            removed += 1;
        }
    }
    // An owner is a label, not a path: only a plain name is joined to the directory.
    for owner in dead_owners
        .iter()
        .filter(|o| !o.is_empty() && !o.contains('/') && *o != "." && *o != "..")
    {
        remove_control_dir(&args.socket_dir.join(owner));
    }
    remove_dead_networks(args, dead_owners).await;
    removed
}

/// Bridges of owners that are gone (after their containers, or Docker refuses).
async fn remove_dead_networks(args: &JanitorArgs, mut dead: std::collections::HashSet<String>) {
    let label = format!("{LABEL_MESH}={}", args.mesh);
    let filters = std::collections::HashMap::from([("label", vec![label.as_str()])]);
    let Ok(networks) = args
        .docker
        .list_networks(Some(
            ListNetworksOptionsBuilder::new().filters(&filters).build(),
        ))
        .await
    else {
        return;
    };
    for n in networks {
        let owner = n.labels.as_ref().and_then(|l| l.get(LABEL_OWNER)).cloned();
        let Some(owner) = owner else { continue };
        if owner == args.me {
            continue;
        }
        // A bridge with no containers left is not found through them: look it up too.
        if !dead.contains(&owner) && owner_alive(&args.nodes_kv, &owner).await {
            continue;
        }
        dead.insert(owner);
        if let Some(name) = n.name {
            remove_network(&args.docker, &name).await;
        }
    }
}

impl Actor for Janitor {
    type Msg = JanitorMsg;
    type State = JanitorArgs;
    type Arguments = JanitorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<JanitorMsg>,
        args: JanitorArgs,
    ) -> Result<JanitorArgs, ActorProcessingErr> {
        myself.send_interval(args.interval, || JanitorMsg::Sweep);
        Ok(args)
    }

    async fn post_start(
        &self,
        myself: ActorRef<JanitorMsg>,
        _state: &mut JanitorArgs,
    ) -> Result<(), ActorProcessingErr> {
        // The start-up reconciliation, right away.
        myself.cast(JanitorMsg::Sweep)?;
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<JanitorMsg>,
        msg: JanitorMsg,
        state: &mut JanitorArgs,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            JanitorMsg::Sweep => {
                sweep(state).await;
            }
            JanitorMsg::SweepNow(reply) => {
                reply.send(sweep(state).await).ok();
            }
        }
        Ok(())
    }
}
