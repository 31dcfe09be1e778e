//! `sandmesh ws` as a person runs it: the real binary against a workspace-store running in
//! this process over a real nats-server; files of any size, refusals as exit code 1.

use std::process::Output;
use std::time::Duration;

use kit::CancellationToken;
use messages::Subjects;
use sandmesh_client::{MeshClient, WorkspaceClient};
use test_support::{eventually, NatsServer};
use workspace_store::WorkspaceConfig;

const BOUND: Duration = Duration::from_secs(60);

async fn start_store(url: &str) -> (CancellationToken, WorkspaceClient) {
    let token = CancellationToken::new();
    tokio::spawn(workspace_store::run(
        WorkspaceConfig::for_url(url),
        token.clone(),
    ));
    let nats = test_support::connect(url).await;
    let ws = MeshClient::new(nats, Subjects::default()).workspace();
    eventually("workspace-store answers", BOUND, || {
        let ws = ws.clone();
        async move { ws.usage("ready-probe").await.ok() }
    })
    .await;
    (token, ws)
}

/// `sandmesh ws <args>`.
async fn sandmesh(url: &str, args: &[&str]) -> Output {
    let args: Vec<&str> = ["ws"].iter().chain(args).copied().collect();
    crate::common::sandmesh(url, &args, BOUND).await
}

#[tokio::test]
async fn ls_get_put_rm() {
    let nats = NatsServer::start();
    let url = nats.url();
    let (stop, ws) = start_store(&url).await;
    let tmp = tempfile::tempdir().unwrap();

    let put = sandmesh(&url, &["put", "s1", "code/a.py", "print(1)"]).await;
    assert!(put.status.success(), "{put:?}");
    // Larger than one message: through the object store both ways.
    let big: Vec<u8> = (0..(2u32 << 20)).map(|i| (i * 7 % 251) as u8).collect();
    let src = tmp.path().join("big.bin");
    std::fs::write(&src, &big).unwrap();
    let src = src.to_str().unwrap();
    let put = sandmesh(&url, &["put", "s1", "data/big.bin", "--file", src]).await;
    assert!(put.status.success(), "{put:?}");
    assert_eq!(ws.read("s1", "data/big.bin").await.unwrap(), big);

    let back = tmp.path().join("back.bin");
    let back_s = back.to_str().unwrap();
    let get = sandmesh(&url, &["get", "s1", "data/big.bin", "--out", back_s]).await;
    assert!(get.status.success(), "{get:?}");
    assert!(std::fs::read(&back).unwrap() == big);
    let cat = sandmesh(&url, &["get", "s1", "code/a.py"]).await;
    assert_eq!(cat.stdout, b"print(1)");
    let ls = sandmesh(&url, &["ls", "s1", "-r"]).await;
    let listed = String::from_utf8_lossy(&ls.stdout).into_owned();
    assert!(
        listed.contains("code/a.py") && listed.contains("data/big.bin"),
        "{listed}"
    );

    // Refusals are exit code 1 with the store's message, not a crash.
    for refused in [
        &["get", "s1", "../etc/passwd"][..],
        &["get", "s1", "missing"],
        &["rm", "s1", "code"],
    ] {
        let out = sandmesh(&url, refused).await;
        assert_eq!(out.status.code(), Some(1), "{refused:?}: {out:?}");
        assert!(!out.stderr.is_empty(), "{refused:?} says why");
    }
    assert!(sandmesh(&url, &["rm", "s1", "code", "-r"])
        .await
        .status
        .success());

    let listing = ws.list("s1", None, true).await.unwrap();
    let paths: Vec<String> = listing.entries.into_iter().map(|e| e.path).collect();
    assert_eq!(paths, ["data", "data/big.bin"]);
    stop.cancel();
}

/// `sandmesh <args>` writing into a pipe whose reader is gone before the command prints
/// anything (`| head` that already has its lines): its exit status and stderr.
async fn into_closed_pipe(url: &str, args: &[&str]) -> (std::process::ExitStatus, String) {
    let mut child = tokio::process::Command::new(crate::common::SANDMESH)
        .args(args)
        .env("SANDMESH_NATS_URL", url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn sandmesh");
    // The only read end: the command's first write finds no reader.
    drop(child.stdout.take());
    let out = tokio::time::timeout(BOUND, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("sandmesh {args:?} did not end within {BOUND:?}"))
        .expect("sandmesh runs");
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn a_reader_that_goes_away_ends_each_command_quietly() {
    let nats = NatsServer::start();
    let url = nats.url();
    let (stop, _ws) = start_store(&url).await;
    for i in 0..20 {
        let path = format!("code/f{i}.py");
        let put = sandmesh(&url, &["put", "pipe-s", &path, "print(1)"]).await;
        assert!(put.status.success(), "{put:?}");
    }
    let commands: [&[&str]; 3] = [
        // Lines printed one by one.
        &["ws", "ls", "pipe-s", "-r"],
        // Bytes written to stdout whole.
        &["ws", "get", "pipe-s", "code/f0.py"],
        // A command with no mesh to ask.
        &["console"],
    ];
    for args in commands {
        // The positive control: with a reader, the command prints.
        let read = crate::common::sandmesh(&url, args, BOUND).await;
        assert!(
            read.status.success() && !read.stdout.is_empty(),
            "{args:?}: {read:?}"
        );
        let (status, stderr) = into_closed_pipe(&url, args).await;
        assert!(
            status.success() || status.code() == Some(141),
            "{args:?} ends with 0 or the SIGPIPE status, not {status:?}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(!stderr.contains("Broken pipe"), "{args:?}: {stderr}");
    }
    stop.cancel();
}
