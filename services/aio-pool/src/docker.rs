//! AIO containers and their network through the Docker API: the one place that decides how an
//! instance is created.
//!
//! Hardening is the sandbox containers' ([`containers::hardened_host_config`]) except, and
//! why:
//! - **network**: instances must be reachable by the pool over HTTP, so they join the pool's
//!   own bridge, created `internal` (no route out, no NAT, no published ports) with
//!   `enable_icc=false` (instances cannot reach each other). The host's services reach them
//!   by container IP. Egress, when allowed, goes through the `egress` proxy: the
//!   seam is [`InstanceSpec::extra_env`] (e.g. `BROWSER_EXTRA_ARGS=--proxy-server=…`,
//!   `HTTP_PROXY`) and a bind-mounted socket, not a wider network;
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

use bollard::models::{ContainerCreateBody, EndpointSettings, NetworkCreateRequest};
use bollard::query_parameters::{CreateContainerOptionsBuilder, ListNetworksOptionsBuilder};
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

/// What every instance of this pool shares.
#[derive(Debug, Clone)]
pub struct InstanceSpec {
    pub image: String,
    pub port: u16,
    pub key_header: KeyHeader,
    pub user: String,
    pub mesh: String,
    pub owner: String,
    pub network: String,
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
            network: network_name(&owner),
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

    pub fn container_body(&self, instance: &str, api_key: &str) -> ContainerCreateBody {
        let mut host = hardened_host_config(&self.hardening);
        host.network_mode = Some(self.network.clone());
        let mut env = vec![format!("SANDBOX_API_KEY={api_key}")];
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

/// The pool's bridge: one per aio-pool process, so its janitor can remove it with the
/// process's containers.
pub fn network_name(owner: &str) -> String {
    format!("sandmesh-aio-{owner}")
}

/// A 256-bit random key from the kernel (no RNG crate needed).
pub fn new_api_key() -> std::io::Result<String> {
    let mut bytes = [0u8; 32];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut bytes)?;
    Ok(hex::encode(bytes))
}

/// Creates the pool's internal bridge unless it exists.
pub async fn ensure_network(docker: &Docker, spec: &InstanceSpec) -> Result<(), DockerError> {
    let filters = HashMap::from([("name", vec![spec.network.as_str()])]);
    let existing = docker
        .list_networks(Some(
            ListNetworksOptionsBuilder::new().filters(&filters).build(),
        ))
        .await
        .map_err(|e| DockerError::api("list networks", &spec.network, e))?;
    if existing
        .iter()
        .any(|n| n.name.as_deref() == Some(spec.network.as_str()))
    {
        return Ok(());
    }
    let labels = [
        (LABEL_SANDMESH.to_string(), "1".to_string()),
        (LABEL_MESH.to_string(), spec.mesh.clone()),
        (LABEL_OWNER.to_string(), spec.owner.clone()),
    ]
    .into_iter()
    .chain(containers::mesh_labels(&spec.mesh))
    .collect();
    let request = NetworkCreateRequest {
        name: spec.network.clone(),
        driver: Some("bridge".into()),
        internal: Some(true),
        options: Some(HashMap::from([(
            "com.docker.network.bridge.enable_icc".to_string(),
            "false".to_string(),
        )])),
        labels: Some(labels),
        ..Default::default()
    };
    docker
        .create_network(request)
        .await
        .map_err(|e| DockerError::api("create network", &spec.network, e))?;
    Ok(())
}

/// Removes a network; one already gone is fine.
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

/// Creates and starts an instance, waits until `GET /v1/sandbox` answers. On failure the
/// caller's [`OwnedContainer`] removes what was made.
pub async fn start_instance(
    docker: &Docker,
    spec: &InstanceSpec,
    container: &str,
) -> Result<Started, DockerError> {
    let key =
        new_api_key().map_err(|e| DockerError::failed("make API key", container, e.to_string()))?;
    let options = CreateContainerOptionsBuilder::new().name(container).build();
    docker
        .create_container(Some(options), spec.container_body(container, &key))
        .await
        .map_err(|e| DockerError::api("create", container, e))?;
    docker
        .start_container(
            container,
            None::<bollard::query_parameters::StartContainerOptions>,
        )
        .await
        .map_err(|e| DockerError::api("start", container, e))?;
    let ip = container_ip(docker, container, &spec.network).await?;
    let client = AioClient::new(
        format!("{ip}:{}", spec.port),
        key.clone(),
        spec.key_header.clone(),
        spec.max_answer,
    );
    wait_ready(&client, container, spec.start_timeout).await?;
    Ok(Started { client })
}

async fn container_ip(
    docker: &Docker,
    container: &str,
    network: &str,
) -> Result<String, DockerError> {
    let inspect = docker
        .inspect_container(
            container,
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await
        .map_err(|e| DockerError::api("inspect", container, e))?;
    inspect
        .network_settings
        .and_then(|n| n.networks)
        .and_then(|mut n| n.remove(network))
        .and_then(|e: EndpointSettings| e.ip_address)
        .filter(|ip| !ip.is_empty())
        .ok_or_else(|| {
            DockerError::failed("inspect", container, format!("no address on {network}"))
        })
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
}

/// A container this pool holds: registered while it lives, removed (and unregistered) when
/// [`OwnedContainer::remove`] is awaited or, as a backstop, when it is dropped.
#[derive(Debug)]
pub struct OwnedContainer {
    docker: Docker,
    name: String,
    registry: Registry,
    removed: bool,
}

impl OwnedContainer {
    /// Registers `name` before the container exists, so the janitor never sees it unowned.
    pub fn claim(docker: Docker, registry: Registry, name: String) -> Self {
        registry.lock().insert(name.clone());
        Self {
            docker,
            name,
            registry,
            removed: false,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub async fn remove(&mut self) {
        if !self.removed {
            containers::remove(&self.docker, &self.name).await;
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
        let (docker, name, registry) = (
            self.docker.clone(),
            self.name.clone(),
            self.registry.clone(),
        );
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    containers::remove(&docker, &name).await;
                    registry.lock().remove(&name);
                });
            }
            // No runtime left: the janitor of the next start removes it.
            Err(_) => tracing::warn!(container = %self.name, "container left for the janitor"),
        }
    }
}
