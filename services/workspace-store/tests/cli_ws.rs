//! The `sandmesh ws` commands (cli/src/ws.rs, compiled in here) against a real store.

mod common;

#[path = "../../../cli/src/ws.rs"]
mod ws;

use clap::Parser;
use common::*;
use kit::Caller;
use messages::Subjects;
use test_support::NatsServer;

#[derive(clap::Parser)]
struct Cli {
    #[command(subcommand)]
    cmd: ws::WsCommand,
}

async fn sandmesh_ws(url: &str, args: &[&str]) -> i32 {
    let cli = Cli::try_parse_from(std::iter::once("ws").chain(args.iter().copied()))
        .expect("arguments parse");
    let caller = Caller::new(common::nats(url).await, TIMEOUT);
    ws::run(&caller, &Subjects::default(), cli.cmd)
        .await
        .unwrap()
}

#[tokio::test]
async fn ls_get_put_rm() {
    let nats = NatsServer::start();
    let url = nats.url();
    let _svc = start(config(&url, "cli")).await;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();

    assert_eq!(
        sandmesh_ws(&url, &["put", "s1", "code/a.py", "print(1)"]).await,
        0
    );
    let big = bytes(2 << 20, 5);
    let src = dir.join("big.bin");
    std::fs::write(&src, &big).unwrap();
    let src = src.to_str().unwrap();
    assert_eq!(
        sandmesh_ws(&url, &["put", "s1", "data/big.bin", "--file", src]).await,
        0
    );

    let out = dir.join("back.bin");
    let out_s = out.to_str().unwrap();
    assert_eq!(
        sandmesh_ws(&url, &["get", "s1", "data/big.bin", "--out", out_s]).await,
        0
    );
    assert!(std::fs::read(&out).unwrap() == big);
    assert_eq!(sandmesh_ws(&url, &["ls", "s1", "-r"]).await, 0);

    // Refusals are exit code 1 with the store's message, not a crash.
    assert_eq!(sandmesh_ws(&url, &["get", "s1", "../etc/passwd"]).await, 1);
    assert_eq!(sandmesh_ws(&url, &["get", "s1", "missing"]).await, 1);
    assert_eq!(sandmesh_ws(&url, &["rm", "s1", "code"]).await, 1);
    assert_eq!(sandmesh_ws(&url, &["rm", "s1", "code", "-r"]).await, 0);

    let listing = client(&url).await.list("s1", None, true).await.unwrap();
    let paths: Vec<String> = listing.entries.into_iter().map(|e| e.path).collect();
    assert_eq!(paths, ["data", "data/big.bin"]);
}
