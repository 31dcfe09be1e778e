//! `sessions-burst` (issue 24): `--sessions` new sessions (default 50) opened at once, each
//! running its first execution (`print(1)`), `--rounds` times with a quiet mesh before each
//! burst. Series (concurrency = sessions per burst):
//!
//! - `sessions-burst/first-result`: from the burst's start to each session's first result,
//!   the figure the targets judge (p50 ≤ 50 ms, p99 ≤ 150 ms), beside the bare `docker exec`
//!   floor of as many execs at once in one running container (`baseline/python/c<sessions>`);
//! - its stages (scenario `sessions-burst-stage`, no floor of their own): `open`
//!   (`sessions.open` alone) and `first-exec` (the first execution alone; its overhead is the
//!   mesh's share, end to end less the executor's `timing.exec_ms`), and the mesh's own timing
//!   of those executions, `mesh-<queued|assess|exec|total>` (`ExecResult::timing`).
//!
//! Then the light backend beside its floor in the same run, at each `-c` (default 4; `light`'s
//! series `bare-bwrap/python/c4` and `exec/python/ephemeral/sync/c4`, taking turns): the
//! target is the mesh's throughput at c=4 ≥ 0.85× the bare `bwrap` loop's.

use std::time::{Duration, Instant};

use messages::exec::{ExecResult, Language, TierChoice};

use crate::client::{call_failed, close_session, exec_sample, open_session};
use crate::driver::{note, Load, Run, Sample};
use crate::mesh::Mesh;
use crate::programs::{request, tiny};
use crate::scenarios::exec::{self, wait_until_quiet};
use crate::scenarios::{light, Ctx};

/// How long a burst waits for the executor to be quiet again (its warm pool refilled, the last
/// burst's containers removed).
const BURST_QUIET_BOUND: Duration = Duration::from_secs(60);

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

/// The bursts, their floor, and the light backend beside its own.
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
    let floor = Load {
        concurrency: sessions,
        requests: Some(sessions as u64 * rounds),
        duration: Duration::from_secs(60),
    };
    exec::baseline(ctx, image, &[Language::Python], &[sessions], floor).await?;

    let run = |concurrency| Run {
        concurrency,
        ..Default::default()
    };
    let (mut open, mut first, mut total) = (run(sessions), run(sessions), run(sessions));
    let mut stage_runs: Vec<(&str, Run)> = Vec::new();
    let started = Instant::now();
    for round in 0..rounds {
        eprint!("\rsessions-burst: round {}/{rounds}   ", round + 1);
        // A burst's worth of containers replaced takes longer than one sample's.
        wait_until_quiet(ctx, messages::now_ms(), BURST_QUIET_BOUND).await;
        let burst = Instant::now();
        let tasks: Vec<_> = (0..sessions)
            .map(|_| tokio::spawn(first_result(ctx.mesh.clone(), burst)))
            .collect();
        let mut opened = Vec::new();
        for task in futures::future::join_all(tasks).await {
            let r = match task {
                Ok(r) => r,
                Err(e) => {
                    total.absorb(&Sample::failed("err:task", e.to_string()));
                    continue;
                }
            };
            open.absorb(&r.open);
            total.absorb(&r.total);
            if let Some((sample, result)) = &r.first {
                first.absorb(sample);
                for (stage, ms) in result.iter().flat_map(stages) {
                    let at = match stage_runs.iter().position(|(s, _)| *s == stage) {
                        Some(at) => at,
                        None => {
                            stage_runs.push((stage, run(sessions)));
                            stage_runs.len() - 1
                        }
                    };
                    let sample = Sample::timed(Duration::from_millis(ms), "ok");
                    stage_runs[at].1.absorb(&sample);
                }
            }
            opened.extend(r.session);
        }
        let mesh = &ctx.mesh;
        futures::future::join_all(opened.iter().map(|id| close_session(mesh, id))).await;
    }
    note("");
    let elapsed = started.elapsed();
    let python = Some(Language::Python.as_str());
    let series = [
        ("sessions-burst/first-result", total),
        ("sessions-burst-stage/open", open),
        ("sessions-burst-stage/first-exec", first),
    ];
    let stage_series = stage_runs
        .into_iter()
        .map(|(stage, run)| (format!("sessions-burst-stage/{stage}"), run));
    let series = series
        .into_iter()
        .map(|(name, run)| (name.to_string(), run))
        .chain(stage_series);
    for (name, mut run) in series {
        run.elapsed = elapsed;
        let series = format!("{name}/c{sessions}");
        ctx.push(
            run.report(&series)
                .tagged(python, Some("session"), Some("sync")),
        );
    }

    light::mesh_beside_bare_bwrap(ctx, image, light_concurrency, light_load).await
}
