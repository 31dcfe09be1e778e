//! `sandmesh proc`: a session's background processes (start, list, logs, kill), and `sandmesh
//! shell`: a terminal in a session (bash in a pseudo-terminal of this terminal's size, this
//! terminal in raw mode until it exits).

use std::io::{Read, Write};

use futures::StreamExt;
use messages::proc::{
    ProcCommand, ProcEvent, ProcInput, ProcOutputRequest, ProcSignalKind, ProcStart, PtySize,
};
use sandmesh_client::MeshClient;

#[derive(clap::Subcommand, Debug, Clone)]
pub enum ProcCommandArgs {
    /// Start a process that outlives runs: `sandmesh proc start s1 -- python3 -m http.server`.
    Start {
        session_id: String,
        /// A name shown by `proc list`.
        #[arg(long)]
        tag: Option<String>,
        /// A command line for `bash -c` instead of a program and its arguments.
        #[arg(long)]
        cmd: Option<String>,
        /// The program and its arguments.
        #[arg(last = true)]
        argv: Vec<String>,
    },
    /// The session's processes.
    List { session_id: String },
    /// A process's output (kept from its start, as far as the ring holds it).
    Logs {
        session_id: String,
        proc_id: String,
        /// Keep printing what comes until the process ends.
        #[arg(short, long)]
        follow: bool,
    },
    /// Kill a process (and its group).
    Kill { session_id: String, proc_id: String },
}

pub async fn run(mesh: &MeshClient, cmd: ProcCommandArgs) -> anyhow::Result<i32> {
    let procs = mesh.procs();
    match cmd {
        ProcCommandArgs::Start {
            session_id,
            tag,
            cmd,
            argv,
        } => {
            let command = match (cmd, argv.is_empty()) {
                (Some(cmd), true) => ProcCommand::Cmd(cmd),
                (None, false) => ProcCommand::Argv(argv),
                _ => anyhow::bail!("give either --cmd LINE or -- PROGRAM ARGS..."),
            };
            let start = ProcStart {
                session_id,
                command,
                cwd: None,
                env: Default::default(),
                stdin: false,
                pty: None,
                tag,
                timeout_ms: 0,
                requested_by: Some("cli".into()),
            };
            let started = procs.start(&start, None).await?;
            outln!("{}", started.proc_id);
        }
        ProcCommandArgs::List { session_id } => {
            for p in procs.list(&session_id).await? {
                let state = serde_json::to_value(p.state)?;
                outln!(
                    "{}\t{}\t{}\t{}",
                    p.proc_id,
                    state.as_str().unwrap_or_default(),
                    p.tag.unwrap_or_default(),
                    p.argv.join(" ")
                );
            }
        }
        ProcCommandArgs::Logs {
            session_id,
            proc_id,
            follow,
        } => {
            let events = match follow {
                true => Some(procs.events(&proc_id).await?),
                false => None,
            };
            let mut next = print_kept(mesh, &session_id, &proc_id, 0).await?;
            if let Some(mut events) = events {
                while let Some(event) = events.next().await {
                    match event? {
                        ProcEvent::Output(chunk) if chunk.seq >= next => {
                            next = chunk.seq + 1;
                            write_out(&chunk.bytes().map_err(anyhow::Error::msg)?)?;
                        }
                        ProcEvent::Output(_) => {}
                        ProcEvent::Ended(_) => break,
                    }
                }
            }
        }
        ProcCommandArgs::Kill {
            session_id,
            proc_id,
        } => {
            let info = procs
                .signal(&session_id, &proc_id, ProcSignalKind::Kill)
                .await?;
            outln!("{} {}", info.proc_id, serde_json::to_value(info.state)?);
        }
    }
    Ok(0)
}

fn write_out(bytes: &[u8]) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(bytes)?;
    out.flush()?;
    Ok(())
}

/// Prints the kept output from `from_seq`, page by page; answers the seq to follow from.
async fn print_kept(
    mesh: &MeshClient,
    session_id: &str,
    proc_id: &str,
    mut from_seq: u64,
) -> anyhow::Result<u64> {
    loop {
        let req = ProcOutputRequest {
            session_id: session_id.into(),
            proc_id: proc_id.into(),
            from_seq,
            max_bytes: None,
        };
        let page = mesh.procs().output(&req).await?;
        for chunk in &page.chunks {
            write_out(&chunk.bytes().map_err(anyhow::Error::msg)?)?;
        }
        if page.chunks.is_empty() || page.next_seq == from_seq {
            return Ok(page.next_seq);
        }
        from_seq = page.next_seq;
    }
}

/// This terminal in raw mode while it lives; restored when dropped.
struct RawMode(Option<rustix::termios::Termios>);

impl RawMode {
    fn enter() -> Self {
        let stdin = std::io::stdin();
        let Ok(saved) = rustix::termios::tcgetattr(&stdin) else {
            return Self(None); // not a terminal: bytes pass as they are
        };
        let mut raw = saved.clone();
        raw.make_raw();
        let _ = rustix::termios::tcsetattr(&stdin, rustix::termios::OptionalActions::Now, &raw);
        Self(Some(saved))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            let stdin = std::io::stdin();
            let _ =
                rustix::termios::tcsetattr(&stdin, rustix::termios::OptionalActions::Now, saved);
        }
    }
}

/// `sandmesh shell SESSION`: bash in the session's container, in a terminal of this one's size.
pub async fn shell(mesh: &MeshClient, session_id: String) -> anyhow::Result<i32> {
    let size = rustix::termios::tcgetwinsize(std::io::stdout())
        .map(|w| PtySize {
            cols: w.ws_col.max(1),
            rows: w.ws_row.max(1),
        })
        .unwrap_or(PtySize { cols: 80, rows: 24 });
    let procs = mesh.procs();
    let start = ProcStart {
        session_id: session_id.clone(),
        command: ProcCommand::Argv(vec!["bash".into(), "-i".into()]),
        cwd: None,
        env: Default::default(),
        stdin: true,
        pty: Some(size),
        tag: Some("shell".into()),
        timeout_ms: 0,
        requested_by: Some("cli shell".into()),
    };
    let started = procs.start(&start, None).await?;
    let proc_id = started.proc_id;
    let mut events = procs.events(&proc_id).await?;
    let raw = RawMode::enter();
    let mut next = print_kept(mesh, &session_id, &proc_id, 0).await?;
    // Keystrokes: read on a thread (stdin blocks), sent in order.
    let (keys_tx, mut keys) = tokio::sync::mpsc::channel::<Vec<u8>>(64);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin();
        let mut buf = [0u8; 4096];
        while let Ok(n) = stdin.read(&mut buf) {
            if n == 0 || keys_tx.blocking_send(buf[..n].to_vec()).is_err() {
                return;
            }
        }
    });
    let code = loop {
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(ProcEvent::Output(chunk))) if chunk.seq >= next => {
                    next = chunk.seq + 1;
                    write_out(&chunk.bytes().map_err(anyhow::Error::msg)?)?;
                }
                Some(Ok(ProcEvent::Output(_))) => {}
                Some(Ok(ProcEvent::Ended(info))) => break info.exit_code.unwrap_or(1),
                Some(Err(e)) => return Err(e.into()),
                None => break 1,
            },
            key = keys.recv() => {
                let Some(bytes) = key else { break 0 };
                let (data, encoding) = match String::from_utf8(bytes) {
                    Ok(text) => (text, messages::exec::ContentEncoding::Utf8),
                    Err(e) => (messages::encode_base64(e.as_bytes()), messages::exec::ContentEncoding::Base64),
                };
                let input = ProcInput {
                    session_id: session_id.clone(),
                    proc_id: proc_id.clone(),
                    data,
                    encoding,
                    eof: false,
                    seq: None,
                };
                procs.input(&input).await?;
            }
        }
    };
    drop(raw);
    Ok(code)
}
