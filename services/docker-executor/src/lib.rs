//! docker-executor: runs untrusted Python, JavaScript and shell code in hardened Docker
//! containers (DESIGN.md §1, §3 "Containers"; seeds 002 and 003 §2.2.1).
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
//! `sandmesh-sandbox-protocol` crate, `sandbox/protocol`). No execution pays a `docker exec`.
//!
//! Subjects (internal; only the scheduler may publish there):
//! - `sandbox.v1.executor.docker.run` — queue group of all executors: ephemeral runs and a
//!   session's first run (the result's `node` says where the session now lives);
//! - `sandbox.v1.executor.docker.<node_id>.{run,close,drain}` — this node only.
//!
//! ```text
//! Executor (admission, routing; restarts failed children)
//! ├── WarmPool            ready single-use containers, replenished in the background
//! ├── WarmPool*           one per template image in use here, started by its first run
//! ├── Janitor             removes containers no live owner holds (this node, dead nodes)
//! └── SessionContainer*   one per session: its container, runs one at a time, idle close
//! (+ the kit's Heartbeat: capacity, running, warm pool size, sessions)
//! ```
//!
//! Behaviour worth knowing:
//! - Processes never outlive their execution: when the program exits (or times out, or
//!   passes the output cap) the supervisor kills every process of the container except
//!   `docker-init`, the keeper and the resident supervisor, daemonised orphans included. Files persist in a session
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
//! - Templates (issue 25): a run naming one runs in that template's image
//!   ([`template_images`], built on first use, content-addressed), from that image's own warm
//!   pool; the result names the template and image.
//! - Network egress (issue 13): a run or session with a network policy gets a container of its
//!   own with an egress proxy ([`egress`]) on a socket bind-mounted into it alone; the
//!   supervisor relays `127.0.0.1:3128` to it during the run, every decision is audited
//!   (`sandbox.v1.audit.egress`) and the result lists the hosts contacted and refused. Warm
//!   containers have no socket, and a pooled run with a policy is refused (400).
//! - The janitor removes this node's unowned containers and those of nodes of the same mesh
//!   whose heartbeat expired — at once, by watching the heartbeat keys' expiry, and in its
//!   periodic sweep; at shutdown every container of the node is removed.
//!
//! Configuration (`SANDMESH_EXEC_*`, see [`ExecutorConfig`]): `IMAGE`, `WARM_POOL` (2),
//! `CAPACITY` (8), `MAX_SESSIONS` (64), `SESSION_IDLE_MS` (600000), `WORKSPACE` (on|off),
//! `WORKSPACE_MB` (64), `TMP_MB` (64), `NOFILE` (256), `FSIZE_MB` (= WORKSPACE_MB),
//! `KILL_GRACE_MS` (5000), `JANITOR_MS` (30000), `EGRESS_DIR` (`$TMPDIR/sandmesh-egress`:
//! the containers' socket directories; the Docker daemon must see this path), and the request
//! ceilings
//! `{DEFAULT,MAX}_{TIMEOUT_MS,MEMORY_MB,CPUS,PIDS,OUTPUT_BYTES}`.

pub mod config;
pub mod docker;
pub mod egress;
pub mod exchange;
pub mod execution;
pub mod executor;
pub mod image;
pub mod janitor;
pub mod lease;
pub mod node;
pub mod outcome;
pub mod probe;
pub mod resident;
pub mod session;
pub mod template_images;
pub mod warm_pool;
pub mod workspace;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use kit::{actor_handler, CancellationToken, EndpointOptions, KitError, Runtime, ServiceInfo};
use messages::subjects::ExecutorOp;
use ractor::Actor;

pub use config::ExecutorConfig;
use docker::{DockerError, SandboxSpec, Sandboxes};
use execution::Runner;
use executor::{Executor, ExecutorArgs, ExecutorMsg};
use janitor::{JanitorArgs, SERVICE_NAME};
use node::NodeState;
use workspace::WorkspaceSync;

/// The image label `deploy/images/build.sh` sets when the supervisor is installed.
pub const SUPERVISOR_LABEL: &str = "org.sandmesh.supervisor";

#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    #[error(transparent)]
    Docker(#[from] DockerError),
    #[error(transparent)]
    Kit(#[from] KitError),
    #[error("sandbox image {image} not found; {BUILD_HINT}")]
    ImageMissing {
        image: String,
        #[source]
        source: bollard::errors::Error,
    },
    #[error("sandbox image {image} has no sandmesh-supervisor; {BUILD_HINT}")]
    ImageWithoutSupervisor { image: String },
    #[error("starting the executor actor")]
    Spawn(#[source] ractor::SpawnErr),
    #[error("stopping the executor actor")]
    Stop(#[source] ractor::RactorErr<ractor::actor::messages::StopMessage>),
}

const BUILD_HINT: &str = "build it with deploy/images/build.sh (SUPERVISOR_BIN=<sandmesh-supervisor>) or docker_executor::image::ensure_image()";

/// Checks that the image exists and carries the supervisor.
pub async fn check_image(docker: &bollard::Docker, image: &str) -> Result<(), ExecutorError> {
    let inspect =
        docker
            .inspect_image(image)
            .await
            .map_err(|source| ExecutorError::ImageMissing {
                image: image.to_string(),
                source,
            })?;
    let has_supervisor = inspect
        .config
        .and_then(|c| c.labels)
        .is_some_and(|l| l.contains_key(SUPERVISOR_LABEL));
    if !has_supervisor {
        return Err(ExecutorError::ImageWithoutSupervisor {
            image: image.to_string(),
        });
    }
    Ok(())
}

/// Runs the docker-executor until `shutdown` is cancelled, then removes every container of
/// this node.
pub async fn run(config: ExecutorConfig, shutdown: CancellationToken) -> Result<(), ExecutorError> {
    let docker = Sandboxes::connect().await?;
    check_image(&docker, &config.image).await?;
    let info = ServiceInfo {
        name: SERVICE_NAME.into(),
        version: env!("CARGO_PKG_VERSION").into(),
        description: "Runs code in hardened Docker containers (ephemeral and session tiers)".into(),
    };
    let mut runtime = Runtime::start(config.kit.clone(), info).await?;
    let subjects = runtime.subjects().clone();
    let (nodes_kv, mesh) = runtime.nodes_and_mesh().await?;
    let sandboxes = Sandboxes::new(docker, SandboxSpec::from_config(&config, &mesh));
    let node = Arc::new(NodeState::new(runtime.metrics.clone()));
    let config = Arc::new(config);

    // The heartbeat first: other nodes' janitors judge this node's containers by it.
    let probe_node = node.clone();
    let capacity = config.capacity;
    let labels = std::collections::BTreeMap::from([
        ("node".to_string(), config.node_id().to_string()),
        ("image".to_string(), config.image.clone()),
        ("mesh".to_string(), mesh.clone()),
    ]);
    let host = kit::resources::HostSampler::default();
    let at = kit::metrics::NodeLabels {
        service: SERVICE_NAME,
        node: config.node_id().to_string(),
    };
    runtime
        .start_heartbeat(Arc::new(move || {
            let resources = host.sample();
            // The gauges are refreshed with each beat: the same figures the scheduler sees.
            let m = &probe_node.metrics;
            let gauge = |n: &std::sync::atomic::AtomicUsize| n.load(Ordering::Relaxed) as i64;
            m.warm_pool_size
                .get_or_create(&at)
                .set(gauge(&probe_node.warm));
            m.sessions_active
                .get_or_create(&at)
                .set(gauge(&probe_node.sessions));
            if let Some(r) = &resources {
                m.host_resources(&at, r);
            }
            kit::heartbeat::Load {
                capacity: capacity as u32,
                load: probe_node.running.load(Ordering::Relaxed) as u32,
                metrics: probe_node.metrics(capacity),
                labels: labels.clone(),
                backends: vec![messages::executor::Backend::Docker],
                resources,
            }
        }))
        .await?;

    let runner = Runner {
        sandboxes: sandboxes.clone(),
        workspace: config.workspace_sync.then(|| {
            WorkspaceSync::new(
                runtime.client.clone(),
                subjects.clone(),
                Duration::from_secs(30),
            )
        }),
        client: runtime.client.clone(),
        subjects: subjects.clone(),
        config: config.clone(),
        egress: egress::EgressHost::new(config.egress_dir.clone(), runtime.auditor.clone()),
    };
    let sandboxes_for_exit = sandboxes.clone();
    let janitor = JanitorArgs {
        sandboxes,
        node: node.clone(),
        nodes_kv,
        interval: config.janitor_interval,
    };
    let args = ExecutorArgs {
        runner,
        node: node.clone(),
        janitor,
    };
    let (executor, _) = Actor::spawn(None, Executor, args)
        .await
        .map_err(ExecutorError::Spawn)?;

    let options = EndpointOptions {
        // Admission (429 past capacity) is the executor's own; the kit only bounds memory.
        max_in_flight: config.kit.max_in_flight.max(config.capacity * 4),
        ..runtime.endpoint_options()
    };
    let me = config.node_id();
    let served = async {
        let run = actor_handler(executor.clone(), ExecutorMsg::Run);
        runtime
            .serve_with(subjects.executor_run(), options, run.clone())
            .await?;
        runtime
            .serve_with(subjects.executor_node(me, ExecutorOp::Run), options, run)
            .await?;
        runtime
            .serve_with(
                subjects.executor_node(me, ExecutorOp::Close),
                options,
                actor_handler(executor.clone(), ExecutorMsg::Close),
            )
            .await?;
        runtime
            .serve_with(
                subjects.executor_node(me, ExecutorOp::Drain),
                options,
                actor_handler(executor.clone(), ExecutorMsg::Drain),
            )
            .await
    };
    if let Err(e) = served.await {
        executor.stop_and_wait(None, None).await.ok();
        runtime.shutdown().await;
        return Err(e.into());
    }
    tracing::info!(node = me, mesh, image = %config.image, "docker-executor ready");

    shutdown.cancelled().await;
    // Requests in flight finish first (bounded by the grace period), then every container of
    // this node is removed by the actors' post_stop.
    runtime.shutdown().await;
    let stopped = executor
        .stop_and_wait(Some("shutdown".into()), Some(Duration::from_secs(60)))
        .await;
    // Starts and removals still in flight finish before `run` returns.
    if !node.finish_tasks(Duration::from_secs(60)).await {
        tracing::warn!("container work still running after 60 s; the janitor will clean up");
    }
    // Last line of defence: a node that stops owns nothing, so anything still labelled with
    // it is a leak of a race above.
    let left = janitor::remove_node(&sandboxes_for_exit).await;
    if left > 0 {
        tracing::warn!(left, "removed containers left at shutdown");
    }
    stopped.map_err(ExecutorError::Stop)
}
