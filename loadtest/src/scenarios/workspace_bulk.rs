//! `workspace-bulk`: what the deleted workspace-store bench measured, as loadtest series, one
//! operation at a time. Large files both ways a client can move them, in the same run: by
//! requests only (`upload` chunks, ranged reads: what a tenant's agent does) and through the
//! object-store hand-off (services with JetStream access: the baseline), and the
//! executor's pair per session run on a small workspace: a snapshot before the run, a restore
//! of what the run changed.

use std::sync::Arc;
use std::time::Instant;

use sandmesh_client::{Transfer, WorkspaceClient};

use crate::client::call_failed;
use crate::driver::{drive, Load, Sample};
use crate::scenarios::workspace::{read, write};
use crate::scenarios::Ctx;

/// The small workspace of the pair: code files as an agent leaves them.
const CODE_FILES: usize = 5;
const CODE_BYTES: usize = 2_000;
/// What a run changes: one output file, written on even runs and deleted on odd ones.
const OUTPUT: &str = "output/result.txt";

/// Large files: writes cycle over these paths, so reads always find one.
const BIG_FILES: u64 = 4;

fn big_path(seq: u64) -> String {
    format!("data/bulk/big.{}", seq % BIG_FILES)
}

/// `big` bounds the large-file series, `pair` the snapshot and restore series; both run with
/// one worker (a restore alternates with the one before it).
pub async fn workspace_bulk(
    ctx: &mut Ctx,
    big_bytes: usize,
    big: Load,
    pair: Load,
) -> anyhow::Result<()> {
    let ws = ctx.mesh.api.workspace().requested_by("loadtest");
    // Two workspaces: the large files would otherwise be in every snapshot of the pair.
    let id = messages::new_id().to_ascii_lowercase();
    let (bulk, small) = (format!("loadtest-bulk-{id}"), format!("loadtest-pair-{id}"));
    for s in [&bulk, &small] {
        ws.init(s)
            .await
            .map_err(|e| anyhow::anyhow!("workspace init: {e}"))?;
    }
    let code = vec![b'#'; CODE_BYTES];
    for i in 0..CODE_FILES {
        ws.write(&small, &format!("code/m{i}.py"), &code)
            .await
            .map_err(|e| anyhow::anyhow!("workspace write: {e}"))?;
    }
    let content: Arc<Vec<u8>> = Arc::new((0..big_bytes).map(|i| (i % 251) as u8).collect());
    let change = Arc::new((output_tar(false)?, output_tar(true)?));
    let mib = big_bytes as f64 / f64::from(1 << 20);
    let (requests, direct) = (Transfer::Requests, Transfer::ObjectStore);
    let series = [
        (
            "write",
            format!("workspace/write_{mib:.0}MiB/requests"),
            &bulk,
            big,
            requests,
        ),
        (
            "read",
            format!("workspace/read_{mib:.0}MiB/requests"),
            &bulk,
            big,
            requests,
        ),
        (
            "write",
            format!("workspace/write_{mib:.0}MiB/object-store"),
            &bulk,
            big,
            direct,
        ),
        (
            "read",
            format!("workspace/read_{mib:.0}MiB/object-store"),
            &bulk,
            big,
            direct,
        ),
        (
            "snapshot",
            "workspace/snapshot".to_string(),
            &small,
            pair,
            requests,
        ),
        (
            "restore",
            "workspace/restore".to_string(),
            &small,
            pair,
            requests,
        ),
    ];
    for (op, name, session, load, transfer) in series {
        let name = format!("{name}/c1");
        let (ws, session) = (ws.clone().transfer(transfer), session.clone());
        let (content, change) = (content.clone(), change.clone());
        let run = drive(&name, load.with_concurrency(1), move |_, seq| {
            let (ws, session) = (ws.clone(), session.clone());
            let (content, change) = (content.clone(), change.clone());
            async move {
                match op {
                    "write" => write(&ws, &session, &big_path(seq), &content).await,
                    "read" => read(&ws, &session, &big_path(seq), content.len()).await,
                    "snapshot" => snapshot(&ws, &session).await,
                    _ => restore(&ws, &session, seq, &change).await,
                }
            }
        })
        .await;
        ctx.push(run.report(&name).tagged(None, None, Some(op)));
    }
    for s in [&bulk, &small] {
        if let Err(e) = ws.cleanup(Some(s)).await {
            eprintln!("loadtest: removing workspace {s}: {e}");
        }
    }
    Ok(())
}

/// The archives a run sends back: its one output file, or nothing (`empty`).
fn output_tar(empty: bool) -> anyhow::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    if !empty {
        let data = b"42\n";
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        builder.append_data(&mut header, OUTPUT, &data[..])?;
    }
    Ok(builder.into_inner()?)
}

async fn snapshot(ws: &WorkspaceClient, session: &str) -> Sample {
    let start = Instant::now();
    match ws.snapshot(session, None).await {
        Ok(tar) if !tar.is_empty() => Sample::timed(start.elapsed(), "ok"),
        Ok(_) => Sample::timed(start.elapsed(), "empty_snapshot"),
        Err(e) => call_failed(&e),
    }
}

/// Even runs create the output file, odd runs delete it: each restore changes one file.
async fn restore(
    ws: &WorkspaceClient,
    session: &str,
    seq: u64,
    tars: &(Vec<u8>, Vec<u8>),
) -> Sample {
    let creates = seq.is_multiple_of(2);
    let (tar, delete) = if creates {
        (&tars.0, Vec::new())
    } else {
        (&tars.1, vec![OUTPUT.to_string()])
    };
    let start = Instant::now();
    match ws.restore(session, tar, false, delete).await {
        Ok(r) => {
            let changed = if creates {
                &r.files_created
            } else {
                &r.files_deleted
            };
            let status = if changed.iter().any(|f| f == OUTPUT) {
                "ok"
            } else {
                "wrong_change"
            };
            Sample::timed(start.elapsed(), status)
        }
        Err(e) => call_failed(&e),
    }
}
