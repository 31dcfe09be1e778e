//! A workspace's revision (`messages::workspace::revision_key`): every change moves it, after
//! the change landed; reads never do; snapshot and restore report it. Executors rely on it to
//! skip fetching a workspace their container already holds.

use crate::common::*;
use async_nats::jetstream::{self, kv};
use messages::subjects::WorkspaceOp;
use messages::workspace::{revision_key, WsArchive, WsSnapshot};
use messages::Subjects;
use test_support::NatsServer;

async fn revision(kv: &kv::Store, session: &str) -> Option<u64> {
    kv.entry(revision_key(session))
        .await
        .unwrap()
        .filter(|e| e.operation == kv::Operation::Put)
        .map(|e| e.revision)
}

fn tar_with(path: &str, data: &[u8]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(data.len() as u64);
    h.set_mode(0o644);
    b.append_data(&mut h, path, data).unwrap();
    b.into_inner().unwrap()
}

#[tokio::test]
async fn every_change_moves_the_revision_and_reads_do_not() {
    let nats = NatsServer::start();
    let _store = start(config(&nats.url(), "rev")).await;
    let ws = client(&nats.url()).await;
    let nc = crate::common::nats(&nats.url()).await;
    let subjects = Subjects::default();
    let kv = jetstream::new(nc.clone())
        .get_key_value(subjects.workspace_index_bucket())
        .await
        .unwrap();
    let s = "rev-s";
    assert_eq!(revision(&kv, s).await, None, "no change yet");

    ws.init(s).await.unwrap();
    let after_init = revision(&kv, s).await.expect("init is a change");
    ws.write(s, "a.txt", b"1").await.unwrap();
    let after_write = revision(&kv, s).await.unwrap();
    assert!(after_write > after_init);

    ws.read(s, "a.txt").await.unwrap();
    ws.stat(s, "a.txt").await.unwrap();
    ws.list(s, None, true).await.unwrap();
    ws.usage(s).await.unwrap();
    let snapshot: WsArchive = raw(
        &nc,
        subjects.workspace(WorkspaceOp::Snapshot),
        &WsSnapshot {
            session_id: s.into(),
            prefix: None,
        },
    )
    .await
    .unwrap();
    assert_eq!(
        snapshot.revision,
        Some(after_write),
        "a snapshot says what it holds"
    );
    assert_eq!(
        revision(&kv, s).await,
        Some(after_write),
        "reads change nothing"
    );

    ws.delete(s, "a.txt", false).await.unwrap();
    let after_delete = revision(&kv, s).await.unwrap();
    assert!(after_delete > after_write);

    let restored = ws
        .restore(s, &tar_with("b.txt", b"2"), false, Vec::new())
        .await
        .unwrap();
    assert_eq!(
        (restored.previous_revision, restored.revision),
        (Some(after_delete), revision(&kv, s).await),
        "a restore reports the revision it followed and the one it made"
    );
    assert!(restored.revision > Some(after_delete));

    ws.cleanup(Some(s)).await.unwrap();
    assert_eq!(revision(&kv, s).await, None, "a removed workspace has none");
}
