//! bwrap-executor: the light single-use backend (issue 18). Each execution runs in a fresh
//! bubblewrap sandbox on this host instead of a Docker container: new user, pid, net, ipc,
//! uts, mount and cgroup namespaces; the sandbox image's rootfs (exported once per image id,
//! [`rootfs`]) mounted read-only as `/`; size-capped tmpfs `/tmp` and `/workspace`; uid 10001
//! (a non-root host uid too: the executor drops to it before bwrap); a seccomp filter at least
//! as strict as Docker's default ([`seccomp`]); memory (no swap), pids and CPU limits through a
//! cgroup made for that one sandbox ([`cgroup`], v1 and v2); rlimits `nofile` and `core=0` on
//! the whole sandbox and `fsize` on the program; no network but loopback.
//!
//! Inside runs the same `sandmesh-supervisor` as in a container, speaking the same frames on
//! stdin and stdout, so results, statuses, output caps and streaming are the Docker backend's
//! (the exchange, run spec and classification are shared from `docker_executor`). A sandbox
//! costs no container: it starts in milliseconds and leaves nothing behind, so this backend
//! takes ephemeral executions only — code the assessor found SAFE, without a session. Sessions
//! and stricter isolation stay in Docker.
//!
//! Subjects (internal; only the scheduler may publish there):
//! - `sandbox.v1.executor.bwrap.run` — queue group of all bwrap executors;
//! - `sandbox.v1.executor.bwrap.<node_id>.{run,drain}` — this node only.
//!
//! ```text
//! Executor (admission: tier ephemeral without a session, capacity → 429, draining → 503;
//! │         one task per execution, each in its own sandbox; restarts the janitor)
//! └── Janitor   stray cgroups (this node, dead nodes of the mesh), image refresh, old rootfs
//! (+ the kit's Heartbeat: capacity, running, backends = [bwrap])
//! ```
//!
//! Startup fails with a clear error when bubblewrap is missing, when the kernel refuses user
//! namespaces (naming the sysctl to change), when no cgroup can be made, or when the image
//! has no supervisor.
//!
//! Configuration: the Docker executor's `SANDMESH_EXEC_*` limits and ceilings (one set of rules
//! for both backends) and `SANDMESH_BWRAP_{CAPACITY,STATE_DIR,BIN,CGROUP_ROOT,UID}`
//! ([`BwrapConfig`]).

pub mod cgroup;
pub mod config;
pub mod execution;
pub mod executor;
pub mod janitor;
pub mod rootfs;
pub mod sandbox;
pub mod seccomp;

use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use docker_executor::docker::{DockerError, Sandboxes};
use docker_executor::node::NodeState;
use docker_executor::ExecutorError;
use kit::{actor_handler, CancellationToken, EndpointOptions, KitError, Runtime, ServiceInfo};
use messages::executor::Backend;
use messages::subjects::ExecutorOp;
use ractor::Actor;

pub use config::BwrapConfig;
use execution::Runner;
use executor::{Executor, ExecutorArgs, ExecutorMsg};
use janitor::{JanitorArgs, SERVICE_NAME};
use sandbox::Launcher;

#[derive(Debug, thiserror::Error)]
pub enum BwrapError {
    #[error(transparent)]
    Docker(#[from] DockerError),
    #[error(transparent)]
    Kit(#[from] KitError),
    #[error("checking the sandbox image")]
    Image(#[source] ExecutorError),
    #[error(
        "bubblewrap ({program}) cannot be started: install Debian's `bubblewrap` package \
         (scripts/install-tools.sh does) or set SANDMESH_BWRAP_BIN"
    )]
    NoBwrap {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the kernel refused the sandbox a user namespace ({message}); allow unprivileged user \
         namespaces: `sysctl -w kernel.unprivileged_userns_clone=1` (Debian kernels), \
         `user.max_user_namespaces` above 0, and on Ubuntu ≥ 23.10 \
         `kernel.apparmor_restrict_unprivileged_userns=0`"
    )]
    UserNamespaces { message: String },
    #[error(transparent)]
    Cgroup(#[from] cgroup::CgroupError),
    #[error(transparent)]
    Rootfs(#[from] rootfs::RootfsError),
    #[error(transparent)]
    Seccomp(#[from] seccomp::SeccompError),
    #[error("starting the executor actor")]
    Spawn(#[source] ractor::SpawnErr),
    #[error("stopping the executor actor")]
    Stop(#[source] ractor::RactorErr<ractor::actor::messages::StopMessage>),
}

/// Whether bubblewrap can be started here at all (for `sandmesh up`, which runs this backend
/// only when it can).
pub fn bwrap_available(program: &Path) -> bool {
    std::process::Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The host uid sandboxes drop to: the sandbox uid when this process is root (nothing in a
/// sandbox may be root on the host), none otherwise (it already is not root).
fn drop_to(config: &BwrapConfig) -> Option<u32> {
    nix::unistd::geteuid()
        .is_root()
        .then_some(config.sandbox_uid)
}

/// Starts one empty sandbox the way every execution's starts (minus the rootfs): fails with
/// the kernel's words when user namespaces are refused.
async fn probe_user_namespaces(config: &BwrapConfig) -> Result<(), BwrapError> {
    let bwrap = config.bwrap.display().to_string();
    let mut cmd = match drop_to(config) {
        Some(uid) => {
            let mut c = tokio::process::Command::new("setpriv");
            c.args([
                format!("--reuid={uid}"),
                format!("--regid={uid}"),
                "--clear-groups".into(),
                "--".into(),
                bwrap.clone(),
            ]);
            c
        }
        None => tokio::process::Command::new(&config.bwrap),
    };
    cmd.args([
        "--unshare-all",
        "--unshare-user",
        "--die-with-parent",
        "--ro-bind",
        "/",
        "/",
        "true",
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    let out = cmd.output().await.map_err(|source| BwrapError::NoBwrap {
        program: bwrap.clone(),
        source,
    })?;
    if out.status.success() {
        return Ok(());
    }
    let message = String::from_utf8_lossy(&out.stderr).trim().to_string();
    Err(BwrapError::UserNamespaces { message })
}

/// Runs the bwrap-executor until `shutdown` is cancelled, then removes every cgroup of this
/// node.
pub async fn run(config: BwrapConfig, shutdown: CancellationToken) -> Result<(), BwrapError> {
    if !bwrap_available(&config.bwrap) {
        return Err(BwrapError::NoBwrap {
            program: config.bwrap.display().to_string(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "`bwrap --version` failed"),
        });
    }
    probe_user_namespaces(&config).await?;
    let docker = Sandboxes::connect().await?;
    docker_executor::check_image(&docker, &config.exec.image)
        .await
        .map_err(BwrapError::Image)?;
    let info = ServiceInfo {
        name: SERVICE_NAME.into(),
        version: env!("CARGO_PKG_VERSION").into(),
        description: "Runs ephemeral code in a fresh bubblewrap sandbox per execution".into(),
    };
    let mut runtime = Runtime::start(config.exec.kit.clone(), info).await?;
    let subjects = runtime.subjects().clone();
    let (nodes_kv, mesh) = runtime.nodes_and_mesh().await?;
    let me = config.node_id().to_string();
    let filters = seccomp::Filters::write(&config.state_dir.join("seccomp"))?;
    let cgroups = cgroup::Cgroups::open(&config.cgroup_root, &mesh, &me)?;
    let rootfs =
        Arc::new(rootfs::RootfsCache::open(docker, &config.exec.image, &config.state_dir).await?);
    let node = Arc::new(NodeState::default());
    let config = Arc::new(config);
    let launcher = Launcher {
        bwrap: config.bwrap.clone(),
        filters,
        cgroups: cgroups.clone(),
        rootfs: rootfs.clone(),
        drop_to: drop_to(&config),
        uid: config.sandbox_uid,
        tmp_mb: config.exec.tmp_mb,
        workspace_mb: config.exec.workspace_mb,
        nofile: config.exec.nofile,
    };

    let probe_node = node.clone();
    let capacity = config.capacity;
    let labels = std::collections::BTreeMap::from([
        ("node".to_string(), me.clone()),
        ("image".to_string(), config.exec.image.clone()),
        ("mesh".to_string(), mesh.clone()),
        ("cgroup".to_string(), format!("v{}", cgroups.version())),
    ]);
    let host = kit::resources::HostSampler::default();
    let metrics = runtime.metrics.clone();
    let at = kit::metrics::NodeLabels {
        service: SERVICE_NAME,
        node: me.clone(),
    };
    runtime
        .start_heartbeat(Arc::new(move || {
            let resources = host.sample();
            if let Some(r) = &resources {
                metrics.host_resources(&at, r);
            }
            kit::heartbeat::Load {
                capacity: capacity as u32,
                load: probe_node.running.load(Ordering::Relaxed) as u32,
                metrics: probe_node.metrics(capacity),
                labels: labels.clone(),
                backends: vec![Backend::Bwrap],
                resources,
            }
        }))
        .await?;

    let runner = Runner {
        launcher: Arc::new(launcher),
        client: runtime.client.clone(),
        subjects: subjects.clone(),
        config: config.clone(),
    };
    let janitor = JanitorArgs {
        cgroups: cgroups.clone(),
        rootfs,
        node: node.clone(),
        node_id: me.clone(),
        nodes_kv,
        interval: config.exec.janitor_interval,
    };
    let args = ExecutorArgs {
        runner,
        node: node.clone(),
        janitor,
    };
    let (executor, _) = Actor::spawn(None, Executor, args)
        .await
        .map_err(BwrapError::Spawn)?;

    let options = EndpointOptions {
        // Admission (429 past capacity) is the executor's own; the kit only bounds memory.
        max_in_flight: config.exec.kit.max_in_flight.max(config.capacity * 4),
        ..runtime.endpoint_options()
    };
    let served = async {
        let run = actor_handler(executor.clone(), ExecutorMsg::Run);
        runtime
            .serve_with(
                subjects.executor_run_on(Backend::Bwrap),
                options,
                run.clone(),
            )
            .await?;
        runtime
            .serve_with(
                subjects.executor_node_on(Backend::Bwrap, &me, ExecutorOp::Run),
                options,
                run,
            )
            .await?;
        runtime
            .serve_with(
                subjects.executor_node_on(Backend::Bwrap, &me, ExecutorOp::Drain),
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
    tracing::info!(node = me, mesh, image = %config.exec.image, cgroup = cgroups.version(), "bwrap-executor ready");

    shutdown.cancelled().await;
    // Requests in flight finish first (bounded by the grace period).
    runtime.shutdown().await;
    let stopped = executor
        .stop_and_wait(Some("shutdown".into()), Some(Duration::from_secs(60)))
        .await;
    // Sandboxes still running and cgroup removals finish before `run` returns.
    if !node.finish_tasks(Duration::from_secs(60)).await {
        tracing::warn!("sandbox work still running after 60 s; the janitor will clean up");
    }
    // A node that stops owns nothing: anything still there is a leak of a race above.
    let left = tokio::task::spawn_blocking(move || {
        let names = cgroups.list(&me);
        for name in &names {
            cgroups.existing(&me, name).remove();
        }
        cgroups.remove_node(&me);
        names.len()
    })
    .await
    .unwrap_or(0);
    if left > 0 {
        tracing::warn!(left, "removed sandbox cgroups left at shutdown");
    }
    stopped.map_err(BwrapError::Stop)
}
