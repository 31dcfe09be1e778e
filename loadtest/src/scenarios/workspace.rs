//! `workspace`: write, read and list through the workspace-store, one workspace per worker,
//! each operation its own series.

use std::sync::Arc;
use std::time::Instant;

use messages::exec::ContentEncoding;
use messages::subjects::WorkspaceOp;
use messages::workspace::{
    WsCleaned, WsCleanup, WsEntry, WsFile, WsInit, WsList, WsListing, WsRead, WsUsage, WsWrite,
};

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
    let mesh = ctx.mesh.clone();
    let sessions: Vec<String> = (0..concurrency.max(1))
        .map(|_| format!("loadtest-ws-{}", messages::new_id().to_ascii_lowercase()))
        .collect();
    for s in &sessions {
        mesh.caller
            .call::<WsInit, WsUsage>(
                mesh.subjects.workspace(WorkspaceOp::Init),
                &WsInit {
                    session_id: s.clone(),
                },
            )
            .await
            .map_err(|e| anyhow::anyhow!("workspace init: {e}"))?;
        // Every file exists before reads start.
        for seq in 0..FILES {
            write(&mesh, s, &path(seq), file_bytes).await;
        }
    }
    let sessions = Arc::new(sessions);
    let load = load.with_concurrency(concurrency);
    for op in ["write", "read", "list"] {
        let name = format!("workspace/{op}/c{concurrency}");
        let (mesh, sessions) = (mesh.clone(), sessions.clone());
        let run = drive(&name, load, move |worker, seq| {
            let (mesh, session) = (mesh.clone(), sessions[worker].clone());
            async move {
                match op {
                    "write" => write(&mesh, &session, &path(seq), file_bytes).await,
                    "read" => read(&mesh, &session, &path(seq), file_bytes).await,
                    _ => list(&mesh, &session).await,
                }
            }
        })
        .await;
        ctx.push(run.report(&name).tagged(None, None, Some(op)));
    }
    for s in sessions.iter() {
        let req = WsCleanup {
            session_id: Some(s.clone()),
            older_than_hours: None,
        };
        if let Err(e) = mesh
            .caller
            .call::<WsCleanup, WsCleaned>(mesh.subjects.workspace(WorkspaceOp::Cleanup), &req)
            .await
        {
            eprintln!("loadtest: removing workspace {s}: {e}");
        }
    }
    Ok(())
}

async fn write(mesh: &crate::mesh::Mesh, session: &str, path: &str, bytes: usize) -> Sample {
    let req = WsWrite {
        session_id: session.to_string(),
        path: path.to_string(),
        content: "x".repeat(bytes),
        encoding: ContentEncoding::Utf8,
        append: false,
        requested_by: Some("loadtest".into()),
        object: None,
    };
    let start = Instant::now();
    match mesh
        .caller
        .call::<WsWrite, WsEntry>(mesh.subjects.workspace(WorkspaceOp::Write), &req)
        .await
    {
        Ok(e) if e.size == bytes as u64 => Sample::timed(start.elapsed(), "ok"),
        Ok(_) => Sample::timed(start.elapsed(), "wrong_size"),
        Err(e) => call_failed(&e),
    }
}

async fn read(mesh: &crate::mesh::Mesh, session: &str, path: &str, bytes: usize) -> Sample {
    let req = WsRead {
        session_id: session.to_string(),
        path: path.to_string(),
        offset: None,
        length: None,
        encoding: None,
    };
    let start = Instant::now();
    match mesh
        .caller
        .call::<WsRead, WsFile>(mesh.subjects.workspace(WorkspaceOp::Read), &req)
        .await
    {
        Ok(f) if f.content.len() == bytes => Sample::timed(start.elapsed(), "ok"),
        Ok(_) => Sample::timed(start.elapsed(), "wrong_content"),
        Err(e) => call_failed(&e),
    }
}

async fn list(mesh: &crate::mesh::Mesh, session: &str) -> Sample {
    let req = WsList {
        session_id: session.to_string(),
        prefix: Some("data/load".into()),
        recursive: true,
        after: None,
        limit: None,
    };
    let start = Instant::now();
    match mesh
        .caller
        .call::<WsList, WsListing>(mesh.subjects.workspace(WorkspaceOp::List), &req)
        .await
    {
        Ok(l) if l.entries.iter().filter(|e| !e.is_dir).count() as u64 == FILES => {
            Sample::timed(start.elapsed(), "ok")
        }
        Ok(_) => Sample::timed(start.elapsed(), "wrong_listing"),
        Err(e) => call_failed(&e),
    }
}
