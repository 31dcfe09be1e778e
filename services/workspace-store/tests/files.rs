//! File operations over real NATS: layout, write/read/list/stat/delete, ranges, append,
//! conflicts, quota, large files, snapshot and restore.

use crate::common::*;
use messages::exec::ContentEncoding;
use messages::subjects::WorkspaceOp;
use messages::workspace::{WsFile, WsList, WsListing, WsRead, WsWrite, LAYOUT_DIRS, MEMORY_FILES};
use messages::{ErrorKind, Subjects};
use sandmesh_client::ErrorKind as ClientKind;
use test_support::NatsServer;

#[tokio::test]
async fn init_creates_the_seed_layout_and_is_idempotent() {
    let nats = NatsServer::start();
    let _svc = start(config(&nats.url(), "f1")).await;
    let ws = client(&nats.url()).await;
    ws.init("s1").await.unwrap();
    ws.write("s1", ".memory/progress.md", b"# Progress\n\nstep 1\n")
        .await
        .unwrap();
    ws.init("s1").await.unwrap();
    let top: Vec<String> = ws
        .list("s1", None, false)
        .await
        .unwrap()
        .entries
        .into_iter()
        .filter(|e| e.is_dir)
        .map(|e| e.path)
        .collect();
    let mut expected: Vec<String> = LAYOUT_DIRS.iter().map(|d| d.to_string()).collect();
    expected.sort();
    assert_eq!(top, expected);
    for (path, header) in MEMORY_FILES {
        let content = ws.read("s1", path).await.unwrap();
        assert!(content.starts_with(header.as_bytes()), "{path}");
    }
    // A second init kept what the agent wrote.
    assert_eq!(
        ws.read("s1", ".memory/progress.md").await.unwrap(),
        b"# Progress\n\nstep 1\n"
    );
    let usage = ws.usage("s1").await.unwrap();
    assert_eq!(usage.files, 3);
    assert_eq!(usage.quota_bytes, 1024 << 20);

    // The instance announces itself in the nodes bucket, with its counters.
    let js = async_nats::jetstream::new(crate::common::nats(&nats.url()).await);
    let nodes = js
        .get_key_value(Subjects::default().nodes_bucket())
        .await
        .unwrap();
    let key = messages::heartbeat::heartbeat_key("workspace-store", "f1");
    let beat = nodes.get(&key).await.unwrap().expect("heartbeat key");
    let beat: messages::heartbeat::Heartbeat = serde_json::from_slice(&beat).unwrap();
    assert!(beat.metrics.contains_key("workspace_writes_total"));
}

#[tokio::test]
async fn files_directories_ranges_and_conflicts() {
    let nats = NatsServer::start();
    let _svc = start(config(&nats.url(), "f2")).await;
    let ws = client(&nats.url()).await;
    let binary: Vec<u8> = (0..=255u8).cycle().take(3000).collect();
    ws.write("s", "data/blob.bin", &binary).await.unwrap();
    ws.write("s", "code/main.py", b"print('hi')\n")
        .await
        .unwrap();
    ws.write("s", "code/lib/util.py", b"x = 1\n").await.unwrap();
    assert_eq!(ws.read("s", "data/blob.bin").await.unwrap(), binary);

    let names = |l: messages::workspace::WsListing| -> Vec<String> {
        l.entries.into_iter().map(|e| e.path).collect()
    };
    assert_eq!(
        names(ws.list("s", Some("code"), false).await.unwrap()),
        ["code/lib", "code/main.py"]
    );
    assert_eq!(
        names(ws.list("s", Some("code/"), true).await.unwrap()),
        ["code/lib", "code/lib/util.py", "code/main.py"]
    );
    assert_eq!(
        ws.list("s", Some("nope"), false).await.unwrap_err().kind(),
        ClientKind::NotFound
    );
    // Paging: `next` names where the following page starts.
    let nc = crate::common::nats(&nats.url()).await;
    let list = Subjects::default().workspace(WorkspaceOp::List);
    let mut page = WsList {
        session_id: "s".into(),
        recursive: true,
        limit: Some(2),
        ..Default::default()
    };
    let mut seen = Vec::new();
    loop {
        let got: WsListing = raw(&nc, list.clone(), &page).await.unwrap();
        assert!(got.entries.len() <= 2);
        seen.extend(got.entries.into_iter().map(|e| e.path));
        match got.next {
            Some(next) => page.after = Some(next),
            None => break,
        }
    }
    assert_eq!(seen.len(), 6);
    assert_eq!(seen, names(ws.list("s", None, true).await.unwrap()));
    let stat = ws.stat("s", "data/blob.bin").await.unwrap();
    assert_eq!((stat.size, stat.is_dir), (3000, false));
    assert!(ws.stat("s", "code").await.unwrap().is_dir);

    // Ranged reads, raw JSON as any client would send them.
    let read = |offset, length| WsRead {
        session_id: "s".into(),
        path: "data/blob.bin".into(),
        offset: Some(offset),
        length: Some(length),
        encoding: Some(ContentEncoding::Base64),
    };
    let subject = Subjects::default().workspace(WorkspaceOp::Read);
    let part: WsFile = raw(&nc, subject.clone(), &read(1000, 10)).await.unwrap();
    assert_eq!(part.size, 3000);
    assert_eq!(
        messages::decode_base64(&part.content).unwrap(),
        &binary[1000..1010]
    );
    let tail: WsFile = raw(&nc, subject.clone(), &read(2995, 100)).await.unwrap();
    assert_eq!(
        messages::decode_base64(&tail.content).unwrap(),
        &binary[2995..]
    );
    let e = raw::<_, WsFile>(&nc, subject, &read(3001, 1))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::BadRequest);

    // Append.
    let append = WsWrite {
        session_id: "s".into(),
        path: "code/main.py".into(),
        content: "print('more')\n".into(),
        encoding: ContentEncoding::Utf8,
        append: true,
        requested_by: Some("alice".into()),
        object: None,
        upload: None,
    };
    let _: serde_json::Value = raw(
        &nc,
        Subjects::default().workspace(WorkspaceOp::Write),
        &append,
    )
    .await
    .unwrap();
    assert_eq!(
        ws.read("s", "code/main.py").await.unwrap(),
        b"print('hi')\nprint('more')\n"
    );

    // A file where a directory is needed, and the reverse.
    assert_eq!(
        ws.write("s", "code/main.py/x", b"x")
            .await
            .unwrap_err()
            .kind(),
        ClientKind::Conflict
    );
    assert_eq!(
        ws.write("s", "code", b"x").await.unwrap_err().kind(),
        ClientKind::Conflict
    );
    assert_eq!(
        ws.read("s", "code").await.unwrap_err().kind(),
        ClientKind::BadRequest
    );
    assert_eq!(
        ws.read("s", "missing").await.unwrap_err().kind(),
        ClientKind::NotFound
    );

    // Delete: a non-empty directory needs `recursive`; usage follows.
    assert_eq!(
        ws.delete("s", "code", false).await.unwrap_err().kind(),
        ClientKind::Conflict
    );
    ws.delete("s", "code", true).await.unwrap();
    ws.delete("s", "data/blob.bin", false).await.unwrap();
    let usage = ws.usage("s").await.unwrap();
    assert_eq!((usage.bytes, usage.files), (0, 0));
    assert_eq!(names(ws.list("s", None, true).await.unwrap()), ["data"]);
    let (objects, _) = store_state(&nats.url(), &[]).await;
    assert!(
        objects.is_empty(),
        "deleted contents leave no objects: {objects:?}"
    );
}

#[tokio::test]
async fn quota_exceeded_is_refused_and_usage_is_unchanged() {
    let nats = NatsServer::start();
    let mut cfg = config(&nats.url(), "q1");
    cfg.max_size_mb = 1;
    let _svc = start(cfg).await;
    let ws = client(&nats.url()).await;
    ws.write("q", "a.bin", &bytes(600 * 1024, 1)).await.unwrap();
    let before = store_state(&nats.url(), &["q"]).await;
    let usage = ws.usage("q").await.unwrap();

    let e = ws
        .write("q", "b.bin", &bytes(600 * 1024, 2))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ClientKind::TooLarge, "{e}");
    assert!(e.to_string().contains("quota"), "{e}");
    // Through the object-store hand-off too.
    let e = ws
        .write("q", "c.bin", &bytes(2 << 20, 3))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ClientKind::TooLarge, "{e}");
    // And an archive that would overflow.
    let tar = RawTar::default()
        .file("d.bin", &bytes(500 * 1024, 4))
        .finish();
    let e = ws.restore("q", &tar, false, Vec::new()).await.unwrap_err();
    assert_eq!(e.kind(), ClientKind::TooLarge, "{e}");

    assert_eq!(ws.usage("q").await.unwrap().bytes, usage.bytes);
    assert_eq!(store_state(&nats.url(), &["q"]).await, before);
    // Shrinking and replacing within the quota still works.
    ws.write("q", "a.bin", &bytes(900 * 1024, 5)).await.unwrap();
    assert_eq!(ws.usage("q").await.unwrap().bytes, 900 * 1024);
}

#[tokio::test]
async fn a_50_mb_file_round_trips_byte_exact() {
    let nats = NatsServer::start();
    let _svc = start(config(&nats.url(), "big")).await;
    let ws = client(&nats.url()).await;
    let data = bytes(50 << 20, 42);
    let t = std::time::Instant::now();
    let entry = ws.write("big", "data/model.bin", &data).await.unwrap();
    let wrote = t.elapsed();
    assert_eq!(entry.size, data.len() as u64);
    let t = std::time::Instant::now();
    let back = ws.read("big", "data/model.bin").await.unwrap();
    let read = t.elapsed();
    assert!(back == data, "50 MB differs after the round trip");
    println!("50 MB: write {wrote:?}, read {read:?}");
    assert_eq!(ws.usage("big").await.unwrap().bytes, 50 << 20);

    // A range deep inside, inline.
    let nc = crate::common::nats(&nats.url()).await;
    let req = WsRead {
        session_id: "big".into(),
        path: "data/model.bin".into(),
        offset: Some(40 << 20),
        length: Some(4096),
        encoding: Some(ContentEncoding::Base64),
    };
    let part: WsFile = raw(&nc, Subjects::default().workspace(WorkspaceOp::Read), &req)
        .await
        .unwrap();
    let at = 40 << 20;
    assert_eq!(
        messages::decode_base64(&part.content).unwrap(),
        &data[at..at + 4096]
    );

    // The workspace as a tar (through the object store: far above one message).
    let tar = ws.snapshot("big", None).await.unwrap();
    let restored = ws.restore("copy", &tar, false, Vec::new()).await.unwrap();
    assert_eq!(restored.files_created, ["data/model.bin"]);
    assert!(ws.read("copy", "data/model.bin").await.unwrap() == data);
}

#[tokio::test]
async fn snapshot_and_restore_round_trip_and_report_changes() {
    let nats = NatsServer::start();
    let _svc = start(config(&nats.url(), "snap")).await;
    let ws = client(&nats.url()).await;
    ws.init("a").await.unwrap();
    ws.write("a", "code/main.py", b"print(1)\n").await.unwrap();
    ws.write("a", "data/input.csv", b"x,y\n1,2\n")
        .await
        .unwrap();
    let long = format!("output/{}/result.txt", "deep".repeat(40));
    ws.write("a", &long, b"long path").await.unwrap();

    let tar = ws.snapshot("a", None).await.unwrap();
    let done = ws.restore("b", &tar, false, Vec::new()).await.unwrap();
    assert_eq!(done.files_created.len(), 6);
    let state = store_state(&nats.url(), &["a", "b"]).await.1;
    assert_eq!(
        state["a"], state["b"],
        "a restored snapshot is the same workspace"
    );

    // Restoring the same archive again changes nothing.
    let again = ws.restore("b", &tar, false, Vec::new()).await.unwrap();
    assert!(again.files_created.is_empty() && again.files_modified.is_empty());

    // An executor's push-back: one file changed, one new, one deleted.
    let changes = RawTar::default()
        .file("code/main.py", b"print(2)\n")
        .file("output/plot.png", &bytes(2000, 7))
        .finish();
    let done = ws
        .restore("b", &changes, false, vec!["data/input.csv".into()])
        .await
        .unwrap();
    assert_eq!(done.files_modified, ["code/main.py"]);
    assert_eq!(done.files_created, ["output/plot.png"]);
    assert_eq!(done.files_deleted, ["data/input.csv"]);
    assert_eq!(ws.read("b", "code/main.py").await.unwrap(), b"print(2)\n");

    // `replace`: the archive becomes the whole workspace.
    let only = RawTar::default().file("solo.txt", b"alone").finish();
    let done = ws.restore("b", &only, true, Vec::new()).await.unwrap();
    assert_eq!(done.files_created, ["solo.txt"]);
    let listing = ws.list("b", None, true).await.unwrap();
    assert_eq!(listing.entries.len(), 1);
    let usage = ws.usage("b").await.unwrap();
    assert_eq!((usage.bytes, usage.files), (5, 1));
}
