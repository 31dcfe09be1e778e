//! The command line: global options, the scenarios and their bounds.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use messages::exec::Language;

use crate::driver::Load;
use crate::scenarios::exec::{ExecTier, Mode};

#[derive(Parser, Debug)]
#[command(
    name = "loadtest",
    about = "Load scenarios against a running sandmesh, with a bare-Docker baseline"
)]
pub struct Cli {
    /// NATS of the mesh under test (loopback only).
    #[arg(
        long,
        env = "SANDMESH_NATS_URL",
        default_value = "nats://127.0.0.1:4222",
        global = true
    )]
    pub nats_url: String,
    #[arg(
        long,
        env = "SANDMESH_PREFIX",
        default_value = "sandbox",
        global = true
    )]
    pub prefix: String,
    /// Start `sandmesh up` (own nats-server on a free port) for the run, stop it after.
    #[arg(long, global = true, conflicts_with = "spawn_cluster")]
    pub spawn_mesh: bool,
    /// Like --spawn-mesh, on three clustered nats-servers with every JetStream asset at three
    /// replicas (`SANDMESH_JS_REPLICAS=3`).
    #[arg(long, global = true)]
    pub spawn_cluster: bool,
    /// The sandmesh program (for --spawn-mesh, the second risk-assessor and idle-rss).
    #[arg(long, global = true)]
    pub sandmesh_bin: Option<PathBuf>,
    /// The mesh's Prometheus endpoint (`SANDMESH_METRICS_ADDR`, also given to a spawned mesh):
    /// scraped before and after the scenario, its executions counter compared with the
    /// results stored meanwhile.
    #[arg(long, env = "SANDMESH_METRICS_ADDR", global = true)]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Write the full report here as JSON.
    #[arg(long, global = true)]
    pub json_out: Option<PathBuf>,
    /// Bound on each request, seconds.
    #[arg(long, default_value_t = 60.0, global = true)]
    pub timeout_s: f64,
    /// The executor's warm pool size: that many idle containers are not leaks.
    #[arg(
        long,
        env = "SANDMESH_EXEC_WARM_POOL",
        default_value_t = 2,
        global = true
    )]
    pub warm_pool: u64,
    /// Sync requests carry an execution id of the client's (as a client that may retry sends
    /// them, so the scheduler claims it); by default they carry none, as `nats req` sends them.
    #[arg(long, global = true)]
    pub sync_ids: bool,
    /// The sandbox image the loadtest's own containers run (the baseline, the bare sandboxes).
    #[arg(
        long,
        env = "SANDMESH_EXEC_IMAGE",
        default_value = "sandmesh/sandbox:latest",
        global = true
    )]
    pub image: String,
    #[command(subcommand)]
    pub scenario: Scenario,
}

/// Bounds shared by the scenarios; each scenario has its own defaults.
#[derive(Args, Debug, Clone, Default)]
pub struct LoadArgs {
    /// Concurrent workers; a list runs one series per value.
    #[arg(short = 'c', long, value_delimiter = ',')]
    pub concurrency: Vec<usize>,
    /// Operations per series (an upper bound).
    #[arg(short = 'n', long)]
    pub requests: Option<u64>,
    /// Seconds per series (an upper bound).
    #[arg(short = 'd', long)]
    pub duration_s: Option<f64>,
}

impl LoadArgs {
    pub fn resolve(
        &self,
        concurrency: &[usize],
        requests: u64,
        duration_s: f64,
    ) -> (Vec<usize>, Load) {
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
pub struct ExecArgs {
    #[command(flatten)]
    pub load: LoadArgs,
    #[arg(long, value_delimiter = ',', default_value = "python,javascript,shell")]
    pub languages: Vec<Language>,
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "ephemeral,session"
    )]
    pub tiers: Vec<ExecTier>,
    #[arg(long, value_enum, value_delimiter = ',', default_value = "sync,async")]
    pub modes: Vec<Mode>,
    /// Do not run the bare-Docker baseline first (no ratios then).
    #[arg(long)]
    pub skip_baseline: bool,
    /// New sessions whose first execution is timed, and ephemeral executions timed with a
    /// warm container ready (0: skip both).
    #[arg(long, default_value_t = 20)]
    pub first_session: u64,
}

#[derive(Subcommand, Debug, Clone)]
pub enum Scenario {
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
    /// One at a time in one workspace: large files written and read through the object
    /// store, and the executor's per-run snapshot + restore of a small workspace.
    WorkspaceBulk {
        /// Operations per series (an upper bound; default 10 large files, 200 pairs).
        #[arg(short = 'n', long)]
        requests: Option<u64>,
        /// Seconds per series (an upper bound; default 60 for large files, 20 for pairs).
        #[arg(short = 'd', long)]
        duration_s: Option<f64>,
        /// Size of the large files.
        #[arg(long, default_value_t = 10 << 20)]
        big_bytes: usize,
    },
    /// The bubblewrap backend: `print(1)` as a bare Docker exec, a bare `bwrap` loop and
    /// through the mesh's ephemeral tier, at each concurrency.
    Light {
        #[command(flatten)]
        load: LoadArgs,
    },
    /// The HTTP gateway: `print(1)` as a bare Docker exec, through NATS and through
    /// `POST /api/v1/execute`, at each concurrency; the gateway's p50 and p99 over NATS's.
    Http {
        #[command(flatten)]
        load: LoadArgs,
        /// The gateway (default: the one `--spawn-mesh` started).
        #[arg(long, env = "SANDMESH_GATEWAY_ADDR")]
        gateway: Option<std::net::SocketAddr>,
        /// An API key of tenant `default` (default: one made with `sandmesh tenant key
        /// create` in the spawned mesh's data directory).
        #[arg(long, env = "SANDMESH_GATEWAY_KEY")]
        key: Option<String>,
    },
    /// Preview ports: a small request and a bulk download from a server in a session, through
    /// the gateway's tunnel, beside the same server program asked directly on loopback.
    Ports {
        #[command(flatten)]
        load: LoadArgs,
        /// The gateway (default: the one `--spawn-mesh` started).
        #[arg(long, env = "SANDMESH_GATEWAY_ADDR")]
        gateway: Option<std::net::SocketAddr>,
        /// An API key of tenant `default` (default: one made in the spawned mesh).
        #[arg(long, env = "SANDMESH_GATEWAY_KEY")]
        key: Option<String>,
        /// The bulk download's size.
        #[arg(long, default_value_t = 64 << 20)]
        big_bytes: u64,
    },
    /// Stateful interpreters: `print(1)` / `console.log(1)` as a kernel cell, as a plain
    /// session execution and as a bare Docker exec, at each concurrency.
    Kernel {
        #[command(flatten)]
        load: LoadArgs,
    },
    /// Python's `print(1)` in each template (ephemeral and session tiers) beside the bare
    /// Docker exec: a template's larger image must not make every execution slower.
    Templates {
        #[command(flatten)]
        load: LoadArgs,
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "python-default,python-data"
        )]
        templates: Vec<String>,
    },
    /// N new sessions opened at once, each running its first execution (time to the first
    /// result, beside as many bare hardened sandboxes started at once), `--rounds` times; then
    /// the light backend's c=4 throughput beside a bare `bwrap` loop.
    SessionsBurst {
        /// Sessions per burst.
        #[arg(long, default_value_t = 50)]
        sessions: usize,
        /// Bursts, each on a quiet mesh.
        #[arg(long, default_value_t = 3)]
        rounds: u64,
        /// Bounds of the light series (default c=4, the target's).
        #[command(flatten)]
        load: LoadArgs,
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
        services: Vec<messages::ServiceName>,
    },
    /// Every scenario with its defaults: the README's figures.
    All {
        #[command(flatten)]
        burst: BurstArgs,
    },
}

#[derive(Args, Debug, Clone)]
pub struct BurstArgs {
    #[arg(long, default_value_t = 10_000)]
    pub jobs: u64,
    #[arg(long, value_enum, default_value = "session")]
    pub burst_tier: ExecTier,
    /// Sessions the jobs are spread over (tier session).
    #[arg(long, default_value_t = 8)]
    pub sessions: usize,
    /// Give up waiting for results after this many seconds.
    #[arg(long, default_value_t = 1800)]
    pub limit_s: u64,
}

impl ExecArgs {
    /// The defaults as declared on the flags.
    pub fn from_defaults() -> Self {
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
    fn workspace_bulk_takes_its_bounds_and_file_size() {
        let cli = Cli::parse_from([
            "loadtest",
            "workspace-bulk",
            "-n",
            "5",
            "--big-bytes",
            "1024",
        ]);
        let Scenario::WorkspaceBulk {
            requests,
            duration_s,
            big_bytes,
        } = cli.scenario
        else {
            panic!("workspace-bulk expected")
        };
        assert_eq!((requests, duration_s, big_bytes), (Some(5), None, 1024));
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
            "--metrics-addr",
            "127.0.0.1:9464",
        ]);
        assert!(cli.spawn_mesh);
        assert_eq!(cli.metrics_addr, Some("127.0.0.1:9464".parse().unwrap()));
        assert_eq!(cli.json_out, Some(PathBuf::from("r.json")));
        let Scenario::Burst(b) = cli.scenario else {
            panic!("burst expected")
        };
        assert_eq!(b.jobs, 100);
    }
}
