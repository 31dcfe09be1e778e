//! Browser containers through the Docker API: the one place that decides how a Chromium
//! container is created, so its hardening cannot drift.
//!
//! Differences from the sandbox containers of docker-executor, each on purpose:
//! - network: the internal bridge [`BrowserConfig::docker_network`] instead of `none`, because
//!   the router must reach Chromium's DevTools by the container's IP. The bridge is created
//!   `--internal` (no route out of the host) with inter-container traffic disabled, so a
//!   browser reaches neither the internet nor another browser; its only way out is the
//!   egress proxy (below).
//! - one bind mount: the container's own egress directory (read-only), where the router binds
//!   the egress proxy's Unix socket when a session takes the browser. Nothing else of the
//!   host is mounted.
//! - `nofile` 4096 instead of 256: Chromium's processes and sockets need it; `/tmp` without
//!   `exec` (Chromium runs nothing from it).
//! - `--no-sandbox` inside: Chromium's own sandbox needs user namespaces or a setuid helper,
//!   neither of which a container with every capability dropped and `no-new-privileges` has;
//!   the container is the boundary, as for untrusted code.
//!
//! Every container carries [`LABEL_BROWSER`] and [`LABEL_ROUTER`] (this instance), so the
//! sweep at start and stop removes exactly this instance's containers and nobody else's.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bollard::models::{ContainerCreateBody, NetworkCreateRequest};
use bollard::query_parameters::{CreateContainerOptionsBuilder, ListContainersOptionsBuilder};
use bollard::Docker;
use tokio_util::task::TaskTracker;

use containers::{hardened_host_config, Hardening};

use crate::config::BrowserConfig;

/// Every browser container carries `sandmesh.browser=1`.
pub const LABEL_BROWSER: &str = "sandmesh.browser";
/// The router instance that owns the container.
pub const LABEL_ROUTER: &str = "sandmesh.browser.router";
/// The browser user of the image (deploy/images/browser/Dockerfile).
pub const BROWSER_UID: u32 = 10002;
/// Where the container finds its egress socket (deploy/images/browser/sandmesh-browser).
const EGRESS_MOUNT: &str = "/run/sandmesh-egress";
/// The size of the container's `/tmp`, its one writable place.
const TMP_MB: u64 = 256;
pub const EGRESS_SOCKET: &str = "egress.sock";
/// The CDP forwarder's port in the container.
pub const CDP_PORT: u16 = 9222;

#[derive(Debug, thiserror::Error)]
pub enum ContainerError {
    #[error(transparent)]
    Docker(#[from] containers::DockerError),
    #[error(
        "browser image {image} not found; build it with deploy/images/build-browser.sh: {source}"
    )]
    ImageMissing {
        image: String,
        #[source]
        source: bollard::errors::Error,
    },
    #[error("container {0} has no address on the browser network")]
    NoAddress(String),
    #[error("preparing the egress directory {}: {source}", path.display())]
    EgressDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn api(op: &'static str, target: &str) -> impl FnOnce(bollard::errors::Error) -> ContainerError {
    let target = target.to_string();
    move |source| containers::DockerError::Api { op, target, source }.into()
}

/// This instance's handle on Docker for browser containers. Cheap to clone.
#[derive(Clone)]
pub struct Containers {
    docker: Docker,
    image: String,
    network: String,
    /// Whether this instance created [`Self::network`] (and so removes it at stop).
    created_network: std::sync::Arc<std::sync::atomic::AtomicBool>,
    router: String,
    /// The mesh, for [`containers::LABEL_MESH`].
    mesh: String,
    egress_dir: PathBuf,
    memory_mb: u64,
    cpus: f64,
    pids: u64,
    /// Removals in flight: shutdown waits for them.
    pub tasks: TaskTracker,
}

impl Containers {
    /// Connects, checks the image and makes sure the internal bridge exists.
    pub async fn connect(config: &BrowserConfig, mesh: &str) -> Result<Self, ContainerError> {
        let docker = containers::connect().await?;
        docker
            .inspect_image(&config.image)
            .await
            .map_err(|source| ContainerError::ImageMissing {
                image: config.image.clone(),
                source,
            })?;
        let this = Self {
            docker,
            image: config.image.clone(),
            network: config.docker_network.clone(),
            created_network: std::sync::Arc::default(),
            router: config.kit.instance_id.clone(),
            mesh: mesh.to_string(),
            egress_dir: config.egress_dir.join(&config.kit.instance_id),
            memory_mb: config.memory_mb,
            cpus: config.cpus,
            pids: config.pids,
            tasks: TaskTracker::new(),
        };
        this.ensure_network().await?;
        std::fs::create_dir_all(&this.egress_dir).map_err(|source| ContainerError::EgressDir {
            path: this.egress_dir.clone(),
            source,
        })?;
        Ok(this)
    }

    pub fn docker(&self) -> &Docker {
        &self.docker
    }

    /// What every container and network of this router carries.
    fn labels(&self) -> HashMap<String, String> {
        [
            (LABEL_BROWSER.to_string(), "1".to_string()),
            (LABEL_ROUTER.to_string(), self.router.clone()),
        ]
        .into_iter()
        .chain(containers::mesh_labels(&self.mesh))
        .collect()
    }

    pub fn router(&self) -> &str {
        &self.router
    }

    /// The bridge: internal (no route out) and no traffic between its containers. Creating
    /// it races with other routers on the host; a 409 means one of them won.
    async fn ensure_network(&self) -> Result<(), ContainerError> {
        if self
            .docker
            .inspect_network(&self.network, None)
            .await
            .is_ok()
        {
            return Ok(());
        }
        let body = NetworkCreateRequest {
            name: self.network.clone(),
            driver: Some("bridge".into()),
            internal: Some(true),
            options: Some(HashMap::from([(
                "com.docker.network.bridge.enable_icc".to_string(),
                "false".to_string(),
            )])),
            labels: Some(self.labels()),
            ..Default::default()
        };
        match self.docker.create_network(body).await {
            Ok(_) => {
                self.created_network
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                Ok(())
            }
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 409, ..
            }) => Ok(()),
            Err(e) => Err(api("create network", &self.network)(e)),
        }
    }

    /// Creates and starts a browser container and waits until its DevTools answer. A
    /// container that fails on the way is removed (the lease is dropped).
    pub async fn start(&self, ready_within: Duration) -> Result<BrowserContainer, StartError> {
        let id = messages::new_id().to_ascii_lowercase();
        let name = format!("sandmesh-browser-{}-{id}", self.router);
        // Only the id: a Unix socket path has room for 107 bytes.
        let egress_dir = self.egress_dir.join(&id);
        let mut lease = BrowserContainer {
            name: name.clone(),
            ip: IpAddr::from([0, 0, 0, 0]),
            egress_dir: egress_dir.clone(),
            containers: self.clone(),
        };
        std::fs::create_dir_all(&egress_dir).map_err(|source| ContainerError::EgressDir {
            path: egress_dir.clone(),
            source,
        })?;
        let options = CreateContainerOptionsBuilder::new().name(&name).build();
        self.docker
            .create_container(Some(options), self.body(&egress_dir))
            .await
            .map_err(api("create", &name))?;
        self.docker
            .start_container(
                &name,
                None::<bollard::query_parameters::StartContainerOptions>,
            )
            .await
            .map_err(api("start", &name))?;
        let inspect = self
            .docker
            .inspect_container(&name, None)
            .await
            .map_err(api("inspect", &name))?;
        let ip = inspect
            .network_settings
            .and_then(|n| n.networks)
            .and_then(|n| n.get(&self.network).cloned())
            .and_then(|n| n.ip_address)
            .and_then(|ip| ip.parse::<IpAddr>().ok())
            .ok_or_else(|| ContainerError::NoAddress(name.clone()))?;
        lease.ip = ip;
        lease.wait_ready(ready_within).await?;
        Ok(lease)
    }

    fn body(&self, egress_dir: &std::path::Path) -> ContainerCreateBody {
        // The sandboxes' hardening, with the differences the module doc gives.
        let mut host = hardened_host_config(&Hardening {
            memory_mb: self.memory_mb,
            cpus: self.cpus,
            pids: self.pids,
            nofile: 4096,
            // What the one writable place holds.
            fsize_bytes: TMP_MB << 20,
            // The profile, caches and HOME live here and die with the container.
            tmpfs: HashMap::from([(
                "/tmp".to_string(),
                format!(
                    "rw,nosuid,nodev,size={TMP_MB}m,uid={BROWSER_UID},gid={BROWSER_UID},mode=1777"
                ),
            )]),
        });
        host.network_mode = Some(self.network.clone());
        host.binds = Some(vec![format!("{}:{EGRESS_MOUNT}:ro", egress_dir.display())]);
        ContainerCreateBody {
            image: Some(self.image.clone()),
            user: Some(format!("{BROWSER_UID}:{BROWSER_UID}")),
            env: Some(Vec::new()),
            labels: Some(self.labels()),
            host_config: Some(host),
            ..Default::default()
        }
    }

    /// Removes a container (running or not); one already gone is fine.
    pub async fn remove(&self, name: &str) {
        containers::remove(&self.docker, name).await;
    }

    /// Names of this instance's containers (running or not).
    pub async fn list(&self) -> Result<Vec<String>, ContainerError> {
        let label = format!("{LABEL_ROUTER}={}", self.router);
        let filters = HashMap::from([("label", vec![label.as_str()])]);
        let options = ListContainersOptionsBuilder::new()
            .all(true)
            .filters(&filters)
            .build();
        let found = self
            .docker
            .list_containers(Some(options))
            .await
            .map_err(api("list", &label))?;
        Ok(found
            .iter()
            .filter_map(|s| s.names.as_ref()?.first())
            .map(|n| n.trim_start_matches('/').to_string())
            .collect())
    }

    /// Removes every container of this instance (at start: a previous run's; at stop: what a
    /// race left). Returns how many there were.
    pub async fn sweep(&self) -> usize {
        let names = match self.list().await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list browser containers");
                return 0;
            }
        };
        for name in &names {
            self.remove(name).await;
        }
        let _ = std::fs::remove_dir_all(&self.egress_dir);
        names.len()
    }

    /// Removes the bridge if this instance created it (its containers are gone by now); one
    /// named by configuration and shared with others stays.
    pub async fn remove_network(&self) {
        if !self
            .created_network
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return;
        }
        if let Err(e) = self.docker.remove_network(&self.network).await {
            tracing::warn!(network = %self.network, error = %e, "browser network not removed");
        }
    }
}

/// Why a browser container could not be started.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Container(#[from] ContainerError),
    #[error("Chromium in {name} did not answer on {addr} within {within:?}: {source}")]
    NotReady {
        name: String,
        addr: String,
        within: Duration,
        #[source]
        source: cdp::CdpError,
    },
}

/// One started browser container, from its creation until Docker removed it: dropping it
/// removes the container (on the instance's task tracker, so shutdown waits) and its egress
/// directory.
pub struct BrowserContainer {
    pub name: String,
    pub ip: IpAddr,
    pub egress_dir: PathBuf,
    containers: Containers,
}

impl BrowserContainer {
    /// `http://<ip>:9222`: `cdp::Connection::browser` reads `/json/version` there and goes to
    /// this address instead of the `127.0.0.1` in its `webSocketDebuggerUrl`.
    pub fn cdp_url(&self) -> String {
        format!("http://{}:{CDP_PORT}", self.ip)
    }

    pub fn egress_socket(&self) -> PathBuf {
        self.egress_dir.join(EGRESS_SOCKET)
    }

    async fn wait_ready(&self, within: Duration) -> Result<(), StartError> {
        let deadline = Instant::now() + within;
        loop {
            match crate::chromium::probe(&self.cdp_url()).await {
                Ok(()) => return Ok(()),
                Err(source) if Instant::now() >= deadline => {
                    return Err(StartError::NotReady {
                        name: self.name.clone(),
                        addr: self.cdp_url(),
                        within,
                        source,
                    })
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
}

impl Drop for BrowserContainer {
    fn drop(&mut self) {
        let containers = self.containers.clone();
        let name = std::mem::take(&mut self.name);
        let dir = std::mem::take(&mut self.egress_dir);
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let tasks = containers.tasks.clone();
            tasks.spawn_on(
                async move {
                    containers.remove(&name).await;
                    let _ = std::fs::remove_dir_all(&dir);
                },
                &handle,
            );
        }
    }
}
