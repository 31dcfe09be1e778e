//! browser-router figures for the README ("Browser"), over the same real mesh as the tests
//! (nats-server, risk-assessor, confirmation, workspace-store, real Chromium containers, the
//! fixture site on 127.0.0.2), beside a bare baseline measured in the same run: the same
//! navigate + screenshot straight over CDP to a browser container of the same image and
//! egress proxy, without NATS, risk assessment, audit or the workspace write.
//!
//! ```sh
//! cargo bench -p sandmesh-browser-router --bench browser      # ROUNDS=20 by default
//! ```

use std::time::{Duration, Instant};

use browser_router::chromium::Chromium;
use browser_router::container::Containers;
use browser_router::BrowserConfig;
use docker_executor::probe::percentile;
use messages::browser::{BrowserAction as A, BrowserPayload};
use test_support::browser::{req, BrowserMesh};

fn p50(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    percentile(&samples, 50.0)
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

/// Until the router's warm pool holds `n` started browsers again.
async fn warm_pool_refilled(mesh: &BrowserMesh, sessions: usize, n: usize) {
    test_support::eventually_true(
        "the warm pool refills",
        test_support::browser::BOUND,
        || async { mesh.containers().len() == sessions + n },
    )
    .await;
    // Started is not yet answering: give the new browser its start.
    tokio::time::sleep(Duration::from_secs(2)).await;
}

/// Navigate + screenshot straight over CDP, `rounds` times.
async fn bare(mesh: &BrowserMesh, rounds: usize) -> Vec<Duration> {
    let policy = format!(
        r#"{{"allow_cidrs":["127.0.0.2/32"],"ports":[{}]}}"#,
        mesh.fixture.port
    );
    let dir = tempfile::tempdir().unwrap();
    let env = kit::config::env_map(&[
        ("SANDMESH_INSTANCE_ID", "benchbare"),
        ("SANDMESH_BROWSER_IMAGE", test_support::browser::image()),
        ("SANDMESH_BROWSER_NETWORK_POLICY", policy.as_str()),
        ("SANDMESH_BROWSER_EGRESS_DIR", dir.path().to_str().unwrap()),
    ]);
    let config = BrowserConfig::from_env(&env).unwrap();
    // The bare floor has no mesh: its containers are labelled as the bench's own.
    let containers = Containers::connect(&config, "bench").await.unwrap();
    let container = containers.start(Duration::from_secs(30)).await.unwrap();
    let proxy = egress::EgressProxy::builder(config.network.clone())
        .bind(container.egress_socket())
        .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        container.egress_socket(),
        std::fs::Permissions::from_mode(0o666),
    )
    .unwrap();
    let mut chromium = Chromium::connect(&container.cdp_url()).await.unwrap();
    let url = mesh.fixture.url("/");
    let mut samples = Vec::new();
    for _ in 0..rounds {
        let t = Instant::now();
        chromium
            .navigate(&url, Duration::from_secs(30))
            .await
            .unwrap();
        chromium.screenshot(false).await.unwrap();
        samples.push(t.elapsed());
    }
    drop(chromium);
    drop(proxy);
    drop(container);
    containers.tasks.close();
    containers.tasks.wait().await;
    containers.remove_socket_dir();
    samples
}

/// The resident memory of each of this router's containers, in MiB, from `docker stats`.
fn rss_mib(router: &str) -> Vec<f64> {
    let names = test_support::browser::containers_of(router);
    let out = std::process::Command::new("docker")
        .args(["stats", "--no-stream", "--format", "{{.MemUsage}}"])
        .args(&names)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let used = l.split('/').next()?.trim();
            let (n, unit) = used.split_at(used.find(|c: char| c.is_ascii_alphabetic())?);
            let n: f64 = n.parse().ok()?;
            Some(match unit {
                "GiB" => n * 1024.0,
                "KiB" => n / 1024.0,
                _ => n,
            })
        })
        .collect()
}

async fn actions_per_second(mesh: &BrowserMesh, sessions: &[String], per_session: usize) -> f64 {
    let t = Instant::now();
    let runs = sessions.iter().map(|s| async move {
        for i in 0..per_session {
            let action = if i % 2 == 0 { A::Elements } else { A::Content };
            mesh.ok(s, action, BrowserPayload::default()).await;
        }
    });
    futures::future::join_all(runs).await;
    (sessions.len() * per_session) as f64 / t.elapsed().as_secs_f64()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(20);
    let mesh = BrowserMesh::start(&[("SANDMESH_BROWSER_WARM_POOL", "1")]).await;

    // First action of a new session, a warm browser ready each time.
    let mut first = Vec::new();
    for i in 0..rounds.min(8) {
        warm_pool_refilled(&mesh, 0, 1).await;
        let s = format!("first-{i}");
        let t = Instant::now();
        mesh.navigate(&s, "/").await;
        first.push(t.elapsed());
        mesh.ok(&s, A::Close, BrowserPayload::default()).await;
    }

    // navigate + screenshot, through the router and bare.
    let mut through = Vec::new();
    mesh.navigate("shots", "/").await;
    for _ in 0..rounds {
        let t = Instant::now();
        mesh.navigate("shots", "/").await;
        mesh.ok("shots", A::Screenshot, req(|_| {})).await;
        through.push(t.elapsed());
    }
    let bare = bare(&mesh, rounds).await;

    // Throughput of light actions (elements, content) on loaded pages.
    let sessions: Vec<String> = (0..4).map(|i| format!("tp-{i}")).collect();
    for s in &sessions {
        mesh.navigate(s, "/").await;
    }
    let c1 = actions_per_second(&mesh, &sessions[..1], rounds * 2).await;
    let c4 = actions_per_second(&mesh, &sessions, rounds).await;
    let rss = rss_mib(&mesh.router);

    println!("browser-router, {rounds} rounds");
    println!(
        "first action of a new session (warm pool), p50: {}",
        ms(p50(first))
    );
    println!(
        "navigate + screenshot via the router, p50:     {}",
        ms(p50(through.clone()))
    );
    println!(
        "navigate + screenshot bare CDP, p50:           {}",
        ms(p50(bare.clone()))
    );
    println!(
        "router / bare:                                 {:.2}x",
        p50(through).as_secs_f64() / p50(bare).as_secs_f64()
    );
    println!("actions/s (elements|content), concurrency 1:   {c1:.1}");
    println!("actions/s (elements|content), concurrency 4:   {c4:.1}");
    let avg = rss.iter().sum::<f64>() / rss.len().max(1) as f64;
    println!(
        "memory per browser container ({} containers): avg {avg:.0} MiB, max {:.0} MiB",
        rss.len(),
        rss.iter().cloned().fold(0.0, f64::max)
    );
    mesh.stop().await;
}
