//! `loadtest`: measures a running sandmesh against what this machine can do at best (bare
//! Docker execs in the same run), and writes the figures as JSON and a short summary.
//!
//! Scenarios: `baseline`, `exec`, `assess`, `workspace`, `mixed`, `burst`, `idle-rss`, and
//! `all` (every one of them, the README's figures). `--spawn-mesh` starts
//! `target/release/sandmesh up` on a free port first, so one command reproduces everything.
//! Traffic goes to loopback only; every loop is bounded in count and time.

mod client;
mod docker;
mod driver;
mod ids;
mod mesh;
mod programs;
mod report;
mod rss;
mod scenarios;
mod stats;
mod summary;
mod targets;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use messages::exec::Language;
use messages::Subjects;

use crate::driver::Load;
use crate::mesh::Mesh;
use crate::report::{Machine, Report};
use crate::scenarios::exec::{ExecTier, Mode};
use crate::scenarios::Ctx;

#[derive(Parser, Debug)]
#[command(
    name = "loadtest",
    about = "Load scenarios against a running sandmesh, with a bare-Docker baseline"
)]
struct Cli {
    /// NATS of the mesh under test (loopback only).
    #[arg(
        long,
        env = "SANDMESH_NATS_URL",
        default_value = "nats://127.0.0.1:4222",
        global = true
    )]
    nats_url: String,
    #[arg(
        long,
        env = "SANDMESH_PREFIX",
        default_value = "sandbox",
        global = true
    )]
    prefix: String,
    /// Start `sandmesh up` (own nats-server on a free port) for the run, stop it after.
    #[arg(long, global = true)]
    spawn_mesh: bool,
    /// The sandmesh program (for --spawn-mesh, the second risk-assessor and idle-rss).
    #[arg(long, global = true)]
    sandmesh_bin: Option<PathBuf>,
    /// Write the full report here as JSON.
    #[arg(long, global = true)]
    json_out: Option<PathBuf>,
    /// Bound on each request, seconds.
    #[arg(long, default_value_t = 60.0, global = true)]
    timeout_s: f64,
    /// The executor's warm pool size: that many idle containers are not leaks.
    #[arg(
        long,
        env = "SANDMESH_EXEC_WARM_POOL",
        default_value_t = 2,
        global = true
    )]
    warm_pool: u64,
    /// The sandbox image the baseline container runs.
    #[arg(
        long,
        env = "SANDMESH_EXEC_IMAGE",
        default_value = "sandmesh/sandbox:latest",
        global = true
    )]
    image: String,
    #[command(subcommand)]
    scenario: Scenario,
}

/// Bounds shared by the scenarios; each scenario has its own defaults.
#[derive(Args, Debug, Clone, Default)]
struct LoadArgs {
    /// Concurrent workers; a list runs one series per value.
    #[arg(short = 'c', long, value_delimiter = ',')]
    concurrency: Vec<usize>,
    /// Operations per series (an upper bound).
    #[arg(short = 'n', long)]
    requests: Option<u64>,
    /// Seconds per series (an upper bound).
    #[arg(short = 'd', long)]
    duration_s: Option<f64>,
}

impl LoadArgs {
    fn resolve(&self, concurrency: &[usize], requests: u64, duration_s: f64) -> (Vec<usize>, Load) {
        let c = if self.concurrency.is_empty() {
            concurrency.to_vec()
        } else {
            self.concurrency.clone()
        };
        let load = Load {
            concurrency: c[0],
            requests: Some(self.requests.unwrap_or(requests)),
            duration: Duration::from_secs_f64(self.duration_s.unwrap_or(duration_s)),
        };
        (c, load)
    }
}

#[derive(Args, Debug, Clone)]
struct ExecArgs {
    #[command(flatten)]
    load: LoadArgs,
    #[arg(long, value_delimiter = ',', default_value = "python,javascript,shell")]
    languages: Vec<Language>,
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "ephemeral,session"
    )]
    tiers: Vec<ExecTier>,
    #[arg(long, value_enum, value_delimiter = ',', default_value = "sync,async")]
    modes: Vec<Mode>,
    /// Do not run the bare-Docker baseline first (no ratios then).
    #[arg(long)]
    skip_baseline: bool,
    /// New sessions whose first execution is timed (0: skip).
    #[arg(long, default_value_t = 20)]
    first_session: u64,
}

#[derive(Subcommand, Debug, Clone)]
enum Scenario {
    /// Bare `docker exec`s of the tiny programs in a running hardened container.
    Baseline {
        #[command(flatten)]
        load: LoadArgs,
        #[arg(long, value_delimiter = ',', default_value = "python,javascript,shell")]
        languages: Vec<Language>,
    },
    /// Tiny programs through the mesh per tier and mode (runs the baseline first).
    Exec(ExecArgs),
    /// The risk-assessor alone, with one instance and then two.
    Assess {
        #[command(flatten)]
        load: LoadArgs,
        /// NATS connections the requests are spread over.
        #[arg(long, default_value_t = 4)]
        connections: usize,
        #[arg(long, value_delimiter = ',', default_value = "1,2")]
        instances: Vec<usize>,
    },
    /// Workspace write / read / list.
    Workspace {
        #[command(flatten)]
        load: LoadArgs,
        #[arg(long, default_value_t = 1024)]
        file_bytes: usize,
    },
    /// A blend with hostile programs; results by status; leaked containers.
    Mixed {
        #[command(flatten)]
        load: LoadArgs,
    },
    /// N async jobs at once; time until all results are stored; lost / duplicated check.
    Burst(BurstArgs),
    /// Idle resident memory of each service started on its own.
    IdleRss {
        /// Services to measure (default: all five).
        #[arg(long, value_delimiter = ',')]
        services: Vec<String>,
    },
    /// Every scenario with its defaults: the README's figures.
    All {
        #[command(flatten)]
        burst: BurstArgs,
    },
}

#[derive(Args, Debug, Clone)]
struct BurstArgs {
    #[arg(long, default_value_t = 10_000)]
    jobs: u64,
    #[arg(long, value_enum, default_value = "session")]
    burst_tier: ExecTier,
    /// Sessions the jobs are spread over (tier session).
    #[arg(long, default_value_t = 8)]
    sessions: usize,
    /// Give up waiting for results after this many seconds.
    #[arg(long, default_value_t = 1800)]
    limit_s: u64,
}

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
    let (spawned, url) = if cli.spawn_mesh {
        eprintln!("loadtest: starting {} up", sandmesh_bin.display());
        let (p, url) = mesh::spawn_up(
            &sandmesh_bin,
            &work_dir,
            &subjects,
            Duration::from_secs(600),
        )
        .await?;
        eprintln!("loadtest: mesh is up at {url}");
        (Some(p), url)
    } else {
        (None, cli.nats_url.clone())
    };
    let mesh = Mesh::connect(&url, subjects, timeout).await?;
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
        sandmesh_bin,
        work_dir,
        timeout,
        report: Report {
            started_unix_ms: messages::now_ms(),
            command: std::env::args().collect::<Vec<_>>().join(" "),
            machine,
            nats_url: url,
            spawned_mesh: spawned.is_some(),
            ..Default::default()
        },
    };
    let outcome = run_scenario(&mut ctx, &cli).await;
    ctx.report.memory = match &spawned {
        Some(p) => rss::read_pid(p.pid()).into_iter().collect(),
        None => rss::mesh_processes(),
    };
    drop(spawned);
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
    use scenarios::{assess, exec, memory, mixed, workspace};
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
        Scenario::Mixed { load } => {
            let (_, l) = load.resolve(&[4], 300, 180.0);
            mixed::mixed(ctx, l).await
        }
        Scenario::Burst(b) => run_burst(ctx, b).await,
        Scenario::IdleRss { services } => memory::idle_rss(ctx, services).await,
        Scenario::All { burst: b } => {
            memory::idle_rss(ctx, &[]).await?;
            let defaults = ExecArgs::from_defaults();
            run_exec(ctx, cli, &defaults).await?;
            let (c, l) = LoadArgs::default().resolve(&[8], 2_000, 20.0);
            workspace::workspace(ctx, c[0], 1024, l).await?;
            let (c, l) = LoadArgs::default().resolve(&[256], 2_000_000, 10.0);
            assess::assess(ctx, &c, 4, l, &[1, 2]).await?;
            let (_, l) = LoadArgs::default().resolve(&[4], 300, 180.0);
            mixed::mixed(ctx, l).await?;
            run_burst(ctx, b).await
        }
    }
}

async fn run_exec(ctx: &mut Ctx, cli: &Cli, a: &ExecArgs) -> anyhow::Result<()> {
    use scenarios::exec;
    let (c, l) = a.load.resolve(&[1, 4], 200, 30.0);
    if !a.skip_baseline {
        exec::baseline(ctx, &cli.image, &a.languages, &c, l).await?;
    }
    exec::exec(ctx, &a.languages, &a.tiers, &a.modes, &c, l).await?;
    if a.first_session > 0 {
        exec::first_session(ctx, Language::Python, a.first_session).await?;
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

impl ExecArgs {
    /// The defaults as declared on the flags.
    fn from_defaults() -> Self {
        #[derive(Parser)]
        struct Wrapper {
            #[command(flatten)]
            exec: ExecArgs,
        }
        Wrapper::parse_from(["exec"]).exec
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_defaults_cover_every_language_tier_and_mode() {
        let d = ExecArgs::from_defaults();
        assert_eq!(d.languages.len(), 3);
        assert_eq!(d.tiers, vec![ExecTier::Ephemeral, ExecTier::Session]);
        assert_eq!(d.modes, vec![Mode::Sync, Mode::Async]);
        assert!(!d.skip_baseline);
    }

    #[test]
    fn load_flags_override_the_scenario_defaults() {
        let cli = Cli::parse_from([
            "loadtest", "exec", "-c", "2,8", "-n", "50", "--tiers", "session",
        ]);
        let Scenario::Exec(a) = cli.scenario else {
            panic!("exec expected")
        };
        let (c, l) = a.load.resolve(&[1, 4], 200, 30.0);
        assert_eq!(c, vec![2, 8]);
        assert_eq!(l.requests, Some(50));
        assert_eq!(l.duration, Duration::from_secs(30));
        assert_eq!(a.tiers, vec![ExecTier::Session]);
    }

    #[test]
    fn global_flags_work_after_the_scenario() {
        let cli = Cli::parse_from([
            "loadtest",
            "burst",
            "--jobs",
            "100",
            "--spawn-mesh",
            "--json-out",
            "r.json",
        ]);
        assert!(cli.spawn_mesh);
        assert_eq!(cli.json_out, Some(PathBuf::from("r.json")));
        let Scenario::Burst(b) = cli.scenario else {
            panic!("burst expected")
        };
        assert_eq!(b.jobs, 100);
    }
}
