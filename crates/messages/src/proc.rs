//! Processes that outlive a run: a session's background processes (dev servers, watchers,
//! REPLs, terminals), started with `sandbox.v1.proc.start` and driven by the other
//! `sandbox.v1.proc.*` subjects until they exit or their session ends.
//!
//! A process belongs to exactly one session and dies with it (close, TTL, idle), never with a
//! client's connection. Its output is kept in a bounded ring of seq-numbered chunks: a client
//! reads from any seq it still holds and gets the same bytes again; `dropped_before` says where
//! the ring starts once it moved on. The same chunks are published live on
//! `sandbox.v1.output.<tenant>.<proc_id>` as [`ProcEvent`]s.
//!
//! Every id a caller names is scoped by its tenant through the session: another tenant's
//! session or process answers 404.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::exec::ContentEncoding;
use crate::tenancy::Tenant;
use crate::validate::{check_size, validate_env, validate_id, Ceilings, ValidationError};

/// Most arguments of an `argv`.
pub const MAX_ARGS: usize = 1024;
/// Most bytes of the command (`cmd`, or `argv` together).
pub const MAX_COMMAND_BYTES: usize = 64 * 1024;
/// Most bytes of one `input` (decoded).
pub const MAX_INPUT_BYTES: usize = 256 * 1024;
/// Most bytes of a tag and of a working directory.
pub const MAX_TAG_BYTES: usize = 128;
pub const MAX_CWD_BYTES: usize = 1024;
/// Most output bytes kept per process: older chunks are dropped first (`dropped_before`).
pub const OUTPUT_RING_BYTES: usize = 4 * 1024 * 1024;
/// Most bytes one `output` reply carries (a client pages on with `next_seq`).
pub const MAX_OUTPUT_REPLY_BYTES: u64 = 512 * 1024;
/// Longest a `wait` is held before it answers the process still running.
pub const MAX_WAIT_MS: u64 = 30_000;
/// Largest terminal, in cells each way.
pub const MAX_PTY_CELLS: u16 = 1000;

/// What to run: a shell command line (`bash -c`) or a program and its arguments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcCommand {
    Cmd(String),
    Argv(Vec<String>),
}

impl ProcCommand {
    /// The program and its arguments as the sandbox runs them.
    pub fn argv(&self) -> Vec<String> {
        match self {
            ProcCommand::Cmd(cmd) => vec!["bash".into(), "-c".into(), cmd.clone()],
            ProcCommand::Argv(argv) => argv.clone(),
        }
    }

    /// The command as shell text, for the risk assessor and a person deciding: `cmd`
    /// itself, or `argv` joined with spaces.
    pub fn shell_text(&self) -> String {
        match self {
            ProcCommand::Cmd(cmd) => cmd.clone(),
            ProcCommand::Argv(argv) => argv.join(" "),
        }
    }

    fn validate(&self) -> Result<(), ValidationError> {
        match self {
            ProcCommand::Cmd(cmd) => {
                if cmd.trim().is_empty() {
                    return Err(ValidationError::invalid("cmd", "must not be empty"));
                }
                check_size("cmd", cmd.len(), MAX_COMMAND_BYTES)?;
                no_nul("cmd", cmd)
            }
            ProcCommand::Argv(argv) => {
                if argv.first().is_none_or(|p| p.is_empty()) {
                    return Err(ValidationError::invalid("argv", "needs a program"));
                }
                if argv.len() > MAX_ARGS {
                    return Err(ValidationError::TooLarge {
                        field: "argv".into(),
                        size: argv.len(),
                        limit: MAX_ARGS,
                    });
                }
                let total = argv.iter().map(|a| a.len() + 1).sum();
                check_size("argv", total, MAX_COMMAND_BYTES)?;
                argv.iter().try_for_each(|a| no_nul("argv", a))
            }
        }
    }
}

fn no_nul(field: &str, text: &str) -> Result<(), ValidationError> {
    if text.contains('\0') {
        return Err(ValidationError::invalid(field, "NUL bytes are not allowed"));
    }
    Ok(())
}

/// A terminal's size in character cells.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PtySize {
    pub cols: u16,
    pub rows: u16,
}

impl PtySize {
    pub fn validate(&self) -> Result<(), ValidationError> {
        let ok = |n: u16| (1..=MAX_PTY_CELLS).contains(&n);
        if !ok(self.cols) || !ok(self.rows) {
            return Err(ValidationError::invalid(
                "pty",
                format!("cols and rows are 1..={MAX_PTY_CELLS}"),
            ));
        }
        Ok(())
    }
}

/// `sandbox.v1.proc.start`: starts a process in the session's sandbox. The command is
/// risk-assessed as shell code and, when the assessment asks for it, waits for a person's
/// approval (the reply comes once decided). On the wire the command is one of two fields
/// ([`wire::Start`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "wire::Start", into = "wire::Start")]
pub struct ProcStart {
    pub session_id: String,
    /// `"cmd": "npm run dev"` or `"argv": ["python3", "-m", "http.server"]`.
    pub command: ProcCommand,
    /// The working directory: absolute, or relative to the workspace (default: the workspace).
    pub cwd: Option<String>,
    /// Added to the sandbox's environment (the same rules as an execution's).
    pub env: BTreeMap<String, String>,
    /// Keep the process's stdin open for `proc.input` (without: `/dev/null`). A terminal
    /// always reads its input.
    pub stdin: bool,
    /// Run it in a pseudo-terminal of this size (stdout and stderr are then one stream).
    pub pty: Option<PtySize>,
    /// A name of the caller's choosing, shown by `proc.list`.
    pub tag: Option<String>,
    /// Killed after this long; 0 or absent: it may run as long as its session.
    pub timeout_ms: u64,
    /// Who asked (shown to a person deciding).
    pub requested_by: Option<String>,
}

/// The wire form of a [`ProcStart`]: the command is `cmd` or `argv`, two fields of which
/// exactly one is given. (`#[serde(flatten)]` of the command would read the same bytes, but
/// serde cannot refuse unknown fields beside a flattened one.)
pub mod wire {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Serialize};

    use super::{ProcCommand, ProcStart, PtySize};

    #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
    #[cfg_attr(feature = "openapi", schema(as = ProcStartFields))]
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Start {
        pub session_id: String,
        /// A command line, run by `bash -c`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub cmd: Option<String>,
        /// A program and its arguments.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub argv: Option<Vec<String>>,
        /// The working directory: absolute, or relative to the workspace (default: the
        /// workspace).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub cwd: Option<String>,
        /// Added to the sandbox's environment (the same rules as an execution's).
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        pub env: BTreeMap<String, String>,
        /// Keep the process's stdin open for `proc.input` (without: `/dev/null`).
        #[serde(default)]
        pub stdin: bool,
        /// Run it in a pseudo-terminal of this size.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub pty: Option<PtySize>,
        /// A name of the caller's choosing, shown by `proc.list`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub tag: Option<String>,
        /// Killed after this long; 0 or absent: it may run as long as its session.
        #[serde(default)]
        pub timeout_ms: u64,
        /// Who asked (shown to a person deciding).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub requested_by: Option<String>,
    }

    /// A start naming both commands or neither.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
    #[error("name the command as exactly one of `cmd` (a line for bash) and `argv` (a program and its arguments)")]
    pub struct NotOneCommand;

    impl TryFrom<Start> for ProcStart {
        type Error = NotOneCommand;

        fn try_from(w: Start) -> Result<Self, NotOneCommand> {
            let command = match (w.cmd, w.argv) {
                (Some(cmd), None) => ProcCommand::Cmd(cmd),
                (None, Some(argv)) => ProcCommand::Argv(argv),
                _ => return Err(NotOneCommand),
            };
            Ok(ProcStart {
                session_id: w.session_id,
                command,
                cwd: w.cwd,
                env: w.env,
                stdin: w.stdin,
                pty: w.pty,
                tag: w.tag,
                timeout_ms: w.timeout_ms,
                requested_by: w.requested_by,
            })
        }
    }

    impl From<ProcStart> for Start {
        fn from(s: ProcStart) -> Self {
            let (cmd, argv) = match s.command {
                ProcCommand::Cmd(cmd) => (Some(cmd), None),
                ProcCommand::Argv(argv) => (None, Some(argv)),
            };
            Start {
                session_id: s.session_id,
                cmd,
                argv,
                cwd: s.cwd,
                env: s.env,
                stdin: s.stdin,
                pty: s.pty,
                tag: s.tag,
                timeout_ms: s.timeout_ms,
                requested_by: s.requested_by,
            }
        }
    }
}

/// The schema of [`ProcStart`]: its wire form's fields, and exactly one of `cmd` and `argv`
/// given (not null).
#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for ProcStart {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{AllOfBuilder, ArrayBuilder, ObjectBuilder, OneOfBuilder};
        use utoipa::openapi::{RefOr, Schema, Type};
        let string = || ObjectBuilder::new().schema_type(Type::String);
        let given = |field: &str, schema: RefOr<Schema>| {
            ObjectBuilder::new().property(field, schema).required(field)
        };
        let argv = ArrayBuilder::new().items(string()).into();
        AllOfBuilder::new()
            .item(utoipa::openapi::Ref::from_schema_name("ProcStartFields"))
            .item(
                OneOfBuilder::new()
                    .item(given("cmd", string().into()))
                    .item(given("argv", argv)),
            )
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for ProcStart {
    fn schemas(
        schemas: &mut Vec<(
            String,
            utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
        )>,
    ) {
        use utoipa::PartialSchema;
        schemas.push(("ProcStartFields".into(), wire::Start::schema()));
        <wire::Start as utoipa::ToSchema>::schemas(schemas);
    }
}

impl ProcStart {
    /// Checks what the caller sent against the protocol's bounds and the mesh's ceilings.
    pub fn validate(&self, c: &Ceilings) -> Result<(), ValidationError> {
        validate_id("session_id", &self.session_id)?;
        self.command.validate()?;
        if let Some(cwd) = &self.cwd {
            check_size("cwd", cwd.len(), MAX_CWD_BYTES)?;
            no_nul("cwd", cwd)?;
        }
        validate_env(&self.env, c)?;
        if let Some(pty) = &self.pty {
            pty.validate()?;
        }
        if let Some(tag) = &self.tag {
            check_size("tag", tag.len(), MAX_TAG_BYTES)?;
            no_nul("tag", tag)?;
        }
        Ok(())
    }
}

/// The reply of `proc.start`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcStarted {
    pub proc_id: String,
    /// The process's pid inside the sandbox.
    pub pid: u32,
    /// Unix milliseconds.
    pub started_at: u64,
}

/// Names one process of a session: `proc.list` needs only the session (`proc_id` is then
/// ignored), the others both.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcRef {
    pub session_id: String,
    #[serde(default)]
    pub proc_id: String,
}

/// Checks the ids of a request naming a process.
pub fn validate_ids(session_id: &str, proc_id: &str) -> Result<(), ValidationError> {
    validate_id("session_id", session_id)?;
    validate_id("proc_id", proc_id)
}

/// Where a process is in its life.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcState {
    Running,
    /// It exited by itself (`exit_code`), or died of a signal nobody sent through
    /// `proc.signal` (`signal`).
    Exited,
    /// Killed: by `proc.signal`, its timeout, or the end of its session or sandbox.
    Killed,
}

/// One process as `proc.list`, `proc.wait` and `proc.signal` describe it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcInfo {
    pub proc_id: String,
    pub pid: u32,
    pub argv: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<PtySize>,
    pub state: ProcState,
    /// Its exit code, once it exited by itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that ended it, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Unix milliseconds.
    pub started_at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<u64>,
    /// The seq its next output chunk will get (all its output so far is below it).
    #[serde(default)]
    pub next_seq: u64,
}

/// The reply of `proc.list`: every process of the session, oldest first.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ProcList {
    pub procs: Vec<ProcInfo>,
}

/// `sandbox.v1.proc.output`: the process's kept output from `from_seq` on.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcOutputRequest {
    pub session_id: String,
    pub proc_id: String,
    #[serde(default)]
    pub from_seq: u64,
    /// At most this many bytes of chunks (at least one chunk is always sent; default and
    /// ceiling [`MAX_OUTPUT_REPLY_BYTES`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
}

/// Which stream a chunk came from; a terminal's output is all `stdout`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcStream {
    Stdout,
    Stderr,
}

/// One piece of a process's output. `data` is UTF-8 text when the bytes are, else base64.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcChunk {
    pub seq: u64,
    pub stream: ProcStream,
    pub data: String,
    #[serde(default)]
    pub encoding: ContentEncoding,
}

impl ProcChunk {
    /// Carries `bytes` as text when they are UTF-8, as base64 otherwise.
    pub fn new(seq: u64, stream: ProcStream, bytes: &[u8]) -> Self {
        let (data, encoding) = match std::str::from_utf8(bytes) {
            Ok(text) => (text.to_string(), ContentEncoding::Utf8),
            Err(_) => (crate::encode_base64(bytes), ContentEncoding::Base64),
        };
        Self {
            seq,
            stream,
            data,
            encoding,
        }
    }

    /// The chunk's bytes.
    pub fn bytes(&self) -> Result<Vec<u8>, String> {
        crate::decode_content(&self.data, self.encoding)
    }
}

/// The reply of `proc.output`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcOutput {
    pub chunks: Vec<ProcChunk>,
    /// The seq to ask from next.
    pub next_seq: u64,
    /// The oldest seq the ring still holds: chunks below it were dropped to bound memory
    /// (0: nothing was dropped).
    pub dropped_before: u64,
    pub state: ProcState,
}

/// `sandbox.v1.proc.input`: bytes for the process's stdin (or terminal).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcInput {
    pub session_id: String,
    pub proc_id: String,
    #[serde(default)]
    pub data: String,
    #[serde(default)]
    pub encoding: ContentEncoding,
    /// Close stdin after `data` (a terminal gets its end-of-file character instead).
    #[serde(default)]
    pub eof: bool,
    /// Orders the inputs of clients that send concurrently: 0, 1, 2, ... per process. An
    /// input whose seq was already written is answered again without being written twice
    /// (a retry); one past the next expected is refused (409). Absent: written in arrival
    /// order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
}

impl ProcInput {
    /// The decoded bytes, bounded.
    pub fn bytes(&self) -> Result<Vec<u8>, ValidationError> {
        check_size("data", self.data.len(), MAX_INPUT_BYTES * 4 / 3 + 4)?;
        let bytes = crate::decode_content(&self.data, self.encoding)
            .map_err(|e| ValidationError::invalid("data", e))?;
        check_size("data", bytes.len(), MAX_INPUT_BYTES)?;
        Ok(bytes)
    }
}

/// The reply of `proc.input`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcInputAck {
    /// The seq the next input takes.
    pub next_seq: u64,
}

/// The signals a process can be sent.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum ProcSignalKind {
    Int,
    Term,
    Kill,
    Hup,
}

impl ProcSignalKind {
    /// The Linux signal number.
    pub const fn number(self) -> i32 {
        match self {
            ProcSignalKind::Hup => 1,
            ProcSignalKind::Int => 2,
            ProcSignalKind::Kill => 9,
            ProcSignalKind::Term => 15,
        }
    }
}

/// `sandbox.v1.proc.signal`: sends a signal to the process's group. Answers the process as it
/// is then (a killed process may take a moment to show `killed`: `proc.wait` for it).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcSignal {
    pub session_id: String,
    pub proc_id: String,
    pub signal: ProcSignalKind,
}

/// `sandbox.v1.proc.wait`: answers once the process ended, or after `timeout_ms` (at most
/// [`MAX_WAIT_MS`]) with it still running.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcWait {
    pub session_id: String,
    pub proc_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// `sandbox.v1.proc.resize`: a terminal's new size.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcResize {
    pub session_id: String,
    pub proc_id: String,
    pub cols: u16,
    pub rows: u16,
}

/// What is published on `sandbox.v1.output.<tenant>.<proc_id>` while a process lives: its
/// chunks as they come (the same seqs `proc.output` answers), then its end.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ProcEvent {
    Output(ProcChunk),
    Ended(ProcInfo),
}

// === executor side (internal: only the scheduler calls it) ===

/// The operation the scheduler forwards to the node holding the session
/// (`sandbox.v1.executor.<backend>.<node>.proc`). Ids are scoped by tenant already.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum ProcCall {
    Start {
        /// The new process's id (chosen by the scheduler, unscoped: the session scopes it).
        proc_id: String,
        /// The session's tenant (its audit events carry it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tenant: Option<Tenant>,
        /// Where its live output goes.
        output_subject: String,
        start: ProcStart,
    },
    List {
        session_id: String,
    },
    Output(ProcOutputRequest),
    Input(ProcInput),
    Signal(ProcSignal),
    Wait(ProcWait),
    Resize(ProcResize),
    /// Brings the session's workspace in the store up to its container's while a process of
    /// the session runs (what a process writes otherwise reaches the store only with the
    /// session's next run). The workspace store sends it before it answers an agent's read.
    Sync {
        session_id: String,
    },
}

impl ProcCall {
    /// The (scoped) session the call is for.
    pub fn session_id(&self) -> &str {
        match self {
            ProcCall::Start { start, .. } => &start.session_id,
            ProcCall::List { session_id } => session_id,
            ProcCall::Output(r) => &r.session_id,
            ProcCall::Input(r) => &r.session_id,
            ProcCall::Signal(r) => &r.session_id,
            ProcCall::Wait(r) => &r.session_id,
            ProcCall::Resize(r) => &r.session_id,
            ProcCall::Sync { session_id } => session_id,
        }
    }
}

/// The executor's answer to a [`ProcCall`], one shape per operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ProcReply {
    Started(ProcStarted),
    List(ProcList),
    Output(ProcOutput),
    Input(ProcInputAck),
    /// `signal`, `wait` and `resize` answer the process as it is.
    Info(ProcInfo),
    /// `sync`: whether a run carried the container's workspace to the store (`false`: no
    /// process of the session runs, so the store held it already).
    Synced {
        ran: bool,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Encoding;

    fn start(json: &str) -> Result<ProcStart, crate::CodecError> {
        Encoding::Json.decode(json.as_bytes())
    }

    #[test]
    fn a_start_names_a_command_line_or_an_argv() {
        let cmd = start(r#"{"session_id":"s1","cmd":"npm run dev"}"#).unwrap();
        assert_eq!(cmd.command.argv(), ["bash", "-c", "npm run dev"]);
        let argv = start(r#"{"session_id":"s1","argv":["python3","-m","http.server"]}"#).unwrap();
        assert_eq!(argv.command.shell_text(), "python3 -m http.server");
        assert!(start(r#"{"session_id":"s1"}"#).is_err());
        assert!(start(r#"{"session_id":"s1","pty":{"cols":-1,"rows":5},"cmd":"x"}"#).is_err());
    }

    #[test]
    fn hostile_starts_are_refused_with_their_field() {
        let c = Ceilings::default();
        let base = start(r#"{"session_id":"s1","cmd":"true"}"#).unwrap();
        let refused = |edit: &dyn Fn(&mut ProcStart)| {
            let mut s = base.clone();
            edit(&mut s);
            crate::ErrorBody::from(s.validate(&c).unwrap_err()).code
        };
        assert!(base.validate(&c).is_ok());
        assert_eq!(refused(&|s| s.session_id = "../x".into()), 400);
        assert_eq!(refused(&|s| s.command = ProcCommand::Argv(vec![])), 400);
        assert_eq!(refused(&|s| s.command = ProcCommand::Cmd(" ".into())), 400);
        let many = vec!["a".to_string(); MAX_ARGS + 1];
        assert_eq!(
            refused(&|s| s.command = ProcCommand::Argv(many.clone())),
            413
        );
        let huge = "x".repeat(MAX_COMMAND_BYTES + 1);
        assert_eq!(
            refused(&|s| s.command = ProcCommand::Cmd(huge.clone())),
            413
        );
        assert_eq!(
            refused(&|s| s.pty = Some(PtySize { cols: 0, rows: 5 })),
            400
        );
        assert_eq!(refused(&|s| s.tag = Some("t".repeat(500))), 413);
        assert_eq!(
            refused(&|s| {
                s.env.insert("LD_PRELOAD".into(), "/x.so".into());
            }),
            400
        );
    }

    #[test]
    fn chunks_carry_text_as_text_and_other_bytes_as_base64() {
        let text = ProcChunk::new(3, ProcStream::Stdout, b"hi\n");
        assert_eq!(
            (text.data.as_str(), text.encoding),
            ("hi\n", ContentEncoding::Utf8)
        );
        let binary = ProcChunk::new(4, ProcStream::Stderr, &[0xff, 0x00]);
        assert_eq!(binary.encoding, ContentEncoding::Base64);
        assert_eq!(binary.bytes().unwrap(), [0xff, 0x00]);
    }

    #[test]
    fn oversized_input_is_413() {
        let input = ProcInput {
            session_id: "s".into(),
            proc_id: "p".into(),
            data: "x".repeat(MAX_INPUT_BYTES + 1),
            encoding: ContentEncoding::Utf8,
            eof: false,
            seq: None,
        };
        assert_eq!(crate::ErrorBody::from(input.bytes().unwrap_err()).code, 413);
    }
}
