//! Listing one session costs that session's keys, not everyone's: a session with 10,000
//! files is listed while other sessions hold 100,000, and the index entries the server sends
//! the store for it are counted. The index is filled with direct KV publishes (what the store
//! would write, without the contents) to keep the test fast.

use crate::common::*;
use async_nats::jetstream;
use futures::StreamExt;
use messages::Subjects;
use sandmesh_client::WorkspaceClient;
use test_support::NatsServer;
use workspace_store::index::{Node, NodeKind, SessionMeta};
use workspace_store::keys::{self, RelPath};

/// Publishes `count` file nodes for `session` straight into the index bucket, acks awaited
/// in windows so the server is kept busy.
async fn fill(js: &jetstream::Context, session: &str, count: usize, dirs: usize) {
    let bucket = Subjects::default().workspace_index_bucket();
    let node = |i: usize| Node {
        kind: NodeKind::File,
        size: 100 + i as u64 % 50,
        sha256: "0".repeat(64),
        object: format!("ws/{session}/none-{i}"),
        mode: 0o644,
        modified: 1_700_000_000_000,
    };
    // The session's totals key: what makes the workspace exist (a listing of one that does
    // not is a 404).
    let meta = serde_json::to_vec(&SessionMeta::default()).unwrap();
    js.publish(
        format!("$KV.{bucket}.{}", keys::meta_key(session)),
        meta.into(),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    let mut acks = Vec::with_capacity(2000);
    for d in 0..dirs {
        let dir = RelPath::from_parts(vec![format!("dir{d}")]);
        let key = keys::node_key(session, &dir);
        let value = serde_json::to_vec(&Node::dir(1_700_000_000_000)).unwrap();
        js.publish(format!("$KV.{bucket}.{key}"), value.into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    for i in 0..count {
        let path =
            RelPath::from_parts(vec![format!("dir{}", i % dirs), format!("file-{i:06}.txt")]);
        let key = keys::node_key(session, &path);
        let value = serde_json::to_vec(&node(i)).unwrap();
        acks.push(
            js.publish(format!("$KV.{bucket}.{key}"), value.into())
                .await
                .unwrap(),
        );
        if acks.len() == 2000 {
            for ack in acks.drain(..) {
                ack.await.unwrap();
            }
        }
    }
    for ack in acks {
        ack.await.unwrap();
    }
}

/// Index entries JetStream delivers to the store while `f` runs: every message on one of its
/// inboxes (`_INBOX_workspace-store.…`, its connections' prefix) whose reply subject is an ack
/// subject of the index stream (a scan's consumer delivers with one, whatever its ack policy),
/// seen by a plain subscription next to the store's own.
async fn index_entries_delivered<T>(
    nc: &async_nats::Client,
    f: impl std::future::Future<Output = T>,
) -> (T, usize) {
    let bucket = Subjects::default().workspace_index_bucket();
    let acks = format!("$JS.ACK.KV_{bucket}.");
    let store_inboxes = format!(
        "{}.>",
        kit::connect::inbox_prefix(workspace_store::SERVICE_NAME)
    );
    let mut sub = nc.subscribe(store_inboxes).await.unwrap();
    nc.flush().await.unwrap();
    let out = f.await;
    // Everything delivered before the answer is already in the subscription; a message to a
    // fresh subject under it, sent last, marks the end of it.
    let marker = format!(
        "{}.{}",
        kit::connect::inbox_prefix(workspace_store::SERVICE_NAME),
        messages::new_id()
    );
    nc.publish(marker.clone(), "".into()).await.unwrap();
    let mut count = 0;
    while let Some(msg) = sub.next().await {
        if msg.subject.as_str() == marker {
            break;
        }
        if msg.reply.as_ref().is_some_and(|r| r.starts_with(&acks)) {
            count += 1;
        }
    }
    (out, count)
}

/// The index entries read by a recursive listing of `target`, a listing of `target/dir3` and
/// a recursive listing of `small`, checking each listing's size.
async fn listing_costs(nc: &async_nats::Client, ws: &WorkspaceClient) -> [usize; 3] {
    let (listing, whole) = index_entries_delivered(nc, ws.list("target", None, true)).await;
    assert_eq!(listing.unwrap().entries.len(), 10_010);
    let (dir, one_dir) = index_entries_delivered(nc, ws.list("target", Some("dir3"), false)).await;
    assert_eq!(dir.unwrap().entries.len(), 1000);
    let (small, small_cost) = index_entries_delivered(nc, ws.list("small", None, true)).await;
    assert_eq!(small.unwrap().entries.len(), 9);
    [whole, one_dir, small_cost]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn listing_a_session_costs_its_own_keys_only() {
    let nats = NatsServer::start();
    let _svc = start(config(&nats.url(), "scale")).await;
    let nc = crate::common::nats(&nats.url()).await;
    let js = jetstream::new(nc.clone());
    let ws = client(&nats.url()).await;
    ws.init("small").await.unwrap();
    fill(&js, "target", 10_000, 10).await;

    let alone = listing_costs(&nc, &ws).await;
    // Each listing reads at least what it lists (a paged listing re-reads its subtree once
    // per page, so a large one reads a few times that).
    assert!(
        alone[0] >= 10_010 && alone[1] >= 1000 && alone[2] >= 9,
        "{alone:?}"
    );
    assert_eq!(
        alone[2], 9,
        "a one-page listing reads each of its keys once"
    );

    for other in 0..10 {
        fill(&js, &format!("other{other}"), 10_000, 10).await;
    }
    let crowded = listing_costs(&nc, &ws).await;
    assert_eq!(
        crowded, alone,
        "100,000 keys of other sessions add nothing to a listing's reads"
    );
}

/// Reads leave nothing behind on the server: 1,500 reads (more than the server allows
/// consumers on a stream) all succeed, and the object store's stream has no consumers after.
/// Reading through ordered consumers left one behind per read until the server refused more.
#[tokio::test]
async fn many_reads_leave_no_consumers_behind() {
    let nats = NatsServer::start();
    let _store = start(config(&nats.url(), "a")).await;
    let ws = client(&nats.url()).await;
    ws.init("s1").await.unwrap();
    let data = bytes(700 * 1024, 7); // two chunks
    ws.write("s1", "data/big.bin", &data).await.unwrap();
    ws.write("s1", "code/small.py", b"print(1)\n")
        .await
        .unwrap();
    for i in 0..1500 {
        let path = if i % 10 == 0 {
            "data/big.bin"
        } else {
            "code/small.py"
        };
        let got = ws
            .read("s1", path)
            .await
            .unwrap_or_else(|e| panic!("read {i}: {e}"));
        if i % 10 == 0 {
            assert_eq!(got, data);
        } else {
            assert_eq!(got, b"print(1)\n");
        }
    }
    let js = jetstream::new(crate::common::nats(&nats.url()).await);
    let bucket = Subjects::default().workspace_objects_bucket();
    let mut stream = js.get_stream(format!("OBJ_{bucket}")).await.unwrap();
    let consumers = stream.info().await.unwrap().state.consumer_count;
    assert_eq!(consumers, 0, "reads left consumers on the object store");
}
