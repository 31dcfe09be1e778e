//! Instances are stateless and interchangeable: concurrent writers on two instances leave a
//! consistent workspace and hold the quota; killing the service (SIGKILL, a real process) and
//! restarting the NATS server lose no acknowledged write.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};

use crate::common::*;
use sandmesh_client::ErrorKind;
use test_support::NatsServer;

/// The service binary as its own process, killed (SIGKILL) on drop.
struct Process(Child);

impl Process {
    fn start(url: &str, instance: &str) -> Self {
        let child = Command::new(env!("CARGO_BIN_EXE_sandmesh-workspace-store"))
            .env("SANDMESH_NATS_URL", url)
            .env("SANDMESH_INSTANCE_ID", instance)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the workspace-store binary");
        Self(child)
    }

    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Checks the session's totals against its files.
async fn assert_consistent(url: &str, session: &str) {
    let ws = client(url).await;
    let files: Vec<_> = ws
        .list(session, None, true)
        .await
        .unwrap()
        .entries
        .into_iter()
        .filter(|e| !e.is_dir)
        .collect();
    let usage = ws.usage(session).await.unwrap();
    assert_eq!(
        usage.bytes,
        files.iter().map(|f| f.size).sum::<u64>(),
        "bytes"
    );
    assert_eq!(usage.files, files.len() as u64, "file count");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_on_two_instances_stay_consistent() {
    let nats = NatsServer::start();
    let url = nats.url();
    let _a = start(config(&url, "inst-a")).await;
    let _b = start(config(&url, "inst-b")).await;
    // Many clients: requests spread over both instances (one queue group).
    let mut tasks = Vec::new();
    for writer in 0..8u64 {
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let ws = client(&url).await;
            for i in 0..25u64 {
                // Some paths are shared between writers (same file, racing overwrites).
                let path = if i % 5 == 0 {
                    format!("shared/{}.bin", i % 3)
                } else {
                    format!("w{writer}/f{i}.bin")
                };
                let data = bytes((100 + writer * 37 + i * 11) as usize, writer * 100 + i);
                ws.write("crowd", &path, &data).await.unwrap();
                if i % 7 == 0 {
                    ws.delete("crowd", &path, false).await.ok();
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_consistent(&url, "crowd").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_quota_holds_under_concurrent_writers() {
    let nats = NatsServer::start();
    let url = nats.url();
    let mut cfg = config(&url, "qa");
    cfg.max_size_mb = 1;
    let _a = start(cfg.clone()).await;
    cfg.kit.instance_id = "qb".into();
    let _b = start(cfg).await;
    let mut tasks = Vec::new();
    for i in 0..20u64 {
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let ws = client(&url).await;
            ws.write("tight", &format!("f{i}.bin"), &bytes(100 * 1024, i))
                .await
        }));
    }
    let mut accepted = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => accepted += 1,
            Err(e) => assert_eq!(e.kind(), ErrorKind::TooLarge, "{e}"),
        }
    }
    // 1 MiB holds ten 100 KiB files, never more.
    assert_eq!(accepted, 10);
    assert_consistent(&url, "tight").await;
    assert_eq!(
        client(&url).await.usage("tight").await.unwrap().bytes,
        10 * 100 * 1024
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_acknowledged_write_is_lost_to_a_killed_service_or_a_nats_restart() {
    let mut nats = NatsServer::start();
    let url = nats.url();
    let mut service = Process::start(&url, "durable-1");
    let ws = client(&url).await;
    wait_ready(&ws).await;

    let mut acked: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let big = bytes(3 << 20, 99);
    ws.write("dur", "data/big.bin", &big).await.unwrap();
    acked.insert("data/big.bin".into(), big);
    for i in 0..60u64 {
        let path = format!("code/f{i}.txt");
        let data = format!("file {i}\n").repeat(i as usize + 1).into_bytes();
        ws.write("dur", &path, &data).await.unwrap();
        acked.insert(path, data);
    }

    async fn check(url: &str, acked: &BTreeMap<String, Vec<u8>>) {
        let ws = client(url).await;
        wait_ready(&ws).await;
        for (path, data) in acked {
            let back = ws.read("dur", path).await.unwrap();
            assert!(back == *data, "{path} differs");
        }
        assert_consistent(url, "dur").await;
    }

    // 1. SIGKILL the service, start a new process.
    service.kill();
    let mut service = Process::start(&url, "durable-2");
    check(&url, &acked).await;

    // 2. Restart NATS under the running service.
    nats.restart();
    check(&url, &acked).await;
    // It keeps taking writes after the restart.
    ws.write("dur", "code/after.txt", b"after restart")
        .await
        .unwrap();
    acked.insert("code/after.txt".into(), b"after restart".to_vec());

    // 3. Both at once.
    service.kill();
    nats.restart();
    let _service = Process::start(&url, "durable-3");
    check(&url, &acked).await;
}
