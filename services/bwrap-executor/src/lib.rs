//! bwrap-executor: the light single-use backend. Each execution runs in a fresh
//! bubblewrap sandbox on this host instead of a Docker container: new user, pid, net, ipc,
//! uts, mount and cgroup namespaces; the image's rootfs — the sandbox image's, or the run's
//! template's (built like docker-executor builds it, exported once per image id, [`rootfs`]) —
//! mounted read-only as `/`; size-capped tmpfs `/tmp` and `/workspace`; uid 10001 inside,
//! mapped to a host uid of that sandbox's own (`SANDMESH_BWRAP_UIDS`, claimed host-wide in
//! `SANDMESH_BWRAP_UID_CLAIMS`: [`executor_node::uids`]; the executor, as root, drops to it
//! before bwrap), so no per-user kernel budget (inotify instances, message-queue bytes,
//! pending signals) is shared between two sandboxes; a seccomp filter at least
//! as strict as Docker's default ([`seccomp`]); memory (no swap), pids and CPU limits through a
//! cgroup made for that one sandbox ([`cgroup`], v1 and v2); rlimits `nofile` and `core=0` on
//! the whole sandbox and `fsize` on the program; no network but loopback.
//!
//! Inside runs the same `sandmesh-supervisor` as in a container, speaking the same frames on
//! stdin and stdout, so results, statuses, output caps and streaming are the Docker backend's
//! (the exchange, run spec and classification are the node's, `executor_node`). A sandbox
//! costs no container: it starts in milliseconds and leaves nothing behind, so this backend
//! takes ephemeral executions only — code the assessor found SAFE, without a session. Sessions
//! and stricter isolation stay in Docker.
//!
//! Subjects (internal; only the scheduler may publish there):
//! - `sandbox.v1.executor.bwrap.run` — queue group of all bwrap executors;
//! - `sandbox.v1.executor.bwrap.<node_id>.{run,drain}` — this node only.
//!
//! It is a backend of `executor_node` ([`backend::BwrapBackend`]): admission, drain, the
//! heartbeat, the janitor and the subjects are the node's.
//!
//! ```text
//! ExecutorNode<BwrapBackend> (admission: tier ephemeral without a session or network,
//! │         capacity → 429, draining → 503; one task per execution, each in its own sandbox;
//! │         restarts the janitor)
//! └── Janitor<BwrapSweeper>   stray cgroups (this node, dead nodes of the mesh), image
//!                             refresh, old rootfs
//! (+ the kit's Heartbeat: capacity, running, backends = [bwrap])
//! ```
//!
//! Startup fails with a clear error when bubblewrap is missing, when the kernel refuses user
//! namespaces (naming the sysctl to change), when no cgroup can be made, or when the image
//! has no supervisor.
//!
//! Configuration: the node's `SANDMESH_EXEC_*` limits and ceilings (one set of rules for every
//! backend) and `SANDMESH_BWRAP_{CAPACITY,STATE_DIR,BIN,CGROUP_ROOT,UID,UIDS,UID_CLAIMS}`
//! ([`BwrapConfig`]).

pub mod backend;
pub mod cgroup;
pub mod config;
pub mod execution;
pub mod janitor;
pub mod launch;
pub mod rootfs;
pub mod sandbox;
pub mod seccomp;

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;

use containers::DockerError;
use executor_node::{Backend, ImageCheckError, NodeError, NodeParts, NodeState, UidError, UidPool};
use kit::{CancellationToken, KitError, Runtime, ServiceInfo};

use backend::BwrapBackend;
pub use config::BwrapConfig;
use execution::Runner;
use janitor::BwrapSweeper;
use sandbox::Launcher;

/// The service name under which bwrap executors beat (`bwrap-executor.<node_id>`).
pub const SERVICE_NAME: &str = BwrapBackend::SERVICE.as_str();

#[derive(Debug, thiserror::Error)]
pub enum BwrapError {
    #[error(transparent)]
    Docker(#[from] DockerError),
    #[error(transparent)]
    Kit(#[from] KitError),
    #[error("checking the sandbox image")]
    Image(#[source] ImageCheckError),
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
    #[error(
        "the sandbox image's supervisor ({program}) cannot start sandboxes on this host \
         ({message}); rebuild the image with this version's supervisor (deploy/images/build.sh)"
    )]
    Launcher { program: String, message: String },
    #[error(transparent)]
    Install(#[from] launch::InstallError),
    #[error(transparent)]
    Cgroup(#[from] cgroup::CgroupError),
    #[error(transparent)]
    Rootfs(#[from] rootfs::RootfsError),
    #[error(transparent)]
    Seccomp(#[from] seccomp::SeccompError),
    #[error(transparent)]
    Uid(#[from] UidError),
    #[error(transparent)]
    Node(#[from] NodeError),
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

/// The host uids sandboxes drop to, one each: a pool of `SANDMESH_BWRAP_UIDS` when this
/// process is root (nothing in a sandbox may be root on the host), none otherwise (it already
/// is not root, and cannot give a sandbox another uid).
fn host_uids(config: &BwrapConfig) -> Result<Option<Arc<UidPool>>, UidError> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    UidPool::claimed_in(config.uids, &config.uid_claims).map(Some)
}

/// Starts one empty sandbox the way every execution's starts (minus the rootfs, cgroup and
/// filters), as a uid of the pool: fails with the kernel's words when user namespaces are
/// refused, or with the launcher's when the image's supervisor cannot launch here.
async fn probe_user_namespaces(
    config: &BwrapConfig,
    supervisor: &Path,
    uids: Option<&Arc<UidPool>>,
) -> Result<(), BwrapError> {
    let uid = uids.map(UidPool::take).transpose()?;
    let drop_to = uid.as_ref().map(executor_node::UidLease::uid);
    let mut cmd = launch::command(supervisor, &[], None, drop_to, &[]);
    cmd.arg(&config.bwrap)
        .args([
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
    let program = supervisor.display().to_string();
    let out = cmd.output().await.map_err(|e| BwrapError::Launcher {
        program: program.clone(),
        message: e.to_string(),
    })?;
    if out.status.success() {
        return Ok(());
    }
    let message = String::from_utf8_lossy(&out.stderr).trim().to_string();
    if out.status.code() == Some(i32::from(sandbox_protocol::LAUNCH_FAILED)) {
        return Err(BwrapError::Launcher { program, message });
    }
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
    let docker = containers::connect().await?;
    executor_node::check_image(&docker, &config.node.image)
        .await
        .map_err(BwrapError::Image)?;
    let info = ServiceInfo {
        name: SERVICE_NAME.into(),
        version: env!("CARGO_PKG_VERSION").into(),
        description: "Runs ephemeral code in a fresh bubblewrap sandbox per execution".into(),
    };
    let runtime = Runtime::start(config.node.kit.clone(), info).await?;
    let subjects = runtime.subjects().clone();
    let (nodes_kv, mesh) = runtime.nodes_and_mesh().await?;
    let me = config.node_id().to_string();
    let filters = seccomp::Filters::write(&config.state_dir.join("seccomp"))?;
    let cgroups = cgroup::Cgroups::open(&config.cgroup_root, &mesh, &me)?;
    let rootfs =
        Arc::new(rootfs::RootfsCache::open(docker, &config.node.image, &config.state_dir).await?);
    let supervisor = launch::install(&*rootfs.tree(&config.node.image).await?, &config.state_dir)?;
    let host_uids = host_uids(&config)?;
    probe_user_namespaces(&config, &supervisor, host_uids.as_ref()).await?;
    let node = Arc::new(NodeState::new(runtime.metrics.clone()));
    let config = Arc::new(config);
    let launcher = Launcher {
        bwrap: config.bwrap.clone(),
        supervisor,
        filters,
        cgroups: cgroups.clone(),
        host_uids,
        uid: config.sandbox_uid,
        tmp_mb: config.node.tmp_mb,
        workspace_mb: config.node.workspace_mb,
        nofile: config.node.nofile,
    };
    let runner = Runner {
        launcher: Arc::new(launcher),
        rootfs: rootfs.clone(),
        images: executor_node::TemplateImages::new(&config.node.image),
        client: runtime.client.clone(),
        subjects,
        config: config.clone(),
    };
    let sweeper = BwrapSweeper {
        cgroups: cgroups.clone(),
        rootfs,
        node: node.clone(),
        node_id: me.clone(),
        nodes_kv: nodes_kv.clone(),
        service: BwrapBackend::SERVICE,
    };
    let labels = std::collections::BTreeMap::from([
        ("image".to_string(), config.node.image.clone()),
        ("mesh".to_string(), mesh.clone()),
        ("cgroup".to_string(), format!("v{}", cgroups.version())),
    ]);
    tracing::info!(node = me, mesh, image = %config.node.image, cgroup = cgroups.version(), "bwrap-executor starting");
    let parts = NodeParts {
        runtime,
        config: Arc::new(config.node.clone()),
        node: node.clone(),
        capacity: config.capacity,
        nodes_kv,
        labels,
    };
    let backend = BwrapBackend { runner, node };
    Ok(executor_node::serve(parts, backend, sweeper, shutdown).await?)
}
