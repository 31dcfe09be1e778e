//! Preview ports, the host's half: every container gets a [`PortDoor`], a Unix socket the
//! host binds in a directory of that container alone, bind-mounted read-only at
//! [`PORTS_MOUNT`] into it. The container's resident supervisor keeps a connection to it
//! waiting (`sandmesh-supervisor`'s `ports` module); to open a tunnel the host writes the port
//! on the newest waiting connection and reads whether the supervisor reached it on the
//! container's loopback. The host only accepts on a socket it bound: it never connects to a
//! path the sandbox could replace, and the directory is read-only inside, so the socket cannot
//! be swapped for another.
//!
//! A door belongs to its container's [`crate::lease::ContainerLease`]: when the container goes,
//! the door's token is cancelled, which ends its accept loop and every tunnel through it.
//! [`Doors`] finds a session's door by session id (weakly: it never keeps one alive).

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use sandbox_protocol::{PORTS_MOUNT, PORTS_SOCKET, PORT_CONNECTED, PORT_REFUSED};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Connections from inside kept waiting at most; the oldest goes first (a supervisor that
/// restarted left dead ones behind, and code of the sandbox may connect too).
const MAX_WAITING: usize = 4;
/// How long a tunnel waits for the supervisor to have a connection waiting.
const WAIT_FOR_SUPERVISOR: Duration = Duration::from_secs(5);
/// How long the supervisor may take to say whether it reached the port.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);
/// Waiting connections tried per tunnel before giving up (dead ones are skipped).
const TRIES: usize = MAX_WAITING + 2;

#[derive(Debug, thiserror::Error)]
pub enum PortsError {
    #[error("cannot prepare the ports directory {}", path.display())]
    Directory {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the session's supervisor is not taking tunnels (no connection to its ports socket \
         within {WAIT_FOR_SUPERVISOR:?})"
    )]
    NoSupervisor,
    #[error("nothing listens on port {port} in the session's container")]
    Refused { port: u16 },
    #[error("the session's supervisor did not answer for port {port}")]
    NoAnswer { port: u16 },
    #[error("the session's container is gone")]
    Gone,
}

/// What every container's door on this node shares: the directory they live under
/// (`SANDMESH_EXEC_PORTS_DIR`) and the doors of the sessions.
#[derive(Clone)]
pub struct PortsHost {
    base: PathBuf,
    doors: Doors,
}

impl PortsHost {
    pub fn new(base: PathBuf) -> Self {
        Self {
            base,
            doors: Doors::default(),
        }
    }

    pub fn doors(&self) -> &Doors {
        &self.doors
    }

    /// Binds a door for one container, in a directory named by a fresh id.
    pub fn bind(&self) -> Result<PortDoor, PortsError> {
        let directory = |path: &Path, source| PortsError::Directory {
            path: path.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(&self.base).map_err(|e| directory(&self.base, e))?;
        // Root's alone: other host users cannot reach any container's socket.
        set_mode(&self.base, 0o711).map_err(|e| directory(&self.base, e))?;
        let dir = self.base.join(messages::new_id().to_ascii_lowercase());
        std::fs::create_dir(&dir).map_err(|e| directory(&dir, e))?;
        let door = PortDoor {
            dir,
            shared: Arc::new(Waiting::default()),
            gone: CancellationToken::new(),
            tunnels: Arc::new(AtomicUsize::new(0)),
        };
        set_mode(&door.dir, 0o755).map_err(|e| directory(&door.dir, e))?;
        let socket = door.dir.join(PORTS_SOCKET);
        let listener = UnixListener::bind(&socket).map_err(|e| directory(&socket, e))?;
        // The sandbox user (not root) connects: a socket needs write permission to connect.
        set_mode(&socket, 0o666).map_err(|e| directory(&socket, e))?;
        tokio::spawn(accept(listener, door.shared.clone(), door.gone.clone()));
        Ok(door)
    }
}

fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// Connections from the supervisor, newest last.
#[derive(Default)]
struct Waiting {
    conns: Mutex<VecDeque<UnixStream>>,
    arrived: Notify,
}

impl Waiting {
    fn push(&self, conn: UnixStream) {
        let mut conns = self.conns.lock().unwrap_or_else(PoisonError::into_inner);
        conns.push_back(conn);
        while conns.len() > MAX_WAITING {
            conns.pop_front();
        }
        drop(conns);
        self.arrived.notify_one();
    }

    /// The newest waiting connection, waiting for one up to [`WAIT_FOR_SUPERVISOR`].
    async fn take(&self) -> Option<UnixStream> {
        let deadline = tokio::time::Instant::now() + WAIT_FOR_SUPERVISOR;
        loop {
            let arrived = self.arrived.notified();
            if let Some(conn) = self
                .conns
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop_back()
            {
                return Some(conn);
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                return None;
            }
        }
    }
}

async fn accept(listener: UnixListener, waiting: Arc<Waiting>, gone: CancellationToken) {
    loop {
        tokio::select! {
            _ = gone.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((conn, _)) => waiting.push(conn),
                // Out of descriptors, say: a pause rather than a spin.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            },
        }
    }
}

/// One container's ports socket and what goes through it; removed when dropped.
pub struct PortDoor {
    dir: PathBuf,
    shared: Arc<Waiting>,
    /// Cancelled when the door goes: the accept loop and every tunnel through it end.
    gone: CancellationToken,
    /// Tunnels open through it now: a session with an open tunnel is in use, not idle.
    tunnels: Arc<AtomicUsize>,
}

impl PortDoor {
    /// The Docker bind of the door's directory (read-only: the sandbox can connect to the
    /// socket, never replace it).
    pub fn bind_spec(&self) -> String {
        format!("{}:{PORTS_MOUNT}:ro", self.dir.display())
    }

    /// The socket's path on the host.
    pub fn host_socket(&self) -> PathBuf {
        self.dir.join(PORTS_SOCKET)
    }

    pub fn open_tunnels(&self) -> usize {
        self.tunnels.load(Ordering::Relaxed)
    }

    /// A stream to `port` on the container's loopback, through the supervisor.
    pub async fn dial(&self, port: u16) -> Result<UnixStream, PortsError> {
        for _ in 0..TRIES {
            let mut conn = tokio::select! {
                _ = self.gone.cancelled() => return Err(PortsError::Gone),
                conn = self.shared.take() => conn.ok_or(PortsError::NoSupervisor)?,
            };
            if conn.write_all(&port.to_be_bytes()).await.is_err() {
                continue; // its supervisor is gone; a newer one may be waiting
            }
            let mut status = [0u8; 1];
            match tokio::time::timeout(ANSWER_WITHIN, conn.read_exact(&mut status)).await {
                Ok(Ok(_)) if status[0] == PORT_CONNECTED => return Ok(conn),
                Ok(Ok(_)) if status[0] == PORT_REFUSED => return Err(PortsError::Refused { port }),
                Ok(Ok(_)) | Ok(Err(_)) => continue,
                Err(_) => return Err(PortsError::NoAnswer { port }),
            }
        }
        Err(PortsError::NoSupervisor)
    }

    /// A token cancelled when the door goes, and a guard counting the tunnel as open.
    pub fn tunnel_guard(&self) -> (CancellationToken, TunnelGuard) {
        self.tunnels.fetch_add(1, Ordering::Relaxed);
        (self.gone.child_token(), TunnelGuard(self.tunnels.clone()))
    }
}

/// Counts an open tunnel until dropped.
pub struct TunnelGuard(Arc<AtomicUsize>);

impl Drop for TunnelGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Drop for PortDoor {
    fn drop(&mut self) {
        self.gone.cancel();
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(dir = %self.dir.display(), error = %e, "ports directory left behind");
            }
        }
    }
}

/// The doors of this node's session containers, by (scoped) session id.
#[derive(Clone, Default)]
pub struct Doors(Arc<Mutex<HashMap<String, Weak<PortDoor>>>>);

impl Doors {
    /// `session`'s container is now the one behind `door`.
    pub fn register(&self, session: &str, door: &Arc<PortDoor>) {
        let mut doors = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        doors.retain(|_, d| d.strong_count() > 0);
        doors.insert(session.to_string(), Arc::downgrade(door));
    }

    pub fn forget(&self, session: &str) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(session);
    }

    pub fn get(&self, session: &str) -> Option<Arc<PortDoor>> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(session)
            .and_then(Weak::upgrade)
    }
}
