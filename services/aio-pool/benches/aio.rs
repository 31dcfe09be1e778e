//! `cargo bench -p sandmesh-aio-pool --bench aio`: the AIO pool's costs, beside the session
//! tier measured in the same run (README "AIO pool").
//!
//! - acquire from warm: a new session takes a warm instance (p50);
//! - cold start: acquire with nothing warm (create + start + `GET /v1/sandbox` answers);
//! - exec `print(1)` through the scheduler, tier `aio` vs tier `session` (same run);
//! - idle memory of an instance: before and after its Chromium started.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use docker_executor::probe::percentile;
use kit::config::env_map;
use kit::CancellationToken;
use messages::browser::{AioAcquire, AioRelease};
use messages::exec::{ExecRequest, ExecStatus, Language, TierChoice};
use messages::Subjects;
use sandmesh_client::MeshClient;
use test_support::NatsServer;

fn p50(name: &str, mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    let p = percentile(&samples, 50.0);
    println!(
        "{name:<34} n={:<3} p50 {:>8.1} ms   max {:>8.1} ms",
        samples.len(),
        p.as_secs_f64() * 1e3,
        samples.last().unwrap().as_secs_f64() * 1e3
    );
    p
}

async fn wait_warm(mesh: &MeshClient, n: u32) {
    for _ in 0..600 {
        if mesh.aio().stats().await.is_ok_and(|s| s.warm >= n) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the pool never had {n} warm instances");
}

async fn memory_mb(docker: &bollard::Docker, container: &str) -> f64 {
    use futures::StreamExt;
    let options = bollard::query_parameters::StatsOptionsBuilder::default()
        .stream(false)
        .one_shot(true)
        .build();
    let stats = docker
        .stats(container, Some(options))
        .next()
        .await
        .unwrap()
        .unwrap();
    let m = stats.memory_stats.unwrap();
    // The kernel's page cache counts in `usage`; the working set is what the instance holds.
    let cache = m
        .stats
        .as_ref()
        .and_then(|s| {
            s.get("inactive_file")
                .or_else(|| s.get("total_inactive_file"))
        })
        .copied()
        .unwrap_or(0);
    (m.usage.unwrap_or(0).saturating_sub(cache)) as f64 / (1 << 20) as f64
}

#[tokio::main]
async fn main() {
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let aio_image = {
        let aio = containers::image::AIO;
        aio.build(&aio.build_binary().expect("agent"))
            .expect("AIO image")
    };
    let sandbox_image = docker_executor::image::ensure()
        .await
        .expect("sandbox image");
    println!("images {aio_image} and {sandbox_image}, {rounds} rounds\n");

    let nats = NatsServer::start();
    let url = nats.url();
    let stop = CancellationToken::new();
    let env = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
        let mut e = env_map(pairs);
        e.insert("SANDMESH_NATS_URL".into(), url.clone());
        e
    };
    let pool = aio_pool::AioPoolConfig::from_env(&env(&[
        ("SANDMESH_AIO_IMAGE", &aio_image),
        ("SANDMESH_AIO_MIN_INSTANCES", "2"),
        ("SANDMESH_AIO_MAX_INSTANCES", "6"),
        ("SANDMESH_AIO_HEALTH_MS", "500"),
    ]))
    .unwrap();
    tokio::spawn(aio_pool::run(pool, stop.clone()));
    let risk = risk_assessor::RiskAssessorConfig::from_env(&env(&[])).unwrap();
    tokio::spawn(risk_assessor::run(risk, stop.clone()));
    let ws = workspace_store::WorkspaceConfig::for_url(&url);
    tokio::spawn(workspace_store::run(ws, stop.clone()));
    let exec_cfg = docker_executor::ExecutorConfig::from_env(&env(&[
        ("SANDMESH_EXEC_IMAGE", &sandbox_image),
        ("SANDMESH_EXEC_WORKSPACE", "off"),
    ]))
    .unwrap();
    tokio::spawn(docker_executor::run(exec_cfg, stop.clone()));
    let sched = scheduler::SchedulerConfig::from_env(&env(&[])).unwrap();
    tokio::spawn(scheduler::run(sched, stop.clone()));

    let client = test_support::connect(&url).await;
    let mesh = MeshClient::new(client, Subjects::default()).with_timeout(Duration::from_secs(60));
    let aio = mesh.aio();
    wait_warm(&mesh, 2).await;

    // Acquire from warm: each sample waits until the pool replenished.
    let mut warm = Vec::new();
    for i in 0..rounds {
        wait_warm(&mesh, 2).await;
        let session = format!("warm{i}");
        let t = Instant::now();
        aio.acquire(&AioAcquire {
            session_id: session.clone(),
            browser: false,
        })
        .await
        .unwrap();
        warm.push(t.elapsed());
        aio.release(&AioRelease {
            session_id: session,
            instance_id: None,
        })
        .await
        .unwrap();
    }
    p50("acquire (warm instance)", warm);

    // Cold: occupy the warm ones, then every acquire must create an instance.
    wait_warm(&mesh, 2).await;
    let mut cold = Vec::new();
    for i in 0..rounds.min(8) {
        for s in ["hold0", "hold1"] {
            aio.acquire(&AioAcquire {
                session_id: s.into(),
                browser: false,
            })
            .await
            .unwrap();
        }
        let session = format!("cold{i}");
        let t = Instant::now();
        aio.acquire(&AioAcquire {
            session_id: session.clone(),
            browser: false,
        })
        .await
        .unwrap();
        cold.push(t.elapsed());
        for s in [session.as_str(), "hold0", "hold1"] {
            aio.release(&AioRelease {
                session_id: s.into(),
                instance_id: None,
            })
            .await
            .unwrap();
        }
        wait_warm(&mesh, 2).await;
    }
    p50("acquire (cold start of one)", cold);

    // print(1) through the scheduler: tier aio vs tier session, interleaved.
    let exec = mesh.exec();
    let run = |tier: TierChoice, session: &'static str| {
        let exec = exec.clone();
        async move {
            let req = ExecRequest {
                session_id: Some(session.into()),
                language: Language::Python,
                code: "print(1)".into(),
                tier,
                ..Default::default()
            };
            let t = Instant::now();
            let r = exec.exec(&req).await.unwrap();
            assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
            t.elapsed()
        }
    };
    for _ in 0..3 {
        run(TierChoice::Aio, "bench-aio").await;
        run(TierChoice::Session, "bench-session").await;
    }
    let (mut a, mut s) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        a.push(run(TierChoice::Aio, "bench-aio").await);
        s.push(run(TierChoice::Session, "bench-session").await);
    }
    let a = p50("exec print(1), tier aio", a);
    let s = p50("exec print(1), tier session", s);
    println!(
        "{:<34} {:.2}x",
        "aio / session (p50)",
        a.as_secs_f64() / s.as_secs_f64()
    );

    // Idle memory of one instance, without and with its browser.
    let docker = containers::connect().await.unwrap();
    let lease = aio
        .acquire(&AioAcquire {
            session_id: "rss".into(),
            browser: false,
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = memory_mb(&docker, &lease.instance_id).await;
    aio.acquire(&AioAcquire {
        session_id: "rss".into(),
        browser: true,
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let with_browser = memory_mb(&docker, &lease.instance_id).await;
    println!("{:<34} {idle:.1} MiB", "idle instance (agent only)");
    println!(
        "{:<34} {with_browser:.1} MiB",
        "idle instance, Chromium started"
    );

    stop.cancel();
    tokio::time::sleep(Duration::from_secs(5)).await;
}
