//! `sessions-burst`: `--sessions` new sessions (default 50) opened at once, each running its
//! first execution (`print(1)`), `--rounds` times with a quiet mesh before each burst. Series
//! (concurrency = sessions per burst):
//!
//! - `bare-sandboxes/python/c<sessions>`, the floor: before each round, as many bare sandboxes
//!   started at once — containers of the same image with the executor's hardening, one per
//!   program, each running `print(1)` — timed from their burst's start to each first line of
//!   output. It does the work a burst of new sessions asks for, without the mesh;
//! - `sessions-burst/first-result`: from the burst's start to each session's first result,
//!   the figure the target judges against that floor;
//! - its stages (scenario `sessions-burst-stage`, no floor of their own): `open`
//!   (`sessions.open` alone) and `first-exec` (the first execution alone; its overhead is the
//!   mesh's share, end to end less the executor's `timing.exec_ms`), and the mesh's own timing
//!   of those executions, `mesh-<queued|assess|exec|total>` (`ExecResult::timing`).
//!
//! Each round is also reported alone (`sessions-burst-round<k>/…`, same stages), with the
//! warm pool's size and target and the host's load average noted before it: the executor's
//! pool follows demand, so round 1 shows a pool at its floor and later rounds a grown one.
//!
//! Then the light backend beside its floor in the same run, at each `-c` (default 4; `light`'s
//! series `bare-bwrap/python/c4` and `exec/python/ephemeral/sync/c4`, taking turns), judged as
//! a throughput ratio.

use std::time::{Duration, Instant};

use anyhow::Context;
use messages::exec::{ExecResult, Language, TierChoice};

use crate::client::{call_failed, close_session, exec_sample, open_session};
use crate::docker;
use crate::driver::{note, Load, Run, Sample};
use crate::mesh::Mesh;
use crate::programs::{request, tiny};
use crate::scenarios::exec::{self, wait_until_quiet};
use crate::scenarios::{light, Ctx};

/// How long a burst waits for the executor to be quiet again (its warm pool refilled to its
/// target — after a burst of 50, 50 containers started two at a time — and the last burst's
/// containers removed).
const BURST_QUIET_BOUND: Duration = Duration::from_secs(180);

/// The most sessions (and so bare sandboxes) one burst may start: a burst beyond a node's
/// session ceiling (64 by default) measures refusals, and the floor's containers must stay
/// within what a shared machine can hold at once.
const MAX_SESSIONS: usize = 256;

/// What one session of a burst measured.
struct FirstResult {
    session: Option<String>,
    open: Sample,
    /// The first execution's sample and its result (for the mesh's stage timings).
    first: Option<(Sample, Option<ExecResult>)>,
    /// From the burst's start to the first result.
    total: Sample,
}

/// Opens a session and runs its first execution, timed from `burst`.
async fn first_result(mesh: Mesh, burst: Instant) -> FirstResult {
    let (code, expect, _) = tiny(Language::Python);
    let t = Instant::now();
    let session = match open_session(&mesh, Language::Python).await {
        Ok(id) => id,
        Err(e) => {
            return FirstResult {
                session: None,
                open: call_failed(&e),
                first: None,
                total: call_failed(&e),
            }
        }
    };
    let open = Sample::timed(t.elapsed(), "ok");
    let req = request(Language::Python, code, TierChoice::Session, Some(&session));
    let t = Instant::now();
    let outcome = mesh.api.exec().exec_timeout(&req, mesh.api.timeout()).await;
    let latency = t.elapsed();
    let result = outcome.as_ref().ok().cloned();
    let sample = exec_sample(outcome, latency, Some(expect));
    let total = Sample {
        latency: sample.latency.map(|_| burst.elapsed()),
        inner: None,
        ..sample.clone()
    };
    FirstResult {
        session: Some(session),
        open,
        first: Some((sample, result)),
        total,
    }
}

/// The mesh's own timing of an execution, stage by stage (each stage's series name).
fn stages(r: &ExecResult) -> [(&'static str, u64); 4] {
    let t = &r.timing;
    [
        ("mesh-queued", t.queued_ms),
        ("mesh-assess", t.assess_ms),
        ("mesh-exec", t.exec_ms),
        ("mesh-total", t.total_ms),
    ]
}

/// The series of some bursts: one round's, or every round's together.
struct Series {
    open: Run,
    first: Run,
    total: Run,
    /// The mesh's stage timings, in the order first seen.
    stages: Vec<(&'static str, Run)>,
    concurrency: usize,
}

impl Series {
    fn new(concurrency: usize) -> Self {
        let run = || Run {
            concurrency,
            ..Default::default()
        };
        Self {
            open: run(),
            first: run(),
            total: run(),
            stages: Vec::new(),
            concurrency,
        }
    }

    fn absorb(&mut self, r: &FirstResult) {
        self.open.absorb(&r.open);
        self.total.absorb(&r.total);
        let Some((sample, result)) = &r.first else {
            return;
        };
        self.first.absorb(sample);
        for (stage, ms) in result.iter().flat_map(stages) {
            let at = match self.stages.iter().position(|(s, _)| *s == stage) {
                Some(at) => at,
                None => {
                    let run = Run {
                        concurrency: self.concurrency,
                        ..Default::default()
                    };
                    self.stages.push((stage, run));
                    self.stages.len() - 1
                }
            };
            let sample = Sample::timed(Duration::from_millis(ms), "ok");
            self.stages[at].1.absorb(&sample);
        }
    }

    fn failed(&mut self, e: &tokio::task::JoinError) {
        self.total
            .absorb(&Sample::failed("err:task", e.to_string()));
    }

    /// Reports the series as `<first-result>`, and `<stage>/open`, `<stage>/first-exec` and
    /// `<stage>/mesh-*` for the stages.
    fn push(self, ctx: &mut Ctx, first_result: &str, stage: &str, elapsed: Duration) {
        let c = self.concurrency;
        let stage_series = self
            .stages
            .into_iter()
            .map(|(name, run)| (format!("{stage}/{name}"), run));
        let series = [
            (first_result.to_string(), self.total),
            (format!("{stage}/open"), self.open),
            (format!("{stage}/first-exec"), self.first),
        ]
        .into_iter()
        .chain(stage_series);
        for (name, mut run) in series {
            run.elapsed = elapsed;
            let tags = (
                Some(Language::Python.as_str()),
                Some("session"),
                Some("sync"),
            );
            ctx.push(
                run.report(&format!("{name}/c{c}"))
                    .tagged(tags.0, tags.1, tags.2),
            );
        }
    }
}

/// The host's 1-minute load average, for the record of a shared machine.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// The docker executors' warm pool: (ready, target) summed over the nodes.
async fn warm_pool(ctx: &Ctx) -> (f64, f64) {
    let beats = exec::docker_heartbeats(ctx).await;
    let sum = |k: &str| -> f64 {
        beats
            .iter()
            .map(|b| b.metrics.get(k).copied().unwrap_or(0.0))
            .sum()
    };
    (sum("warm_pool_size"), sum("warm_pool_target"))
}

/// The floor of one burst: `sessions` bare sandboxes started at once, each running `print(1)`,
/// timed from the burst's start to each first line of output (each container removed after
/// its line, every one bounded by the per-request timeout).
async fn bare_burst(ctx: &Ctx, image: &str, sessions: usize, run: &mut Run) -> anyhow::Result<()> {
    let docker = ctx.docker.clone().context("Docker is not reachable")?;
    let (_, expect, argv) = tiny(Language::Python);
    let bound = ctx.timeout;
    let burst = Instant::now();
    let sandboxes = (0..sessions).map(|_| {
        let docker = docker.clone();
        async move {
            match docker::bare_sandbox_first_line(&docker, image, argv, bound).await {
                Ok((at, line)) if line == expect => Sample::timed(at - burst, "ok"),
                Ok((at, line)) => Sample::timed(at - burst, "wrong_output").with_detail(line),
                Err(e) => Sample::failed("err:docker", format!("{e:#}")),
            }
        }
    });
    for sample in futures::future::join_all(sandboxes).await {
        run.absorb(&sample);
    }
    Ok(())
}

/// The bursts, their floor, and the light backend beside its own. Each round is also reported
/// on its own (`sessions-burst-round<k>/…`): round 1 meets the pool at its floor, later rounds
/// a pool grown by the bursts before them.
pub async fn sessions_burst(
    ctx: &mut Ctx,
    image: &str,
    sessions: usize,
    rounds: u64,
    light_concurrency: &[usize],
    light_load: Load,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        sessions > 0 && rounds > 0,
        "--sessions and --rounds: at least 1"
    );
    anyhow::ensure!(
        sessions <= MAX_SESSIONS,
        "--sessions: at most {MAX_SESSIONS}"
    );

    let mut floor = Run {
        concurrency: sessions,
        ..Default::default()
    };
    let mut all = Series::new(sessions);
    let started = Instant::now();
    for round in 1..=rounds {
        // The floor's burst first, then the mesh's once it is quiet again: background load on a
        // shared machine falls on both alike.
        eprint!("\rsessions-burst: round {round}/{rounds}, bare sandboxes   ");
        let floor_started = Instant::now();
        bare_burst(ctx, image, sessions, &mut floor).await?;
        floor.elapsed += floor_started.elapsed();
        eprint!("\rsessions-burst: round {round}/{rounds}, sessions         ");
        // A burst's worth of containers replaced (and a grown pool warmed) takes longer than
        // one sample's.
        let quiet = Instant::now();
        wait_until_quiet(ctx, messages::now_ms(), BURST_QUIET_BOUND).await;
        let (ready, target) = warm_pool(ctx).await;
        note(&format!(
            "sessions-burst: round {round}: warm pool {ready} ready (target {target}) after \
             {:.1} s of quiet wait; load average {}",
            quiet.elapsed().as_secs_f64(),
            load_average()
        ));
        let mut this = Series::new(sessions);
        let burst = Instant::now();
        let tasks: Vec<_> = (0..sessions)
            .map(|_| tokio::spawn(first_result(ctx.mesh.clone(), burst)))
            .collect();
        let mut opened = Vec::new();
        for task in futures::future::join_all(tasks).await {
            match task {
                Ok(r) => {
                    this.absorb(&r);
                    all.absorb(&r);
                    opened.extend(r.session);
                }
                Err(e) => {
                    this.failed(&e);
                    all.failed(&e);
                }
            }
        }
        let took = burst.elapsed();
        let name = format!("sessions-burst-round{round}");
        this.push(ctx, &format!("{name}/first-result"), &name, took);
        let mesh = &ctx.mesh;
        futures::future::join_all(opened.iter().map(|id| close_session(mesh, id))).await;
    }
    note("");
    ctx.push(
        floor
            .report(&format!("bare-sandboxes/python/c{sessions}"))
            .tagged(Some(Language::Python.as_str()), None, None),
    );
    let elapsed = started.elapsed();
    all.push(
        ctx,
        "sessions-burst/first-result",
        "sessions-burst-stage",
        elapsed,
    );

    light::mesh_beside_bare_bwrap(ctx, image, light_concurrency, light_load).await
}
