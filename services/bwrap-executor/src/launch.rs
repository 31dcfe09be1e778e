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
//! Only the node's own image is used (never a template's), and the copy is the executor's
//! own file, made from a regular file only: a link in the tree could name any host file.

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
    let kind = std::fs::symlink_metadata(&from).map_err(err)?.file_type();
    if !kind.is_file() {
        let not_a_file = std::io::Error::other("not a regular file (a link or a directory)");
        return Err(err(not_a_file));
    }
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
    fn a_supervisor_that_is_a_link_in_the_tree_is_refused() {
        let tree = tempfile::tempdir().unwrap();
        let state = tempfile::tempdir().unwrap();
        let at = tree.path().join(SUPERVISOR_PATH.trim_start_matches('/'));
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", &at).unwrap();
        let rootfs = Rootfs {
            id: "abc".into(),
            path: tree.path().to_path_buf(),
        };
        let e = install(&rootfs, state.path()).unwrap_err();
        assert!(format!("{:?}", e).contains("not a regular file"), "{e:?}");
        assert!(!state.path().join("bin/sandmesh-supervisor.abc").exists());

        std::fs::remove_file(&at).unwrap();
        std::fs::write(&at, b"#!/bin/sh\n").unwrap();
        let copy = install(&rootfs, state.path()).unwrap();
        assert_eq!(std::fs::read(copy).unwrap(), b"#!/bin/sh\n");
    }

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
