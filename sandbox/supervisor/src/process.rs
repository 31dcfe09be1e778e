//! Runs the program: its own process group, a clean environment, rlimits, output streamed as
//! frames under a byte cap, a wall-clock timeout — and at the end every process of the
//! execution killed, including daemonised orphans that left the group with `setsid`.
//!
//! "Every process" is found by scanning `/proc`: in the container's PID namespace the only
//! processes that may survive an execution are PID 1 (`sandmesh-supervisor keep`, the
//! container's init), the resident supervisor that started this run (its parent, when there
//! is one in the namespace), the resident's kernels (its other children, `kernel.rs`), the
//! session's background processes (each a proc host, `proc.rs`, and its descendants) and
//! this supervisor. A proc host is known by its parent being outside the namespace (seen as
//! 0): only the executor's `docker exec` starts such a process — code inside cannot. The kernels survive frozen: the sweep stops them before it looks for
//! anything else, so no thread of theirs runs, and nothing they could start escapes it, while
//! no cell of theirs runs. So nothing an execution starts outlives it, and the next execution
//! of a session starts in a quiet container.

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MFdFlags};
use nix::sys::resource::{getrusage, setrlimit, Resource, UsageWho};
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::{getpid, getppid, Pid};
use sandbox_protocol::{FrameKind, Outcome, RunReport, RunSpec};

use crate::FrameOut;

/// How long to wait for pipes to close after everything was killed (a process stuck in
/// uninterruptible sleep keeps them open; the executor's backstop covers that).
const DRAIN_GRACE: Duration = Duration::from_secs(2);
const READ_CHUNK: usize = 64 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stream {
    Stdout,
    Stderr,
}

enum Event {
    Output(Stream, Vec<u8>),
    Eof,
    Exited(io::Result<ExitStatus>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KillReason {
    Timeout,
    OutputLimit,
}

/// Counters of the container's cgroup that tell why something died. cgroup v1 (this host)
/// and v2 paths are both tried.
#[derive(Debug, Default, Clone, Copy)]
pub struct CgroupCounters {
    pub oom_kills: u64,
    pub pids_max_events: u64,
    pub cpu_ns: Option<u64>,
}

fn read_keyed(path: &str, key: &str) -> Option<u64> {
    let text = fs::read_to_string(path).ok()?;
    text.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        (it.next() == Some(key)).then(|| it.next()?.parse().ok())?
    })
}

impl CgroupCounters {
    pub fn read() -> Self {
        let oom_kills = read_keyed("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill")
            .or_else(|| read_keyed("/sys/fs/cgroup/memory.events", "oom_kill"))
            .unwrap_or(0);
        let pids_max_events = read_keyed("/sys/fs/cgroup/pids/pids.events", "max")
            .or_else(|| read_keyed("/sys/fs/cgroup/pids.events", "max"))
            .unwrap_or(0);
        let cpu_ns = fs::read_to_string("/sys/fs/cgroup/cpuacct/cpuacct.usage")
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .or_else(|| read_keyed("/sys/fs/cgroup/cpu.stat", "usage_usec").map(|us| us * 1000));
        Self {
            oom_kills,
            pids_max_events,
            cpu_ns,
        }
    }
}

/// `(pid, ppid, state)` of every process visible in `/proc`.
fn processes() -> Vec<(i32, i32, char)> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
            let rest = &stat[stat.rfind(')')? + 2..];
            let mut fields = rest.split_whitespace();
            let state = fields.next()?.chars().next()?;
            let ppid = fields.next()?.parse().ok()?;
            Some((pid, ppid, state))
        })
        .collect()
}

/// The processes a run leaves alive besides PID 1 and itself.
pub struct Spared {
    /// The resident supervisor that started this run (the parent; one started by a
    /// `docker exec` has its parent outside the namespace, seen as 0, and a run in a bwrap
    /// sandbox has bwrap, PID 1).
    resident: Option<i32>,
    /// The resident's other children: its kernels, which outlive runs (a run's own processes
    /// can never become the resident's children). Each leads its own process group.
    kernels: Vec<i32>,
}

impl Spared {
    /// Found now, before the run starts anything.
    pub fn find() -> Self {
        let parent = getppid().as_raw();
        let me = getpid().as_raw();
        let resident = (parent > 1).then_some(parent);
        let kernels = processes()
            .into_iter()
            .filter(|&(pid, ppid, _)| Some(ppid) == resident && pid != me)
            .map(|(pid, _, _)| pid)
            .collect();
        Self { resident, kernels }
    }

    fn contains(&self, pid: i32) -> bool {
        self.resident == Some(pid) || self.kernels.contains(&pid)
    }

    /// The session's background processes in `procs`: every proc host (a process whose
    /// parent is outside the namespace, other than PID 1, the resident and this supervisor)
    /// and its descendants. Found anew on each scan: the executor may start one during a run.
    fn background(&self, procs: &[(i32, i32, char)]) -> HashSet<i32> {
        let me = getpid().as_raw();
        let hosts = procs
            .iter()
            .filter(|&&(pid, ppid, _)| {
                ppid == 0 && pid != 1 && pid != me && Some(pid) != self.resident
            })
            .map(|&(pid, _, _)| pid);
        subtree(procs, hosts)
    }

    /// Stops every kernel's process group (SIGSTOP; a cell continues its own kernel). A
    /// frozen kernel's threads and timers do not run, print, read other processes or use CPU
    /// while no cell of theirs runs, and cannot start anything behind the sweep's back.
    pub fn freeze_kernels(&self) {
        for &kernel in &self.kernels {
            let _ = killpg(Pid::from_raw(kernel), Signal::SIGSTOP);
        }
    }
}

/// SIGKILLs the program's group, freezes the kernels, then SIGKILLs every other process except
/// PID 1, the `spared` ones and this supervisor, until a scan finds none alive. Returns how
/// many processes the scans killed.
pub fn kill_all(group: Option<i32>, spared: &Spared) -> u32 {
    if let Some(pgid) = group {
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
    // A run may have continued a kernel (same user: SIGCONT needs no privilege).
    spared.freeze_kernels();
    let me = getpid().as_raw();
    let mut victims = HashSet::new();
    // Bounded: SIGKILL cannot be blocked, so each round leaves fewer live processes; a fork
    // racing the scan is caught by the next round.
    for _ in 0..500 {
        let mut found = false;
        let procs = processes();
        let background = spared.background(&procs);
        for (pid, _, state) in procs {
            if pid == 1
                || pid == me
                || spared.contains(pid)
                || background.contains(&pid)
                || state == 'Z'
                || state == 'X'
            {
                continue;
            }
            if kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok() {
                found = true;
                victims.insert(pid);
            }
        }
        if !found {
            break;
        }
        thread::sleep(Duration::from_millis(1));
    }
    victims.len() as u32
}

/// `roots` and every descendant of theirs in `procs`.
fn subtree(procs: &[(i32, i32, char)], roots: impl Iterator<Item = i32>) -> HashSet<i32> {
    let mut tree: HashSet<i32> = roots.collect();
    // Parents may come after their children in a scan: repeat until nothing is added.
    loop {
        let before = tree.len();
        for &(pid, ppid, _) in procs {
            if tree.contains(&ppid) {
                tree.insert(pid);
            }
        }
        if tree.len() == before {
            return tree;
        }
    }
}

/// SIGKILLs every descendant of this process until a scan finds none alive (a proc host's
/// end: it is their subreaper, so its program's daemonised children are among them).
pub fn kill_descendants() {
    let me = getpid().as_raw();
    for _ in 0..500 {
        let procs = processes();
        let mine = subtree(&procs, std::iter::once(me));
        let mut found = false;
        for (pid, _, state) in procs {
            if pid == me || state == 'Z' || state == 'X' || !mine.contains(&pid) {
                continue;
            }
            if kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok() {
                found = true;
            }
        }
        if !found {
            return;
        }
        thread::sleep(Duration::from_millis(1));
    }
}

/// The program's rlimits, set on this (single-run) supervisor process so the program inherits
/// them; a resident supervisor starts a fresh process per run and never carries them.
fn set_limits(spec: &RunSpec) {
    let _ = setrlimit(Resource::RLIMIT_CORE, 0, 0);
    let _ = setrlimit(Resource::RLIMIT_NOFILE, spec.nofile, spec.nofile);
    let _ = setrlimit(Resource::RLIMIT_FSIZE, spec.fsize_bytes, spec.fsize_bytes);
}

fn reader(stream: Stream, mut pipe: impl Read + Send + 'static, tx: mpsc::Sender<Event>) {
    thread::spawn(move || {
        let mut buf = vec![0u8; READ_CHUNK];
        loop {
            match pipe.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx.send(Event::Output(stream, buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = tx.send(Event::Eof);
    });
}

/// Runs the program of `spec` to its end, streaming output frames to `out`.
pub fn run(spec: &RunSpec, out: &mut FrameOut, report: &mut RunReport) {
    let spared = Spared::find();
    let before = CgroupCounters::read();
    // Held open until the program has started: it inherits the descriptor.
    let code = match SealedCode::new(&spec.code) {
        Ok(code) => code,
        Err(e) => {
            report.outcome = Outcome::Failed {
                message: format!("cannot place the code: {e}"),
            };
            return;
        }
    };
    let argv = code.argv(&spec.argv, &spec.code_path);
    set_limits(spec);

    let Some((program, args)) = argv.split_first() else {
        report.outcome = Outcome::Failed {
            message: "empty argv".into(),
        };
        return;
    };
    // Every thread exists before the program does: a fork bomb may exhaust the pids limit
    // a moment after it starts, and a supervisor that cannot start a thread then could not
    // stop it either.
    let (tx, rx) = mpsc::channel();
    let pipes = io::pipe().and_then(|stdout| Ok((stdout, io::pipe()?)));
    let ((out_r, out_w), (err_r, err_w)) = match pipes {
        Ok(p) => p,
        Err(e) => {
            report.outcome = Outcome::Failed {
                message: format!("cannot create pipes: {e}"),
            };
            return;
        }
    };
    reader(Stream::Stdout, out_r, tx.clone());
    reader(Stream::Stderr, err_r, tx.clone());
    let (child_tx, child_rx) = mpsc::channel::<Child>();
    let exit_tx = tx.clone();
    thread::spawn(move || {
        if let Ok(mut child) = child_rx.recv() {
            let _ = exit_tx.send(Event::Exited(child.wait()));
        }
    });
    let (stdin_tx, stdin_rx) = mpsc::channel::<(ChildStdin, String)>();
    thread::spawn(move || {
        // A program that never reads its stdin must not block the supervisor: own thread.
        if let Ok((mut pipe, data)) = stdin_rx.recv() {
            let _ = pipe.write_all(data.as_bytes());
        }
    });
    drop(tx);

    let started = Instant::now();
    let spawned = {
        // The command (holding the pipes' write ends) is dropped right after the spawn, so
        // the readers see end-of-file once the program's side closes.
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env_clear()
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&spec.workspace)
            .process_group(0)
            .stdin(if spec.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(out_w)
            .stderr(err_w);
        cmd.spawn()
    };
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            report.outcome = Outcome::Failed {
                message: format!("cannot start {program}: {e}"),
            };
            return;
        }
    };
    let group = child.id() as i32;
    // Under the memory limit the kernel's OOM killer must pick the program, never the
    // supervisor (whose death loses the report: the run would end `killed`, not `oom`).
    // Raising a score needs no privilege, and the program's children inherit it.
    let _ = std::fs::write(format!("/proc/{group}/oom_score_adj"), "1000");
    if let (Some(pipe), Some(data)) = (child.stdin.take(), spec.stdin.clone()) {
        let _ = stdin_tx.send((pipe, data));
    }
    drop(stdin_tx);
    let _ = child_tx.send(child);
    drop(code);

    let deadline = started + Duration::from_millis(spec.timeout_ms);
    let mut budget = spec.max_output_bytes;
    let mut open_pipes = 2;
    let mut status: Option<io::Result<ExitStatus>> = None;
    let mut reason: Option<KillReason> = None;
    let mut drain_until: Option<Instant> = None;
    while open_pipes > 0 || status.is_none() {
        let until = drain_until.unwrap_or(deadline);
        let event = match rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
            Ok(ev) => ev,
            Err(mpsc::RecvTimeoutError::Timeout) if drain_until.is_none() => {
                reason = Some(KillReason::Timeout);
                report.processes_killed += kill_all(Some(group), &spared);
                drain_until = Some(Instant::now() + DRAIN_GRACE);
                continue;
            }
            // Drain grace over (or every sender gone): stop waiting.
            Err(_) => break,
        };
        match event {
            Event::Output(stream, data) => {
                if reason == Some(KillReason::OutputLimit) {
                    continue;
                }
                let kind = match stream {
                    Stream::Stdout => FrameKind::Stdout,
                    Stream::Stderr => FrameKind::Stderr,
                };
                let allowed = (data.len() as u64).min(budget) as usize;
                if allowed > 0 {
                    out.send(kind, &data[..allowed]);
                }
                budget -= allowed as u64;
                if allowed < data.len() {
                    match stream {
                        Stream::Stdout => report.stdout_truncated = true,
                        Stream::Stderr => report.stderr_truncated = true,
                    }
                    reason.get_or_insert(KillReason::OutputLimit);
                    report.processes_killed += kill_all(Some(group), &spared);
                    drain_until.get_or_insert(Instant::now() + DRAIN_GRACE);
                }
            }
            Event::Eof => open_pipes -= 1,
            Event::Exited(s) => {
                status = Some(s);
                report.wall_ms = started.elapsed().as_millis() as u64;
                // The program is done: whatever it left running (background jobs holding the
                // pipes open, daemons) ends with it.
                report.processes_killed += kill_all(Some(group), &spared);
                drain_until.get_or_insert(Instant::now() + DRAIN_GRACE);
            }
        }
    }
    if report.wall_ms == 0 {
        report.wall_ms = started.elapsed().as_millis() as u64;
    }
    // A last sweep: something may have been forked while the pipes drained.
    report.processes_killed += kill_all(Some(group), &spared);

    let after = CgroupCounters::read();
    report.oom_killed = after.oom_kills > before.oom_kills;
    report.pids_limit_hit = after.pids_max_events > before.pids_max_events;
    if let Ok(usage) = getrusage(UsageWho::RUSAGE_CHILDREN) {
        report.peak_memory_bytes = usage.max_rss().max(0) as u64 * 1024;
        let tv_ms = |tv: nix::sys::time::TimeVal| {
            (tv.tv_sec().max(0) as u64) * 1000 + (tv.tv_usec().max(0) as u64) / 1000
        };
        report.cpu_ms = tv_ms(usage.user_time()) + tv_ms(usage.system_time());
    }
    if let (Some(a), Some(b)) = (after.cpu_ns, before.cpu_ns) {
        // The cgroup also counts orphans that getrusage never sees.
        report.cpu_ms = report.cpu_ms.max(a.saturating_sub(b) / 1_000_000);
    }
    report.outcome = match (reason, status) {
        (Some(KillReason::Timeout), _) => Outcome::Timeout,
        (Some(KillReason::OutputLimit), _) => Outcome::OutputLimit,
        (None, Some(Ok(s))) => match (s.code(), s.signal()) {
            (Some(code), _) => Outcome::Exited { code },
            (None, Some(signal)) => Outcome::Signaled { signal },
            (None, None) => Outcome::Failed {
                message: format!("unknown exit status {s:?}"),
            },
        },
        (None, Some(Err(e))) => Outcome::Failed {
            message: format!("waiting for the program failed: {e}"),
        },
        (None, None) => Outcome::Failed {
            message: "the program did not end after its pipes closed".into(),
        },
    };
}

/// A run's code in a sealed memfd: the interpreter reads it through the descriptor it
/// inherits (`/proc/self/fd/N`), which nothing can rewrite, truncate or grow, not even the
/// program itself. A file would leave a window between its write and the interpreter's read
/// in which any process of the sandbox user could replace the code that was approved.
pub struct SealedCode(File);

impl SealedCode {
    pub fn new(code: &str) -> io::Result<Self> {
        // Without MFD_CLOEXEC: the program must inherit it.
        let fd = memfd_create(c"sandmesh-code", MFdFlags::MFD_ALLOW_SEALING)?;
        let mut file = File::from(fd);
        file.write_all(code.as_bytes())?;
        let seals = SealFlag::F_SEAL_WRITE
            | SealFlag::F_SEAL_SHRINK
            | SealFlag::F_SEAL_GROW
            | SealFlag::F_SEAL_SEAL;
        fcntl(&file, FcntlArg::F_ADD_SEALS(seals))?;
        Ok(Self(file))
    }

    /// The path the program opens the code by, valid in any process that inherited it.
    pub fn path(&self) -> String {
        format!("/proc/self/fd/{}", self.0.as_raw_fd())
    }

    /// `argv` with `placeholder` (the request's code path) replaced by [`Self::path`].
    pub fn argv(&self, argv: &[String], placeholder: &str) -> Vec<String> {
        argv.iter()
            .map(|arg| {
                if arg == placeholder {
                    self.path()
                } else {
                    arg.clone()
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subtree_holds_its_roots_and_every_descendant_in_any_scan_order() {
        // 10 → 11 → 12 (listed before its parent), 13 elsewhere, 14 a child of 13.
        let procs = [
            (12, 11, 'S'),
            (10, 0, 'S'),
            (13, 1, 'S'),
            (11, 10, 'S'),
            (14, 13, 'S'),
        ];
        let tree = subtree(&procs, [10].into_iter());
        assert_eq!(tree, HashSet::from([10, 11, 12]));
        assert!(subtree(&procs, std::iter::empty()).is_empty());
    }

    #[test]
    fn background_processes_are_the_hosts_outside_the_namespace_and_their_trees() {
        let me = getpid().as_raw();
        let spared = Spared {
            resident: Some(50),
            kernels: vec![51],
        };
        let procs = [
            (1, 0, 'S'),   // init: spared on its own account, never a host
            (50, 0, 'S'),  // the resident: not a host, so its runs are not spared
            (51, 50, 'S'), // a kernel
            (60, 0, 'S'),  // a proc host
            (61, 60, 'S'), // its program
            (62, 61, 'S'), // the program's child
            (70, 1, 'S'),  // a run's daemon, re-parented to init
            (me, 50, 'R'), // this run
        ];
        assert_eq!(spared.background(&procs), HashSet::from([60, 61, 62]));
    }
}
