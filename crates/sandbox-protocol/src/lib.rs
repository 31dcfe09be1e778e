//! The framed protocol between the executor and `sandmesh-supervisor`, the small program inside
//! the sandbox that runs each execution.
//!
//! Both sides depend on this crate (the docker-executor library and the `sandmesh-supervisor`
//! binary), so they can never disagree about the format. It needs only std and serde: the
//! supervisor stays small, and the executor needs no process-control crates.
//!
//! A frame is `kind: u8`, `len: u32` big-endian, then `len` bytes of payload.
//!
//! ```text
//! executor → supervisor (exec stdin):   Request(json) Archive(tar)* Files(tar)* End
//! supervisor → executor (exec stdout):  (Stdout | Stderr)*  Changes(tar bytes)*  Report(json)
//! ```
//!
//! A container's resident supervisor (`sandmesh-supervisor serve`, one `docker exec` for the
//! container's life) carries many runs over one stream: it says `Ready` once, then for each
//! request `Started`, the run's frames as above, and `Done` (the run process's exit, as text),
//! so the executor knows where a run ends even when its report never came, and that a stream
//! which ended before `Started` ended before the run began.
//!
//! A session's background process (`sandmesh-supervisor proc`, one `docker exec` each, for the
//! process's life) speaks the same frames:
//!
//! ```text
//! executor → proc host:   Request(ProcSpec json)  (Input | InputEnd | Signal | Resize)*
//! proc host → executor:   Started(pid)  (Stdout | Stderr)*  Exited(ProcEnd json)
//! ```
//!
//! The supervisor runs as the sandbox user next to the untrusted code, so nothing it says is
//! trusted by the executor: sizes are bounded here and again by the executor.

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

/// Bumped on any incompatible change; the supervisor refuses a request of another version.
pub const PROTOCOL_VERSION: u32 = 1;

/// Largest payload of one frame. Output and archives are split into frames this size or less.
pub const MAX_FRAME: usize = 1024 * 1024;

/// Bytes of the frame header.
pub const HEADER_LEN: usize = 5;

/// A frame header the protocol does not allow; the stream cannot be resynchronised after it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("unknown frame kind {0:#04x}")]
    UnknownKind(u8),
    #[error("frame of {0} bytes exceeds {MAX_FRAME}")]
    TooLarge(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    /// executor → supervisor: the [`RunSpec`] as JSON.
    Request,
    /// executor → supervisor: a piece of the workspace tar placed before the run.
    Archive,
    /// executor → supervisor: a piece of the tar of the request's files, written over the
    /// workspace after it is placed; they count as changes of the run (and so persist).
    Files,
    /// executor → supervisor: no more input.
    End,
    /// supervisor → executor: program stdout bytes.
    Stdout,
    /// supervisor → executor: program stderr bytes.
    Stderr,
    /// supervisor → executor: a piece of the tar of files created or modified in the workspace.
    Changes,
    /// supervisor → executor: the [`RunReport`] as JSON; the last frame of a run.
    Report,
    /// resident supervisor → executor: ready for requests (once, after its start).
    Ready,
    /// resident supervisor → executor: a request arrived; its run process starts now.
    Started,
    /// resident supervisor → executor: the run process ended (its exit status, as text); the
    /// last frame of every run it serves, after the report or in place of a lost one.
    Done,
    /// executor → proc host: bytes for the process's stdin (or terminal).
    Input,
    /// executor → proc host: no more input (stdin closed; a terminal gets its EOF character).
    InputEnd,
    /// executor → proc host: a signal for the process's group (its number, as text).
    Signal,
    /// executor → proc host: the terminal's new size ([`PtyWinsize`] as JSON).
    Resize,
    /// proc host → executor: the process ended ([`ProcEnd`] as JSON); the last frame.
    Exited,
}

impl FrameKind {
    pub const fn byte(self) -> u8 {
        match self {
            FrameKind::Request => b'Q',
            FrameKind::Archive => b'A',
            FrameKind::Files => b'F',
            FrameKind::End => b'E',
            FrameKind::Stdout => b'O',
            FrameKind::Stderr => b'R',
            FrameKind::Changes => b'C',
            FrameKind::Report => b'Z',
            FrameKind::Ready => b'Y',
            FrameKind::Started => b'S',
            FrameKind::Done => b'D',
            FrameKind::Input => b'I',
            FrameKind::InputEnd => b'J',
            FrameKind::Signal => b'K',
            FrameKind::Resize => b'W',
            FrameKind::Exited => b'X',
        }
    }

    pub fn from_byte(b: u8) -> Option<Self> {
        Some(match b {
            b'Q' => FrameKind::Request,
            b'A' => FrameKind::Archive,
            b'F' => FrameKind::Files,
            b'E' => FrameKind::End,
            b'O' => FrameKind::Stdout,
            b'R' => FrameKind::Stderr,
            b'C' => FrameKind::Changes,
            b'Z' => FrameKind::Report,
            b'Y' => FrameKind::Ready,
            b'S' => FrameKind::Started,
            b'D' => FrameKind::Done,
            b'I' => FrameKind::Input,
            b'J' => FrameKind::InputEnd,
            b'K' => FrameKind::Signal,
            b'W' => FrameKind::Resize,
            b'X' => FrameKind::Exited,
            _ => return None,
        })
    }
}

/// One execution, as the supervisor receives it. Every value is already validated and clamped
/// by the executor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSpec {
    pub version: u32,
    /// The program and its arguments, e.g. `["python3", "-u", "/tmp/.sandmesh/main.py"]`.
    pub argv: Vec<String>,
    /// The argument of `argv` that stands for the code: the supervisor replaces it with the
    /// path of a sealed descriptor holding `code` (`/proc/self/fd/N`), which the program
    /// inherits and nothing can rewrite. No file is written.
    pub code_path: String,
    pub code: String,
    #[serde(default)]
    pub stdin: Option<String>,
    /// The program's whole environment: nothing of the exec's own environment is inherited.
    pub env: Vec<(String, String)>,
    /// The working directory, also the root the archive is unpacked into and diffed.
    pub workspace: String,
    pub timeout_ms: u64,
    /// Cap on stdout + stderr together; beyond it the output is cut and the program killed.
    pub max_output_bytes: u64,
    /// `RLIMIT_NOFILE` and `RLIMIT_FSIZE` for the program (the container has the same ulimits;
    /// this is a second fence).
    pub nofile: u64,
    pub fsize_bytes: u64,
    /// Largest total size of the changed files sent back; the rest is reported as skipped.
    /// 0: the run's changes are not kept (it has no workspace), so none are listed either.
    pub max_changes_bytes: u64,
    /// The container's egress socket (bind-mounted), when its run has a network policy: the
    /// supervisor relays `127.0.0.1:`[`EGRESS_PROXY_PORT`] to it for the run's duration and
    /// points the program's proxy variables there. Absent: no network at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_socket: Option<String>,
    /// Run `code` as a cell of the container's kernel for this language (started by the
    /// resident supervisor on first use, kept between runs) instead of as a fresh program;
    /// `argv` and `stdin` are then unused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelLanguage>,
}

/// A session's background process, as its proc host receives it. Every value is already
/// validated and clamped by the executor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcSpec {
    pub version: u32,
    /// The program and its arguments.
    pub argv: Vec<String>,
    /// The program's whole environment.
    pub env: Vec<(String, String)>,
    /// The working directory (absolute).
    pub cwd: String,
    /// Keep stdin open for `Input` frames (otherwise `/dev/null`).
    #[serde(default)]
    pub stdin: bool,
    /// Run it in a pseudo-terminal of this size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<PtyWinsize>,
    pub nofile: u64,
    pub fsize_bytes: u64,
    /// The process's own egress socket, when the session has a network policy: the proc host
    /// relays a loopback port of its own (not [`EGRESS_PROXY_PORT`], which runs use) to it
    /// while the process lives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_socket: Option<String>,
}

/// A terminal's size in cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtyWinsize {
    pub cols: u16,
    pub rows: u16,
}

/// How a background process ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ProcEnd {
    Exited {
        code: i32,
    },
    Signaled {
        signal: i32,
    },
    /// It could not be started (or its request was unusable).
    Failed {
        message: String,
    },
}

/// The languages a kernel runs; a container has at most one kernel of each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KernelLanguage {
    Python,
    Javascript,
}

impl KernelLanguage {
    pub const fn as_str(self) -> &'static str {
        match self {
            KernelLanguage::Python => "python",
            KernelLanguage::Javascript => "javascript",
        }
    }
}

/// A cell's rich output larger than this (encoded) is written to the workspace's
/// [`ARTIFACTS_DIR`] and named by path instead of travelling inline.
pub const INLINE_OUTPUT_MAX: usize = 128 * 1024;

/// Where a cell's large rich outputs go, relative to the workspace.
pub const ARTIFACTS_DIR: &str = "artifacts";

/// The MIME types a cell's rich output may carry; anything else the kernel says is dropped.
pub const OUTPUT_MIME_TYPES: &[&str] =
    &["text/plain", "text/html", "image/png", "application/json"];

/// Where a rich output came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputKind {
    /// The value of the cell's last expression.
    Result,
    /// A `display(...)` call or a captured figure.
    Display,
}

/// One typed output of a cell: inline `content` (text, or base64 for binary types), or the
/// workspace-relative `path` of the artifact it was written to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RichOutput {
    pub kind: OutputKind,
    pub mime_type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// `content` is base64 (binary types).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub base64: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// The exception a cell raised.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CellError {
    pub name: String,
    pub value: String,
    #[serde(default)]
    pub traceback: Vec<String>,
}

/// The in-container TCP port of the egress relay (the conventional HTTP proxy port).
pub const EGRESS_PROXY_PORT: u16 = 3128;

/// Where a session run leaves the manifest of the workspace as its changes left it (in `/tmp`,
/// which outlives runs but not the container). The next run that gets no archive takes it as
/// its baseline, so what the session's background processes wrote between runs is among that
/// run's changes; the executor removes it whenever it clears the workspace.
pub const PUSHED_MANIFEST: &str = "/tmp/.sandmesh-pushed.json";

/// Preview ports: where the host's ports socket appears inside a container (a directory of that
/// container alone, bind-mounted read-only). The host binds and listens; the resident supervisor
/// connects, so the host never connects to a path the sandbox could replace.
pub const PORTS_MOUNT: &str = "/run/sandmesh-ports";
/// The ports socket's file name in [`PORTS_MOUNT`].
pub const PORTS_SOCKET: &str = "ports.sock";
/// The supervisor keeps one connection to the ports socket waiting; on it the host writes the
/// port (2 bytes, big-endian), the supervisor dials `127.0.0.1:<port>` and answers one byte:
/// [`PORT_CONNECTED`] (then the connection is the tunnel's byte stream both ways) or
/// [`PORT_REFUSED`] (nothing listens there; the connection closes).
pub const PORT_CONNECTED: u8 = 0;
/// See [`PORT_CONNECTED`].
pub const PORT_REFUSED: u8 = 1;

/// Most changes (files created, modified and deleted) one run carries back, and most bytes
/// their names take in its report (as JSON strings). The report is one frame, and every later
/// hop carries the same list in one NATS message (the store's restore and its reply, the
/// result), so the list is bounded where the files are: changes past either bound are neither
/// packed nor listed but counted ([`RunReport::files_omitted`]), those nearest the workspace's
/// root kept first. With [`RunReport::files_skipped`] (a subset, listed again) and a kernel
/// cell's inline outputs the report stays within [`MAX_FRAME`].
pub const MAX_CHANGED_PATHS: usize = 10_000;
pub const MAX_CHANGE_LIST_BYTES: usize = 192 * 1024;

/// Bytes the changes archive may hold on top of the files' content: per file a header, a GNU
/// long-name record (a header and the name, each padded to 512 bytes) and the content's
/// padding; the names themselves; the end-of-archive blocks.
pub const CHANGES_ARCHIVE_OVERHEAD: u64 =
    MAX_CHANGED_PATHS as u64 * 4 * 512 + MAX_CHANGE_LIST_BYTES as u64 + 4 * 1024;

/// The exit code of `sandmesh-supervisor launch` when it failed before starting its program
/// (as `env` and `nohup` do): the bwrap-executor tells it from bwrap's own failures.
pub const LAUNCH_FAILED: u8 = 125;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Outcome {
    /// The program exited by itself.
    Exited { code: i32 },
    /// The program was killed by a signal the supervisor did not send.
    Signaled { signal: i32 },
    /// The wall-clock timeout fired; everything was killed.
    Timeout,
    /// Output went past the cap; it was cut and everything was killed.
    OutputLimit,
    /// The program could not be started (or the request was unusable).
    Failed { message: String },
    /// The kernel died during the cell (killed, OOM, or it killed itself); it is started
    /// anew, without its state, for the next cell.
    KernelDied,
}

/// How an execution ended, sent as the last frame.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    pub outcome: Outcome,
    /// The memory cgroup's OOM killer fired during the run.
    #[serde(default)]
    pub oom_killed: bool,
    /// A fork failed because the pids cgroup limit was reached.
    #[serde(default)]
    pub pids_limit_hit: bool,
    #[serde(default)]
    pub peak_memory_bytes: u64,
    #[serde(default)]
    pub cpu_ms: u64,
    /// From program start to its end (or kill).
    #[serde(default)]
    pub wall_ms: u64,
    #[serde(default)]
    pub stdout_truncated: bool,
    #[serde(default)]
    pub stderr_truncated: bool,
    /// Workspace-relative paths, sorted.
    #[serde(default)]
    pub files_created: Vec<String>,
    #[serde(default)]
    pub files_modified: Vec<String>,
    #[serde(default)]
    pub files_deleted: Vec<String>,
    /// Changed files left out of the changes archive (too large in total).
    #[serde(default)]
    pub files_skipped: Vec<String>,
    /// Changes past [`MAX_CHANGED_PATHS`] or [`MAX_CHANGE_LIST_BYTES`]: neither packed nor
    /// listed.
    #[serde(default)]
    pub files_omitted: u64,
    /// Processes still found (and killed) after the program ended: background or daemonised
    /// children.
    #[serde(default)]
    pub processes_killed: u32,
    /// Problems that did not stop the run (an unwritable path in the archive, ...).
    #[serde(default)]
    pub warnings: Vec<String>,
    /// A kernel cell's typed outputs, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outputs: Vec<RichOutput>,
    /// The exception a kernel cell raised.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cell_error: Option<CellError>,
    /// The cell ran in a kernel started anew because the previous one had died: the
    /// variables of earlier cells are gone.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub state_lost: bool,
}

impl RunReport {
    pub fn failed(message: impl Into<String>) -> Self {
        Self {
            outcome: Outcome::Failed {
                message: message.into(),
            },
            oom_killed: false,
            pids_limit_hit: false,
            peak_memory_bytes: 0,
            cpu_ms: 0,
            wall_ms: 0,
            stdout_truncated: false,
            stderr_truncated: false,
            files_created: Vec::new(),
            files_modified: Vec::new(),
            files_deleted: Vec::new(),
            files_skipped: Vec::new(),
            files_omitted: 0,
            processes_killed: 0,
            warnings: Vec::new(),
            outputs: Vec::new(),
            cell_error: None,
            state_lost: false,
        }
    }
}

/// Writes one frame (not flushed).
pub fn write_frame(w: &mut impl Write, kind: FrameKind, payload: &[u8]) -> io::Result<()> {
    if payload.len() > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            FrameError::TooLarge(payload.len()),
        ));
    }
    let mut header = [0u8; HEADER_LEN];
    header[0] = kind.byte();
    header[1..].copy_from_slice(&(payload.len() as u32).to_be_bytes());
    w.write_all(&header)?;
    w.write_all(payload)
}

/// Writes `data` as as many frames of `kind` as needed.
pub fn write_chunked(w: &mut impl Write, kind: FrameKind, data: &[u8]) -> io::Result<()> {
    for chunk in data.chunks(MAX_FRAME) {
        write_frame(w, kind, chunk)?;
    }
    Ok(())
}

/// Encodes one frame into a new buffer.
pub fn encode_frame(kind: FrameKind, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    // Writing into a Vec cannot fail; oversized payloads are a caller bug caught by tests.
    write_frame(&mut out, kind, payload).expect("frame fits");
    out
}

/// Reads one frame; `Ok(None)` at a clean end of stream.
pub fn read_frame(r: &mut impl Read) -> io::Result<Option<(FrameKind, Vec<u8>)>> {
    let mut header = [0u8; HEADER_LEN];
    let mut filled = 0;
    while filled < HEADER_LEN {
        let n = r.read(&mut header[filled..])?;
        if n == 0 {
            return if filled == 0 {
                Ok(None)
            } else {
                Err(io::ErrorKind::UnexpectedEof.into())
            };
        }
        filled += n;
    }
    let (kind, len) =
        parse_header(&header).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload)?;
    Ok(Some((kind, payload)))
}

/// Checks a frame header: a known kind and a length within [`MAX_FRAME`].
pub fn parse_header(header: &[u8; HEADER_LEN]) -> Result<(FrameKind, usize), FrameError> {
    let kind = FrameKind::from_byte(header[0]).ok_or(FrameError::UnknownKind(header[0]))?;
    let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    if len > MAX_FRAME {
        return Err(FrameError::TooLarge(len));
    }
    Ok((kind, len))
}

/// Splits a byte stream that arrives in arbitrary pieces (Docker's exec stream) into frames.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    start: usize,
}

impl FrameDecoder {
    /// No bytes are waiting: the stream is at a frame boundary.
    pub fn is_empty(&self) -> bool {
        self.start == self.buf.len()
    }

    pub fn push(&mut self, data: &[u8]) {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        self.buf.extend_from_slice(data);
    }

    /// The next complete frame, `Ok(None)` when more bytes are needed, or an error for a
    /// malformed header (the stream cannot be resynchronised after that).
    pub fn next_frame(&mut self) -> Result<Option<(FrameKind, Vec<u8>)>, FrameError> {
        let avail = &self.buf[self.start..];
        if avail.len() < HEADER_LEN {
            return Ok(None);
        }
        let header: [u8; HEADER_LEN] = avail[..HEADER_LEN].try_into().expect("header length");
        let (kind, len) = parse_header(&header)?;
        if avail.len() < HEADER_LEN + len {
            return Ok(None);
        }
        let payload = avail[HEADER_LEN..HEADER_LEN + len].to_vec();
        self.start += HEADER_LEN + len;
        if self.start > MAX_FRAME {
            // Compact now and then so the buffer does not grow with the whole stream.
            self.buf.drain(..self.start);
            self.start = 0;
        }
        Ok(Some((kind, payload)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_through_any_split() {
        let mut wire = Vec::new();
        write_frame(&mut wire, FrameKind::Stdout, b"hello").unwrap();
        write_frame(&mut wire, FrameKind::Stderr, b"").unwrap();
        write_chunked(&mut wire, FrameKind::Changes, &vec![7u8; MAX_FRAME + 10]).unwrap();
        for split in [1, 3, 5, 4096, wire.len()] {
            let mut d = FrameDecoder::default();
            let mut got = Vec::new();
            for piece in wire.chunks(split) {
                d.push(piece);
                while let Some((k, p)) = d.next_frame().unwrap() {
                    got.push((k, p.len()));
                }
            }
            assert_eq!(
                got,
                vec![
                    (FrameKind::Stdout, 5),
                    (FrameKind::Stderr, 0),
                    (FrameKind::Changes, MAX_FRAME),
                    (FrameKind::Changes, 10)
                ],
                "split {split}"
            );
        }
        let mut r = &wire[..];
        assert_eq!(read_frame(&mut r).unwrap().unwrap().1, b"hello");
    }

    #[test]
    fn hostile_headers_are_refused() {
        let mut d = FrameDecoder::default();
        d.push(&[b'O', 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(d.next_frame(), Err(FrameError::TooLarge(u32::MAX as usize)));
        let mut d = FrameDecoder::default();
        d.push(&[b'?', 0, 0, 0, 1, 0]);
        assert_eq!(d.next_frame(), Err(FrameError::UnknownKind(b'?')));
        let err = write_frame(&mut Vec::new(), FrameKind::Stdout, &vec![0; MAX_FRAME + 1]);
        assert_eq!(err.unwrap_err().kind(), io::ErrorKind::InvalidInput);
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        const KINDS: [FrameKind; 16] = [
            FrameKind::Request,
            FrameKind::Archive,
            FrameKind::Files,
            FrameKind::End,
            FrameKind::Stdout,
            FrameKind::Stderr,
            FrameKind::Changes,
            FrameKind::Report,
            FrameKind::Ready,
            FrameKind::Started,
            FrameKind::Done,
            FrameKind::Input,
            FrameKind::InputEnd,
            FrameKind::Signal,
            FrameKind::Resize,
            FrameKind::Exited,
        ];

        fn frames() -> impl Strategy<Value = Vec<(FrameKind, Vec<u8>)>> {
            let frame = (
                proptest::sample::select(&KINDS[..]),
                proptest::collection::vec(any::<u8>(), 0..600),
            );
            proptest::collection::vec(frame, 0..12)
        }

        /// Feeds `wire` to a decoder in pieces cut at `cuts` (positions, any order).
        fn decode_in_pieces(
            wire: &[u8],
            cuts: &[usize],
        ) -> Result<Vec<(FrameKind, Vec<u8>)>, FrameError> {
            let mut at: Vec<usize> = cuts.iter().map(|c| c % (wire.len() + 1)).collect();
            at.push(0);
            at.push(wire.len());
            at.sort_unstable();
            let mut decoder = FrameDecoder::default();
            let mut out = Vec::new();
            for piece in at.windows(2) {
                decoder.push(&wire[piece[0]..piece[1]]);
                while let Some(frame) = decoder.next_frame()? {
                    out.push(frame);
                }
            }
            Ok(out)
        }

        proptest! {
            #[test]
            fn any_split_of_the_stream_decodes_to_the_same_frames(
                frames in frames(),
                cuts in proptest::collection::vec(any::<usize>(), 0..40),
            ) {
                let mut wire = Vec::new();
                for (kind, payload) in &frames {
                    write_frame(&mut wire, *kind, payload).unwrap();
                }
                prop_assert_eq!(decode_in_pieces(&wire, &cuts), Ok(frames.clone()));
                let mut reader = &wire[..];
                let mut read = Vec::new();
                while let Some(frame) = read_frame(&mut reader).unwrap() {
                    read.push(frame);
                }
                prop_assert_eq!(read, frames);
            }

            #[test]
            fn garbage_never_panics_and_never_yields_an_oversized_frame(
                garbage in proptest::collection::vec(any::<u8>(), 0..4096),
                cuts in proptest::collection::vec(any::<usize>(), 0..20),
            ) {
                if let Ok(frames) = decode_in_pieces(&garbage, &cuts) {
                    prop_assert!(frames.iter().all(|(_, p)| p.len() <= MAX_FRAME));
                }
                let mut reader = &garbage[..];
                while let Ok(Some((_, payload))) = read_frame(&mut reader) {
                    prop_assert!(payload.len() <= MAX_FRAME);
                }
            }
        }
    }
}
