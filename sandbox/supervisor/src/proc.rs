//! `proc`: the host of one background process of a session, started by its own `docker exec`
//! for the process's life. It reads the [`ProcSpec`], starts the program (pipes, or a
//! pseudo-terminal), streams its output as frames, takes input, signals and terminal sizes
//! from the executor, and at the program's end kills whatever it left behind and says how it
//! ended.
//!
//! Ownership is explicit. A run's final sweep (`process::kill_all`) spares exactly the proc
//! hosts — the processes whose parent is outside the container's PID namespace, which only
//! the executor's `docker exec` makes — and their descendants. The host is a child subreaper,
//! so what its program daemonises stays its descendant (and is killed with it) instead of
//! becoming PID 1's orphan. When the executor's stream closes (the session closed, the
//! executor went), the host kills its program: a process never outlives its owner.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::resource::{setrlimit, Resource};
use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::Pid;
use rustix::pty::{ioctl_tiocgptpeer, openpt, unlockpt, OpenptFlags};
use rustix::termios::{tcsetwinsize, Winsize};
use sandbox_protocol::{self as protocol, FrameKind, ProcEnd, ProcSpec, PtyWinsize};

use crate::process;

/// How long output may keep draining after the program ended and its descendants were killed.
const DRAIN_GRACE: Duration = Duration::from_secs(2);
const READ_CHUNK: usize = 64 * 1024;
/// The terminal's end-of-file character (^D), written for `InputEnd` to a terminal.
const TTY_EOF: u8 = 0x04;

/// Frames to the executor, from several threads: one frame at a time.
#[derive(Clone)]
struct Out(Arc<Mutex<io::Stdout>>);

impl Out {
    fn send(&self, kind: FrameKind, payload: &[u8]) -> io::Result<()> {
        let mut out = self.0.lock().unwrap_or_else(|e| e.into_inner());
        protocol::write_chunked(&mut *out, kind, payload)?;
        out.flush()
    }
}

/// Where input for the program goes.
enum Sink {
    Pipe(io::PipeWriter),
    Tty(File),
}

impl Sink {
    fn write(&mut self, data: &[u8]) -> io::Result<()> {
        match self {
            Sink::Pipe(p) => p.write_all(data),
            Sink::Tty(t) => t.write_all(data),
        }
    }
}

/// `sandmesh-supervisor proc`.
pub fn host() -> ExitCode {
    // Not dumpable: code of the same user cannot trace this process to speak for it.
    let _ = nix::sys::prctl::set_dumpable(false);
    let _ = nix::sys::prctl::set_child_subreaper(true);
    let out = Out(Arc::new(Mutex::new(io::stdout())));
    // Unlocked: the controls are read from a thread of their own.
    let mut input = io::stdin();
    let end = match read_spec(&mut input) {
        Ok(spec) => run(&spec, input, &out),
        Err(message) => ProcEnd::Failed { message },
    };
    let json = serde_json::to_vec(&end).expect("an end serialises");
    let _ = out.send(FrameKind::Exited, &json);
    ExitCode::SUCCESS
}

fn read_spec(input: &mut impl Read) -> Result<ProcSpec, String> {
    match protocol::read_frame(input) {
        Ok(Some((FrameKind::Request, payload))) => {
            let spec: ProcSpec =
                serde_json::from_slice(&payload).map_err(|e| format!("malformed request: {e}"))?;
            if spec.version != protocol::PROTOCOL_VERSION {
                return Err(format!(
                    "protocol version {} requested; this supervisor speaks {} \
                     (rebuild the sandbox image)",
                    spec.version,
                    protocol::PROTOCOL_VERSION
                ));
            }
            if spec.argv.is_empty() {
                return Err("empty argv".into());
            }
            Ok(spec)
        }
        Ok(other) => Err(format!("expected a request, got {:?}", other.map(|f| f.0))),
        Err(e) => Err(format!("reading the request: {e}")),
    }
}

fn winsize(size: PtyWinsize) -> Winsize {
    Winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

/// A pseudo-terminal: the master this host keeps, the peer the program gets as 0, 1 and 2.
fn open_pty(size: PtyWinsize) -> io::Result<(OwnedFd, OwnedFd)> {
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
    unlockpt(&master)?;
    tcsetwinsize(&master, winsize(size))?;
    let peer = ioctl_tiocgptpeer(
        &master,
        OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC,
    )?;
    Ok((master, peer))
}

enum Event {
    Eof,
    /// The program ended (its status as the executor is told it).
    Exited(ProcEnd),
}

/// Starts a thread, or says why not (the container's pids limit counts threads).
fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> io::Result<()> {
    thread::Builder::new().name(name.into()).spawn(f).map(drop)
}

fn reader(
    kind: FrameKind,
    mut from: impl Read + Send + 'static,
    out: Out,
    tx: mpsc::Sender<Event>,
) -> io::Result<()> {
    spawn("proc-output", move || {
        let mut buf = vec![0u8; READ_CHUNK];
        // A terminal's master reads EIO once the last holder of its peer closed it.
        while let Ok(n @ 1..) = from.read(&mut buf) {
            if out.send(kind, &buf[..n]).is_err() {
                break;
            }
        }
        let _ = tx.send(Event::Eof);
    })
}

/// Reaps every child of this host once the program's pid arrives: the program (its end goes
/// to `tx`) and, since the host is their subreaper, its orphaned descendants. Unreaped, each
/// of those would hold one of the container's pids until the host ended: a long-lived process
/// whose short-lived daemons keep dying would fill the pids limit with zombies, and a killed
/// fork bomb would leave it full.
fn reaper(program: mpsc::Receiver<i32>, tx: mpsc::Sender<Event>) -> io::Result<()> {
    spawn("proc-reaper", move || {
        let Ok(program) = program.recv() else {
            return;
        };
        loop {
            let end = match waitpid(None::<Pid>, None) {
                Ok(WaitStatus::Exited(pid, code)) if pid.as_raw() == program => {
                    ProcEnd::Exited { code }
                }
                Ok(WaitStatus::Signaled(pid, signal, _)) if pid.as_raw() == program => {
                    ProcEnd::Signaled {
                        signal: signal as i32,
                    }
                }
                Ok(_) | Err(Errno::EINTR) => continue,
                // ECHILD: no child is left, so no descendant is either (an orphan is
                // re-parented here only from a living descendant): none can come.
                Err(_) => return,
            };
            let _ = tx.send(Event::Exited(end));
        }
    })
}

/// Starts the program and serves it to its end.
fn run(spec: &ProcSpec, input: io::Stdin, out: &Out) -> ProcEnd {
    let _ = setrlimit(Resource::RLIMIT_CORE, 0, 0);
    let _ = setrlimit(Resource::RLIMIT_NOFILE, spec.nofile, spec.nofile);
    let _ = setrlimit(Resource::RLIMIT_FSIZE, spec.fsize_bytes, spec.fsize_bytes);
    let mut env = spec.env.clone();
    if let Some(socket) = &spec.egress_socket {
        // A port of its own: a run's relay (on the run port) never takes its connections.
        let port = match crate::relay::start(socket, 0) {
            Ok(port) => port,
            Err(e) => {
                return ProcEnd::Failed {
                    message: format!("cannot start the egress relay: {e}"),
                }
            }
        };
        let proxy = crate::relay::proxy_env(port);
        env.retain(|(name, _)| !proxy.iter().any(|(p, _)| p == name));
        env.extend(proxy);
    }
    let Prepared {
        mut command,
        events,
        program,
        pipes,
    } = match prepare(spec, input, out) {
        Ok(prepared) => prepared,
        Err(message) => return ProcEnd::Failed { message },
    };
    command
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .current_dir(&spec.cwd);
    let spawned = command.spawn();
    // The command holds the pipes' write ends and the terminal's peer: dropped now, so the
    // readers see their end once the program's side closes.
    drop(command);
    let pid = match spawned {
        Ok(child) => child.id() as i32,
        Err(e) => {
            return ProcEnd::Failed {
                message: format!("cannot start {}: {e}", spec.argv[0]),
            }
        }
    };
    // As for every run's program: the OOM killer takes it, never a supervisor.
    let _ = std::fs::write(format!("/proc/{pid}/oom_score_adj"), "1000");
    for to in program {
        let _ = to.send(pid);
    }
    if out
        .send(FrameKind::Started, pid.to_string().as_bytes())
        .is_err()
    {
        process::kill_descendants();
    }

    let mut open = pipes;
    let mut status = None;
    let mut drain_until: Option<Instant> = None;
    while open > 0 || status.is_none() {
        let event = match drain_until {
            Some(until) => {
                match events.recv_timeout(until.saturating_duration_since(Instant::now())) {
                    Ok(ev) => ev,
                    Err(_) => break,
                }
            }
            None => match events.recv() {
                Ok(ev) => ev,
                Err(_) => break,
            },
        };
        match event {
            Event::Eof => open -= 1,
            Event::Exited(end) => {
                status = Some(end);
                // The program is done: what it left running (holding its output open) ends
                // with it.
                process::kill_descendants();
                drain_until = Some(Instant::now() + DRAIN_GRACE);
            }
        }
    }
    process::kill_descendants();
    status.unwrap_or_else(|| ProcEnd::Failed {
        message: "the program did not end".into(),
    })
}

/// The program's command and every thread its life needs, made before it exists: a fork bomb
/// may exhaust the pids limit a moment after it starts, and a host that could then not start
/// a thread would die and leave the bomb to PID 1, holding the session's pids for good.
struct Prepared {
    command: Command,
    /// Output ends, the program's end.
    events: mpsc::Receiver<Event>,
    /// Where the program's pid goes once it exists (the reaper's and the controls' threads).
    program: [mpsc::Sender<i32>; 2],
    /// How many output streams the readers follow.
    pipes: usize,
}

fn prepare(spec: &ProcSpec, input: io::Stdin, out: &Out) -> Result<Prepared, String> {
    let thread = |e: io::Error| format!("cannot start a thread: {e}");
    let (tx, events) = mpsc::channel();
    let (input_tx, input_rx) = mpsc::channel::<Option<Vec<u8>>>();
    let (reaper_pid, reaper_rx) = mpsc::channel();
    let (controls_pid, controls_rx) = mpsc::channel();
    let (command, sink, tty, pipes) = match spec.pty {
        Some(size) => {
            let (master, peer) =
                open_pty(size).map_err(|e| format!("cannot open a terminal: {e}"))?;
            let share = || "cannot share the terminal".to_string();
            let stdio = |fd: &OwnedFd| fd.try_clone().map(Stdio::from);
            let (Ok(i), Ok(o), Ok(e)) = (stdio(&peer), stdio(&peer), stdio(&peer)) else {
                return Err(share());
            };
            let exe =
                std::env::current_exe().map_err(|e| format!("cannot find its own binary: {e}"))?;
            // The trampoline makes the program a session leader with the terminal as its
            // controlling one (Ctrl-C, job control), then becomes it.
            let mut command = Command::new(exe);
            command.arg("tty-exec").arg("--").args(&spec.argv);
            command.stdin(i).stdout(o).stderr(e);
            let master = File::from(master);
            let (Ok(writer), Ok(resizer)) = (master.try_clone(), master.try_clone()) else {
                return Err(share());
            };
            reader(FrameKind::Stdout, master, out.clone(), tx.clone()).map_err(thread)?;
            (command, Some(Sink::Tty(writer)), Some(resizer), 1)
        }
        None => {
            let pipe = || io::pipe().map_err(|e| format!("cannot create pipes: {e}"));
            let ((out_r, out_w), (err_r, err_w)) = (pipe()?, pipe()?);
            reader(FrameKind::Stdout, out_r, out.clone(), tx.clone()).map_err(thread)?;
            reader(FrameKind::Stderr, err_r, out.clone(), tx.clone()).map_err(thread)?;
            let mut command = Command::new(&spec.argv[0]);
            command
                .args(&spec.argv[1..])
                .process_group(0)
                .stdout(out_w)
                .stderr(err_w);
            let sink = if spec.stdin {
                let (in_r, in_w) = pipe()?;
                command.stdin(in_r);
                Some(Sink::Pipe(in_w))
            } else {
                command.stdin(Stdio::null());
                None
            };
            (command, sink, None, 2)
        }
    };
    writer(sink, tty.is_some(), input_rx).map_err(thread)?;
    reaper(reaper_rx, tx).map_err(thread)?;
    controls(input, controls_rx, tty, input_tx).map_err(thread)?;
    Ok(Prepared {
        command,
        events,
        program: [reaper_pid, controls_pid],
        pipes,
    })
}

/// Writes input from its own thread, so a program that does not read cannot hold up the
/// signals and sizes behind it. `None` is the end of input.
fn writer(sink: Option<Sink>, tty: bool, rx: mpsc::Receiver<Option<Vec<u8>>>) -> io::Result<()> {
    spawn("proc-input", move || {
        let mut sink = sink;
        while let Ok(item) = rx.recv() {
            let Some(s) = sink.as_mut() else { continue };
            let failed = match item {
                Some(data) => s.write(&data).is_err(),
                // A terminal has no end of its own: its EOF character ends a line discipline's
                // read. A pipe's end is its close.
                None if tty => s.write(&[TTY_EOF]).is_err(),
                None => true,
            };
            if failed {
                sink = None;
            }
        }
    })
}

/// Reads the executor's frames, once the program exists, until its stream ends; then the
/// program goes.
fn controls(
    mut input: io::Stdin,
    program: mpsc::Receiver<i32>,
    tty: Option<File>,
    input_tx: mpsc::Sender<Option<Vec<u8>>>,
) -> io::Result<()> {
    spawn("proc-controls", move || {
        let Ok(pid) = program.recv() else {
            return;
        };
        loop {
            match protocol::read_frame(&mut input) {
                Ok(Some((FrameKind::Input, data))) => {
                    let _ = input_tx.send(Some(data));
                }
                Ok(Some((FrameKind::InputEnd, _))) => {
                    let _ = input_tx.send(None);
                }
                Ok(Some((FrameKind::Signal, payload))) => {
                    let signal = std::str::from_utf8(&payload)
                        .ok()
                        .and_then(|s| s.parse::<i32>().ok())
                        .and_then(|n| Signal::try_from(n).ok());
                    if let Some(signal) = signal {
                        let _ = killpg(Pid::from_raw(pid), signal);
                    }
                }
                Ok(Some((FrameKind::Resize, payload))) => {
                    let size = serde_json::from_slice::<PtyWinsize>(&payload);
                    if let (Some(tty), Ok(size)) = (tty.as_ref(), size) {
                        // The kernel sends the foreground group SIGWINCH.
                        let _ = tcsetwinsize(tty, winsize(size));
                    }
                }
                // Anything else is ignored; the executor sends nothing else.
                Ok(Some(_)) => {}
                // The executor closed the stream or it broke: the process's owner is gone.
                Ok(None) | Err(_) => break,
            }
        }
        process::kill_descendants();
    })
}

/// `sandmesh-supervisor tty-exec -- <argv>`: becomes a session leader whose controlling
/// terminal is its stdin, then executes `argv`.
pub fn tty_exec(argv: Vec<String>) -> ExitCode {
    let Some((program, args)) = argv.split_first() else {
        eprintln!("usage: sandmesh-supervisor tty-exec -- <program> [args...]");
        return ExitCode::from(64);
    };
    if let Err(e) = nix::unistd::setsid() {
        eprintln!("sandmesh-supervisor: setsid: {e}");
        return ExitCode::FAILURE;
    }
    if let Err(e) = rustix::process::ioctl_tiocsctty(io::stdin()) {
        eprintln!("sandmesh-supervisor: taking the terminal: {e}");
        return ExitCode::FAILURE;
    }
    let e = Command::new(program).args(args).exec();
    eprintln!("sandmesh-supervisor: cannot start {program}: {e}");
    ExitCode::from(127)
}
