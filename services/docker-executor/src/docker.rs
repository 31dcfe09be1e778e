//! Sandbox containers through the Docker API: the one place that decides how a container is
//! created, so the hardening cannot drift between tiers.
//!
//! Requests never reach this module's container body: only the node's configuration and the
//! clamped memory / CPU / pids limits do. Privileged mode, host namespaces, devices, the
//! working directory and the Docker socket are not parameters at all; the one mount that is
//! (the container's own egress socket directory, read-only) is made by `crate::egress`.

use std::collections::HashMap;
use std::sync::Arc;

use bollard::models::{ContainerCreateBody, ContainerUpdateBody};
use bollard::query_parameters::CreateContainerOptionsBuilder;
use bollard::Docker;
use containers::{hardened_host_config, tmpfs_options, Hardening};
pub use containers::{summary_name, DockerError};
use messages::exec::EffectiveLimits;
use messages::filesystem::{FilesystemPolicy, Mount, TMP_DIR};

use executor_node::{UidPool, UidRange};

use crate::config::ExecutorConfig;
use crate::ports::PortsHost;

/// Every sandbox container carries `sandmesh=1` (the janitor hook counts these) and its
/// [`LABEL_KIND`]: `warm` (pool, single use), `isolated` (made for one run) or `session`.
/// (`SANDBOX_UID` is the image's own user: containers run as a uid of the node's pool instead.)
pub use containers::{LABEL_KIND, LABEL_SANDMESH, SANDBOX_UID};
/// The executor node that owns the container.
pub const LABEL_NODE: &str = "sandmesh.node";
/// The session a cold-started session container belongs to.
pub const LABEL_SESSION: &str = "sandmesh.session";
/// The mesh (NATS deployment) of the node: janitors only judge containers of their own mesh
/// (and, here, only those with a [`LABEL_NODE`]: AIO and browser containers carry the mesh
/// label too).
pub use containers::LABEL_MESH;

pub use executor_node::{SUPERVISOR_PATH, WORKSPACE_DIR};
/// A directory a filesystem policy hides or keeps read-only: an empty tmpfs mounted `ro`.
const EMPTY_READ_ONLY: &str = "ro,nosuid,nodev,noexec,size=4k,mode=0555";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerKind {
    Warm,
    Isolated,
    Session,
}

impl ContainerKind {
    pub const fn as_str(self) -> &'static str {
        match self {
            ContainerKind::Warm => "warm",
            ContainerKind::Isolated => "isolated",
            ContainerKind::Session => "session",
        }
    }
}

/// The cgroup limits a container runs under; changed in place (`docker update`) when a
/// request asks for others.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ContainerLimits {
    pub memory_mb: u64,
    pub cpus: f64,
    pub pids: u64,
}

impl From<&EffectiveLimits> for ContainerLimits {
    fn from(l: &EffectiveLimits) -> Self {
        Self {
            memory_mb: l.memory_mb,
            cpus: l.cpus,
            pids: l.pids,
        }
    }
}

/// Whether the daemon refused to create a container because one of its name exists (or is
/// being removed).
pub fn is_name_conflict(e: &DockerError) -> bool {
    matches!(
        e,
        DockerError::Api {
            op: "create",
            source: bollard::errors::Error::DockerResponseServerError {
                status_code: 409,
                ..
            },
            ..
        }
    )
}

/// A container to make: its name and the host uid it runs as.
#[derive(Debug, Clone, Copy)]
pub struct ContainerId<'a> {
    pub name: &'a str,
    pub uid: u32,
}

/// A started sandbox container.
#[derive(Debug, Clone, PartialEq)]
pub struct Container {
    pub name: String,
    pub limits: ContainerLimits,
}

/// What every container of this node shares.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    pub image: String,
    pub node_id: String,
    pub mesh: String,
    pub workspace_mb: u64,
    pub tmp_mb: u64,
    pub nofile: u64,
    pub fsize_bytes: u64,
    /// The host uids its containers run as, one each (`SANDMESH_EXEC_UIDS`).
    pub uids: UidRange,
    /// Where each container's ports socket directory is made (`SANDMESH_EXEC_PORTS_DIR`).
    pub ports_dir: std::path::PathBuf,
}

impl SandboxSpec {
    pub fn from_config(config: &ExecutorConfig, mesh: &str) -> Self {
        let c = &config.node;
        Self {
            image: c.image.clone(),
            node_id: c.node_id().to_string(),
            mesh: mesh.to_string(),
            workspace_mb: c.workspace_mb,
            tmp_mb: c.tmp_mb,
            nofile: c.nofile,
            fsize_bytes: c.fsize_mb << 20,
            uids: config.uids,
            ports_dir: config.ports_dir.clone(),
        }
    }

    /// The create body of a hardened sandbox container running as `uid` (and the gid of the
    /// same number; its writable mounts are theirs), with the mounts of its filesystem policy
    /// when it has one.
    pub fn container_body(
        &self,
        kind: ContainerKind,
        session: Option<&str>,
        uid: u32,
        limits: ContainerLimits,
        binds: &[String],
        filesystem: Option<&FilesystemPolicy>,
    ) -> ContainerCreateBody {
        let mut tmpfs = HashMap::from([
            (TMP_DIR.to_string(), tmpfs_options(self.tmp_mb, uid, "1777")),
            (
                WORKSPACE_DIR.to_string(),
                tmpfs_options(self.workspace_mb, uid, "0755"),
            ),
        ]);
        // Docker mounts parents before what they hold, whatever the map's order.
        for (path, mount) in filesystem.map(FilesystemPolicy::mounts).unwrap_or_default() {
            let options = match mount {
                Mount::Writable => tmpfs_options(self.tmp_mb, uid, "0755"),
                Mount::EmptyReadOnly => EMPTY_READ_ONLY.to_string(),
            };
            tmpfs.insert(path, options);
        }
        let mut host = hardened_host_config(&Hardening {
            memory_mb: limits.memory_mb,
            cpus: limits.cpus,
            pids: limits.pids,
            nofile: self.nofile,
            fsize_bytes: self.fsize_bytes,
            tmpfs,
        });
        // The supervisor is the init (`keep`): Docker's init would be a process of the sandbox
        // user that code could trace and take over, and every run must spare PID 1.
        host.init = Some(false);
        // The network stays `none`: the egress socket directory is the only way out, and the
        // ports socket's the only way in (each bound read-only, its socket the host's).
        host.binds = (!binds.is_empty()).then(|| binds.to_vec());
        let mut labels: HashMap<String, String> = [
            (LABEL_SANDMESH.to_string(), "1".to_string()),
            (LABEL_NODE.to_string(), self.node_id.clone()),
            (LABEL_KIND.to_string(), kind.as_str().to_string()),
        ]
        .into_iter()
        .chain(containers::mesh_labels(&self.mesh))
        .collect();
        if let Some(s) = session {
            labels.insert(LABEL_SESSION.to_string(), s.to_string());
        }
        ContainerCreateBody {
            image: Some(self.image.clone()),
            cmd: Some(vec![SUPERVISOR_PATH.into(), "keep".into()]),
            user: Some(format!("{uid}:{uid}")),
            network_disabled: Some(true),
            env: Some(Vec::new()),
            labels: Some(labels),
            host_config: Some(host),
            ..Default::default()
        }
    }
}

/// The node's handle on Docker for sandbox containers. Cheap to clone.
#[derive(Clone)]
pub struct Sandboxes {
    pub docker: Docker,
    pub spec: Arc<SandboxSpec>,
    /// The uids this node's containers run as, shared by every image's containers.
    pub uids: Arc<UidPool>,
    /// Binds each container's ports socket; finds a session's (shared by every image's).
    pub ports: PortsHost,
}

impl Sandboxes {
    pub async fn connect() -> Result<Docker, DockerError> {
        containers::connect().await
    }

    pub fn new(docker: Docker, spec: SandboxSpec) -> Self {
        Self {
            docker,
            uids: UidPool::new(spec.uids),
            ports: PortsHost::new(spec.ports_dir.clone()),
            spec: Arc::new(spec),
        }
    }

    /// The same node's sandboxes, running `image` (a template's) instead of its own.
    pub fn with_image(&self, image: &str) -> Self {
        Self {
            docker: self.docker.clone(),
            spec: Arc::new(SandboxSpec {
                image: image.to_string(),
                ..(*self.spec).clone()
            }),
            uids: self.uids.clone(),
            ports: self.ports.clone(),
        }
    }

    /// The name of the container running as `uid`. One name per uid is what keeps two nodes
    /// from handing out one uid: the daemon refuses a second container of a name, whichever
    /// node made the first, until the first is removed.
    pub fn name_for_uid(uid: u32) -> String {
        format!("sandmesh-uid-{uid}")
    }

    /// A fresh, unique container name on this node (for containers made outside a lease).
    pub fn new_name(&self) -> String {
        format!(
            "sandmesh-{}-{}",
            self.spec.node_id,
            messages::new_id().to_ascii_lowercase()
        )
    }

    /// Creates and starts the container `id` (with `binds`: its ports socket directory, and its
    /// egress socket directory when it has one; its filesystem policy mounted when given); a
    /// container that fails to start is removed again.
    pub async fn start(
        &self,
        id: ContainerId<'_>,
        kind: ContainerKind,
        session: Option<&str>,
        limits: ContainerLimits,
        binds: &[String],
        filesystem: Option<&FilesystemPolicy>,
    ) -> Result<Container, DockerError> {
        let body = self
            .spec
            .container_body(kind, session, id.uid, limits, binds, filesystem);
        let name = id.name;
        let options = CreateContainerOptionsBuilder::new().name(name).build();
        self.docker
            .create_container(Some(options), body)
            .await
            .map_err(|e| DockerError::api("create", name, e))?;
        if let Err(e) = self
            .docker
            .start_container(
                name,
                None::<bollard::query_parameters::StartContainerOptions>,
            )
            .await
        {
            self.remove(name).await;
            return Err(DockerError::api("start", name, e));
        }
        Ok(Container {
            name: name.to_string(),
            limits,
        })
    }

    /// Empties the container's workspace (before a newer snapshot is unpacked over it), and
    /// forgets the last run's manifest of it, which no longer describes it.
    pub async fn clear_workspace(&self, name: &str) -> Result<(), DockerError> {
        let script = format!(
            "find {WORKSPACE_DIR} -mindepth 1 -delete && rm -f {}",
            sandbox_protocol::PUSHED_MANIFEST
        );
        let cmd = ["sh", "-c", script.as_str()];
        let out = crate::probe::exec_capture(&self.docker, name, &cmd).await?;
        match out.exit_code {
            Some(0) => Ok(()),
            code => Err(DockerError::failed(
                "clear workspace",
                name,
                format!("exit {code:?}: {}", out.stderr.trim()),
            )),
        }
    }

    /// Removes a container (running or not); a container already gone is fine.
    pub async fn remove(&self, name: &str) {
        containers::remove(&self.docker, name).await
    }

    /// Applies other cgroup limits to a running container.
    pub async fn update_limits(
        &self,
        name: &str,
        limits: ContainerLimits,
    ) -> Result<(), DockerError> {
        let memory = (limits.memory_mb << 20) as i64;
        let body = ContainerUpdateBody {
            memory: Some(memory),
            memory_swap: Some(memory),
            nano_cpus: Some((limits.cpus * 1e9) as i64),
            pids_limit: Some(limits.pids as i64),
            ..Default::default()
        };
        self.docker
            .update_container(name, body)
            .await
            .map_err(|e| DockerError::api("update", name, e))
    }

    /// Every container (running or not) carrying `label` (`key` or `key=value`).
    pub async fn list(
        &self,
        label: &str,
    ) -> Result<Vec<bollard::models::ContainerSummary>, DockerError> {
        containers::list(&self.docker, label).await
    }
}
