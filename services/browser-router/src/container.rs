//! Browser containers through the Docker API: the one place that decides how a Chromium
//! container is created, so its hardening cannot drift.
//!
//! Like the sandbox containers of docker-executor, a browser container has no network
//! (`NetworkMode none`): only its own loopback, so neither Chromium nor anything that takes
//! over a renderer reaches the host (no bridge gateway, no host address), another browser or
//! the internet. Its ways in and out are two Unix sockets in directories of its own:
//! - the egress directory (read-only in the container), where the router binds the egress
//!   proxy's socket when a session takes the browser: Chromium's only way out;
//! - the DevTools directory, where the container's forwarder makes the socket the router
//!   drives Chromium through. It is writable only while the container starts (no page is
//!   loaded yet) and read-only once DevTools answers, so a browser cannot fill the host's
//!   disk through it.
//!
//! Nothing else of the host is mounted. The other differences, each on purpose:
//! - `nofile` 4096 instead of 256: Chromium's processes and sockets need it; `/tmp` without
//!   `exec` (Chromium runs nothing from it).
//! - `--no-sandbox` inside: Chromium's own sandbox needs user namespaces or a setuid helper,
//!   neither of which a container with every capability dropped and `no-new-privileges` has;
//!   the container is the boundary, as for untrusted code.
//!
//! Every container carries [`LABEL_BROWSER`] and [`LABEL_ROUTER`] (this instance), so the
//! sweep at start and stop removes exactly this instance's containers and nobody else's.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bollard::models::ContainerCreateBody;
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
/// Where the container makes its DevTools socket (deploy/images/browser/sandmesh-browser).
const CDP_MOUNT: &str = "/run/sandmesh-cdp";
/// The DevTools socket in [`CDP_MOUNT`].
pub const CDP_SOCKET: &str = "cdp.sock";
/// The size of the container's `/tmp`, its one writable place.
const TMP_MB: u64 = 256;
pub const EGRESS_SOCKET: &str = "egress.sock";

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
    #[error("preparing the socket directory {}: {source}", path.display())]
    SocketDir {
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
    /// Connects, checks the image and makes this instance's socket directory (closed to the
    /// host's other users: the bind mounts do not pass through it).
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
            router: config.kit.instance_id.clone(),
            mesh: mesh.to_string(),
            egress_dir: config.egress_dir.join(&config.kit.instance_id),
            memory_mb: config.memory_mb,
            cpus: config.cpus,
            pids: config.pids,
            tasks: TaskTracker::new(),
        };
        let private = std::fs::create_dir_all(&this.egress_dir).and_then(|()| {
            std::fs::set_permissions(&this.egress_dir, std::fs::Permissions::from_mode(0o700))
        });
        private.map_err(|source| ContainerError::SocketDir {
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

    /// Creates and starts a browser container and waits until its DevTools answer. A
    /// container that fails on the way is removed (the lease is dropped).
    pub async fn start(&self, ready_within: Duration) -> Result<BrowserContainer, StartError> {
        let id = messages::new_id().to_ascii_lowercase();
        let name = format!("sandmesh-browser-{}-{id}", self.router);
        // Only the id: a Unix socket path has room for 107 bytes.
        let lease = BrowserContainer {
            name: name.clone(),
            dir: self.egress_dir.join(&id),
            containers: self.clone(),
        };
        let dir_failed = |source| ContainerError::SocketDir {
            path: lease.dir.clone(),
            source,
        };
        std::fs::create_dir(&lease.dir).map_err(dir_failed)?;
        std::fs::create_dir(lease.egress_dir()).map_err(dir_failed)?;
        std::fs::create_dir(lease.cdp_dir()).map_err(dir_failed)?;
        // The container's user makes its socket here; not its owner, it cannot undo the lock.
        std::fs::set_permissions(lease.cdp_dir(), std::fs::Permissions::from_mode(0o777))
            .map_err(dir_failed)?;
        let options = CreateContainerOptionsBuilder::new().name(&name).build();
        self.docker
            .create_container(Some(options), self.body(&lease))
            .await
            .map_err(api("create", &name))?;
        self.docker
            .start_container(
                &name,
                None::<bollard::query_parameters::StartContainerOptions>,
            )
            .await
            .map_err(api("start", &name))?;
        lease.wait_ready(ready_within).await?;
        std::fs::set_permissions(lease.cdp_dir(), std::fs::Permissions::from_mode(0o555)).map_err(
            |source| ContainerError::SocketDir {
                path: lease.cdp_dir(),
                source,
            },
        )?;
        Ok(lease)
    }

    fn body(&self, lease: &BrowserContainer) -> ContainerCreateBody {
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
        host.network_mode = Some("none".into());
        host.binds = Some(vec![
            format!("{}:{EGRESS_MOUNT}:ro", lease.egress_dir().display()),
            format!("{}:{CDP_MOUNT}", lease.cdp_dir().display()),
        ]);
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

    /// Removes every container of this instance and their socket directories (at start: a
    /// previous run's; at stop: what a race left). Returns how many containers there were.
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
        let _ = std::fs::read_dir(&self.egress_dir)
            .map(|dirs| dirs.flatten().for_each(|d| remove_container_dir(&d.path())));
        names.len()
    }

    /// Removes this instance's socket directory (at stop, once [`Self::sweep`] emptied it).
    pub fn remove_socket_dir(&self) {
        let _ = std::fs::remove_dir(&self.egress_dir);
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
/// removes the container (on the instance's task tracker, so shutdown waits) and its socket
/// directories.
pub struct BrowserContainer {
    pub name: String,
    /// Its socket directories' parent (`egress/`, `cdp/`).
    dir: PathBuf,
    containers: Containers,
}

impl BrowserContainer {
    /// `unix:<path>` of the DevTools socket: `cdp::Connection::browser` reads `/json/version`
    /// there and opens the browser's WebSocket through the same socket.
    pub fn cdp_url(&self) -> String {
        format!(
            "{}{}",
            cdp::UNIX_PREFIX,
            self.cdp_dir().join(CDP_SOCKET).display()
        )
    }

    fn egress_dir(&self) -> PathBuf {
        self.dir.join("egress")
    }

    fn cdp_dir(&self) -> PathBuf {
        self.dir.join("cdp")
    }

    pub fn egress_socket(&self) -> PathBuf {
        self.egress_dir().join(EGRESS_SOCKET)
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
        let dir = std::mem::take(&mut self.dir);
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let tasks = containers.tasks.clone();
            tasks.spawn_on(
                async move {
                    containers.remove(&name).await;
                    remove_container_dir(&dir);
                },
                &handle,
            );
        }
    }
}

/// Removes a container's socket directories (the locked DevTools one opened first: it refuses
/// unlinking its socket even to its owner).
fn remove_container_dir(dir: &std::path::Path) {
    let _ = std::fs::set_permissions(dir.join("cdp"), std::fs::Permissions::from_mode(0o700));
    let _ = std::fs::remove_dir_all(dir);
}
