//! docker-executor: runs untrusted Python, JavaScript and shell code in hardened Docker
//! containers.
//!
//! It owns the node's sandbox containers: a warm pool of pre-started single-use containers
//! (tier `ephemeral`), containers made for one isolated run (`RunKind::Isolated`: strict mode
//! without a session) and one container per session (tier `session`). Every container is held
//! through a [`lease::ContainerLease`], which removes it when dropped, and every accepted run
//! through a [`lease::RunSlot`], which gives its capacity back. Each container has one
//! resident `sandmesh-supervisor serve` ([`resident::Resident`], one `docker exec` for the
//! container's life, started while the container is warmed), and each execution is a request
//! to it: a fresh supervisor process receives the code, workspace and limits as frames, runs
//! the program in its own process group, streams its output, kills everything it started at the
//! end or on timeout, and sends back the changed files and a report (the
//! `sandmesh-sandbox-protocol` crate, `crates/sandbox-protocol`). No execution pays a `docker exec`.
//!
//! It is a backend of `executor_node` ([`backend::DockerBackend`]): admission, drain, the
//! heartbeat, the janitor and the subjects are the node's; this crate makes, runs and
//! removes containers.
//!
//! Subjects (internal; only the scheduler may publish there):
//! - `sandbox.v1.executor.docker.run` — queue group of all executors: ephemeral runs and a
//!   session's first run (the result's `node` says where the session now lives);
//! - `sandbox.v1.executor.docker.<node_id>.{run,close,drain}` — this node only.
//!
//! ```text
//! ExecutorNode<DockerBackend> (admission, drain; restarts the janitor; fails with Containers)
//! ├── Janitor<DockerSweeper>  removes containers no live owner holds (this node, dead nodes)
//! └── Containers              routing; restarts failed pools
//!     ├── WarmPool            ready single-use containers, replenished in the background,
//!     │                       as many as the busiest 10 s of takes lately (`demand`)
//!     ├── WarmPool*           one per template image in use here, started by its first run
//!     └── SessionContainer*   one per session: its container, runs one at a time, idle close
//! (+ the kit's Heartbeat: capacity, running, warm pool size and target, sessions)
//! ```
//!
//! Behaviour worth knowing:
//! - Processes never outlive their execution: when the program exits (or times out, or
//!   passes the output cap) the supervisor kills every process of the container except its
//!   init (`sandmesh-supervisor keep`, not traceable), the resident supervisor and the
//!   session's kernels, daemonised orphans included; the kernels stay frozen while no cell
//!   of theirs runs. Files persist in a session
//!   (`/workspace`, `/tmp`); with `SANDMESH_EXEC_WORKSPACE=on` the workspace also lives in
//!   workspace-store, so an ephemeral run of a session sees it and a lost container loses
//!   nothing.
//! - Workspace freshness: a session's container remembers the workspace revision it holds.
//!   Before a run the executor reads the session's revision key from the workspace index
//!   bucket (one direct KV get; no workspace-store request); when it matches, nothing is
//!   fetched. A new container fetches the snapshot; one that is behind (a client changed the
//!   workspace) is cleared and fetches it. After the run only the changes are pushed, and the
//!   restore's reply says whether the container now holds the new revision (no other change
//!   came in between) or must refetch next time. Chosen over a watch (which could lag behind
//!   a client's write answered just before the next run) and over a revision carried by the
//!   scheduler (which would make the session record depend on workspace-store's writes):
//!   the store puts the key before it answers, so a write the client saw answered is always
//!   seen by the next run. An isolated run makes no workspace round trip at all.
//! - Nothing the supervisor says is trusted (it runs next to the untrusted code): sizes are
//!   capped again here, reported paths are validated, and an outer deadline (timeout +
//!   `SANDMESH_EXEC_KILL_GRACE_MS`) removes the container.
//! - Output is capped at what one NATS message can carry (max payload − 64 KiB).
//! - A container found dead before a run began is replaced and the run retried once.
//! - Templates: a run naming one runs in that template's image
//!   (`executor_node::template_images`, built on first use, content-addressed), from that image's own warm
//!   pool; the result names the template and image.
//! - Network egress: a run or session with a network policy gets a container of its
//!   own with an egress proxy ([`egress`]) on a socket bind-mounted into it alone; the
//!   supervisor relays `127.0.0.1:3128` to it during the run, every decision is audited
//!   (`sandbox.v1.audit.egress`) and the result lists the hosts contacted and refused. Warm
//!   containers have no socket, and a pooled run with a policy is refused (400).
//! - Preview ports: every container gets a ports socket the host binds in a directory of its
//!   own, bind-mounted read-only ([`ports`]); its resident supervisor keeps a connection to it
//!   waiting, and `executor.docker.<node>.tunnel` ([`tunnel`]) dials a port of a session's
//!   container through it and pumps the bytes over NATS. Tunnels end with their container.
//! - Each container runs as a host uid of its own (`SANDMESH_EXEC_UIDS`), its tmpfs mounts
//!   owned by it: per-user kernel budgets (inotify instances, message-queue bytes, pending
//!   signals) are never shared between two containers, of one tenant or two. The container's
//!   name is made from its uid, so no two containers on one daemon — of any node, or of a
//!   crashed one not yet removed — hold one uid ([`executor_node::uids`]); the uid goes back
//!   to the pool once its container is removed.
//! - The janitor removes this node's unowned containers and those of nodes of the same mesh
//!   whose heartbeat expired — at once, by watching the heartbeat keys' expiry, and in its
//!   periodic sweep; at shutdown every container of the node is removed.
//!
//! Configuration (`SANDMESH_EXEC_*`, see [`ExecutorConfig`] and `executor_node::NodeConfig`): `IMAGE`, `WARM_POOL` (2, the
//! pool's floor), `WARM_POOL_MAX` (= `MAX_SESSIONS`), `WARM_POOL_WINDOW_MS` (600000), `CAPACITY` (8), `MAX_SESSIONS` (64), `SESSION_IDLE_MS` (600000), `WORKSPACE` (on|off),
//! `WORKSPACE_MB` (64), `TMP_MB` (64), `NOFILE` (256), `FSIZE_MB` (= WORKSPACE_MB),
//! `KILL_GRACE_MS` (5000), `JANITOR_MS` (30000), `EGRESS_DIR` (`$TMPDIR/sandmesh-egress`:
//! the containers' socket directories; the Docker daemon must see this path), `PORTS_DIR`
//! (`$TMPDIR/sandmesh-ports`: the containers' ports socket directories, likewise), `UIDS`
//! (`2000000000-2000099999`: the host uids of containers, one each), and the request
//! ceilings
//! `{DEFAULT,MAX}_{TIMEOUT_MS,MEMORY_MB,CPUS,PIDS,OUTPUT_BYTES}`.

pub mod backend;
pub mod config;
pub mod containers;
pub mod demand;
pub mod docker;
pub mod egress;
pub mod exchange;
pub mod execution;
pub mod gauges;
pub mod janitor;
pub mod lease;
pub mod ports;
pub mod probe;
pub mod proc_error;
pub mod procs;
pub mod resident;
pub mod session;
pub mod tunnel;
pub mod warm_pool;

use std::sync::Arc;
use std::time::Duration;

use executor_node::workspace::WorkspaceSync;
use executor_node::{Backend, ImageCheckError, NodeError, NodeParts, NodeState};
use kit::{CancellationToken, KitError, Runtime, ServiceInfo};

use backend::DockerBackend;
pub use config::ExecutorConfig;
use docker::{DockerError, SandboxSpec, Sandboxes};
use execution::Runner;
/// The sandbox image: shared by every backend, kept here for the callers that build it.
pub use executor_node::image;
use janitor::DockerSweeper;

/// The service name under which Docker executors beat (`docker-executor.<node_id>`).
pub const SERVICE_NAME: &str = DockerBackend::SERVICE.as_str();

#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    #[error(transparent)]
    Docker(#[from] DockerError),
    #[error(transparent)]
    Kit(#[from] KitError),
    #[error(transparent)]
    Image(#[from] ImageCheckError),
    #[error(transparent)]
    Node(#[from] NodeError),
}

/// Runs the docker-executor until `shutdown` is cancelled, then removes every container of
/// this node.
pub async fn run(config: ExecutorConfig, shutdown: CancellationToken) -> Result<(), ExecutorError> {
    let docker = Sandboxes::connect().await?;
    executor_node::check_image(&docker, &config.node.image).await?;
    let info = ServiceInfo {
        name: SERVICE_NAME.into(),
        version: env!("CARGO_PKG_VERSION").into(),
        description: "Runs code in hardened Docker containers (ephemeral and session tiers)".into(),
    };
    let runtime = Runtime::start(config.node.kit.clone(), info).await?;
    let subjects = runtime.subjects().clone();
    let (nodes_kv, mesh) = runtime.nodes_and_mesh().await?;
    let sandboxes = Sandboxes::new(docker, SandboxSpec::from_config(&config, &mesh));
    let node = Arc::new(NodeState::new(runtime.metrics.clone()));
    let config = Arc::new(config);
    let doors = sandboxes.ports.doors().clone();
    tunnel::serve(&runtime, config.node_id(), doors, node.clone()).await?;

    let runner = Runner {
        sandboxes: sandboxes.clone(),
        workspace: config.workspace_sync.then(|| {
            WorkspaceSync::new(
                runtime.client.clone(),
                subjects.clone(),
                Duration::from_secs(30),
                DockerBackend::SERVICE,
            )
        }),
        client: runtime.client.clone(),
        subjects,
        config: config.clone(),
        egress: egress::EgressHost::new(config.egress_dir.clone(), runtime.auditor.clone()),
        auditor: runtime.auditor.clone(),
    };
    let sweeper = DockerSweeper {
        sandboxes,
        node: node.clone(),
        nodes_kv: nodes_kv.clone(),
        service: DockerBackend::SERVICE,
    };
    let labels = std::collections::BTreeMap::from([
        ("image".to_string(), config.node.image.clone()),
        ("mesh".to_string(), mesh.clone()),
    ]);
    tracing::info!(node = config.node_id(), mesh, image = %config.node.image, "docker-executor starting");
    let parts = NodeParts {
        runtime,
        config: Arc::new(config.node.clone()),
        node: node.clone(),
        capacity: config.capacity,
        nodes_kv,
        labels,
    };
    let backend = DockerBackend::new(runner, node);
    Ok(executor_node::serve(parts, backend, sweeper, shutdown).await?)
}
