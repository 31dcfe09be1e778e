//! AIO containers through the Docker API: the one place that decides how an instance is
//! created.
//!
//! Hardening is the sandbox containers' ([`containers::hardened_host_config`]) except, and
//! why:
//! - **no network, one control socket**: an instance has `NetworkMode none`, like the session
//!   containers: no interface but its own loopback, so its code reaches nothing of the host
//!   (no bridge gateway, no host address, no other instance). The pool drives the agent's HTTP
//!   API over a Unix socket the agent makes in the instance's own control directory
//!   ([`CONTROL_MOUNT`]), a host directory bind-mounted into that one instance. The directory
//!   is writable only while the instance starts (the agent makes its socket; no code of a
//!   session runs yet) and read-only from then on, so an instance cannot fill the host's disk
//!   through it. Egress, when allowed, would come the same way (a socket, not a network), as
//!   the session containers' does;
//! - **`/tmp` is larger** (256 MiB by default): Chromium runs with `--disable-dev-shm-usage`
//!   (Docker's 64 MiB `/dev/shm` crashes renderers), so its shared memory lives there;
//! - **pids and `nofile` are higher** (512 / 4096): Chromium is a dozen processes with
//!   hundreds of threads and file descriptors;
//! - Chromium runs with `--no-sandbox` inside: its own sandbox needs user namespaces or a
//!   setuid helper, both refused by `CapDrop ALL`, `no-new-privileges` and the default seccomp
//!   profile, which all stay on (upstream AIO asks for `seccomp=unconfined`; we do not).
//!
//! Each instance gets its own random API key, passed as `SANDBOX_API_KEY`.

use std::collections::HashMap;
use std::time::Duration;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use bollard::models::ContainerCreateBody;
use bollard::query_parameters::CreateContainerOptionsBuilder;
use bollard::Docker;
use containers::{hardened_host_config, tmpfs_options, DockerError, Hardening};

use crate::aio_client::{AioClient, KeyHeader};
use crate::config::AioPoolConfig;

/// Every container and network carries `sandmesh=1`, like the executor's (leak checks count
/// these). The executor's janitor judges only its own `sandmesh.node`/`sandmesh.mesh`
/// labels, so it never touches AIO instances, and this pool's janitor only its own.
pub use containers::LABEL_SANDMESH;
/// The mesh (NATS deployment) of the pool, as this pool's janitor judges it (instances also
/// carry the mesh-wide `containers::LABEL_MESH`, for leak accounting).
pub const LABEL_MESH: &str = "sandmesh.aio.mesh";
/// The aio-pool process (its instance id) that owns the container or network.
pub const LABEL_OWNER: &str = "sandmesh.aio.owner";
/// The session an instance is bound to (set at creation: instances are warm first, so this
/// is informational only and absent on warm ones).
pub const LABEL_INSTANCE: &str = "sandmesh.aio.instance";

/// The image's user (deploy/images/aio/Dockerfile); tmpfs mounts are owned by it.
pub const AIO_UID: u32 = 10001;
/// Where an instance sees its control directory.
pub const CONTROL_MOUNT: &str = "/run/sandmesh-aio";
/// The agent's socket in the control directory.
pub const CONTROL_SOCKET: &str = "agent.sock";

/// What every instance of this pool shares.
#[derive(Debug, Clone)]
pub struct InstanceSpec {
    pub image: String,
    pub port: u16,
    pub key_header: KeyHeader,
    pub user: String,
    pub mesh: String,
    pub owner: String,
    /// This pool's control directories, one per instance (`<SANDMESH_AIO_SOCKET_DIR>/<owner>`).
    pub control_root: PathBuf,
    pub hardening: Hardening,
    pub start_timeout: Duration,
    /// The egress seam: variables an egress-enabled pool would add (proxy address).
    pub extra_env: Vec<String>,
    pub max_answer: usize,
}

impl InstanceSpec {
    pub fn from_config(c: &AioPoolConfig, mesh: &str) -> Self {
        let owner = c.kit.instance_id.clone();
        Self {
            image: c.image.clone(),
            port: c.port,
            key_header: c.key_header.clone(),
            user: c.user.clone(),
            mesh: mesh.to_string(),
            control_root: c.socket_dir.join(&owner),
            owner,
            hardening: Hardening {
                memory_mb: c.memory_mb,
                cpus: c.cpus,
                pids: c.pids,
                nofile: c.nofile,
                fsize_bytes: c.home_mb.max(c.tmp_mb) << 20,
                tmpfs: HashMap::from([
                    ("/tmp".to_string(), tmpfs_options(c.tmp_mb, AIO_UID, "1777")),
                    (
                        c.home_dir.clone(),
                        tmpfs_options(c.home_mb, AIO_UID, "0755"),
                    ),
                ]),
            },
            start_timeout: c.start_timeout,
            extra_env: Vec::new(),
            max_answer: c.max_output_chars * 8 + (1 << 20),
        }
    }

    pub fn labels(&self, instance: &str) -> HashMap<String, String> {
        [
            (LABEL_SANDMESH.to_string(), "1".to_string()),
            (LABEL_MESH.to_string(), self.mesh.clone()),
            (LABEL_OWNER.to_string(), self.owner.clone()),
            (LABEL_INSTANCE.to_string(), instance.to_string()),
        ]
        .into_iter()
        .chain(containers::mesh_labels(&self.mesh))
        .collect()
    }

    /// The container of `instance`, with `control_dir` (made by [`open_control_dir`]) as its
    /// control directory.
    pub fn container_body(
        &self,
        instance: &str,
        api_key: &str,
        control_dir: &Path,
    ) -> ContainerCreateBody {
        let mut host = hardened_host_config(&self.hardening);
        host.network_mode = Some("none".into());
        host.binds = Some(vec![format!("{}:{CONTROL_MOUNT}", control_dir.display())]);
        let mut env = vec![
            format!("SANDBOX_API_KEY={api_key}"),
            format!("AIO_CONTROL_SOCKET={CONTROL_MOUNT}/{CONTROL_SOCKET}"),
        ];
        env.extend(self.extra_env.iter().cloned());
        ContainerCreateBody {
            image: Some(self.image.clone()),
            user: (!self.user.is_empty()).then(|| self.user.clone()),
            env: Some(env),
            labels: Some(self.labels(instance)),
            host_config: Some(host),
            ..Default::default()
        }
    }
}

/// A 256-bit random key from the kernel (no RNG crate needed).
pub fn new_api_key() -> std::io::Result<String> {
    let mut bytes = [0u8; 32];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut bytes)?;
    Ok(hex::encode(bytes))
}

/// Makes an instance's control directory, writable by the instance's user until
/// [`lock_control_dir`]. Its parent, the pool's own, is closed to other users of the host
/// (the bind mount does not pass through it), so only the pool reaches the socket from the
/// host.
pub fn open_control_dir(dir: &Path) -> std::io::Result<()> {
    let parent = dir.parent().unwrap_or(dir);
    std::fs::DirBuilder::new().recursive(true).create(parent)?;
    std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o700))?;
    std::fs::create_dir(dir)?;
    // Not owned by the instance's user, so the instance cannot undo the lock.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777))
}

/// Closes the control directory to writes once the agent has made its socket.
pub fn lock_control_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o555))
}

/// Removes a control directory (what the instance left in it goes too).
pub fn remove_control_dir(dir: &Path) {
    // Locked, it refuses unlinking its entries even to its owner; it may be gone already.
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "could not remove a control directory")
        }
    }
}

/// Removes a bridge an earlier version of the pool made (instances had one then); one
/// already gone is fine.
pub async fn remove_network(docker: &Docker, name: &str) {
    match docker.remove_network(name).await {
        Ok(()) => {}
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => {}
        Err(e) => tracing::warn!(network = name, error = %e, "could not remove network"),
    }
}

/// A started, answering instance container.
#[derive(Debug, Clone)]
pub struct Started {
    pub client: AioClient,
}

/// Creates and starts an instance with its control directory, waits until `GET
/// /v1/sandbox` answers on the control socket, then locks the directory. On failure the
/// caller's [`OwnedContainer`] removes what was made.
pub async fn start_instance(
    docker: &Docker,
    spec: &InstanceSpec,
    container: &OwnedContainer,
) -> Result<Started, DockerError> {
    let name = container.name();
    let dir = container.control_dir();
    let key =
        new_api_key().map_err(|e| DockerError::failed("make API key", name, e.to_string()))?;
    open_control_dir(dir).map_err(|e| {
        DockerError::failed(
            "make the control directory",
            name,
            format!("{}: {e}", dir.display()),
        )
    })?;
    let options = CreateContainerOptionsBuilder::new().name(name).build();
    docker
        .create_container(Some(options), spec.container_body(name, &key, dir))
        .await
        .map_err(|e| DockerError::api("create", name, e))?;
    docker
        .start_container(
            name,
            None::<bollard::query_parameters::StartContainerOptions>,
        )
        .await
        .map_err(|e| DockerError::api("start", name, e))?;
    let client = AioClient::new(
        dir.join(CONTROL_SOCKET),
        spec.port,
        key.clone(),
        spec.key_header.clone(),
        spec.max_answer,
    );
    wait_ready(&client, name, spec.start_timeout).await?;
    lock_control_dir(dir).map_err(|e| {
        DockerError::failed(
            "lock the control directory",
            name,
            format!("{}: {e}", dir.display()),
        )
    })?;
    Ok(Started { client })
}

async fn wait_ready(
    client: &AioClient,
    container: &str,
    limit: Duration,
) -> Result<(), DockerError> {
    let deadline = tokio::time::Instant::now() + limit;
    let mut last = String::new();
    while tokio::time::Instant::now() < deadline {
        match client.health(Duration::from_secs(2)).await {
            Ok(()) => return Ok(()),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(DockerError::failed(
        "wait until ready",
        container,
        format!("no answer on GET /v1/sandbox within {limit:?}: {last}"),
    ))
}

/// The names of the containers this pool process holds (being created, or owned by an
/// instance): the janitor removes this owner's containers that are not in it.
#[derive(Debug, Clone, Default)]
pub struct Registry(std::sync::Arc<std::sync::Mutex<std::collections::HashSet<String>>>);

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn contains(&self, name: &str) -> bool {
        self.lock().contains(name)
    }

    /// No container is held: every creation in flight has ended and removed what it made.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

/// A container this pool holds, with its control directory: registered while it lives,
/// removed (and unregistered) when [`OwnedContainer::remove`] is awaited or, as a backstop,
/// when it is dropped.
#[derive(Debug)]
pub struct OwnedContainer {
    docker: Docker,
    name: String,
    control_dir: PathBuf,
    registry: Registry,
    removed: bool,
}

impl OwnedContainer {
    /// Registers `name` before the container exists, so the janitor never sees it unowned.
    pub fn claim(docker: Docker, registry: Registry, name: String, control_dir: PathBuf) -> Self {
        registry.lock().insert(name.clone());
        Self {
            docker,
            name,
            control_dir,
            registry,
            removed: false,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn control_dir(&self) -> &Path {
        &self.control_dir
    }

    pub async fn remove(&mut self) {
        if !self.removed {
            containers::remove(&self.docker, &self.name).await;
            remove_control_dir(&self.control_dir);
            self.registry.lock().remove(&self.name);
            self.removed = true;
        }
    }
}

impl std::fmt::Display for OwnedContainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

impl Drop for OwnedContainer {
    fn drop(&mut self) {
        if self.removed {
            return;
        }
        let (docker, name, dir, registry) = (
            self.docker.clone(),
            self.name.clone(),
            self.control_dir.clone(),
            self.registry.clone(),
        );
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    containers::remove(&docker, &name).await;
                    remove_control_dir(&dir);
                    registry.lock().remove(&name);
                });
            }
            // No runtime left: the janitor of the next start removes it.
            Err(_) => tracing::warn!(container = %self.name, "container left for the janitor"),
        }
    }
}
