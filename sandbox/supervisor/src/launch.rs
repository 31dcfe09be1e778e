//! `sandmesh-supervisor launch`: the host side of a bubblewrap sandbox's start. The
//! bwrap-executor runs this binary (copied out of its sandbox image) between itself and
//! `bwrap`, in place of an `sh` wrapper and `setpriv`: one exec instead of two per sandbox.
//!
//! ```text
//! sandmesh-supervisor launch [--cgroup-procs FILE]... [--nofile N] [--uid UID]
//!                            [--seccomp FILE]... -- PROGRAM ARGS...
//! ```
//!
//! In this order, before anything of the sandbox exists:
//! 0. closes every descriptor but stdin, stdout and stderr: whatever started the executor
//!    may have left pipes or sockets open without close-on-exec, the executor inherits them,
//!    and bwrap would pass them on into every sandbox;
//! 1. writes its pid into every `cgroup.procs` file, so every later fork is counted there;
//! 2. sets the rlimits `core` = 0 and `nofile` = N (soft and hard), inherited by the sandbox;
//! 3. opens the seccomp filters as fds 3, 4, ... (in the order given; the caller's bwrap
//!    arguments name them), left open across the exec;
//! 4. with `--uid`, drops to that uid and gid with no supplementary group (when the executor is
//!    root: nothing in a sandbox may be root on the host);
//! 5. clears every capability set, the inheritable one included (`setuid` leaves it), and
//!    checks that none is left;
//! 6. execs PROGRAM with its own environment (the executor passes `PATH` only).
//!
//! Any failure ends it with [`LAUNCH_FAILED`] and a message on stderr, before PROGRAM runs.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::ExitCode;

use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use nix::sys::resource::{setrlimit, Resource};
use nix::unistd::{setgroups, setresgid, setresuid, Gid, Uid};
use rustix::thread::{capabilities, set_capabilities, CapabilitySet, CapabilitySets};
use sandbox_protocol::LAUNCH_FAILED;

/// The first fd a seccomp filter gets: after stdin, stdout and stderr.
const FIRST_FILTER_FD: i32 = 3;

/// What to do, from the command line.
#[derive(Debug, PartialEq)]
pub struct Launch {
    pub cgroup_procs: Vec<PathBuf>,
    pub nofile: Option<u64>,
    pub uid: Option<u32>,
    pub seccomp: Vec<PathBuf>,
    pub program: Vec<OsString>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum UsageError {
    #[error("{0} needs a value")]
    MissingValue(String),
    #[error("{flag} wants a number, not {value:?}")]
    NotANumber { flag: &'static str, value: String },
    #[error("unknown flag {0:?}")]
    UnknownFlag(String),
    #[error("no program after --")]
    NoProgram,
}

/// Why the launch stopped before the program.
#[derive(Debug, thiserror::Error)]
enum LaunchError {
    #[error("listing the open descriptors")]
    Descriptors(#[source] std::io::Error),
    #[error("joining the cgroup ({0})")]
    Cgroup(PathBuf, #[source] std::io::Error),
    #[error("setting rlimit {0}")]
    Rlimit(&'static str, #[source] nix::Error),
    #[error("opening the seccomp filter {0}")]
    Filter(PathBuf, #[source] std::io::Error),
    #[error("the seccomp filter {path} opened as fd {got}, not {want}: fds were left open")]
    FilterFd { path: PathBuf, got: i32, want: i32 },
    #[error("keeping the seccomp filter fd {0} open across exec")]
    Inherit(i32, #[source] nix::Error),
    #[error("dropping to uid {0}")]
    Drop(u32, #[source] nix::Error),
    #[error("clearing the capabilities")]
    Capabilities(#[source] std::io::Error),
    #[error("capabilities left after clearing them: {0:?}")]
    CapabilitiesLeft(CapabilitySets),
}

fn number<T: std::str::FromStr>(flag: &'static str, value: OsString) -> Result<T, UsageError> {
    let value = value.to_string_lossy().into_owned();
    value
        .parse()
        .map_err(|_| UsageError::NotANumber { flag, value })
}

impl Launch {
    /// Parses the arguments after `launch`.
    pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Self, UsageError> {
        let mut launch = Launch {
            cgroup_procs: Vec::new(),
            nofile: None,
            uid: None,
            seccomp: Vec::new(),
            program: Vec::new(),
        };
        let mut args = args.into_iter();
        while let Some(flag) = args.next() {
            if flag == "--" {
                launch.program = args.collect();
                break;
            }
            let mut value = || {
                args.next()
                    .ok_or_else(|| UsageError::MissingValue(flag.to_string_lossy().into_owned()))
            };
            match flag.to_str() {
                Some("--cgroup-procs") => launch.cgroup_procs.push(value()?.into()),
                Some("--seccomp") => launch.seccomp.push(value()?.into()),
                Some("--nofile") => launch.nofile = Some(number("--nofile", value()?)?),
                Some("--uid") => launch.uid = Some(number("--uid", value()?)?),
                _ => return Err(UsageError::UnknownFlag(flag.to_string_lossy().into_owned())),
            }
        }
        if launch.program.is_empty() {
            return Err(UsageError::NoProgram);
        }
        Ok(launch)
    }

    /// Steps 0-5; the filters' files must stay open until the exec.
    fn prepare(&self) -> Result<Vec<File>, LaunchError> {
        close_inherited()?;
        let pid = std::process::id().to_string();
        for path in &self.cgroup_procs {
            OpenOptions::new()
                .write(true)
                .open(path)
                .and_then(|mut f| f.write_all(pid.as_bytes()))
                .map_err(|e| LaunchError::Cgroup(path.clone(), e))?;
        }
        setrlimit(Resource::RLIMIT_CORE, 0, 0).map_err(|e| LaunchError::Rlimit("core", e))?;
        if let Some(n) = self.nofile {
            setrlimit(Resource::RLIMIT_NOFILE, n, n)
                .map_err(|e| LaunchError::Rlimit("nofile", e))?;
        }
        let mut filters = Vec::new();
        for (want, path) in (FIRST_FILTER_FD..).zip(&self.seccomp) {
            let file = File::open(path).map_err(|e| LaunchError::Filter(path.clone(), e))?;
            let got = file.as_raw_fd();
            if got != want {
                return Err(LaunchError::FilterFd {
                    path: path.clone(),
                    got,
                    want,
                });
            }
            fcntl(&file, FcntlArg::F_SETFD(FdFlag::empty()))
                .map_err(|e| LaunchError::Inherit(got, e))?;
            filters.push(file);
        }
        if let Some(uid) = self.uid {
            // Groups first: after the uid changes, there is no privilege left to change them.
            let (u, g) = (Uid::from_raw(uid), Gid::from_raw(uid));
            setgroups(&[])
                .and_then(|()| setresgid(g, g, g))
                .and_then(|()| setresuid(u, u, u))
                .map_err(|e| LaunchError::Drop(uid, e))?;
        }
        // `setuid` empties the permitted and effective sets but keeps the inheritable one;
        // lowering every set is allowed to anyone (and takes the ambient set with it).
        let none = CapabilitySets {
            effective: CapabilitySet::empty(),
            permitted: CapabilitySet::empty(),
            inheritable: CapabilitySet::empty(),
        };
        set_capabilities(None, none).map_err(|e| LaunchError::Capabilities(e.into()))?;
        let left = capabilities(None).map_err(|e| LaunchError::Capabilities(e.into()))?;
        if !(left.effective.is_empty() && left.permitted.is_empty() && left.inheritable.is_empty())
        {
            return Err(LaunchError::CapabilitiesLeft(left));
        }
        Ok(filters)
    }
}

/// Closes every descriptor above stderr. Collected first: the listing holds a descriptor of
/// its own (closed with it, so its close fails harmlessly).
fn close_inherited() -> Result<(), LaunchError> {
    let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .map_err(LaunchError::Descriptors)?
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .filter(|&fd| fd > 2)
        .collect();
    for fd in fds {
        let _ = nix::unistd::close(fd);
    }
    Ok(())
}

/// `sandmesh-supervisor launch ...`: returns only when the launch failed.
pub fn launch(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let launch = match Launch::parse(args) {
        Ok(launch) => launch,
        Err(e) => {
            eprintln!(
                "sandmesh-supervisor launch: {e}\nusage: sandmesh-supervisor launch \
                 [--cgroup-procs FILE]... [--nofile N] [--uid UID] [--seccomp FILE]... \
                 -- PROGRAM ARGS..."
            );
            return ExitCode::from(64);
        }
    };
    let _filters = match launch.prepare() {
        Ok(filters) => filters,
        Err(e) => {
            let mut message = e.to_string();
            let mut cause = std::error::Error::source(&e);
            while let Some(c) = cause {
                message = format!("{message}: {c}");
                cause = c.source();
            }
            eprintln!("sandmesh-supervisor launch: {message}");
            return ExitCode::from(LAUNCH_FAILED);
        }
    };
    let e = std::process::Command::new(&launch.program[0])
        .args(&launch.program[1..])
        .exec();
    eprintln!(
        "sandmesh-supervisor launch: starting {}: {e}",
        launch.program[0].to_string_lossy()
    );
    ExitCode::from(LAUNCH_FAILED)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &[&str]) -> Vec<OsString> {
        s.iter().map(OsString::from).collect()
    }

    #[test]
    fn flags_repeat_and_the_program_follows_the_double_dash() {
        let l = Launch::parse(args(&[
            "--cgroup-procs",
            "/a/cgroup.procs",
            "--cgroup-procs",
            "/b/cgroup.procs",
            "--nofile",
            "1024",
            "--uid",
            "10001",
            "--seccomp",
            "/s/deny",
            "--seccomp",
            "/s/nosys",
            "--",
            "bwrap",
            "--uid",
            "--",
        ]))
        .unwrap();
        assert_eq!(
            l,
            Launch {
                cgroup_procs: vec!["/a/cgroup.procs".into(), "/b/cgroup.procs".into()],
                nofile: Some(1024),
                uid: Some(10001),
                seccomp: vec!["/s/deny".into(), "/s/nosys".into()],
                program: args(&["bwrap", "--uid", "--"]),
            }
        );
    }

    #[test]
    fn bad_command_lines_say_what_is_wrong() {
        let cases: [(&[&str], UsageError); 4] = [
            (&["--uid"], UsageError::MissingValue("--uid".into())),
            (
                &["--nofile", "many", "--", "x"],
                UsageError::NotANumber {
                    flag: "--nofile",
                    value: "many".into(),
                },
            ),
            (
                &["--gid", "1", "--", "x"],
                UsageError::UnknownFlag("--gid".into()),
            ),
            (&["--nofile", "8", "--"], UsageError::NoProgram),
        ];
        for (line, want) in cases {
            assert_eq!(Launch::parse(args(line)), Err(want), "{line:?}");
        }
    }
}
