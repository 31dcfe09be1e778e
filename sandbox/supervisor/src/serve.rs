//! `serve`: the container's resident supervisor, started by one `docker exec` for the
//! container's life instead of one per execution (a `docker exec` costs tens of milliseconds of
//! dockerd, containerd and runc work; a process start here costs about one).
//!
//! Each request read from stdin is handed to a fresh `sandmesh-supervisor run` process — the
//! same single-run code as ever, so rlimits, resource usage and the final kill sweep stay per
//! run — whose stdout is this process's stdout: its frames reach the executor directly.
//! `Started` comes before them (a stream that ends earlier ended before the run began: the
//! executor may retry elsewhere), and `Done` with the run process's exit status after them, so
//! the executor knows where the run ended even if its report never came (the program killed
//! the run process).
//!
//! It relays the container's preview ports ([`crate::ports`]) for as long as it lives.
//!
//! It also owns the session's kernel ([`Kernel`]): it must outlive the runs, which kill
//! everything they did not start. A kernel request gets the kernel (started, or restarted
//! after its death) and its run process inherits the kernel's pipes.

use std::io::{self, Read, Write};
use std::process::{ChildStdin, Command, ExitCode, Stdio};

use sandbox_protocol::{self as protocol, FrameKind, KernelLanguage};

use crate::kernel::Kernel;

/// Serves requests until the executor closes stdin. With `warm_first`, starts each
/// interpreter once before saying `Ready` (a warm pool container's preparation).
pub fn serve(warm_first: bool) -> ExitCode {
    // Not dumpable: code running as the same user cannot ptrace this process, read its memory
    // or open its stdin and stdout through /proc to speak for it.
    let _ = nix::sys::prctl::set_dumpable(false);
    crate::ports::start();
    if warm_first && !crate::warm() {
        return ExitCode::FAILURE;
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("sandmesh-supervisor: cannot find its own binary: {e}");
            return ExitCode::FAILURE;
        }
    };
    if send(FrameKind::Ready, b"").is_err() {
        return ExitCode::FAILURE;
    }
    let mut input = io::stdin().lock();
    // One kernel per language, each started by its language's first cell.
    let mut kernels: [Option<Kernel>; 2] = [None, None];
    loop {
        let first = match protocol::read_frame(&mut input) {
            Ok(Some(frame)) => frame,
            // The executor closed the stream: the container is going away.
            Ok(None) => return ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("sandmesh-supervisor: reading a request: {e}");
                return ExitCode::FAILURE;
            }
        };
        // Before the run process exists, so it cannot write in between.
        if send(FrameKind::Started, b"").is_err() {
            return ExitCode::FAILURE;
        }
        let mut command = Command::new(&exe);
        command
            .arg("run")
            .stdin(Stdio::piped())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit());
        let shared = kernel_for(&first, &mut kernels, &exe, &mut command);
        let run = command.spawn();
        if let Some(slot) = shared {
            if let Some(Err(e)) = kernels[slot].as_ref().map(|k| k.share_pipes(false)) {
                // A later run's program could inherit them: no kernel is better than that.
                eprintln!("sandmesh-supervisor: hiding the kernel's pipes: {e}");
                kernels[slot] = None;
            }
        }
        let (status, forwarded) = match run {
            Ok(mut child) => {
                let forwarded = forward(first, &mut input, child.stdin.take());
                let status = match child.wait() {
                    Ok(status) => status.to_string(),
                    Err(e) => format!("not known: {e}"),
                };
                (status, forwarded)
            }
            Err(e) => {
                // Nothing was said for this run yet: its report says why it did not start.
                let report = protocol::RunReport::failed(format!("cannot start a run: {e}"));
                let json = serde_json::to_vec(&report).expect("a report serialises");
                let sent = send(FrameKind::Report, &json);
                (
                    format!("not started: {e}"),
                    forward(first, &mut input, None).and(sent),
                )
            }
        };
        if send(FrameKind::Done, status.as_bytes()).is_err() {
            return ExitCode::FAILURE;
        }
        if let Err(e) = forwarded {
            // The request stream ended or broke mid-request: nothing after it can be trusted.
            eprintln!("sandmesh-supervisor: reading a request: {e}");
            return ExitCode::FAILURE;
        }
    }
}

/// For a kernel request (`first` is its request frame), gets its language's kernel ready and
/// names it to the run `command`, its pipes made inheritable until the spawn (`Some(slot)`:
/// hide that kernel's pipes again after it). A kernel that cannot start is left out; the run
/// reports why it has none.
fn kernel_for(
    first: &(FrameKind, Vec<u8>),
    kernels: &mut [Option<Kernel>; 2],
    exe: &std::path::Path,
    command: &mut Command,
) -> Option<usize> {
    let (FrameKind::Request, payload) = first else {
        return None;
    };
    let spec = serde_json::from_slice::<protocol::RunSpec>(payload).ok()?;
    let language = spec.kernel?;
    let slot = match language {
        KernelLanguage::Python => 0,
        KernelLanguage::Javascript => 1,
    };
    let kernel = &mut kernels[slot];
    let state = match Kernel::ensure(kernel, exe, language, &spec) {
        Ok(state) => state,
        Err(e) => {
            eprintln!("sandmesh-supervisor: cannot start the kernel: {e}");
            return None;
        }
    };
    let k = kernel.as_ref()?;
    if let Err(e) = k.share_pipes(true) {
        // Perhaps half shared: the kernel goes (with its pipes) rather than leak them.
        eprintln!("sandmesh-supervisor: sharing the kernel's pipes: {e}");
        *kernel = None;
        return None;
    }
    command.args(["--kernel", &k.handle_arg(state)]);
    Some(slot)
}

/// Copies the request's frames, `first` included, up to and including `End`, to the run
/// process's stdin (`None`: no run process will see them). A run process that stops reading
/// (it refused the request) leaves the rest to be read and dropped here, so the next request
/// starts at a frame boundary. Dropping the pipe at the end closes the run's stdin.
fn forward(
    first: (FrameKind, Vec<u8>),
    input: &mut impl Read,
    mut pipe: Option<ChildStdin>,
) -> io::Result<()> {
    let mut frame = Some(first);
    loop {
        let (kind, payload) = match frame.take() {
            Some(f) => f,
            None => protocol::read_frame(input)?.ok_or(io::ErrorKind::UnexpectedEof)?,
        };
        if let Some(p) = pipe.as_mut() {
            if protocol::write_frame(p, kind, &payload).is_err() {
                pipe = None;
            }
        }
        if kind == FrameKind::End {
            return Ok(());
        }
    }
}

/// One frame on stdout, flushed (a run's frames go straight from its process to the same fd).
fn send(kind: FrameKind, payload: &[u8]) -> io::Result<()> {
    let mut out = io::stdout().lock();
    protocol::write_frame(&mut out, kind, payload)?;
    out.flush()
}
