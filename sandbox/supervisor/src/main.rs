//! `sandmesh-supervisor`: the sandbox side of one execution, installed in the sandbox image
//! as `/usr/local/bin/sandmesh-supervisor` (deploy/images, `SUPERVISOR_BIN`).
//!
//! ```text
//! sandmesh-supervisor keep   the container's init (PID 1): reaps orphans, keeps the container
//!                            up, cannot be traced or rewritten by the code it outlives
//! sandmesh-supervisor run    one execution: reads the request and workspace archive (frames
//!                            on stdin), unpacks the archive, runs the program, streams its
//!                            output, kills everything it started, sends the changed files and
//!                            the report (frames on stdout); with an egress socket, relays
//!                            127.0.0.1:3128 to it meanwhile
//! sandmesh-supervisor run --kernel <pid:fd:fd:state>
//!                            one cell of the resident's kernel instead of a program
//! sandmesh-supervisor kernel python|javascript <nofile> <fsize>
//!                            becomes that language's kernel driver (started by `serve`)
//! sandmesh-supervisor serve [--warm]
//!                            the resident supervisor, one `docker exec` for the container's
//!                            life: a `run` process per request read from stdin, `Done` after
//!                            each; with --warm it first starts each interpreter once, so the
//!                            first execution in a new container does not pay for cold
//!                            file-system caches; it owns the session's kernel and relays
//!                            preview ports to loopback ([`ports`])
//! sandmesh-supervisor proc  one background process of a session, one `docker exec` for its
//!                            life: reads its spec, starts the program (pipes or a terminal),
//!                            streams its output, takes input, signals and terminal sizes, kills
//!                            what it left behind at its end ([`proc`])
//! sandmesh-supervisor tty-exec -- <argv>
//!                            a terminal program's start: session leader, controlling terminal
//! sandmesh-supervisor launch ... -- bwrap ...
//!                            on the host, not in the sandbox: the bwrap-executor's start of
//!                            one sandbox (cgroup, rlimits, seccomp fds, uid and capabilities
//!                            dropped, then exec bwrap; [`launch`])
//! ```
//!
//! The frame format is the `sandmesh-sandbox-protocol` crate (`crates/sandbox-protocol`), shared with
//! the executor. This binary uses std, nix, rustix, serde_json and tar only: it must run on the
//! image's bookworm glibc and start in about a millisecond.

mod files;
mod kernel;
mod launch;
mod ports;
mod proc;
mod process;
mod relay;
mod serve;

use std::io::{self, BufWriter, Read, Write};
use std::path::Path;
use std::process::ExitCode;

use kernel::KernelConn;
use sandbox_protocol::{
    self as protocol, FrameKind, KernelLanguage, Outcome, RunReport, RunSpec, PROTOCOL_VERSION,
};

/// Upper bound on the input (request + archive); the workspace tmpfs is far smaller.
const MAX_INPUT: usize = 512 * 1024 * 1024;

/// Frames to the executor on stdout. Write errors mean the executor is gone (its backstop
/// killed the exec, or it crashed): the run still ends cleanly, with nobody listening.
pub struct FrameOut {
    out: BufWriter<io::Stdout>,
    broken: bool,
}

impl FrameOut {
    fn new() -> Self {
        Self {
            out: BufWriter::with_capacity(256 * 1024, io::stdout()),
            broken: false,
        }
    }

    /// Sends one frame at once: output is streamed, not batched.
    pub fn send(&mut self, kind: FrameKind, payload: &[u8]) {
        self.queue(kind, payload);
        self.flush();
    }

    fn queue(&mut self, kind: FrameKind, payload: &[u8]) {
        if !self.broken && protocol::write_chunked(&mut self.out, kind, payload).is_err() {
            self.broken = true;
        }
    }

    fn flush(&mut self) {
        if !self.broken && self.out.flush().is_err() {
            self.broken = true;
        }
    }
}

/// Packs changed files straight into `Changes` frames.
struct ChangesWriter<'a> {
    out: &'a mut FrameOut,
    buf: Vec<u8>,
}

impl Write for ChangesWriter<'_> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= protocol::MAX_FRAME {
            let rest = self.buf.split_off(protocol::MAX_FRAME);
            self.out.queue(FrameKind::Changes, &self.buf);
            self.buf = rest;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if !self.buf.is_empty() {
            self.out.queue(FrameKind::Changes, &self.buf);
            self.buf.clear();
        }
        Ok(())
    }
}

/// The request, the workspace archive and the request's files archive.
type Input = (RunSpec, Vec<u8>, Vec<u8>);

/// Why the executor's input could not be used; it becomes the report's failure message.
#[derive(Debug, thiserror::Error)]
enum InputError {
    #[error("reading the request: {0}")]
    Read(#[source] io::Error),
    #[error("malformed request: {0}")]
    Malformed(#[source] serde_json::Error),
    #[error(
        "protocol version {0} requested; this supervisor speaks {PROTOCOL_VERSION} \
         (rebuild the sandbox image)"
    )]
    Version(u32),
    #[error("the input exceeds {MAX_INPUT} bytes")]
    TooLarge,
    #[error("unexpected {0:?} frame from the executor")]
    Unexpected(FrameKind),
    #[error("no request frame")]
    NoRequest,
}

fn read_input(input: &mut impl Read) -> Result<Input, InputError> {
    let mut spec: Option<RunSpec> = None;
    let mut archive = Vec::new();
    let mut files = Vec::new();
    loop {
        match protocol::read_frame(input).map_err(InputError::Read)? {
            Some((FrameKind::Request, payload)) => {
                let s: RunSpec = serde_json::from_slice(&payload).map_err(InputError::Malformed)?;
                if s.version != PROTOCOL_VERSION {
                    return Err(InputError::Version(s.version));
                }
                spec = Some(s);
            }
            Some((kind @ (FrameKind::Archive | FrameKind::Files), payload)) => {
                if archive.len() + files.len() + payload.len() > MAX_INPUT {
                    return Err(InputError::TooLarge);
                }
                let target = if kind == FrameKind::Archive {
                    &mut archive
                } else {
                    &mut files
                };
                target.extend_from_slice(&payload);
            }
            Some((FrameKind::End, _)) | None => break,
            Some((kind, _)) => return Err(InputError::Unexpected(kind)),
        }
    }
    spec.map(|s| (s, archive, files))
        .ok_or(InputError::NoRequest)
}

/// One execution; `kernel` is the resident's kernel for a kernel cell.
fn run_once(kernel: Option<Result<KernelConn, String>>) -> ExitCode {
    // Not dumpable: code running as the same user cannot ptrace this process or read its
    // memory to forge the report (the executor does not trust the report anyway).
    let _ = nix::sys::prctl::set_dumpable(false);
    let mut out = FrameOut::new();
    let mut report = RunReport::failed("not started");
    match read_input(&mut io::stdin().lock()) {
        Ok((spec, archive, files)) => {
            execute(&spec, &archive, &files, kernel, &mut out, &mut report)
        }
        Err(e) => {
            report.outcome = Outcome::Failed {
                message: e.to_string(),
            }
        }
    }
    match serde_json::to_vec(&report) {
        Ok(json) => out.send(FrameKind::Report, &json),
        Err(e) => eprintln!("sandmesh-supervisor: cannot encode the report: {e}"),
    }
    ExitCode::SUCCESS
}

/// Places the workspace, runs the program, and collects what changed.
fn execute(
    spec: &RunSpec,
    archive: &[u8],
    files: &[u8],
    kernel: Option<Result<KernelConn, String>>,
    out: &mut FrameOut,
    report: &mut RunReport,
) {
    let kernel = match (spec.kernel.is_some(), kernel) {
        (false, _) => None,
        (true, Some(Ok(conn))) => Some(conn),
        (true, Some(Err(e))) => {
            report.outcome = Outcome::Failed { message: e };
            return;
        }
        (true, None) => {
            report.outcome = Outcome::Failed {
                message: "no kernel: kernel cells run under a resident supervisor".into(),
            };
            return;
        }
    };
    // Egress first: a run whose network cannot be set up does not run at all (its program
    // would find no proxy and fail in a more confusing way).
    let mut spec = spec.clone();
    if let Some(socket) = &spec.egress_socket {
        if let Err(e) = relay::start(socket, protocol::EGRESS_PROXY_PORT) {
            report.outcome = Outcome::Failed {
                message: format!(
                    "cannot listen on 127.0.0.1:{} for the egress relay: {e}",
                    protocol::EGRESS_PROXY_PORT
                ),
            };
            return;
        }
        let proxy = relay::proxy_env(protocol::EGRESS_PROXY_PORT);
        spec.env
            .retain(|(name, _)| !proxy.iter().any(|(p, _)| p == name));
        spec.env.extend(proxy);
    }
    let spec = &spec;
    let root = Path::new(&spec.workspace);
    if let Err(e) = files::unpack(root, archive, &mut report.warnings) {
        report.outcome = Outcome::Failed {
            message: format!("cannot place the workspace: {e}"),
        };
        return;
    }
    // The baseline is the workspace as stored: the request's files, written next, are
    // changes of this run. Without an archive the container holds what the store holds, which
    // is what the last run left (its manifest), plus whatever the session's background
    // processes wrote since: changes of this run too, so they reach the store.
    let keeps_changes = spec.max_changes_bytes > 0;
    let before = match (archive.is_empty() && keeps_changes).then(|| files::Manifest::pushed(root))
    {
        Some(Some(pushed)) => pushed,
        _ => files::Manifest::scan(root),
    };
    if let Err(e) = files::unpack(root, files, &mut report.warnings) {
        report.outcome = Outcome::Failed {
            message: format!("cannot write the request's files: {e}"),
        };
        return;
    }
    match kernel {
        Some(conn) => kernel::run_cell(spec, conn, out, report),
        None => process::run(spec, out, report),
    }
    let after = files::Manifest::scan(root);
    if before.truncated || after.truncated {
        report
            .warnings
            .push("the workspace has too many files to track every change".into());
    }
    // A run whose changes are not kept (it has no workspace) lists none.
    let (diff, omitted) = if keeps_changes {
        files::bound(files::diff(&before, &after))
    } else {
        Default::default()
    };
    report.files_omitted = omitted;
    let changed: Vec<String> = diff.created.iter().chain(&diff.modified).cloned().collect();
    if !changed.is_empty() && keeps_changes {
        let mut writer = ChangesWriter {
            out,
            buf: Vec::new(),
        };
        match files::pack(root, &changed, spec.max_changes_bytes, &mut writer) {
            Ok(skipped) => report.files_skipped = skipped,
            Err(e) => report
                .warnings
                .push(format!("could not pack the changed files: {e}")),
        }
    }
    report.files_created = diff.created;
    report.files_modified = diff.modified;
    report.files_deleted = diff.deleted;
    if keeps_changes {
        if let Err(e) = after.save_pushed() {
            report
                .warnings
                .push(format!("could not keep the workspace's manifest: {e}"));
        }
    }
}

/// The container's init: the executor creates its containers without Docker's init, so this
/// is PID 1. Docker's init was an ordinary process of the sandbox user: code could ptrace it
/// and turn it into a program of its own that every later run spares (every run's sweep must
/// spare PID 1). Not dumpable, this process cannot be traced, nor its memory read, by code
/// running as the same user without capabilities.
///
/// As init it reaps what the runs' sweeps kill (their orphans are re-parented here), and ends
/// on SIGTERM, SIGINT or SIGHUP (`docker stop`); everything else in the namespace goes with it.
/// The signals are blocked and waited for: a PID 1 with default handlers would never see them.
fn keep() -> ExitCode {
    use nix::sys::signal::{SigSet, Signal};
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    let _ = nix::sys::prctl::set_dumpable(false);
    let mut signals = SigSet::empty();
    for signal in [
        Signal::SIGCHLD,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
    ] {
        signals.add(signal);
    }
    if let Err(e) = signals.thread_block() {
        eprintln!("sandmesh-supervisor keep: blocking signals: {e}");
        return ExitCode::FAILURE;
    }
    loop {
        match signals.wait() {
            Ok(Signal::SIGCHLD) => {
                // One SIGCHLD may stand for many children: reap until none is left waiting.
                while let Ok(status) = waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                    if status == WaitStatus::StillAlive {
                        break;
                    }
                }
            }
            Ok(_) => return ExitCode::SUCCESS,
            Err(_) => {}
        }
    }
}

/// The first start of an interpreter in a fresh container reads its files through a cold
/// overlay (fuse-overlayfs here: tens of ms); the warm pool pays that before handing the
/// container out. Each interpreter runs a trivial script the way `run` starts programs (the
/// code through a sealed descriptor, same working directory and environment), so the real
/// first run finds it all cached.
fn warm() -> bool {
    let mut ok = true;
    for (code, argv) in [
        ("pass\n", &["python3", "-u"][..]),
        ("0\n", &["node", "--preserve-symlinks-main"]),
        (":\n", &["bash"]),
    ] {
        let status = process::SealedCode::new(code).and_then(|code| {
            std::process::Command::new(argv[0])
                .args(&argv[1..])
                .arg(code.path())
                .env_clear()
                .envs([
                    (
                        "PATH",
                        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    ),
                    ("HOME", "/workspace"),
                    ("LANG", "C.UTF-8"),
                    ("PYTHONUNBUFFERED", "1"),
                    ("PYTHONDONTWRITEBYTECODE", "1"),
                    ("PYTHONPATH", "/workspace"),
                ])
                .current_dir("/workspace")
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .status()
        });
        if !matches!(status, Ok(s) if s.success()) {
            eprintln!(
                "sandmesh-supervisor: warming {} failed: {status:?}",
                argv[0]
            );
            ok = false;
        }
    }
    ok
}

fn main() -> ExitCode {
    match std::env::args().nth(1).as_deref() {
        Some("run") => {
            let args: Vec<String> = std::env::args().skip(2).collect();
            let kernel = match args.as_slice() {
                [] => None,
                // Opened before anything else: the inherited pipes are this run's alone.
                [flag, handle] if flag == "--kernel" => Some(KernelConn::open(handle)),
                _ => {
                    eprintln!("usage: sandmesh-supervisor run [--kernel <handle>]");
                    return ExitCode::from(64);
                }
            };
            run_once(kernel)
        }
        Some("kernel") => {
            let language = match std::env::args().nth(2).as_deref() {
                Some("python") => Some(KernelLanguage::Python),
                Some("javascript") => Some(KernelLanguage::Javascript),
                _ => None,
            };
            let limit = |i: usize| std::env::args().nth(i).and_then(|v| v.parse::<u64>().ok());
            let (Some(language), Some(nofile), Some(fsize)) = (language, limit(3), limit(4)) else {
                eprintln!("usage: sandmesh-supervisor kernel python|javascript <nofile> <fsize>");
                return ExitCode::from(64);
            };
            let e = kernel::exec_driver(language, nofile, fsize);
            eprintln!("sandmesh-supervisor: cannot start the {language:?} kernel: {e}");
            ExitCode::FAILURE
        }
        Some("keep") => keep(),
        Some("proc") => proc::host(),
        Some("tty-exec") => {
            let mut args: Vec<String> = std::env::args().skip(2).collect();
            if args.first().map(String::as_str) == Some("--") {
                args.remove(0);
            }
            proc::tty_exec(args)
        }
        Some("launch") => launch::launch(std::env::args_os().skip(2)),
        Some("serve") => serve::serve(std::env::args().nth(2).as_deref() == Some("--warm")),
        _ => {
            eprintln!(
                "usage: sandmesh-supervisor run [--kernel <handle>]|keep|\
                 kernel python|javascript <nofile> <fsize>|serve [--warm]|proc|\
                 tty-exec -- <argv>|launch ..."
            );
            ExitCode::from(64)
        }
    }
}
