//! One execution in a fresh bubblewrap sandbox: its cgroup created with its limits, then
//!
//! ```text
//! sandmesh-supervisor launch   (the image's supervisor, copied to the host: joins the cgroup,
//!  │                            rlimits, opens the seccomp filters as fds 3 and 4, drops to the
//!  │                            sandbox's own host uid when the executor is root, clears every
//!  │                            capability)
//!  └─ exec bwrap --unshare-all --unshare-user --disable-userns --die-with-parent ...
//!      └─ sandmesh-supervisor run   (pid 2 of the new pid namespace, uid 10001 inside, mapped
//!                                    to that host uid)
//! ```
//!
//! and the same frame exchange as in a Docker exec over the sandbox's stdin and stdout
//! ([`FrameCollector`]). The sandbox ends with its supervisor; on the outer deadline, a flood
//! or garbage the executor kills the bwrap process, and with it the pid namespace (its init
//! dies, so the kernel kills every process in it, daemonised orphans included). Whatever
//! happened, the cgroup is then emptied and removed by its [`CgroupLease`], and only then does
//! the sandbox's host uid go back to the node's pool: no process of it is left to share that
//! uid's kernel budgets with the next sandbox.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use executor_node::exchange::{Ending, Exchange, FrameCollector, OutputStreamer};
use executor_node::{NodeState, UidError, UidLease, UidPool, SUPERVISOR_PATH, WORKSPACE_DIR};
use messages::filesystem::{FilesystemPolicy, Mount};
use sandbox_protocol::RunSpec;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::cgroup::{CgroupError, Cgroups, Counters, Limits, SandboxCgroup};
use crate::seccomp::Filters;

/// How long to keep reading bwrap's own error output after the sandbox ended without a report.
const STDERR_GRACE: Duration = Duration::from_millis(200);

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error("no host uid for the sandbox")]
    Uid(#[from] UidError),
    #[error("starting {program}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
}

/// Everything that starts sandboxes on this node. Cheap to share.
pub struct Launcher {
    pub bwrap: PathBuf,
    /// `sandmesh-supervisor` on the host, run as `launch` in front of bwrap (one exec where a
    /// shell wrapper and `setpriv` took two): see [`crate::launch`].
    pub supervisor: PathBuf,
    pub filters: Filters,
    pub cgroups: Cgroups,
    /// Set when the executor runs as root: each sandbox drops to a host uid of its own from
    /// this pool before bwrap, so nothing in it is root on the host, not even through the user
    /// namespace's mapping, and no per-user kernel budget is shared with another sandbox.
    /// (Without root, every sandbox runs as the executor's own uid: it cannot change it.)
    pub host_uids: Option<Arc<UidPool>>,
    /// The uid (and gid) inside the sandbox.
    pub uid: u32,
    pub tmp_mb: u64,
    pub workspace_mb: u64,
    pub nofile: u64,
}

/// One sandbox's input.
pub struct SandboxInput<'a> {
    /// The cgroup's name: unique among this node's sandboxes, past and present.
    pub name: &'a str,
    pub spec: &'a RunSpec,
    /// The image tree mounted as `/` (the caller holds it until the sandbox ended).
    pub rootfs: &'a Path,
    /// The frames for the supervisor's stdin.
    pub wire: Vec<u8>,
    pub limits: Limits,
    pub deadline: Instant,
    pub streamer: Option<&'a mut OutputStreamer>,
    /// The run's filesystem policy, mounted over the usual layout.
    pub filesystem: Option<&'a FilesystemPolicy>,
}

/// What a sandbox left: the exchange with its supervisor and what its cgroup counted.
pub struct Finished {
    pub exchange: Exchange,
    pub counters: Counters,
}

/// A sandbox's cgroup while the node holds it: owned by name (the janitor leaves it alone)
/// from before it exists until it is gone; dropping the lease kills what is left in it and
/// removes it, on the node's task tracker so shutdown waits for that. It also holds the
/// sandbox's host uid, given back once the cgroup (so every process of the sandbox) is gone.
pub struct CgroupLease {
    pub cgroup: SandboxCgroup,
    name: String,
    node: Arc<NodeState>,
    uid: Option<UidLease>,
}

impl CgroupLease {
    pub fn create(
        cgroups: &Cgroups,
        node: &Arc<NodeState>,
        name: &str,
        limits: Limits,
        uid: Option<UidLease>,
    ) -> Result<Self, CgroupError> {
        node.own(name);
        match cgroups.create(name, limits) {
            Ok(cgroup) => Ok(Self {
                cgroup,
                name: name.to_string(),
                node: node.clone(),
                uid,
            }),
            Err(e) => {
                node.disown(name);
                Err(e)
            }
        }
    }
}

impl Drop for CgroupLease {
    fn drop(&mut self) {
        let cgroup = self.cgroup.clone();
        let name = std::mem::take(&mut self.name);
        let node = self.node.clone();
        let uid = self.uid.take();
        self.node.tasks.spawn_blocking(move || {
            if cgroup.remove() {
                drop(uid);
            } else {
                tracing::warn!(
                    name,
                    "a sandbox cgroup could not be removed; the janitor retries, and its \
                     host uid stays out of use while this node runs"
                );
                // Something of the sandbox may still run as that uid: never hand it out again.
                std::mem::forget(uid);
            }
            node.disown(&name);
        });
    }
}

impl Launcher {
    /// The bwrap arguments of one sandbox (after the program name).
    pub fn bwrap_args(&self, rootfs: &Path, filesystem: Option<&FilesystemPolicy>) -> Vec<String> {
        let uid = self.uid.to_string();
        let mut args: Vec<String> = [
            // Every namespace: user, pid, net (loopback only), ipc, uts, mount, cgroup.
            "--unshare-all",
            "--unshare-user",
            // Code inside cannot make user namespaces of its own (nor any other, by seccomp).
            "--disable-userns",
            "--die-with-parent",
            // A new session: no terminal to push input into (TIOCSTI).
            "--new-session",
            "--uid",
            &uid,
            "--gid",
            &uid,
            "--hostname",
            "sandbox",
            "--ro-bind",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.push(rootfs.display().to_string());
        args.push("/".into());
        let tmp = (self.tmp_mb << 20).to_string();
        let ws = (self.workspace_mb << 20).to_string();
        for a in [
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--size",
            &tmp,
            "--tmpfs",
            "/tmp",
            "--size",
            &ws,
            "--tmpfs",
            WORKSPACE_DIR,
        ] {
            args.push(a.to_string());
        }
        // In order, parents first: a read-only directory inside a writable one goes on top.
        for (path, mount) in filesystem.map(FilesystemPolicy::mounts).unwrap_or_default() {
            let size = match mount {
                Mount::Writable => tmp.clone(),
                Mount::EmptyReadOnly => "4096".to_string(),
            };
            args.extend(["--size".into(), size, "--tmpfs".into(), path.clone()]);
            if mount == Mount::EmptyReadOnly {
                args.extend(["--remount-ro".into(), path]);
            }
        }
        for a in [
            "--chdir",
            WORKSPACE_DIR,
            "--add-seccomp-fd",
            "3",
            "--add-seccomp-fd",
            "4",
            SUPERVISOR_PATH,
            "run",
        ] {
            args.push(a.to_string());
        }
        args
    }

    fn command(
        &self,
        rootfs: &Path,
        lease: &CgroupLease,
        filesystem: Option<&FilesystemPolicy>,
    ) -> tokio::process::Command {
        let mut cmd = crate::launch::command(
            &self.supervisor,
            &lease.cgroup.procs_files(),
            Some(self.nofile),
            lease.uid.as_ref().map(UidLease::uid),
            &[&self.filters.deny, &self.filters.nosys],
        );
        cmd.arg(&self.bwrap)
            .args(self.bwrap_args(rootfs, filesystem))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd
    }

    /// Runs one sandbox to its end.
    pub async fn run(
        &self,
        node: &Arc<NodeState>,
        input: SandboxInput<'_>,
    ) -> Result<Finished, SandboxError> {
        let uid = self.host_uids.as_ref().map(UidPool::take).transpose()?;
        let lease = CgroupLease::create(&self.cgroups, node, input.name, input.limits, uid)?;
        let mut child = self
            .command(input.rootfs, &lease, input.filesystem)
            .spawn()
            .map_err(|source| SandboxError::Spawn {
                program: self.supervisor.display().to_string(),
                source,
            })?;
        let (Some(mut stdin), Some(mut stdout), Some(mut stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            unreachable!("all three pipes were requested");
        };
        let wire = input.wire;
        // Written from its own task so a supervisor that does not read never blocks us.
        let writer = tokio::spawn(async move {
            let _ = stdin.write_all(&wire).await;
            let _ = stdin.shutdown().await;
        });
        let mut collector = FrameCollector::new(input.spec, input.streamer);
        let deadline = tokio::time::Instant::from_std(input.deadline);
        let mut out = vec![0u8; 64 * 1024];
        let mut err = vec![0u8; 16 * 1024];
        let mut err_open = true;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => {
                    collector.stop(Ending::Deadline);
                    break;
                }
                read = stdout.read(&mut out) => match read {
                    Ok(0) => break,
                    Err(e) => {
                        collector.stop(Ending::StreamFailed(e.to_string()));
                        break;
                    }
                    Ok(n) => {
                        if collector.push(&out[..n]).await {
                            break;
                        }
                    }
                },
                read = stderr.read(&mut err), if err_open => match read {
                    Ok(0) | Err(_) => err_open = false,
                    Ok(n) => collector.log(&err[..n]),
                },
            }
        }
        writer.abort();
        // Whatever is still running belongs to this execution: bwrap's death takes the pid
        // namespace with it.
        let _ = child.start_kill();
        if *collector.ending() == Ending::Closed {
            // bwrap's own complaints (a missing mount point, a refused namespace) say why.
            let until = tokio::time::Instant::now() + STDERR_GRACE;
            while err_open {
                match tokio::time::timeout_at(until, stderr.read(&mut err)).await {
                    Ok(Ok(n)) if n > 0 => collector.log(&err[..n]),
                    _ => err_open = false,
                }
            }
            if let Ok(status) = child.wait().await {
                collector.note(&format!(" (sandbox {status})"));
            }
        } else {
            let _ = child.wait().await;
        }
        let counters = lease.cgroup.counters();
        drop(lease);
        Ok(Finished {
            exchange: collector.finish().await,
            counters,
        })
    }
}
