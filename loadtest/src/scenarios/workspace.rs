//! `workspace`: write, read and list through the workspace-store, one workspace per worker,
//! each operation its own series.

use std::sync::Arc;
use std::time::Instant;

use sandmesh_client::WorkspaceClient;

use crate::client::call_failed;
use crate::driver::{drive, Load, Sample};
use crate::scenarios::Ctx;

/// Files per workspace: writes cycle over them, so reads always find one and lists stay small.
const FILES: u64 = 32;

fn path(seq: u64) -> String {
    format!("data/load/f{:02}.txt", seq % FILES)
}

pub async fn workspace(
    ctx: &mut Ctx,
    concurrency: usize,
    file_bytes: usize,
    load: Load,
) -> anyhow::Result<()> {
    let ws = ctx.mesh.api.workspace().requested_by("loadtest");
    let content = Arc::new(vec![b'x'; file_bytes]);
    let sessions: Vec<String> = (0..concurrency.max(1))
        .map(|_| format!("loadtest-ws-{}", messages::new_id().to_ascii_lowercase()))
        .collect();
    for s in &sessions {
        ws.init(s)
            .await
            .map_err(|e| anyhow::anyhow!("workspace init: {e}"))?;
        // Every file exists before reads start.
        for seq in 0..FILES {
            write(&ws, s, &path(seq), &content).await;
        }
    }
    let sessions = Arc::new(sessions);
    let load = load.with_concurrency(concurrency);
    for op in ["write", "read", "list"] {
        let name = format!("workspace/{op}/c{concurrency}");
        let (ws, sessions, content) = (ws.clone(), sessions.clone(), content.clone());
        let run = drive(&name, load, move |worker, seq| {
            let (ws, session) = (ws.clone(), sessions[worker].clone());
            let content = content.clone();
            async move {
                match op {
                    "write" => write(&ws, &session, &path(seq), &content).await,
                    "read" => read(&ws, &session, &path(seq), file_bytes).await,
                    _ => list(&ws, &session).await,
                }
            }
        })
        .await;
        ctx.push(run.report(&name).tagged(None, None, Some(op)));
    }
    for s in sessions.iter() {
        if let Err(e) = ws.cleanup(Some(s)).await {
            eprintln!("loadtest: removing workspace {s}: {e}");
        }
    }
    Ok(())
}

/// One timed write of `data`; a reply with another size is not ok.
pub(crate) async fn write(ws: &WorkspaceClient, session: &str, path: &str, data: &[u8]) -> Sample {
    let start = Instant::now();
    match ws.write(session, path, data).await {
        Ok(e) if e.size == data.len() as u64 => Sample::timed(start.elapsed(), "ok"),
        Ok(_) => Sample::timed(start.elapsed(), "wrong_size"),
        Err(e) => call_failed(&e),
    }
}

/// One timed read; content of another length is not ok.
pub(crate) async fn read(ws: &WorkspaceClient, session: &str, path: &str, bytes: usize) -> Sample {
    let start = Instant::now();
    match ws.read(session, path).await {
        Ok(content) if content.len() == bytes => Sample::timed(start.elapsed(), "ok"),
        Ok(_) => Sample::timed(start.elapsed(), "wrong_content"),
        Err(e) => call_failed(&e),
    }
}

async fn list(ws: &WorkspaceClient, session: &str) -> Sample {
    let start = Instant::now();
    match ws.list(session, Some("data/load"), true).await {
        Ok(l) if l.entries.iter().filter(|e| !e.is_dir).count() as u64 == FILES => {
            Sample::timed(start.elapsed(), "ok")
        }
        Ok(_) => Sample::timed(start.elapsed(), "wrong_listing"),
        Err(e) => call_failed(&e),
    }
}
