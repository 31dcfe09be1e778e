//! Throughput numbers for the README (printed, never asserted): sequential write and read
//! of 1 KB and 10 MB files, concurrent 1 KB writes, and the executor's per-run pair,
//! snapshot + restore of a small workspace. Run with
//! `cargo test --release -p sandmesh-workspace-store --test bench -- --nocapture`.

mod common;

use std::time::{Duration, Instant};

use common::*;
use test_support::NatsServer;

fn rate(label: &str, ops: usize, bytes: usize, took: Duration) {
    let secs = took.as_secs_f64();
    println!(
        "{label:<32} {ops:>5} ops in {took:>10.1?}: {:>8.0} ops/s {:>8.1} MB/s {:>8.2} ms/op",
        ops as f64 / secs,
        bytes as f64 / secs / 1e6,
        secs * 1000.0 / ops as f64,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn throughput() {
    let nats = NatsServer::start();
    let _svc = start(config(&nats.url(), "bench")).await;
    let ws = client(&nats.url()).await;

    let small = bytes(1024, 1);
    let n = 300;
    let t = Instant::now();
    for i in 0..n {
        ws.write("b", &format!("small/f{i}.bin"), &small)
            .await
            .unwrap();
    }
    rate("write 1 KB (sequential)", n, n * 1024, t.elapsed());
    let t = Instant::now();
    for i in 0..n {
        ws.read("b", &format!("small/f{i}.bin")).await.unwrap();
    }
    rate("read 1 KB (sequential)", n, n * 1024, t.elapsed());

    let t = Instant::now();
    let tasks: Vec<_> = (0..16)
        .map(|w| {
            let url = nats.url();
            let small = small.clone();
            tokio::spawn(async move {
                let ws = client(&url).await;
                for i in 0..50 {
                    ws.write(&format!("c{w}"), &format!("f{i}.bin"), &small)
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    rate("write 1 KB (16 clients)", 800, 800 * 1024, t.elapsed());

    let big = bytes(10 << 20, 2);
    let m = 5;
    let t = Instant::now();
    for i in 0..m {
        ws.write("b", &format!("big/f{i}.bin"), &big).await.unwrap();
    }
    rate("write 10 MB (sequential)", m, m * big.len(), t.elapsed());
    let t = Instant::now();
    for i in 0..m {
        let back = ws.read("b", &format!("big/f{i}.bin")).await.unwrap();
        assert_eq!(back.len(), big.len());
    }
    rate("read 10 MB (sequential)", m, m * big.len(), t.elapsed());

    // The executor's pair per run on a fresh session workspace.
    ws.init("exec").await.unwrap();
    for i in 0..5 {
        ws.write("exec", &format!("code/m{i}.py"), &bytes(2000, i))
            .await
            .unwrap();
    }
    let k = 50;
    let t = Instant::now();
    let mut tar = Vec::new();
    for _ in 0..k {
        tar = ws.snapshot("exec", None).await.unwrap();
    }
    rate("snapshot (8 files, 6 dirs)", k, k * tar.len(), t.elapsed());
    let change = RawTar::default()
        .file("output/result.txt", b"42\n")
        .finish();
    let t = Instant::now();
    for i in 0..k {
        let delete = if i % 2 == 1 {
            vec!["output/result.txt".to_string()]
        } else {
            vec![]
        };
        let tar = if i % 2 == 1 {
            RawTar::default().finish()
        } else {
            change.clone()
        };
        ws.restore("exec", &tar, false, delete).await.unwrap();
    }
    rate("restore (one file changed)", k, 0, t.elapsed());
}
