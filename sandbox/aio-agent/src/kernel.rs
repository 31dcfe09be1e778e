//! Long-lived interpreters for `/v1/jupyter/*`, stateful `/v1/code/execute` and stateful
//! `/v1/nodejs/execute`: one kernel per session, so `x = 41` in one call and `print(x + 1)`
//! in the next prints 42.
//!
//! The kernels are the supervisor's drivers (the `sandmesh-kernel` crate): stdlib Python and
//! plain Node speaking JSON lines,
//! no ipykernel (not in the image, slow to start, a five-socket protocol). The Python driver
//! runs as `python3 -c <driver>`; the JavaScript one needs its output pipes handed over as
//! extra fds (Node cannot re-point its own), which `NODE_LAUNCHER` sets up before it becomes
//! `node` (the workspace forbids the `unsafe` a `pre_exec` would take).
//!
//! Nothing a kernel says is trusted: event lines are bounded, output is capped per cell, and a
//! kernel that dies, floods or ignores an interrupt is killed with its process group; the
//! session then starts a new kernel on its next call and says the state was lost.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use sandbox_protocol::{CellError, OutputKind, RichOutput};
use sandmesh_kernel::{Event, JAVASCRIPT_DRIVER, PYTHON_DRIVER};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin};
use tokio::sync::mpsc;

/// Becomes `node -e <driver>` with the fds `kernel.js` expects: the event pipe moved off
/// fd 1, fds 1 and 2 new pipes whose non-blocking read ends the driver drains.
const NODE_LAUNCHER: &str = r#"import os, sys
events = os.dup(1)
out_r, out_w = os.pipe()
err_r, err_w = os.pipe()
os.dup2(out_w, 1); os.dup2(err_w, 2); os.close(out_w); os.close(err_w)
for fd in (out_r, err_r): os.set_blocking(fd, False)
for fd in (events, out_r, err_r): os.set_inheritable(fd, True)
os.environ["SANDMESH_KERNEL_FDS"] = "%d,%d,%d" % (events, out_r, err_r)
os.execvp("node", ["node", "-e", sys.argv[1]])
"#;

/// How long an interrupted cell may take to stop before its kernel is killed.
const INTERRUPT_GRACE: Duration = Duration::from_secs(2);
/// Longest session id accepted.
const MAX_SESSION_ID: usize = 128;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Language {
    Python,
    Javascript,
}

impl Language {
    pub fn kernel_name(self) -> &'static str {
        match self {
            Language::Python => "python3",
            Language::Javascript => "javascript",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("session id must be 1 to {MAX_SESSION_ID} characters of A-Z a-z 0-9 _ . -")]
    BadSessionId,
    #[error("{0} sessions are running, all busy: close one first")]
    TooManySessions(usize),
    #[error("no session {0}")]
    NoSession(String),
    #[error("starting the {language} kernel")]
    Start {
        language: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// What a cell produced, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum CellOutput {
    Stream {
        name: String,
        text: String,
    },
    /// One object's representations; a representation too large to inline was saved by the
    /// kernel and is named by `path` instead.
    Rich {
        kind: OutputKind,
        data: Vec<(String, String)>,
        paths: Vec<(String, String)>,
    },
    Error {
        name: String,
        value: String,
        traceback: Vec<String>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CellStatus {
    Ok,
    Error,
    Timeout,
}

impl CellStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            CellStatus::Ok => "ok",
            CellStatus::Error => "error",
            CellStatus::Timeout => "timeout",
        }
    }
}

#[derive(Debug, Clone)]
pub struct CellResult {
    pub session_id: String,
    pub status: CellStatus,
    pub outputs: Vec<CellOutput>,
    pub execution_count: u64,
    /// The session's previous kernel had died: this cell ran in a new one.
    pub state_lost: bool,
    /// Output past the cap was dropped.
    pub truncated: bool,
}

impl CellResult {
    /// All stream text of one name, in order.
    pub fn stream(&self, which: &str) -> String {
        self.outputs
            .iter()
            .filter_map(|o| match o {
                CellOutput::Stream { name, text } if name == which => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }
}

/// Limits every kernel shares.
#[derive(Debug, Clone)]
pub struct KernelConfig {
    /// Where large rich outputs are saved (`artifacts/` below it).
    pub workspace: PathBuf,
    /// Bytes of output (streams and inline outputs together) kept per cell.
    pub max_output_bytes: usize,
    pub max_sessions: usize,
    pub idle_timeout: Duration,
}

// === impl Kernel ===

/// A running driver, its process group killed on drop.
struct Kernel {
    child: Child,
    requests: ChildStdin,
    events: mpsc::Receiver<Option<Event>>,
    pgid: Option<Pid>,
}

impl Drop for Kernel {
    fn drop(&mut self) {
        if let Some(pgid) = self.pgid {
            killpg(pgid, Signal::SIGKILL).ok();
        }
    }
}

/// What ended a cell other than its `done`.
enum Ended {
    Done,
    /// The kernel is gone or misbehaved: it must be replaced.
    Dead,
}

impl Kernel {
    fn start(language: Language, cwd: &Path, event_line_max: usize) -> std::io::Result<Self> {
        let mut command = match language {
            Language::Python => {
                let mut c = tokio::process::Command::new("python3");
                c.args(["-c", PYTHON_DRIVER]);
                c
            }
            Language::Javascript => {
                let mut c = tokio::process::Command::new("python3");
                c.args(["-c", NODE_LAUNCHER, JAVASCRIPT_DRIVER]);
                c
            }
        };
        let mut child = command
            .current_dir(cwd)
            .env_remove(crate::exec::API_KEY_VAR)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()?;
        let pgid = child.id().map(|id| Pid::from_raw(id as i32));
        let requests = child.stdin.take().expect("stdin is piped");
        let stdout = child.stdout.take().expect("stdout is piped");
        let (tx, events) = mpsc::channel(64);
        tokio::spawn(read_events(stdout, tx, event_line_max));
        Ok(Self {
            child,
            requests,
            events,
            pgid,
        })
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_none()
    }

    /// Runs one cell; at `timeout` the kernel gets SIGINT, and if the cell has not ended
    /// within `INTERRUPT_GRACE` after that the kernel is declared dead.
    async fn run(
        &mut self,
        code: &str,
        config: &KernelConfig,
        timeout: Duration,
        out: &mut CellCollector,
    ) -> (Ended, bool) {
        let request = serde_json::json!({
            "id": "cell",
            "code": code,
            "workspace": config.workspace,
            "inline_max": config.max_output_bytes,
        });
        let mut line = serde_json::to_vec(&request).expect("a JSON value encodes");
        line.push(b'\n');
        if self.requests.write_all(&line).await.is_err() || self.requests.flush().await.is_err() {
            return (Ended::Dead, false);
        }
        let mut deadline = tokio::time::Instant::now() + timeout;
        let mut interrupted = false;
        loop {
            tokio::select! {
                event = self.events.recv() => match event {
                    Some(Some(Event::Done { .. })) => return (Ended::Done, interrupted),
                    Some(Some(event)) => out.push(event),
                    // A malformed or oversized line: the driver never writes one.
                    Some(None) | None => return (Ended::Dead, interrupted),
                },
                () = tokio::time::sleep_until(deadline) => {
                    if interrupted {
                        return (Ended::Dead, true);
                    }
                    interrupted = true;
                    if let Some(id) = self.child.id() {
                        kill(Pid::from_raw(id as i32), Signal::SIGINT).ok();
                    }
                    deadline = tokio::time::Instant::now() + INTERRUPT_GRACE;
                }
            }
        }
    }
}

/// Forwards the driver's events; `None` for a line that is too long or not an event, then
/// stops (the kernel is killed by its owner).
async fn read_events(
    stdout: tokio::process::ChildStdout,
    tx: mpsc::Sender<Option<Event>>,
    max: usize,
) {
    let mut reader = BufReader::new(stdout);
    let mut line = Vec::new();
    loop {
        line.clear();
        match (&mut reader)
            .take(max as u64 + 1)
            .read_until(b'\n', &mut line)
            .await
        {
            Ok(0) | Err(_) => return,
            Ok(_) if line.last() != Some(&b'\n') => {
                tx.send(None).await.ok();
                return;
            }
            Ok(_) => {}
        }
        let event = match serde_json::from_slice::<serde_json::Value>(&line) {
            Ok(value) => match serde_json::from_value::<Event>(value) {
                Ok(event) => event,
                // A well-formed line of a kind this agent does not know.
                Err(_) => continue,
            },
            Err(_) => {
                tx.send(None).await.ok();
                return;
            }
        };
        if tx.send(Some(event)).await.is_err() {
            return;
        }
    }
}

/// Gathers a cell's events into outputs under the byte cap.
struct CellCollector {
    outputs: Vec<CellOutput>,
    room: usize,
    truncated: bool,
    failed: bool,
}

impl CellCollector {
    fn new(cap: usize) -> Self {
        Self {
            outputs: Vec::new(),
            room: cap,
            truncated: false,
            failed: false,
        }
    }

    /// Takes up to `room` bytes of `text` (on a char boundary).
    fn fit(&mut self, text: String) -> Option<String> {
        if text.len() <= self.room {
            self.room -= text.len();
            return Some(text);
        }
        self.truncated = true;
        let mut end = self.room;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        self.room -= end;
        (end > 0).then(|| text[..end].to_string())
    }

    fn push(&mut self, event: Event) {
        match event {
            Event::Stream { name, text } => {
                let Some(text) = self.fit(text) else { return };
                match self.outputs.last_mut() {
                    Some(CellOutput::Stream {
                        name: last,
                        text: t,
                    }) if *last == name => t.push_str(&text),
                    _ => self.outputs.push(CellOutput::Stream { name, text }),
                }
            }
            Event::Output(RichOutput {
                kind,
                mime_type,
                content,
                path,
                ..
            }) => {
                // One object's representations arrive one after another; a MIME type seen
                // again (or another kind) starts the next object.
                let starts_new = match self.outputs.last() {
                    Some(CellOutput::Rich {
                        kind: k,
                        data,
                        paths,
                    }) => *k != kind || data.iter().chain(paths).any(|(m, _)| *m == mime_type),
                    _ => true,
                };
                if starts_new {
                    self.outputs.push(CellOutput::Rich {
                        kind,
                        data: Vec::new(),
                        paths: Vec::new(),
                    });
                }
                let Some(CellOutput::Rich { data, paths, .. }) = self.outputs.last_mut() else {
                    unreachable!("a rich output was just pushed")
                };
                match (content, path) {
                    (Some(content), _) => {
                        if content.len() <= self.room {
                            self.room -= content.len();
                            data.push((mime_type, content));
                        } else {
                            self.truncated = true;
                        }
                    }
                    (None, Some(path)) => paths.push((mime_type, path)),
                    (None, None) => {}
                }
            }
            Event::Error(CellError {
                name,
                value,
                traceback,
            }) => {
                self.failed = true;
                let value = self.fit(value).unwrap_or_default();
                let traceback = traceback.into_iter().filter_map(|l| self.fit(l)).collect();
                self.outputs.push(CellOutput::Error {
                    name,
                    value,
                    traceback,
                });
            }
            // One cell runs at a time, so its `done` needs no id; a fence is never the driver's.
            Event::Done { .. } | Event::Fence { .. } => {}
        }
    }
}

// === impl Kernels ===

/// A session: its kernel (started on first use, replaced when it died) and bookkeeping.
pub struct Session {
    language: Language,
    kernel: Option<Kernel>,
    cwd: PathBuf,
    executions: u64,
    /// A kernel of this session died: the next cell says so.
    lost: bool,
}

/// The session table entry: the session behind its own lock (a cell holds it while it
/// runs), and when it was last used, readable without that lock.
struct Entry {
    language: Language,
    session: Arc<tokio::sync::Mutex<Session>>,
    last_used: Instant,
    last_used_wall: SystemTime,
}

/// What `/v1/jupyter/sessions` and `/v1/nodejs/sessions` list.
#[derive(Debug, Clone)]
pub struct SessionSummary {
    pub id: String,
    pub language: Language,
    pub last_used: SystemTime,
    pub idle: Duration,
}

/// Every session of the agent.
pub struct Kernels {
    config: KernelConfig,
    sessions: Mutex<HashMap<String, Entry>>,
}

impl Kernels {
    pub fn new(config: KernelConfig) -> Self {
        Self {
            config,
            sessions: Mutex::new(HashMap::new()),
        }
    }

    pub fn config(&self) -> &KernelConfig {
        &self.config
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The session `id` (made with `cwd` when new; a new id when none is given), and whether
    /// it was created now. Idle sessions past the timeout go first; at the cap the least
    /// recently used idle one makes room.
    pub fn open(
        &self,
        language: Language,
        id: Option<&str>,
        cwd: &Path,
    ) -> Result<(String, Arc<tokio::sync::Mutex<Session>>, bool), KernelError> {
        let id = match id {
            Some(id) => valid_session_id(id)?.to_string(),
            None => crate::api::next_id(language.kernel_name()),
        };
        let mut table = self.table();
        let now = Instant::now();
        table.retain(|_, e| {
            now.duration_since(e.last_used) < self.config.idle_timeout
                || e.session.try_lock().is_err()
        });
        if let Some(entry) = table.get_mut(&id) {
            if entry.language != language {
                return Err(KernelError::NoSession(format!(
                    "{id} (it is a {} session)",
                    entry.language.kernel_name()
                )));
            }
            entry.last_used = now;
            entry.last_used_wall = SystemTime::now();
            return Ok((id, entry.session.clone(), false));
        }
        if table.len() >= self.config.max_sessions {
            let idle_lru = table
                .iter()
                .filter(|(_, e)| e.session.try_lock().is_ok())
                .min_by_key(|(_, e)| e.last_used)
                .map(|(k, _)| k.clone());
            match idle_lru {
                Some(k) => {
                    table.remove(&k);
                }
                None => return Err(KernelError::TooManySessions(table.len())),
            }
        }
        let session = Arc::new(tokio::sync::Mutex::new(Session {
            language,
            kernel: None,
            cwd: cwd.to_path_buf(),
            executions: 0,
            lost: false,
        }));
        table.insert(
            id.clone(),
            Entry {
                language,
                session: session.clone(),
                last_used: now,
                last_used_wall: SystemTime::now(),
            },
        );
        Ok((id, session, true))
    }

    /// Starts the session's kernel now (session creation does, so its first cell is fast).
    pub async fn warm(
        &self,
        session: &Arc<tokio::sync::Mutex<Session>>,
    ) -> Result<(), KernelError> {
        let mut s = session.lock().await;
        self.ensure_kernel(&mut s).map(|_| ())
    }

    fn ensure_kernel<'a>(&self, s: &'a mut Session) -> Result<&'a mut Kernel, KernelError> {
        if s.kernel.as_mut().is_some_and(|k| !k.alive()) {
            s.kernel = None;
            s.lost = true;
        }
        if s.kernel.is_none() {
            // The driver's largest line is one inline output, JSON-escaped (up to 6 bytes
            // per byte), plus its envelope.
            let line_max = self.config.max_output_bytes * 6 + 64 * 1024;
            let kernel = Kernel::start(s.language, &s.cwd, line_max).map_err(|source| {
                KernelError::Start {
                    language: s.language.kernel_name(),
                    source,
                }
            })?;
            s.kernel = Some(kernel);
        }
        Ok(s.kernel.as_mut().expect("just ensured"))
    }

    /// Runs `code` in session `id` (opened when needed).
    pub async fn execute(
        &self,
        language: Language,
        id: Option<&str>,
        cwd: &Path,
        code: &str,
        timeout: Duration,
    ) -> Result<CellResult, KernelError> {
        let (id, session, _) = self.open(language, id, cwd)?;
        let mut s = session.lock().await;
        let mut out = CellCollector::new(self.config.max_output_bytes);
        let kernel = self.ensure_kernel(&mut s)?;
        let (ended, interrupted) = kernel.run(code, &self.config, timeout, &mut out).await;
        if let Ended::Dead = ended {
            s.kernel = None;
            out.failed = true;
            out.outputs.push(CellOutput::Error {
                name: "KernelDied".into(),
                value: "the kernel exited or stopped answering; its state is lost and the \
                        session's next execution starts a new kernel"
                    .into(),
                traceback: Vec::new(),
            });
        }
        s.executions += 1;
        let state_lost = std::mem::take(&mut s.lost);
        if let Ended::Dead = ended {
            s.lost = true;
        }
        let status = match (interrupted, out.failed) {
            (true, _) => CellStatus::Timeout,
            (false, true) => CellStatus::Error,
            (false, false) => CellStatus::Ok,
        };
        Ok(CellResult {
            session_id: id,
            status,
            outputs: out.outputs,
            execution_count: s.executions,
            state_lost,
            truncated: out.truncated,
        })
    }

    pub fn list(&self, language: Language) -> Vec<SessionSummary> {
        let now = Instant::now();
        let mut list: Vec<_> = self
            .table()
            .iter()
            .filter(|(_, e)| e.language == language)
            .map(|(id, e)| SessionSummary {
                id: id.clone(),
                language,
                last_used: e.last_used_wall,
                idle: now.duration_since(e.last_used),
            })
            .collect();
        list.sort_by(|a, b| a.id.cmp(&b.id));
        list
    }

    /// Ends a session (its kernel is killed when a running cell lets go of it).
    pub fn close(&self, language: Language, id: &str) -> Result<(), KernelError> {
        let mut table = self.table();
        if !table.get(id).is_some_and(|e| e.language == language) {
            return Err(KernelError::NoSession(id.to_string()));
        }
        table.remove(id);
        Ok(())
    }

    /// Ends every session of `language`.
    pub fn close_all(&self, language: Language) -> usize {
        let mut table = self.table();
        let before = table.len();
        table.retain(|_, e| e.language != language);
        before - table.len()
    }
}

fn valid_session_id(id: &str) -> Result<&str, KernelError> {
    let ok = !id.is_empty()
        && id.len() <= MAX_SESSION_ID
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    ok.then_some(id).ok_or(KernelError::BadSessionId)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernels(dir: &Path) -> Kernels {
        Kernels::new(KernelConfig {
            workspace: dir.to_path_buf(),
            max_output_bytes: 4096,
            max_sessions: 2,
            idle_timeout: Duration::from_secs(600),
        })
    }

    #[tokio::test]
    async fn a_python_session_keeps_state_and_types_its_outputs() {
        let dir = tempfile::tempdir().unwrap();
        let k = kernels(dir.path());
        let t = Duration::from_secs(20);
        let py = Language::Python;
        let first = k
            .execute(py, Some("s1"), dir.path(), "x = 41\nprint('hi')", t)
            .await
            .unwrap();
        assert_eq!(first.status, CellStatus::Ok, "{first:?}");
        assert_eq!(first.stream("stdout"), "hi\n");
        let second = k
            .execute(py, Some("s1"), dir.path(), "x + 1", t)
            .await
            .unwrap();
        assert_eq!(second.execution_count, 2);
        assert!(matches!(
            &second.outputs[..],
            [CellOutput::Rich { kind, data, .. }] if *kind == OutputKind::Result
                && data == &[("text/plain".to_string(), "42".to_string())]
        ));
        let other = k.execute(py, Some("s2"), dir.path(), "x", t).await.unwrap();
        assert_eq!(other.status, CellStatus::Error);
        assert!(
            matches!(&other.outputs.last(), Some(CellOutput::Error { name, .. }) if name == "NameError")
        );
    }

    #[tokio::test]
    async fn a_killed_kernel_is_replaced_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let k = kernels(dir.path());
        let t = Duration::from_secs(20);
        let py = Language::Python;
        k.execute(py, Some("s"), dir.path(), "x = 1", t)
            .await
            .unwrap();
        let died = k
            .execute(
                py,
                Some("s"),
                dir.path(),
                "import os; os.kill(os.getpid(), 9)",
                t,
            )
            .await
            .unwrap();
        assert_eq!(died.status, CellStatus::Error);
        let after = k
            .execute(py, Some("s"), dir.path(), "print('x' in dir())", t)
            .await
            .unwrap();
        assert!(after.state_lost);
        assert_eq!(after.stream("stdout"), "False\n");
    }

    #[tokio::test]
    async fn a_timeout_interrupts_the_cell_and_keeps_the_kernel() {
        let dir = tempfile::tempdir().unwrap();
        let k = kernels(dir.path());
        let py = Language::Python;
        k.execute(py, Some("s"), dir.path(), "y = 7", Duration::from_secs(20))
            .await
            .unwrap();
        let looped = k
            .execute(
                py,
                Some("s"),
                dir.path(),
                "while True: pass",
                Duration::from_millis(300),
            )
            .await
            .unwrap();
        assert_eq!(looped.status, CellStatus::Timeout);
        let after = k
            .execute(
                py,
                Some("s"),
                dir.path(),
                "print(y)",
                Duration::from_secs(20),
            )
            .await
            .unwrap();
        assert!(!after.state_lost);
        assert_eq!(after.stream("stdout"), "7\n");
    }

    #[tokio::test]
    async fn output_is_capped_and_sessions_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let k = kernels(dir.path());
        let t = Duration::from_secs(20);
        let py = Language::Python;
        let flood = k
            .execute(py, Some("a"), dir.path(), "print('x' * 100000)", t)
            .await
            .unwrap();
        assert!(flood.truncated);
        assert_eq!(flood.stream("stdout").len(), 4096);
        // Two sessions is the cap: a third evicts the least recently used one.
        k.execute(py, Some("b"), dir.path(), "1", t).await.unwrap();
        k.execute(py, Some("c"), dir.path(), "1", t).await.unwrap();
        let ids: Vec<_> = k.list(py).into_iter().map(|s| s.id).collect();
        assert_eq!(ids, ["b", "c"]);
        for bad in ["", "../x", "a b", &"x".repeat(200)] {
            assert!(matches!(
                k.open(py, Some(bad), dir.path()),
                Err(KernelError::BadSessionId)
            ));
        }
    }
}
