//! Workspace sync with the real workspace-store: the session's files are placed at
//! `/workspace` before a run (request files on top), and what the code creates, modifies or
//! deletes goes back to the store — inline or, when large, through the object store.

mod common;

use common::{run, Harness};
use kit::CancellationToken;
use messages::exec::{ContentEncoding, ExecStatus, FileSpec, Language, Tier};
use sandmesh_client::MeshClient;
use std::time::Duration;
use test_support::NatsServer;
use workspace_store::WorkspaceConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_flow_between_the_store_and_the_sandbox() {
    let nats = NatsServer::start();
    let store_stop = CancellationToken::new();
    let store = tokio::spawn(workspace_store::run(
        WorkspaceConfig::for_url(&nats.url()),
        store_stop.clone(),
    ));
    let h = Harness::start_on(
        nats,
        &[
            ("SANDMESH_EXEC_WORKSPACE", "on"),
            ("SANDMESH_EXEC_WARM_POOL", "1"),
        ],
    )
    .await;
    let ws = MeshClient::new(h.client.clone(), h.subjects.clone()).workspace();
    let s = "ws-sync";
    // The store may still be starting: retry the first write briefly.
    let mut tries = 0;
    while let Err(e) = ws.write(s, "data/in.txt", b"from the store").await {
        tries += 1;
        assert!(tries < 100, "workspace-store never answered: {e}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ws.write(s, "old.txt", b"to be deleted").await.unwrap();

    let mut req = run(
        Tier::Session,
        Some(s),
        Language::Python,
        "import os\n\
         print(open('data/in.txt').read(), open('code/given.py').read())\n\
         open('data/in.txt', 'a').write(' + changed')\n\
         os.makedirs('output', exist_ok=True)\n\
         open('output/out.txt', 'w').write('made here')\n\
         open('big.bin', 'wb').write(os.urandom(3 << 20))\n\
         os.remove('old.txt')",
    );
    req.request.files = vec![FileSpec {
        path: "code/given.py".into(),
        content: "# from the request".into(),
        encoding: ContentEncoding::Utf8,
    }];
    let r = h.call_node(&req).await.unwrap();
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    assert!(r.error.is_none(), "{r:?}");
    assert_eq!(r.stdout, "from the store # from the request\n");
    // The request's files are changes of the run as well: they persist with the rest.
    assert_eq!(
        r.files_created,
        vec!["big.bin", "code/given.py", "output/out.txt"],
        "{r:?}"
    );
    assert_eq!(r.files_modified, vec!["data/in.txt"], "{r:?}");

    assert_eq!(ws.read(s, "output/out.txt").await.unwrap(), b"made here");
    assert_eq!(
        ws.read(s, "data/in.txt").await.unwrap(),
        b"from the store + changed"
    );
    assert_eq!(
        ws.read(s, "big.bin").await.unwrap().len(),
        3 << 20,
        "via the object store"
    );
    assert_eq!(
        ws.read(s, "code/given.py").await.unwrap(),
        b"# from the request"
    );
    assert!(
        ws.stat(s, "old.txt").await.is_err(),
        "deleted in the store too"
    );

    // A change made through the store between runs is seen by the session's next run...
    ws.write(s, "data/in.txt", b"edited outside").await.unwrap();
    let r = h
        .session(
            s,
            Language::Shell,
            "cat data/in.txt; ls old.txt 2>&1 | wc -l",
        )
        .await;
    assert_eq!(r.stdout, "edited outside1\n", "{r:?}");
    // ...and by an ephemeral run of the same session, in a fresh container.
    let mut eph = run(
        Tier::Ephemeral,
        Some(s),
        Language::Shell,
        "cat output/out.txt; echo new > eph.txt",
    );
    eph.request.timeout_ms = Some(5000);
    let r = h.call(&eph).await.unwrap();
    assert_eq!(
        (r.status, r.stdout.as_str()),
        (ExecStatus::Ok, "made here"),
        "{r:?}"
    );
    assert_eq!(ws.read(s, "eph.txt").await.unwrap(), b"new\n");

    assert!(h.close(s).await);
    store_stop.cancel();
    store.await.unwrap().unwrap();
    h.stop().await;
}
