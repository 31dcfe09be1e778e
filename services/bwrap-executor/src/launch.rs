//! What runs between the executor and `bwrap`: `sandmesh-supervisor launch`, the node image's
//! own supervisor copied to the host at start. It joins the sandbox's cgroup before anything of
//! the sandbox exists, sets the rlimits, opens the seccomp filters as fds 3 and 4, drops to the
//! sandbox uid (when the executor is root) and clears every capability set, then execs bwrap —
//! one exec per sandbox where an `sh` wrapper and `setpriv` took two (about 2.5 ms of CPU of
//! the 29 ms a `print(1)` cost, measured with `perf`). The executor cannot do it in the
//! forked child itself without `unsafe` (`pre_exec`), which the workspace forbids.
//!
//! Why that binary: it is already on the host (in the exported tree), it is this version's
//! (the sandbox protocol already ties image and executor), and it is small and starts fast.
//! The copy is the executor's own file, not the tree's, so nothing a tree holds is ever run
//! as root.

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use executor_node::SUPERVISOR_PATH;

use crate::rootfs::Rootfs;

/// The variables bwrap starts with: only `PATH`, for the launcher to find bwrap.
const PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";

#[derive(Debug, thiserror::Error)]
#[error("copying the sandbox image's supervisor {from} to {to}")]
pub struct InstallError {
    from: PathBuf,
    to: PathBuf,
    #[source]
    source: std::io::Error,
}

/// Copies the supervisor out of `tree` (the node image's) into `<state_dir>/bin`, executable
/// and owned by this process; returns its path.
pub fn install(tree: &Rootfs, state_dir: &Path) -> Result<PathBuf, InstallError> {
    let from = tree.path.join(SUPERVISOR_PATH.trim_start_matches('/'));
    let dir = state_dir.join("bin");
    let to = dir.join(format!("sandmesh-supervisor.{}", tree.id));
    // Under a name of its own first: another executor of this host (or of this process, in
    // tests) may be running the copy of the same image, and a half-written file must never
    // be run.
    let tmp = dir.join(format!(".sandmesh-supervisor.{}", messages::new_id()));
    let err = |source| InstallError {
        from: from.clone(),
        to: to.clone(),
        source,
    };
    std::fs::create_dir_all(&dir).map_err(err)?;
    std::fs::copy(&from, &tmp).map_err(err)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).map_err(err)?;
    std::fs::rename(&tmp, &to).map_err(err)?;
    Ok(to)
}

/// `supervisor launch ... --` for one sandbox; the caller appends bwrap and its arguments.
/// The environment is `PATH` alone: nothing of the executor's reaches the sandbox.
pub fn command(
    supervisor: &Path,
    cgroup_procs: &[PathBuf],
    nofile: Option<u64>,
    drop_to: Option<u32>,
    seccomp: &[&Path],
) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(supervisor);
    cmd.arg("launch");
    for file in cgroup_procs {
        cmd.arg("--cgroup-procs").arg(file);
    }
    if let Some(n) = nofile {
        cmd.arg("--nofile").arg(n.to_string());
    }
    if let Some(uid) = drop_to {
        cmd.arg("--uid").arg(uid.to_string());
    }
    for filter in seccomp {
        cmd.arg("--seccomp").arg(filter);
    }
    cmd.arg(OsStr::new("--"));
    cmd.env_clear().env("PATH", PATH);
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_names_every_cgroup_and_filter_in_order_and_passes_only_path() {
        let cmd = command(
            Path::new("/s/sup"),
            &[
                "/c/memory/x/cgroup.procs".into(),
                "/c/pids/x/cgroup.procs".into(),
            ],
            Some(1024),
            Some(10001),
            &[Path::new("/f/deny"), Path::new("/f/nosys")],
        );
        let cmd = cmd.as_std();
        let args: Vec<_> = cmd.get_args().map(|a| a.to_str().unwrap()).collect();
        assert_eq!(
            args,
            [
                "launch",
                "--cgroup-procs",
                "/c/memory/x/cgroup.procs",
                "--cgroup-procs",
                "/c/pids/x/cgroup.procs",
                "--nofile",
                "1024",
                "--uid",
                "10001",
                "--seccomp",
                "/f/deny",
                "--seccomp",
                "/f/nosys",
                "--"
            ]
        );
        let env: Vec<_> = cmd.get_envs().collect();
        assert_eq!(env, [(OsStr::new("PATH"), Some(OsStr::new(PATH)))]);
    }
}
