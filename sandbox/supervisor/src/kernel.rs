//! The session's kernels: long-lived interpreters (the drivers of the `sandmesh-kernel` crate)
//! whose cells share variables, so `x = 41` in one run and `print(x + 1)` in the next
//! prints 42.
//!
//! Ownership follows lifetimes. The kernel must outlive a run, and every run process kills
//! everything it did not start, so the resident supervisor (`serve`) owns it: [`Kernel`]
//! starts it on the first kernel request, keeps it between runs, and restarts it (the next
//! result says `state_lost`) when it finds it dead. Each cell is still a run process of its
//! own — workspace placement, changed files, report, the final kill sweep (which spares the
//! kernel but not what a cell started) — that reaches the kernel through the pipes the
//! resident hands down ([`KernelConn`]) and drives one cell: its request, the kernel's
//! events as frames under the output cap, SIGINT at the timeout, SIGKILL when that is
//! ignored.
//!
//! Between cells a kernel does not run: each cell continues it (SIGCONT) and, at its `done`,
//! stops its process group (SIGSTOP) and waits until every thread is stopped. So threads and
//! timers a cell leaves behind run only during that session's later cells: they cannot
//! print into, read or rewrite another run, or use CPU, while no cell runs. What they printed
//! before the stop is read up to a fence line the run writes into the event pipe once the
//! kernel is stopped, and belongs to the cell that just ended. SIGSTOP and not the cgroup
//! freezer: the container's cgroup is not writable from inside. A run may continue the
//! kernel itself (same user), so every run's final sweep stops the kernels again
//! (`process::Spared::freeze_kernels`).
//!
//! The kernel runs untrusted code, so nothing it says is trusted: lines are bounded, unknown
//! events and MIME types dropped, artifact paths checked by the executor. The driver lives in
//! the interpreter it drives, so a cell can rewrite the driver and with it what the session's
//! later cells compute and return: a kernel session is one trust domain. Plain executions and
//! test runs never run inside a kernel.

use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use nix::sys::resource::{setrlimit, Resource};
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use sandbox_protocol::{
    CellError, FrameKind, KernelLanguage, Outcome, RunReport, RunSpec, INLINE_OUTPUT_MAX,
    OUTPUT_MIME_TYPES,
};
use sandmesh_kernel::{Event, JAVASCRIPT_DRIVER, KERNEL_FDS_VAR, PYTHON_DRIVER};

use crate::process::{self, CgroupCounters};
use crate::FrameOut;

/// How long an interrupted cell may take to stop before its kernel is killed.
const INTERRUPT_GRACE: Duration = Duration::from_secs(1);

/// Longest event line read from the kernel; longer ones are dropped unread. The driver's
/// largest (a 64 KiB read of output, JSON-escaped, or an inline output) fits well below it.
const MAX_EVENT_LINE: u64 = 1024 * 1024;

/// Most rich outputs one cell may return, and their most inline bytes: with the rest of the
/// report they must fit one frame.
const MAX_OUTPUTS: usize = 64;
const MAX_INLINE_TOTAL: u64 = 512 * 1024;

/// `sandmesh-supervisor kernel <language> <nofile> <fsize>`: sets the run limits on itself
/// and becomes the driver (exec, so the kernel's pid is the one the resident started).
pub fn exec_driver(language: KernelLanguage, nofile: u64, fsize: u64) -> io::Error {
    let _ = setrlimit(Resource::RLIMIT_CORE, 0, 0);
    let _ = setrlimit(Resource::RLIMIT_NOFILE, nofile, nofile);
    let _ = setrlimit(Resource::RLIMIT_FSIZE, fsize, fsize);
    match language {
        KernelLanguage::Python => Command::new("python3").args(["-c", PYTHON_DRIVER]).exec(),
        KernelLanguage::Javascript => match node_fds() {
            Ok(fds) => Command::new("node")
                .args(["-e", JAVASCRIPT_DRIVER])
                .env(KERNEL_FDS_VAR, fds)
                .exec(),
            Err(e) => e,
        },
    }
}

/// Node cannot re-point its own fds (the Python driver does that itself): the event pipe
/// moves from fd 1 to a new fd, fds 1 and 2 become pipes whose non-blocking read ends the
/// driver drains, so a child's output is captured too. Returns `events,stdout,stderr`; the
/// fds stay open across the exec.
fn node_fds() -> io::Result<String> {
    use nix::fcntl::OFlag;
    use std::os::fd::IntoRawFd;
    let events = nix::unistd::dup(io::stdout())?;
    let (out_r, out_w) = nix::unistd::pipe()?;
    let (err_r, err_w) = nix::unistd::pipe()?;
    nix::unistd::dup2_stdout(&out_w)?;
    nix::unistd::dup2_stderr(&err_w)?;
    for read_end in [&out_r, &err_r] {
        fcntl(read_end, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    }
    Ok(format!(
        "{},{},{}",
        events.into_raw_fd(),
        out_r.into_raw_fd(),
        err_r.into_raw_fd()
    ))
}

/// Whether the kernel a cell reaches kept the state of the cells before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelState {
    /// The session's first kernel.
    Fresh,
    /// The same kernel as the last cell's.
    Kept,
    /// Started anew: the previous kernel had died.
    Lost,
}

// === impl Kernel (resident side) ===

/// A running kernel, owned by the resident supervisor.
pub struct Kernel {
    child: Child,
    commands: ChildStdin,
    events: ChildStdout,
}

impl Kernel {
    /// Starts the driver in its own process group, with the environment, working directory
    /// and file limits of `spec` (the cell that needs it first).
    fn start(exe: &Path, language: KernelLanguage, spec: &RunSpec) -> io::Result<Self> {
        let mut env = spec.env.clone();
        if spec.egress_socket.is_some() {
            // The relay listens only while a run is in progress; the variables stay.
            let proxy = crate::relay::proxy_env(sandbox_protocol::EGRESS_PROXY_PORT);
            env.retain(|(name, _)| !proxy.iter().any(|(p, _)| p == name));
            env.extend(proxy);
        }
        let mut child = Command::new(exe)
            .args(["kernel", language.as_str()])
            .args([spec.nofile.to_string(), spec.fsize_bytes.to_string()])
            .env_clear()
            .envs(env)
            .current_dir(&spec.workspace)
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        // As for every run's program: the OOM killer takes the kernel, not a supervisor.
        let _ = std::fs::write(format!("/proc/{}/oom_score_adj", child.id()), "1000");
        let commands = child.stdin.take().expect("piped stdin");
        let events = child.stdout.take().expect("piped stdout");
        Ok(Self {
            child,
            commands,
            events,
        })
    }

    /// The kernel for the next cell: `kernel` if it lives, else a new one (its state lost).
    pub fn ensure(
        kernel: &mut Option<Kernel>,
        exe: &Path,
        language: KernelLanguage,
        spec: &RunSpec,
    ) -> io::Result<KernelState> {
        let state = match kernel.as_mut().map(|k| k.child.try_wait()) {
            Some(Ok(None)) => return Ok(KernelState::Kept),
            Some(_) => KernelState::Lost,
            None => KernelState::Fresh,
        };
        *kernel = None;
        *kernel = Some(Kernel::start(exe, language, spec)?);
        Ok(state)
    }

    /// The `run` argument naming this kernel: `pid:commands-fd:events-fd:state`.
    pub fn handle_arg(&self, state: KernelState) -> String {
        let state = match state {
            KernelState::Fresh => "fresh",
            KernelState::Kept => "kept",
            KernelState::Lost => "lost",
        };
        format!(
            "{}:{}:{}:{state}",
            self.child.id(),
            self.commands.as_raw_fd(),
            self.events.as_raw_fd()
        )
    }

    /// Lets the next spawned process inherit the kernel's pipes (`true`), or no process
    /// (`false`). The resident is single-threaded, so only the run it spawns in between
    /// inherits them.
    pub fn share_pipes(&self, share: bool) -> io::Result<()> {
        let flags = if share {
            FdFlag::empty()
        } else {
            FdFlag::FD_CLOEXEC
        };
        fcntl(&self.commands, FcntlArg::F_SETFD(flags))?;
        fcntl(&self.events, FcntlArg::F_SETFD(flags))?;
        Ok(())
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        let _ = killpg(Pid::from_raw(self.child.id() as i32), Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

// === impl KernelConn (run side) ===

/// A run's connection to the resident's kernel.
pub struct KernelConn {
    pid: i32,
    commands: File,
    events: File,
    state: KernelState,
}

impl KernelConn {
    /// Parses `pid:commands-fd:events-fd:state` and opens the inherited pipes anew through
    /// `/proc/self/fd` (a raw fd cannot become a `File` without `unsafe`), closing the
    /// inherited descriptors so nothing this run starts could hold them.
    pub fn open(arg: &str) -> Result<Self, String> {
        let parts: Vec<&str> = arg.split(':').collect();
        let [pid, commands, events, state] = parts.as_slice() else {
            return Err(format!("--kernel wants pid:fd:fd:state, not {arg:?}"));
        };
        let number = |s: &str| s.parse::<i32>().map_err(|e| format!("{s:?}: {e}"));
        let state = match *state {
            "fresh" => KernelState::Fresh,
            "kept" => KernelState::Kept,
            "lost" => KernelState::Lost,
            other => return Err(format!("unknown kernel state {other:?}")),
        };
        let reopen = |fd: RawFd, write: bool| -> Result<File, String> {
            let file = OpenOptions::new()
                .read(!write)
                .write(write)
                .open(format!("/proc/self/fd/{fd}"))
                .map_err(|e| format!("opening the kernel's fd {fd}: {e}"))?;
            let _ = nix::unistd::close(fd);
            Ok(file)
        };
        Ok(Self {
            pid: number(pid)?,
            commands: reopen(number(commands)?, true)?,
            events: reopen(number(events)?, false)?,
            state,
        })
    }
}

enum Pipe {
    Line(Vec<u8>),
    Eof,
}

/// Reads event lines on a thread of its own (the cell's timeout must not wait on a read);
/// a line longer than [`MAX_EVENT_LINE`] is skipped to its end.
fn reader(events: File, tx: mpsc::Sender<Pipe>) {
    thread::spawn(move || {
        let mut events = BufReader::with_capacity(64 * 1024, events);
        loop {
            let mut line = Vec::new();
            match (&mut events)
                .take(MAX_EVENT_LINE)
                .read_until(b'\n', &mut line)
            {
                Ok(0) | Err(_) => break,
                Ok(_) if line.last() != Some(&b'\n') && line.len() as u64 == MAX_EVENT_LINE => {
                    let mut skipped = Vec::new();
                    if !matches!(events.read_until(b'\n', &mut skipped), Ok(n) if n > 0) {
                        break;
                    }
                }
                Ok(_) => {
                    if tx.send(Pipe::Line(line)).is_err() {
                        return;
                    }
                }
            }
        }
        let _ = tx.send(Pipe::Eof);
    });
}

/// Why the cell was stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Timeout,
    OutputLimit,
}

/// Runs `spec.code` as one cell of the kernel behind `conn`, streaming its output as frames to
/// `out` and filling `report`.
pub fn run_cell(spec: &RunSpec, conn: KernelConn, out: &mut FrameOut, report: &mut RunReport) {
    report.state_lost = conn.state == KernelState::Lost;
    // The kernel is among them: it is the resident's child.
    let spared = process::Spared::find();
    let kernel = Pid::from_raw(conn.pid);
    let before = CgroupCounters::read();
    let started = Instant::now();
    // Unique per run, so a stale `done` (or one written ahead by an earlier cell's thread)
    // ends nothing.
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let id = format!("{}-{}", std::process::id(), since_epoch.as_nanos());
    let request = serde_json::json!({
        "id": id,
        "code": spec.code,
        "workspace": spec.workspace,
        "inline_max": INLINE_OUTPUT_MAX,
    });
    let mut line = serde_json::to_vec(&request).expect("a request serialises");
    line.push(b'\n');
    let (tx, rx) = mpsc::channel();
    let events_fd = conn.events.as_raw_fd();
    reader(conn.events, tx);
    // Frozen since its last cell (or a run) ended: it runs again for this cell only.
    let _ = killpg(kernel, Signal::SIGCONT);
    let mut commands = conn.commands;
    let mut died = commands.write_all(&line).is_err();
    // The cell is done and the kernel frozen: the fence is written, and what comes before it
    // is this cell's.
    let mut fenced = false;

    let mut budget = spec.max_output_bytes;
    let mut inline = 0u64;
    let mut stop: Option<Stop> = None;
    let mut until = started + Duration::from_millis(spec.timeout_ms);
    let mut interrupted = false;
    while !died {
        let event = match rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
            Ok(event) => event,
            // A fence that never came (it is written after a partial line, or the pipe is
            // full): the rest is dropped by the next cell as lines that are not events.
            Err(mpsc::RecvTimeoutError::Timeout) if fenced => break,
            Err(mpsc::RecvTimeoutError::Timeout) if !interrupted => {
                stop.get_or_insert(Stop::Timeout);
                interrupted = true;
                // KeyboardInterrupt in the cell: the kernel and its state live on.
                let _ = kill(kernel, Signal::SIGINT);
                until = Instant::now() + INTERRUPT_GRACE;
                continue;
            }
            Err(_) => {
                // The cell ignored the interrupt: the kernel goes, its state with it.
                let _ = killpg(kernel, Signal::SIGKILL);
                died = true;
                break;
            }
        };
        let line = match event {
            Pipe::Line(line) => line,
            Pipe::Eof => {
                died = true;
                break;
            }
        };
        // Lines that are not events (a partial line left by an earlier run) are dropped.
        let Ok(event) = serde_json::from_slice::<Event>(&line) else {
            continue;
        };
        match event {
            Event::Stream { name, text } => {
                let (kind, truncated) = match name.as_str() {
                    "stderr" => (FrameKind::Stderr, &mut report.stderr_truncated),
                    _ => (FrameKind::Stdout, &mut report.stdout_truncated),
                };
                let data = text.as_bytes();
                let allowed = (data.len() as u64).min(budget) as usize;
                // Cut on a character boundary so the streamed text stays valid UTF-8.
                let allowed = (0..=allowed)
                    .rev()
                    .find(|&i| text.is_char_boundary(i))
                    .unwrap_or(0);
                if allowed > 0 {
                    out.send(kind, &data[..allowed]);
                }
                budget -= allowed as u64;
                if allowed < data.len() {
                    *truncated = true;
                    if stop.is_none() {
                        stop = Some(Stop::OutputLimit);
                        interrupted = true;
                        let _ = kill(kernel, Signal::SIGINT);
                        until = Instant::now() + INTERRUPT_GRACE;
                    }
                }
            }
            Event::Output(output) => {
                let size = output.content.as_ref().map_or(0, |c| c.len()) as u64;
                let known = OUTPUT_MIME_TYPES.contains(&output.mime_type.as_str());
                let room = budget.min(MAX_INLINE_TOTAL.saturating_sub(inline));
                if known && report.outputs.len() < MAX_OUTPUTS && size <= room {
                    budget -= size;
                    inline += size;
                    report.outputs.push(output);
                } else if known {
                    report.warnings.push(format!(
                        "a {} output was dropped (output cap)",
                        output.mime_type
                    ));
                }
            }
            Event::Error(error) => report.cell_error = Some(bounded(error)),
            Event::Done { id: Some(done) } if done == id && !fenced => {
                // Threads and timers the cell left behind stop with the kernel now; what they
                // wrote before that is in the pipe ahead of the fence, and is this cell's.
                fenced = true;
                until = Instant::now() + INTERRUPT_GRACE;
                if !freeze(conn.pid) || write_fence(events_fd, &id).is_err() {
                    break;
                }
            }
            Event::Fence { id: fence } if fence == id => break,
            Event::Done { .. } | Event::Fence { .. } => {}
        }
    }
    report.wall_ms = started.elapsed().as_millis() as u64;
    if died {
        // Its pipes close before it is a zombie: the resident must find it dead (and start
        // a new one) for the next cell, not write that cell to a kernel still exiting.
        let until = Instant::now() + INTERRUPT_GRACE;
        while alive(conn.pid) && Instant::now() < until {
            thread::sleep(Duration::from_millis(1));
        }
    }
    // What the cell started (background processes, daemons) ends with it; the kernel stays.
    report.processes_killed += process::kill_all(None, &spared);
    let after = CgroupCounters::read();
    report.oom_killed = after.oom_kills > before.oom_kills;
    report.pids_limit_hit = after.pids_max_events > before.pids_max_events;
    if let (Some(a), Some(b)) = (after.cpu_ns, before.cpu_ns) {
        report.cpu_ms = a.saturating_sub(b) / 1_000_000;
    }
    report.peak_memory_bytes = peak_memory(conn.pid);
    report.outcome = match stop {
        Some(Stop::Timeout) => Outcome::Timeout,
        Some(Stop::OutputLimit) => Outcome::OutputLimit,
        None if died => Outcome::KernelDied,
        None => Outcome::Exited {
            code: i32::from(report.cell_error.is_some()),
        },
    };
}

/// Stops the kernel's process group and waits (bounded) until every thread of the kernel is
/// stopped, so it writes nothing more; false if it did not stop in time.
fn freeze(pid: i32) -> bool {
    let _ = killpg(Pid::from_raw(pid), Signal::SIGSTOP);
    let until = Instant::now() + INTERRUPT_GRACE;
    loop {
        let running = thread_states(pid).any(|state| !matches!(state, 'T' | 't' | 'Z' | 'X'));
        if !running {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        thread::sleep(Duration::from_micros(50));
    }
}

/// Writes the fence after whatever the frozen kernel wrote, through a write end of the event
/// pipe opened only for it (holding one would hide the kernel's death, the pipe's end). The
/// newline first ends a line the kernel was stopped in the middle of.
fn write_fence(events_fd: RawFd, id: &str) -> io::Result<()> {
    let fence = serde_json::json!({ "t": "fence", "id": id });
    let mut pipe = OpenOptions::new()
        .write(true)
        .open(format!("/proc/self/fd/{events_fd}"))?;
    pipe.write_all(format!("\n{fence}\n").as_bytes())
}

/// The state letter of each thread of `pid` (none once it is reaped).
fn thread_states(pid: i32) -> impl Iterator<Item = char> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten();
    tasks.flatten().filter_map(|task| {
        let stat = std::fs::read_to_string(task.path().join("stat")).ok()?;
        stat.rfind(')')
            .and_then(|i| stat[i + 1..].trim_start().chars().next())
    })
}

/// The kernel still runs (a dead one stays a zombie until the resident reaps it). Every
/// thread counts: the Python driver has two, and its leader shows `Z` as soon as it exits
/// while the other thread may still be exiting — the resident's `waitpid` then still says
/// "running", and the next cell would be written to a kernel about to vanish.
fn alive(pid: i32) -> bool {
    thread_states(pid).any(|state| !matches!(state, 'Z' | 'X'))
}

/// A cell error cut to sizes a report can carry: 64 KiB in all.
fn bounded(mut error: CellError) -> CellError {
    const MAX_TEXT: usize = 16 * 1024;
    let cut = |s: &mut String, max: usize| {
        if s.len() > max {
            let at = (0..=max)
                .rev()
                .find(|&i| s.is_char_boundary(i))
                .unwrap_or(0);
            s.truncate(at);
        }
    };
    cut(&mut error.name, 256);
    cut(&mut error.value, MAX_TEXT);
    let mut room = 3 * MAX_TEXT;
    error.traceback.retain_mut(|line| {
        cut(line, room);
        room -= line.len();
        !line.is_empty()
    });
    error
}

/// The kernel's peak resident memory so far (`VmHWM`), in bytes.
fn peak_memory(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_protocol::OutputKind;

    /// Sends one cell to a driver and collects its events up to `done`.
    fn cell(child: &mut Child, out: &mut BufReader<ChildStdout>, code: &str) -> Vec<Event> {
        let request = serde_json::json!({ "id": "c", "code": code, "workspace": "/tmp" });
        let stdin = child.stdin.as_mut().unwrap();
        writeln!(stdin, "{request}").unwrap();
        let mut events = Vec::new();
        loop {
            let mut line = String::new();
            assert!(out.read_line(&mut line).unwrap() > 0, "the driver ended");
            let event: Event = serde_json::from_str(&line).unwrap();
            if matches!(event, Event::Done { .. }) {
                return events;
            }
            events.push(event);
        }
    }

    fn stdout_of(events: &[Event]) -> String {
        events
            .iter()
            .filter_map(|e| match e {
                Event::Stream { name, text } if name == "stdout" => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn the_driver_keeps_state_and_types_its_outputs() {
        let mut child = Command::new("python3")
            .args(["-c", PYTHON_DRIVER])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        assert!(cell(&mut child, &mut out, "x = 41").is_empty());
        let events = cell(&mut child, &mut out, "print(x + 1)\n{'x': x}");
        assert_eq!(stdout_of(&events), "42\n");
        let outputs: Vec<_> = events
            .iter()
            .filter_map(|e| match e {
                Event::Output(o) => Some((o.kind, o.mime_type.as_str(), o.content.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(
            outputs,
            [(OutputKind::Result, "text/plain", Some("{'x': 41}".into()))]
        );
        let events = cell(&mut child, &mut out, "def f():\n    1 / 0\nf()");
        let error = events.iter().find_map(|e| match e {
            Event::Error(e) => Some(e),
            _ => None,
        });
        let error = error.expect("an error event");
        assert_eq!(error.name, "ZeroDivisionError");
        assert!(
            error.traceback.iter().all(|l| !l.contains("<string>")),
            "no driver frames: {error:?}"
        );
        let events = cell(&mut child, &mut out, "import os\nos.system('echo child')");
        assert_eq!(stdout_of(&events), "child\n", "fd-level output is captured");
        drop(child.stdin.take());
        assert!(child.wait().unwrap().success(), "ends when its input does");
    }

    #[test]
    fn cell_errors_are_cut_to_a_bounded_size() {
        let huge = CellError {
            name: "N".repeat(10_000),
            value: "v".repeat(100_000),
            traceback: vec!["t".repeat(20_000); 1000],
        };
        let cut = bounded(huge);
        assert_eq!(cut.name.len(), 256);
        assert_eq!(cut.value.len(), 16 * 1024);
        let total: usize = cut.traceback.iter().map(String::len).sum();
        assert_eq!(total, 48 * 1024);
    }

    #[test]
    fn a_kernel_whose_leader_thread_exited_first_is_still_alive() {
        // The leader ends with pthread_exit (it shows `Z`) while its other thread runs on,
        // as when a killed multithreaded kernel is part-way through exiting.
        let mut child = Command::new("python3")
            .args([
                "-c",
                "import ctypes, threading, time\n\
                 threading.Thread(target=time.sleep, args=(30,)).start()\n\
                 print('up', flush=True)\n\
                 ctypes.CDLL(None).pthread_exit(None)",
            ])
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3");
        let pid = child.id() as i32;
        let mut up = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut up)
            .unwrap();
        assert_eq!(up, "up\n");
        // Waits (bounded) for the leader to show `Z`, so the check below is the one that matters.
        let leader_gone = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                s.rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with('Z'))
            })
        };
        let until = Instant::now() + Duration::from_secs(10);
        while !leader_gone() && Instant::now() < until {
            thread::sleep(Duration::from_millis(5));
        }
        assert!(leader_gone(), "the leader thread did not exit");
        assert!(alive(pid), "a thread of the kernel still runs");
        assert!(child.try_wait().unwrap().is_none(), "waitpid agrees");

        kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
        child.wait().unwrap();
        assert!(!alive(pid), "a reaped kernel is not alive");
    }

    #[test]
    fn a_malformed_kernel_handle_is_refused() {
        for bad in ["", "1:2:3", "x:3:4:kept", "1:3:4:maybe"] {
            assert!(KernelConn::open(bad).is_err(), "{bad:?}");
        }
    }
}
