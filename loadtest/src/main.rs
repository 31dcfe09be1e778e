//! `loadtest`: measures a running sandmesh against what this machine can do at best (bare
//! Docker execs in the same run), and writes the figures as JSON and a short summary.
//!
//! Scenarios: `baseline`, `exec`, `http`, `assess`, `workspace`, `mixed`, `burst`, `idle-rss`, and
//! `all` (every one of them, the README's figures). `--spawn-mesh` starts
//! `target/release/sandmesh up` on a free port first, so one command reproduces everything.
//! Traffic goes to loopback only; every loop is bounded in count and time. With
//! `--metrics-addr` the mesh's `/metrics` is scraped before and after, and the executions
//! counter checked against the results stored meanwhile.

mod cli;
mod client;
mod cluster;
mod docker;
mod driver;
mod ids;
mod mesh;
mod metrics_check;
mod programs;
mod report;
mod rss;
mod scenarios;
mod stats;
mod summary;
mod targets;

use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use messages::exec::Language;
use messages::Subjects;

use crate::cli::{BurstArgs, Cli, ExecArgs, LoadArgs, Scenario};
use crate::mesh::Mesh;
use crate::report::{Machine, Report};
use crate::scenarios::exec::{ExecTier, Mode};
use crate::scenarios::Ctx;

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(cli).await {
        eprintln!("loadtest: {e:#}");
        std::process::exit(1);
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let subjects = Subjects::new(cli.prefix.clone()).map_err(anyhow::Error::msg)?;
    let work_dir = tempfile::Builder::new()
        .prefix("sandmesh-loadtest-")
        .tempdir()?
        .keep();
    eprintln!("loadtest: logs in {}", work_dir.display());
    let sandmesh_bin = cli
        .sandmesh_bin
        .clone()
        .unwrap_or_else(mesh::default_sandmesh_bin);
    let timeout = Duration::from_secs_f64(cli.timeout_s);
    // The servers of --spawn-cluster: stopped after the mesh on them.
    let mut cluster_servers = None;
    let (spawned, url) = if cli.spawn_mesh {
        eprintln!("loadtest: starting {} up", sandmesh_bin.display());
        let (p, url) = mesh::spawn_up(
            &sandmesh_bin,
            &work_dir,
            &subjects,
            cli.metrics_addr,
            Duration::from_secs(600),
        )
        .await?;
        eprintln!(
            "loadtest: mesh is up at {}",
            sandmesh_auth::split_url(&url).0
        );
        (Some(p), url)
    } else if cli.spawn_cluster {
        eprintln!(
            "loadtest: starting three clustered nats-servers and {} up",
            sandmesh_bin.display()
        );
        let (c, url) = cluster::spawn_cluster(
            &sandmesh_bin,
            &work_dir,
            &subjects,
            Duration::from_secs(600),
        )
        .await?;
        eprintln!(
            "loadtest: mesh is up on the cluster (R3) at {}",
            sandmesh_auth::split_url(&url).0
        );
        cluster_servers = Some(c.servers);
        (Some(c.up), url)
    } else {
        (None, cli.nats_url.clone())
    };
    let mut mesh = Mesh::connect(&url, subjects, timeout).await?;
    mesh.sync_ids = cli.sync_ids;
    let docker = docker::connect().await.ok();
    let machine = Machine {
        cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string(),
        docker: match &docker {
            Some(d) => docker::version(d).await,
            None => "unreachable".into(),
        },
    };
    let mut ctx = Ctx {
        mesh_id: scenarios::mesh_id(&mesh).await,
        mesh,
        docker,
        warm_pool: cli.warm_pool,
        gateway: spawned.as_ref().and_then(|p| p.gateway),
        sandmesh_bin,
        work_dir,
        timeout,
        report: Report {
            started_unix_ms: messages::now_ms(),
            command: std::env::args().collect::<Vec<_>>().join(" "),
            machine,
            // Without the admin's password: the report is shared.
            nats_url: sandmesh_auth::split_url(&url).0,
            spawned_mesh: spawned.is_some(),
            ..Default::default()
        },
    };
    let before = match cli.metrics_addr {
        Some(addr) => Some(metrics_check::checkpoint(&ctx.mesh, addr).await?),
        None => None,
    };
    let (stop_watch, stopped) = tokio::sync::oneshot::channel();
    let watch = match (cli.metrics_addr, &before) {
        (Some(addr), Some(b)) => Some(tokio::spawn(metrics_check::watch(
            ctx.mesh.clone(),
            addr,
            b.position(),
            Duration::from_secs(2),
            stopped,
        ))),
        _ => None,
    };
    let mut outcome = run_scenario(&mut ctx, &cli).await;
    let _ = stop_watch.send(());
    let during = match watch {
        Some(w) => w.await.unwrap_or_default(),
        None => Vec::new(),
    };
    if let (Some(addr), Some(before)) = (cli.metrics_addr, &before) {
        let checked = async {
            let after = metrics_check::checkpoint(&ctx.mesh, addr).await?;
            metrics_check::compare(&ctx.mesh, addr, before, &after, during).await
        }
        .await;
        match checked {
            Ok(check) => {
                if !check.consistent {
                    ctx.report
                        .failures
                        .push("metrics: counters disagree with the stored results".into());
                }
                ctx.report.metrics = Some(check);
            }
            Err(e) => {
                let e = e.context(format!("metrics at {addr}"));
                ctx.report.failures.push(format!("{e:#}"));
                outcome = outcome.and(Err(e));
            }
        }
    }
    let mesh_memory = match &spawned {
        Some(p) => rss::read_pid(p.pid()).into_iter().collect(),
        None => rss::mesh_processes(),
    };
    ctx.report.memory.splice(0..0, mesh_memory);
    drop(spawned);
    drop(cluster_servers);
    ctx.report.attach_baselines();
    ctx.report.evaluate_targets();
    println!("{}", ctx.report.human());
    if let Some(path) = &cli.json_out {
        let json = serde_json::to_string_pretty(&ctx.report)?;
        std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("loadtest: report written to {}", path.display());
    }
    outcome
}

async fn run_scenario(ctx: &mut Ctx, cli: &Cli) -> anyhow::Result<()> {
    use scenarios::{assess, exec, light, memory, mixed, workspace, workspace_bulk};
    match &cli.scenario {
        Scenario::Baseline { load, languages } => {
            let (c, l) = load.resolve(&[1, 4], 200, 30.0);
            exec::baseline(ctx, &cli.image, languages, &c, l).await
        }
        Scenario::Exec(a) => run_exec(ctx, cli, a).await,
        Scenario::Assess {
            load,
            connections,
            instances,
        } => {
            let (c, l) = load.resolve(&[256], 2_000_000, 10.0);
            assess::assess(ctx, &c, *connections, l, instances).await
        }
        Scenario::Workspace { load, file_bytes } => {
            let (c, l) = load.resolve(&[8], 2_000, 20.0);
            workspace::workspace(ctx, c[0], *file_bytes, l).await
        }
        Scenario::WorkspaceBulk {
            requests,
            duration_s,
            big_bytes,
        } => {
            let (big, pair) = bulk_loads(*requests, *duration_s);
            workspace_bulk::workspace_bulk(ctx, *big_bytes, big, pair).await
        }
        Scenario::Mixed { load } => {
            let (_, l) = load.resolve(&[4], 300, 180.0);
            mixed::mixed(ctx, l).await
        }
        Scenario::Light { load } => {
            let (c, l) = load.resolve(&[1, 4], 400, 20.0);
            light::light(ctx, &cli.image, &c, l).await
        }
        Scenario::Kernel { load } => {
            let (c, l) = load.resolve(&[1, 4], 400, 20.0);
            let languages = [Language::Python, Language::Javascript];
            exec::baseline(ctx, &cli.image, &languages, &c, l).await?;
            let tiers = [ExecTier::Session, ExecTier::Kernel];
            exec::exec(ctx, &languages, &tiers, &[Mode::Sync], &c, l).await
        }
        Scenario::Templates { load, templates } => {
            let (c, l) = load.resolve(&[1, 4], 400, 20.0);
            exec::baseline(ctx, &cli.image, &[Language::Python], &c, l).await?;
            let tiers = [ExecTier::Ephemeral, ExecTier::Session];
            exec::templates(ctx, templates, &tiers, &c, l).await
        }
        Scenario::Http { load, gateway, key } => {
            let (c, l) = load.resolve(&[1, 4], 400, 20.0);
            let (gateway, key) = scenarios::http::gateway_and_key(ctx, *gateway, key).await?;
            scenarios::http::http(ctx, &cli.image, gateway, &key, &c, l).await
        }
        Scenario::Ports {
            load,
            gateway,
            key,
            big_bytes,
        } => {
            let (_, l) = load.resolve(&[1], 200, 20.0);
            let (gateway, key) = scenarios::http::gateway_and_key(ctx, *gateway, key).await?;
            scenarios::ports::ports(ctx, gateway, &key, *big_bytes, l).await
        }
        Scenario::SessionsBurst {
            sessions,
            rounds,
            load,
        } => {
            let (c, l) = load.resolve(&[4], 400, 20.0);
            scenarios::sessions_burst::sessions_burst(ctx, &cli.image, *sessions, *rounds, &c, l)
                .await
        }
        Scenario::Burst(b) => run_burst(ctx, b).await,
        Scenario::IdleRss { services } => memory::idle_rss(ctx, services).await,
        Scenario::All { burst: b } => run_all(ctx, cli, b).await,
    }
}

/// Every scenario, each failure recorded and the rest still run. Session work comes before
/// the long ephemeral series so each tier is measured on a mesh that has not yet run thousands
/// of executions; the order is part of the reproduce command's definition.
async fn run_all(ctx: &mut Ctx, cli: &Cli, b: &BurstArgs) -> anyhow::Result<()> {
    use scenarios::{assess, exec, memory, mixed, workspace, workspace_bulk};
    let d = ExecArgs::from_defaults();
    let (c, l) = d.load.resolve(&[1, 4], 200, 30.0);
    let mut failures = Vec::new();
    let mut step = |name: &str, r: anyhow::Result<()>| {
        if let Err(e) = r {
            eprintln!("loadtest: {name} failed: {e:#}");
            failures.push(format!("{name}: {e:#}"));
        }
    };
    step("idle-rss", memory::idle_rss(ctx, &[]).await);
    step(
        "baseline",
        exec::baseline(ctx, &cli.image, &d.languages, &c, l).await,
    );
    step(
        "exec session",
        exec::exec(ctx, &d.languages, &[ExecTier::Session], &d.modes, &c, l).await,
    );
    step(
        "first session",
        exec::first_session(ctx, Language::Python, d.first_session).await,
    );
    step(
        "ephemeral with a warm container ready",
        exec::ephemeral_ready(ctx, Language::Python, d.first_session).await,
    );
    step("burst", run_burst(ctx, b).await);
    step(
        "exec ephemeral",
        exec::exec(ctx, &d.languages, &[ExecTier::Ephemeral], &d.modes, &c, l).await,
    );
    let (c, l) = LoadArgs::default().resolve(&[8], 2_000, 20.0);
    step("workspace", workspace::workspace(ctx, c[0], 1024, l).await);
    let (big, pair) = bulk_loads(None, None);
    step(
        "workspace-bulk",
        workspace_bulk::workspace_bulk(ctx, 10 << 20, big, pair).await,
    );
    let (c, l) = LoadArgs::default().resolve(&[256], 2_000_000, 10.0);
    step("assess", assess::assess(ctx, &c, 4, l, &[1, 2]).await);
    let (_, l) = LoadArgs::default().resolve(&[4], 300, 180.0);
    step("mixed", mixed::mixed(ctx, l).await);
    ctx.report.failures.extend(failures);
    Ok(())
}

async fn run_exec(ctx: &mut Ctx, cli: &Cli, a: &ExecArgs) -> anyhow::Result<()> {
    use scenarios::exec;
    let (c, l) = a.load.resolve(&[1, 4], 200, 30.0);
    if !a.skip_baseline {
        exec::baseline(ctx, &cli.image, &a.languages, &c, l).await?;
    }
    exec::exec(ctx, &a.languages, &a.tiers, &a.modes, &c, l).await?;
    if a.first_session > 0 {
        if a.tiers.contains(&ExecTier::Session) {
            exec::first_session(ctx, Language::Python, a.first_session).await?;
        }
        if a.tiers.contains(&ExecTier::Ephemeral) {
            exec::ephemeral_ready(ctx, Language::Python, a.first_session).await?;
        }
    }
    Ok(())
}

async fn run_burst(ctx: &mut Ctx, b: &BurstArgs) -> anyhow::Result<()> {
    scenarios::burst::burst(
        ctx,
        b.jobs,
        b.burst_tier,
        b.sessions,
        Duration::from_secs(b.limit_s),
    )
    .await
}

/// The bounds of `workspace-bulk`: large-file series, then snapshot / restore series.
fn bulk_loads(requests: Option<u64>, duration_s: Option<f64>) -> (driver::Load, driver::Load) {
    let args = LoadArgs {
        concurrency: Vec::new(),
        requests,
        duration_s,
    };
    (
        args.resolve(&[1], 10, 60.0).1,
        args.resolve(&[1], 200, 20.0).1,
    )
}
