//! Docker plumbing shared by the services that own containers (docker-executor, aio-pool):
//! one definition of the hardening, so it cannot drift between
//! them, plus connecting, listing by label and removing.
//!
//! [`hardened_host_config`] is the baseline; a service changes only what its workload needs
//! and says why where it does (aio-pool: a network, and a bigger `/tmp` for Chromium).

pub mod image;
pub mod template;

use std::collections::HashMap;

use bollard::models::{ContainerSummary, HostConfig, HostConfigLogConfig, ResourcesUlimits};
use bollard::query_parameters::{ListContainersOptionsBuilder, RemoveContainerOptionsBuilder};
use bollard::Docker;

#[derive(Debug, thiserror::Error)]
pub enum DockerError {
    #[error("cannot reach the Docker daemon: {0}")]
    Connect(#[source] bollard::errors::Error),
    /// The Docker API refused or failed a call.
    #[error("docker {op} {target}: {source}")]
    Api {
        op: &'static str,
        target: String,
        #[source]
        source: bollard::errors::Error,
    },
    /// The call went through but did not do its job (a command's exit code, a stream
    /// that was not attached).
    #[error("docker {op} {target}: {message}")]
    Failed {
        op: &'static str,
        target: String,
        message: String,
    },
}

impl DockerError {
    pub fn api(op: &'static str, target: &str, source: bollard::errors::Error) -> Self {
        DockerError::Api {
            op,
            target: target.to_string(),
            source,
        }
    }

    pub fn failed(op: &'static str, target: &str, message: impl Into<String>) -> Self {
        DockerError::Failed {
            op,
            target: target.to_string(),
            message: message.into(),
        }
    }
}

/// The local daemon, API version negotiated.
/// The mesh (NATS deployment) a container or network belongs to: every one the mesh creates
/// carries it — executors', AIO instances', browsers' — so a leak check finds all of a
/// mesh's leftovers by one label. Janitors judge only what also carries their own labels.
pub const LABEL_MESH: &str = "sandmesh.mesh";

/// Every container and network the mesh makes for running code carries `sandmesh=1` (sandbox
/// containers, AIO instances; leak checks count these).
pub const LABEL_SANDMESH: &str = "sandmesh";
/// What a sandbox container is for: `warm` (pool, single use), `isolated` (made for one run),
/// `session`, or a tool's own (the loadtest's baseline).
pub const LABEL_KIND: &str = "sandmesh.kind";
/// The sandbox image's user (deploy/images/sandbox/Dockerfile); its tmpfs mounts are owned by
/// it.
pub const SANDBOX_UID: u32 = 10001;

/// Set on every container and network the mesh makes while `SANDMESH_TEST_RUN` is in the
/// process environment: the test command marks each run (`scripts/test.sh`), so what a run
/// that died or panicked left behind is found and removed by the next one, and a mesh of a
/// user's own on the same host is never touched.
pub const LABEL_TEST_RUN: &str = "sandmesh.test-run";

/// The labels that say whose a container or network is: [`LABEL_MESH`], and under a test run
/// [`LABEL_TEST_RUN`].
pub fn mesh_labels(mesh: &str) -> impl Iterator<Item = (String, String)> {
    let run = std::env::var("SANDMESH_TEST_RUN")
        .ok()
        .filter(|r| !r.is_empty());
    std::iter::once((LABEL_MESH.to_string(), mesh.to_string()))
        .chain(run.map(|r| (LABEL_TEST_RUN.to_string(), r)))
}

pub async fn connect() -> Result<Docker, DockerError> {
    let docker = Docker::connect_with_local_defaults().map_err(DockerError::Connect)?;
    docker
        .negotiate_version()
        .await
        .map_err(DockerError::Connect)
}

/// The limits and sizes a hardened container runs under.
#[derive(Debug, Clone, PartialEq)]
pub struct Hardening {
    pub memory_mb: u64,
    pub cpus: f64,
    pub pids: u64,
    pub nofile: u64,
    pub fsize_bytes: u64,
    /// Mount point → tmpfs options (the only writable places: the root is read-only).
    pub tmpfs: HashMap<String, String>,
}

/// Tmpfs options for a directory owned by `uid`: `exec` (tmpfs defaults to noexec) and owned
/// by the sandbox user (Docker would make a working directory root-owned otherwise).
pub fn tmpfs_options(size_mb: u64, uid: u32, mode: &str) -> String {
    format!("rw,exec,nosuid,nodev,size={size_mb}m,uid={uid},gid={uid},mode={mode}")
}

/// The hardened baseline: no capabilities, no privilege gain, Docker's default seccomp
/// profile (none is named; never `unconfined`), read-only root with tmpfs where writing is
/// needed, memory = memory + swap, CPU and pids limits, `nofile`/`fsize`/`core=0` ulimits,
/// private IPC, an init reaping orphans, no log driver (output travels through the service;
/// a log could only fill the disk) and no network.
pub fn hardened_host_config(h: &Hardening) -> HostConfig {
    let ulimit = |name: &str, v: u64| ResourcesUlimits {
        name: Some(name.into()),
        soft: Some(v as i64),
        hard: Some(v as i64),
    };
    let memory = (h.memory_mb << 20) as i64;
    HostConfig {
        memory: Some(memory),
        memory_swap: Some(memory),
        oom_kill_disable: Some(false),
        nano_cpus: Some((h.cpus * 1e9) as i64),
        pids_limit: Some(h.pids as i64),
        network_mode: Some("none".into()),
        readonly_rootfs: Some(true),
        cap_drop: Some(vec!["ALL".into()]),
        cap_add: Some(Vec::new()),
        security_opt: Some(vec!["no-new-privileges:true".into()]),
        privileged: Some(false),
        ipc_mode: Some("private".into()),
        tmpfs: Some(h.tmpfs.clone()),
        ulimits: Some(vec![
            ulimit("nofile", h.nofile),
            ulimit("fsize", h.fsize_bytes),
            ulimit("core", 0),
        ]),
        log_config: Some(HostConfigLogConfig {
            typ: Some("none".into()),
            config: None,
        }),
        init: Some(true),
        ..Default::default()
    }
}

/// Removes a container (running or not); a container already gone is fine.
pub async fn remove(docker: &Docker, name: &str) {
    let options = RemoveContainerOptionsBuilder::new()
        .force(true)
        .v(true)
        .build();
    match docker.remove_container(name, Some(options)).await {
        Ok(()) => {}
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => {}
        // "removal already in progress" and similar: the container is on its way out.
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 409, ..
        }) => {}
        Err(e) => tracing::warn!(container = name, error = %e, "could not remove container"),
    }
}

/// Every container (running or not) carrying `label` (`key` or `key=value`).
pub async fn list(docker: &Docker, label: &str) -> Result<Vec<ContainerSummary>, DockerError> {
    let filters = HashMap::from([("label", vec![label])]);
    let options = ListContainersOptionsBuilder::new()
        .all(true)
        .filters(&filters)
        .build();
    docker
        .list_containers(Some(options))
        .await
        .map_err(|e| DockerError::api("list", label, e))
}

/// The container's name without Docker's leading `/`.
pub fn summary_name(s: &ContainerSummary) -> Option<String> {
    s.names
        .as_ref()?
        .first()
        .map(|n| n.trim_start_matches('/').to_string())
}
