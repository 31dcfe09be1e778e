//! The background process tools: start a process that outlives one call (a dev server, a
//! watcher), read its output, kill it (`proc.*`).

use messages::proc::{ProcCommand, ProcOutputRequest, ProcSignalKind, ProcStart};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::{tool, tool_router, ErrorData};

use crate::params::{KillProcess, ProcessOutput, StartProcess};
use crate::render;
use crate::tools::{MeshTools, REQUESTED_BY};

/// The most output `process_output` returns at once (the model's context is the limit).
const OUTPUT_MAX_BYTES: u64 = 64 * 1024;

#[tool_router(router = proc_tools, vis = "pub(crate)")]
impl MeshTools {
    #[tool(
        description = "Start a background process in a session that keeps running after the \
        call (a dev server, a watcher, a worker): a shell command line. Answers its proc_id; \
        read what it prints with process_output, stop it with kill_process. Risky commands \
        wait for a person's approval first.",
        annotations(title = "Start a process", open_world_hint = false)
    )]
    async fn start_process(
        &self,
        Parameters(p): Parameters<StartProcess>,
    ) -> Result<CallToolResult, ErrorData> {
        let start = ProcStart {
            session_id: p.session_id,
            command: ProcCommand::Cmd(p.command),
            cwd: p.cwd,
            env: Default::default(),
            stdin: false,
            pty: None,
            tag: p.tag,
            timeout_ms: p.timeout_ms.unwrap_or(0),
            requested_by: Some(REQUESTED_BY.into()),
        };
        Ok(match self.mesh.procs().start(&start, None).await {
            Ok(s) => CallToolResult::success(vec![ContentBlock::text(format!(
                "started: proc_id {} (pid {})",
                s.proc_id, s.pid
            ))]),
            Err(e) => render::client_error(&e),
        })
    }

    #[tool(
        description = "Read what a background process printed (stdout and stderr together), \
        from from_seq on (0: from its start). Answers the text, the seq to continue from and \
        whether it still runs.",
        annotations(
            title = "Process output",
            read_only_hint = true,
            open_world_hint = false
        )
    )]
    async fn process_output(
        &self,
        Parameters(p): Parameters<ProcessOutput>,
    ) -> Result<CallToolResult, ErrorData> {
        let req = ProcOutputRequest {
            session_id: p.session_id,
            proc_id: p.proc_id,
            from_seq: p.from_seq.unwrap_or(0),
            max_bytes: Some(OUTPUT_MAX_BYTES),
        };
        Ok(match self.mesh.procs().output(&req).await {
            Ok(out) => {
                let mut text = String::new();
                for chunk in &out.chunks {
                    match chunk.bytes() {
                        Ok(bytes) => text.push_str(&String::from_utf8_lossy(&bytes)),
                        Err(e) => return Ok(render::error("internal", &e)),
                    }
                }
                let state = serde_json::to_value(out.state).unwrap_or_default();
                CallToolResult::success(vec![ContentBlock::text(format!(
                    "{text}\n[state {}, next from_seq {}{}]",
                    state.as_str().unwrap_or_default(),
                    out.next_seq,
                    if out.dropped_before > 0 {
                        format!(", output before seq {} was dropped", out.dropped_before)
                    } else {
                        String::new()
                    }
                ))])
            }
            Err(e) => render::client_error(&e),
        })
    }

    #[tool(
        description = "Stop a background process (it and everything it started are killed).",
        annotations(
            title = "Kill a process",
            destructive_hint = true,
            open_world_hint = false
        )
    )]
    async fn kill_process(
        &self,
        Parameters(p): Parameters<KillProcess>,
    ) -> Result<CallToolResult, ErrorData> {
        let signalled = self
            .mesh
            .procs()
            .signal(&p.session_id, &p.proc_id, ProcSignalKind::Kill)
            .await;
        Ok(match signalled {
            Ok(info) => CallToolResult::success(vec![ContentBlock::text(format!(
                "killed: proc_id {}",
                info.proc_id
            ))]),
            Err(e) => render::client_error(&e),
        })
    }
}
