//! A container's network egress: an
//! [`egress::EgressProxy`] on a Unix socket in a host directory of that container alone,
//! bind-mounted read-only at [`EGRESS_MOUNT`] into it and into no other. The container keeps
//! `NetworkMode none`; the supervisor relays `127.0.0.1:3128` to the socket during each run.
//!
//! [`ContainerEgress`] lives inside the container's [`crate::lease::ContainerLease`], so the
//! socket, its directory and the proxy's connections go exactly when the lease does. Every
//! decision is audited (`sandbox.v1.audit.egress`) under the execution running at the time and
//! collected into that execution's [`NetworkReport`].
//!
//! A session's background process gets a proxy of its own ([`ProcessEgress`]): a second socket
//! in the same directory, under the same policy, whose decisions are audited under the process
//! (its id as the event's `execution_id`), never under whichever run happens to be current.
//! Its relay in the container listens on a port of its own, so the kernel never hands a run's
//! connection to it or its connection to a run's relay.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use egress::{EgressError, EgressEvent, EgressProxy};
use kit::{AuditScope, Auditor};
use messages::network::{NetworkPolicy, NetworkReport};

/// Where the socket directory appears inside the container.
pub const EGRESS_MOUNT: &str = "/run/sandmesh-egress";
/// The socket's file name in its directory.
pub const SOCKET_NAME: &str = "egress.sock";

#[derive(Debug, thiserror::Error)]
pub enum EgressSetupError {
    #[error("cannot prepare the egress directory {}", path.display())]
    Directory {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Proxy(#[from] EgressError),
}

/// What every container's egress on this node shares: the directory the sockets live under
/// (`SANDMESH_EXEC_EGRESS_DIR`) and the audit publisher.
#[derive(Clone)]
pub struct EgressHost {
    base: PathBuf,
    auditor: Auditor,
}

impl EgressHost {
    pub fn new(base: PathBuf, auditor: Auditor) -> Self {
        Self { base, auditor }
    }

    /// Binds a proxy for one container under `policy`. The directory is named by a fresh id
    /// (short, so the socket path stays far below the 108-byte limit of Unix socket names).
    pub fn bind(&self, policy: &NetworkPolicy) -> Result<ContainerEgress, EgressSetupError> {
        let directory = |path: &Path, source| EgressSetupError::Directory {
            path: path.to_path_buf(),
            source,
        };
        // The base is root's alone: other host users cannot reach any container's socket.
        std::fs::create_dir_all(&self.base).map_err(|e| directory(&self.base, e))?;
        set_mode(&self.base, 0o711).map_err(|e| directory(&self.base, e))?;
        let dir = self.base.join(messages::new_id().to_ascii_lowercase());
        std::fs::create_dir(&dir).map_err(|e| directory(&dir, e))?;
        // From here on, dropping `egress` removes the directory again.
        let mut egress = ContainerEgress {
            proxy: None,
            doors: ProcessDoors {
                dir,
                policy: policy.clone(),
                auditor: self.auditor.clone(),
            },
            log: Arc::new(Mutex::new(RunLog::default())),
        };
        let dir = egress.doors.dir.clone();
        set_mode(&dir, 0o755).map_err(|e| directory(&dir, e))?;
        let log = egress.log.clone();
        let auditor = self.auditor.clone();
        let proxy = EgressProxy::builder(policy.clone())
            .observer(move |event| observe(&log, &auditor, event))
            .bind(dir.join(SOCKET_NAME))?;
        open_to_the_sandbox(&proxy)?;
        egress.proxy = Some(proxy);
        Ok(egress)
    }
}

/// The sandbox user (not root) connects: a socket needs write permission to connect.
fn open_to_the_sandbox(proxy: &EgressProxy) -> Result<(), EgressSetupError> {
    let socket = proxy.socket_path();
    set_mode(socket, 0o666).map_err(|source| EgressSetupError::Directory {
        path: socket.to_path_buf(),
        source,
    })
}

fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// The execution a container runs now, and what its proxy decided for it so far.
#[derive(Default)]
struct RunLog {
    scope: AuditScope,
    report: NetworkReport,
}

fn observe(log: &Mutex<RunLog>, auditor: &Auditor, event: &EgressEvent) {
    let scope = {
        let mut log = log.lock().unwrap_or_else(PoisonError::into_inner);
        log.report
            .record(&event.host, event.port, event.allowed, &event.rule);
        log.scope.clone()
    };
    auditor.emit(&scope, event.clone());
}

/// One container's egress: its proxy and socket directory, removed when dropped.
pub struct ContainerEgress {
    proxy: Option<EgressProxy>,
    doors: ProcessDoors,
    log: Arc<Mutex<RunLog>>,
}

impl ContainerEgress {
    /// The Docker bind of the socket directory (read-only: the sandbox can connect to the
    /// socket, never replace it).
    pub fn bind_spec(&self) -> String {
        format!("{}:{EGRESS_MOUNT}:ro", self.doors.dir.display())
    }

    /// What the container's background processes bind their own proxies with.
    pub fn process_doors(&self) -> ProcessDoors {
        self.doors.clone()
    }

    /// The socket's path inside the container.
    pub fn socket_in_container() -> String {
        format!("{EGRESS_MOUNT}/{SOCKET_NAME}")
    }

    /// The socket's path on the host.
    pub fn host_socket(&self) -> PathBuf {
        self.doors.dir.join(SOCKET_NAME)
    }

    /// Decisions from now on belong to the execution of `scope`.
    pub fn begin(&self, scope: AuditScope) {
        let mut log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        *log = RunLog {
            scope,
            report: NetworkReport::default(),
        };
    }

    /// What the proxy decided since [`Self::begin`].
    pub fn finish(&self) -> NetworkReport {
        let mut log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        std::mem::take(&mut log.report)
    }
}

impl Drop for ContainerEgress {
    fn drop(&mut self) {
        // The proxy first: it ends its connections and removes its socket file.
        drop(self.proxy.take());
        let dir = &self.doors.dir;
        if let Err(e) = std::fs::remove_dir_all(dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(dir = %dir.display(), error = %e, "egress directory left behind");
            }
        }
    }
}

/// How a container's background process gets a proxy of its own: the container's socket
/// directory (already mounted in it), its policy and the audit publisher.
#[derive(Clone)]
pub struct ProcessDoors {
    dir: PathBuf,
    policy: NetworkPolicy,
    auditor: Auditor,
}

impl ProcessDoors {
    /// Binds the proxy of process `proc_id`, its decisions audited under `scope` with the
    /// process's id as the execution id.
    pub fn bind(
        &self,
        proc_id: &str,
        scope: AuditScope,
    ) -> Result<ProcessEgress, EgressSetupError> {
        let scope = AuditScope {
            execution_id: Some(proc_id.to_string()),
            ..scope
        };
        let auditor = self.auditor.clone();
        // Short and unique: the container's socket directory is shared with its other
        // processes, and a socket's name is at most 108 bytes.
        let name = format!("p-{}.sock", messages::new_id().to_ascii_lowercase());
        let proxy = EgressProxy::builder(self.policy.clone())
            .observer(move |event| auditor.emit(&scope, event.clone()))
            .bind(self.dir.join(&name))?;
        open_to_the_sandbox(&proxy)?;
        Ok(ProcessEgress {
            _proxy: proxy,
            name,
        })
    }
}

/// One background process's egress proxy; its socket goes when it is dropped (with the
/// process's end).
pub struct ProcessEgress {
    /// Held for the process's life: dropping it closes the socket.
    _proxy: EgressProxy,
    name: String,
}

impl ProcessEgress {
    /// The socket's path inside the container.
    pub fn socket_in_container(&self) -> String {
        format!("{EGRESS_MOUNT}/{}", self.name)
    }
}
