//! Workspace sync with the real workspace-store: the session's files are placed at
//! `/workspace` before a run (request files on top), and what the code creates, modifies or
//! deletes goes back to the store — inline or, when large, through the object store. A
//! session's container keeps the revision it holds, so a run after one that changed nothing
//! asks the store nothing; an isolated run never talks to it.

use crate::common::{run, run_of, DockerRuns, Harness};
use docker_executor::docker::{LABEL_KIND, LABEL_NODE};
use futures::{FutureExt, StreamExt};
use kit::CancellationToken;
use messages::exec::{ContentEncoding, ExecStatus, FileSpec, Language};
use messages::executor::RunKind;
use messages::subjects::WorkspaceOp;
use messages::ErrorKind;
use sandmesh_client::{MeshClient, WorkspaceClient};
use std::time::Duration;
use test_support::{eventually, eventually_true, NatsServer};
use workspace_store::{WorkspaceConfig, WorkspaceError};

struct WithStore {
    h: Harness,
    ws: WorkspaceClient,
    stop: CancellationToken,
    store: tokio::task::JoinHandle<Result<(), WorkspaceError>>,
}

/// An executor with workspace sync on, next to a real workspace-store; `session` is written
/// once (`data/in.txt` = `first`) so the store is known to answer.
async fn with_store(session: &str, first: &[u8]) -> WithStore {
    let nats = NatsServer::start();
    let stop = CancellationToken::new();
    let store = tokio::spawn(workspace_store::run(
        WorkspaceConfig::for_url(&nats.url()),
        stop.clone(),
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
    // The store may still be starting.
    eventually("workspace-store to answer", Duration::from_secs(10), || {
        let ws = &ws;
        async move { ws.write(session, "data/in.txt", first).await.ok() }
    })
    .await;
    WithStore { h, ws, stop, store }
}

impl WithStore {
    async fn stop(self) {
        self.stop.cancel();
        self.store.await.unwrap().unwrap();
        self.h.stop().await;
    }
}

/// Every message on the workspace-store's subjects (`<prefix>.v1.workspace.>`), whoever
/// sends it: a plain subscription, so nothing can hide a request from it.
struct WorkspaceTraffic {
    sub: async_nats::Subscriber,
    /// Openings of the workspace index bucket (a `STREAM.INFO` each), counted in `openings`:
    /// once per executor, not once per run.
    index_opened: async_nats::Subscriber,
    openings: usize,
    client: async_nats::Client,
    marker: String,
}

impl WorkspaceTraffic {
    async fn watch(h: &Harness) -> Self {
        let init = h.subjects.workspace(WorkspaceOp::Init);
        let (group, _) = init.rsplit_once('.').expect("a workspace subject");
        let sub = h.client.subscribe(format!("{group}.>")).await.unwrap();
        let index = h.subjects.workspace_index_bucket();
        let index_opened = h
            .client
            .subscribe(format!("$JS.API.STREAM.INFO.KV_{index}"))
            .await
            .unwrap();
        Self {
            sub,
            index_opened,
            openings: 0,
            client: h.client.clone(),
            marker: format!("{group}.test-marker"),
        }
    }

    /// The workspace subjects seen since the last call. A marker published last comes back
    /// after everything sent before it (one server, in order), so nothing is still on its way
    /// — on the other subscription of the same connection either.
    async fn since_last(&mut self) -> Vec<String> {
        self.client
            .publish(self.marker.clone(), "".into())
            .await
            .unwrap();
        let mut seen = Vec::new();
        loop {
            let msg = tokio::time::timeout(Duration::from_secs(10), self.sub.next())
                .await
                .expect("the marker comes back")
                .expect("subscription open");
            if msg.subject.as_str() == self.marker {
                break;
            }
            seen.push(msg.subject.to_string());
        }
        while let Some(Some(_)) = self.index_opened.next().now_or_never() {
            self.openings += 1;
        }
        seen
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_second_execution_makes_no_workspace_request() {
    let s = "ws-fresh";
    let t = with_store(s, b"v1").await;
    let (h, ws) = (&t.h, &t.ws);
    ws.write(s, "data/gone.txt", b"deleted later")
        .await
        .unwrap();
    let mut traffic = WorkspaceTraffic::watch(h).await;

    // The first run fetches the workspace into the new container and pushes its change.
    let r = h
        .session(s, Language::Shell, "cat data/in.txt; echo made > out.txt")
        .await;
    assert_eq!(
        (r.status, r.stdout.as_str()),
        (ExecStatus::Ok, "v1"),
        "{r:?}"
    );
    let first = traffic.since_last().await;
    assert!(
        first.iter().any(|s| s.ends_with(".snapshot"))
            && first.iter().any(|s| s.ends_with(".restore")),
        "the first run fetches and pushes: {first:?}"
    );

    // Nothing changed since: the second run asks the store nothing (its own push included).
    let r = h
        .session(s, Language::Shell, "cat data/in.txt out.txt")
        .await;
    assert_eq!(
        (r.status, r.stdout.as_str()),
        (ExecStatus::Ok, "v1made\n"),
        "{r:?}"
    );
    assert_eq!(traffic.since_last().await, Vec::<String>::new());

    // A client's changes between runs are seen by the next run: a write and a deletion.
    ws.write(s, "data/in.txt", b"v2").await.unwrap();
    ws.delete(s, "data/gone.txt", false).await.unwrap();
    traffic.since_last().await;
    let r = h
        .session(
            s,
            Language::Shell,
            "cat data/in.txt; test -e data/gone.txt && echo ' still there' || echo ' gone'",
        )
        .await;
    assert_eq!(
        (r.status, r.stdout.as_str()),
        (ExecStatus::Ok, "v2 gone\n"),
        "{r:?}"
    );
    let third = traffic.since_last().await;
    assert!(
        third.iter().any(|s| s.ends_with(".snapshot")),
        "a changed workspace is fetched: {third:?}"
    );

    // A session the store has never heard of: asked once, then no more.
    let unknown = "ws-unknown";
    assert_eq!(
        h.session(unknown, Language::Shell, "echo hi").await.stdout,
        "hi\n"
    );
    assert!(!traffic.since_last().await.is_empty());
    assert_eq!(
        h.session(unknown, Language::Shell, "echo hi").await.stdout,
        "hi\n"
    );
    assert_eq!(traffic.since_last().await, Vec::<String>::new());
    // Every run after a session's first read the workspace's revision from its index.
    assert_eq!(traffic.openings, 1, "the index bucket is opened once");
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_run_leaves_nothing_and_never_touches_the_workspace() {
    let s = "ws-isolated";
    let t = with_store(s, b"stored").await;
    let h = &t.h;
    let mut traffic = WorkspaceTraffic::watch(h).await;
    let isolated = |code: &str| {
        // An isolated run names no session, so it has no workspace (while the session
        // that has one exists).
        let isolated = RunKind::Isolated {
            session_grade: false,
        };
        run_of(isolated, Language::Shell, code)
    };
    let r = h
        .call(&isolated(
            "ls /workspace; echo secret > /workspace/left.txt; echo secret > /tmp/left.txt; echo ok",
        ))
        .await
        .unwrap();
    assert_eq!(
        (r.status, r.stdout.as_str()),
        (ExecStatus::Ok, "ok\n"),
        "{r:?}"
    );
    assert!(r.files_created.is_empty(), "{r:?}");
    // The container made for it is gone right after.
    let label = format!("{LABEL_KIND}=isolated");
    eventually_true(
        "the isolated container removed",
        Duration::from_secs(20),
        || {
            let docker = &h.backend.docker;
            let labels = [label.clone(), format!("{LABEL_NODE}={}", h.node)];
            async move {
                let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
                crate::common::containers_with_all(docker, &labels)
                    .await
                    .is_empty()
            }
        },
    )
    .await;
    let r = h
        .call(&isolated(
            "ls -A /workspace /tmp | grep -c left.txt || true",
        ))
        .await
        .unwrap();
    assert_eq!(
        (r.status, r.stdout.as_str()),
        (ExecStatus::Ok, "0\n"),
        "{r:?}"
    );
    assert_eq!(traffic.since_last().await, Vec::<String>::new());
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_flow_between_the_store_and_the_sandbox() {
    let s = "ws-sync";
    let t = with_store(s, b"from the store").await;
    let (h, ws) = (&t.h, &t.ws);
    ws.write(s, "old.txt", b"to be deleted").await.unwrap();

    let mut req = run(
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
    req.edit_request(|r| {
        r.files = vec![FileSpec {
            path: "code/given.py".into(),
            content: "# from the request".into(),
            encoding: ContentEncoding::Utf8,
        }]
    });
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

    // A change made through the store between runs is seen by the session's next run.
    ws.write(s, "data/in.txt", b"edited outside").await.unwrap();
    let r = h
        .session(
            s,
            Language::Shell,
            "cat data/in.txt; ls old.txt 2>&1 | wc -l",
        )
        .await;
    assert_eq!(r.stdout, "edited outside1\n", "{r:?}");

    assert!(h.close(s).await);
    t.stop().await;
}

/// The names the workspace refuses, as code in the sandbox makes them (legal on Linux, and
/// what unpacking a hostile zip leaves behind).
const ODD_NAMES: [&str; 3] = ["weird\nname.txt", "back\\slash.txt", "%2e%2e%2fescape.txt"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_names_are_refused_by_name_and_every_other_change_is_saved() {
    let s = "ws-odd-names";
    let t = with_store(s, b"from the store").await;
    let (h, ws) = (&t.h, &t.ws);
    let r = h
        .session(
            s,
            Language::Python,
            "open('important_result.csv', 'w').write('1,2,3')\n\
             open('data/in.txt', 'a').write(' + changed')\n\
             for name in ['weird\\nname.txt', 'back\\\\slash.txt', '%2e%2e%2fescape.txt']:\n\
             \x20   open(name, 'w').write('x')\n\
             import os\n\
             print(sorted(os.listdir('.')))",
        )
        .await;
    assert_eq!((r.status, &r.error), (ExecStatus::Ok, &None), "{r:?}");
    // The probe saw its odd files in the sandbox: they were made, then refused.
    for name in ODD_NAMES {
        assert!(
            r.stdout.contains(&format!("{name:?}").replace('"', "'")),
            "{r:?}"
        );
    }
    assert_eq!(r.files_created, vec!["important_result.csv"], "{r:?}");
    assert_eq!(r.files_modified, vec!["data/in.txt"], "{r:?}");
    let mut refused: Vec<&str> = r.files_refused.iter().map(|f| f.path.as_str()).collect();
    refused.sort_unstable();
    let mut expected = ODD_NAMES.to_vec();
    expected.sort_unstable();
    assert_eq!(refused, expected, "{r:?}");
    assert_eq!(r.files_omitted, 0);
    // Every other change is in the store.
    assert_eq!(ws.read(s, "important_result.csv").await.unwrap(), b"1,2,3");
    assert_eq!(
        ws.read(s, "data/in.txt").await.unwrap(),
        b"from the store + changed"
    );
    // The session's next run sees the workspace as stored: the refused files are not there.
    let r = h.session(s, Language::Shell, "ls -A | sort").await;
    assert_eq!(
        r.stdout, "data\nimportant_result.csv\n",
        "only saved files: {r:?}"
    );
    assert!(h.close(s).await);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_past_the_change_list_bound_keeps_what_fits_and_names_the_limit() {
    let s = "ws-many-files";
    let t = with_store(s, b"from the store").await;
    let (h, ws) = (&t.h, &t.ws);
    let many = |dir: &str, count: usize| {
        let code = format!(
            "import os\n\
             open('/tmp/marker', 'w').write('same container')\n\
             open('{dir}.csv', 'w').write('42')\n\
             os.makedirs('{dir}', exist_ok=True)\n\
             for i in range({count}):\n\
             \x20   open(f'{dir}/file-{{i:06}}.dat', 'w').close()\n\
             print('made')"
        );
        let mut req = run(Some(s), Language::Python, &code);
        req.edit_request(|r| r.timeout_ms = Some(60_000));
        req
    };
    // Positive control: a few files are all kept, with no error.
    let r = h.call_node(&many("few", 3)).await.unwrap();
    assert_eq!((r.status, &r.error), (ExecStatus::Ok, &None), "{r:?}");
    assert_eq!(
        r.files_created,
        vec![
            "few.csv",
            "few/file-000000.dat",
            "few/file-000001.dat",
            "few/file-000002.dat"
        ]
    );
    assert_eq!(
        ws.list(s, Some("few"), false).await.unwrap().entries.len(),
        3
    );

    // 60,000 files: more than one run carries back (their names alone, 1.4 MB, are more than
    // the report's frame holds).
    let r = h.call_node(&many("bulk", 60_000)).await.unwrap();
    assert_eq!(
        (r.status, r.stdout.as_str()),
        (ExecStatus::Ok, "made\n"),
        "{r:?}"
    );
    let error = r.error.clone().expect("an error naming the limit");
    assert_eq!(error.kind, ErrorKind::TooLarge, "{error:?}");
    let details = error.details.expect("the limit in the details");
    assert_eq!(
        details["max_changed_paths"],
        sandbox_protocol::MAX_CHANGED_PATHS,
        "{details}"
    );
    assert!(r.files_modified.is_empty(), "{:?}", r.files_modified);
    assert_eq!(
        r.files_created.len() as u64 + r.files_omitted,
        60_001,
        "every change listed or counted"
    );
    assert!(r.files_omitted > 0, "{}", r.files_omitted);
    // What fits is kept, nearest the root first: listed, and in the store.
    assert!(r.files_created.contains(&"bulk.csv".to_string()));
    assert_eq!(ws.read(s, "bulk.csv").await.unwrap(), b"42");
    let stored = ws.list(s, Some("bulk"), false).await.unwrap().entries.len();
    assert_eq!(
        stored + 1,
        r.files_created.len(),
        "the listed files are stored"
    );
    // The container was kept (its /tmp holds what the run left there), and runs on.
    let r = h.session(s, Language::Shell, "cat /tmp/marker").await;
    assert_eq!(
        (r.status, r.stdout.as_str()),
        (ExecStatus::Ok, "same container"),
        "{r:?}"
    );
    assert!(h.close(s).await);
    t.stop().await;
}
