//! `baseline` and `exec`: the tiny programs as bare Docker execs in a running container, then
//! through the mesh per tier (ephemeral, session) and mode (sync, async), and the first
//! execution of new sessions; `templates`: the same in each named template.

use std::sync::Arc;
use std::time::{Duration, Instant};

use messages::exec::{Language, TierChoice};
use messages::heartbeat::Heartbeat;

use crate::client::{close_session, exec_async, exec_sync, open_session};
use crate::docker::{self, BaselineContainer};
use crate::driver::{drive, note, Load, Sample};
use crate::programs::{request, tiny};
use crate::scenarios::Ctx;

/// How long a one-at-a-time sample waits for the executor to be quiet again.
const QUIET_BOUND: Duration = Duration::from_secs(6);

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExecTier {
    Ephemeral,
    Session,
    /// Session executions as cells of the session's long-lived interpreter (`kernel: true`;
    /// Python and JavaScript).
    Kernel,
}

impl ExecTier {
    pub fn as_str(self) -> &'static str {
        match self {
            ExecTier::Ephemeral => "ephemeral",
            ExecTier::Session => "session",
            ExecTier::Kernel => "kernel",
        }
    }
}

/// A request of `tier` (kernel cells are session executions with `kernel: true`).
pub fn tier_request(
    language: Language,
    code: &str,
    tier: ExecTier,
    session: Option<&str>,
) -> messages::exec::ExecRequest {
    let choice = match tier {
        ExecTier::Ephemeral => TierChoice::Ephemeral,
        ExecTier::Session | ExecTier::Kernel => TierChoice::Session,
    };
    messages::exec::ExecRequest {
        kernel: tier == ExecTier::Kernel,
        ..request(language, code, choice, session)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    Sync,
    Async,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Mode::Sync => "sync",
            Mode::Async => "async",
        }
    }
}

/// `baseline`: the tiny programs as bare `docker exec`s in one already running, hardened
/// container of the sandbox image.
pub async fn baseline(
    ctx: &mut Ctx,
    image: &str,
    languages: &[Language],
    concurrency: &[usize],
    load: Load,
) -> anyhow::Result<()> {
    let docker = docker::connect().await?;
    let container = Arc::new(BaselineContainer::start(&docker, image).await?);
    let outcome = async {
        for &language in languages {
            let (_, expect, argv) = tiny(language);
            // One unmeasured exec: page cache and the runtime's first-exec costs.
            container.exec(argv).await?;
            for &c in concurrency {
                let name = format!("baseline/{}/c{c}", language.as_str());
                let container = container.clone();
                let run = drive(&name, load.with_concurrency(c), move |_, _| {
                    let container = container.clone();
                    async move {
                        let start = Instant::now();
                        match container.exec(argv).await {
                            Ok((0, out)) if out == expect => Sample::timed(start.elapsed(), "ok"),
                            Ok((0, _)) => Sample::timed(start.elapsed(), "wrong_output"),
                            Ok((code, out)) => {
                                Sample::timed(start.elapsed(), format!("exit_{code}"))
                                    .with_detail(out)
                            }
                            Err(e) => Sample::failed("err:docker", e.to_string()),
                        }
                    }
                })
                .await;
                ctx.push(
                    run.report(&name)
                        .tagged(Some(language.as_str()), None, None),
                );
            }
        }
        anyhow::Ok(())
    }
    .await;
    container.remove().await;
    outcome
}

/// `exec`: every tier × mode × language × concurrency through the mesh.
pub async fn exec(
    ctx: &mut Ctx,
    languages: &[Language],
    tiers: &[ExecTier],
    modes: &[Mode],
    concurrency: &[usize],
    load: Load,
) -> anyhow::Result<()> {
    for &tier in tiers {
        for &mode in modes {
            for &language in languages {
                for &c in concurrency {
                    series(ctx, language, tier, mode, None, c, load).await?;
                }
            }
        }
    }
    Ok(())
}

/// `templates`: Python's tiny program in each template, per tier and concurrency (sync): a
/// template's larger image must not make every execution slower.
pub async fn templates(
    ctx: &mut Ctx,
    templates: &[String],
    tiers: &[ExecTier],
    concurrency: &[usize],
    load: Load,
) -> anyhow::Result<()> {
    for &tier in tiers {
        for &c in concurrency {
            for template in templates {
                series(
                    ctx,
                    Language::Python,
                    tier,
                    Mode::Sync,
                    Some(template),
                    c,
                    load,
                )
                .await?;
            }
        }
    }
    Ok(())
}

/// One series; with a `template`, every request names it (series `template/…/<template>`).
async fn series(
    ctx: &mut Ctx,
    language: Language,
    tier: ExecTier,
    mode: Mode,
    template: Option<&str>,
    c: usize,
    load: Load,
) -> anyhow::Result<()> {
    let scenario = if template.is_some() {
        "template"
    } else {
        "exec"
    };
    let mut name = format!(
        "{scenario}/{}/{}/{}/c{c}",
        language.as_str(),
        tier.as_str(),
        mode.as_str()
    );
    if let Some(t) = template {
        name = format!("{name}/{t}");
    }
    let (code, expect, _) = tiny(language);
    let template = template.map(str::to_string);
    let make = move |session: Option<&str>| messages::exec::ExecRequest {
        template: template.clone(),
        ..tier_request(language, code, tier, session)
    };
    // Session and kernel tiers: one session per worker (a session runs one execution at a
    // time), each warmed by one unmeasured execution so the series measures the steady state
    // (for a kernel: its interpreter started).
    let mut sessions = Vec::new();
    if tier != ExecTier::Ephemeral {
        for _ in 0..c {
            let id = open_session(&ctx.mesh, language).await?;
            exec_sync(&ctx.mesh, &make(Some(&id)), None).await;
            sessions.push(id);
        }
    } else {
        // One unmeasured execution: the first one pays for connections and caches.
        exec_sync(&ctx.mesh, &make(None), None).await;
    }
    let sessions = Arc::new(sessions);
    let mesh = ctx.mesh.clone();
    let limit = ctx.timeout;
    let worker_sessions = sessions.clone();
    let run = drive(&name, load.with_concurrency(c), move |worker, _| {
        let mesh = mesh.clone();
        let session = worker_sessions.get(worker).cloned();
        let req = make(session.as_deref());
        async move {
            match mode {
                Mode::Sync => exec_sync(&mesh, &req, Some(expect)).await,
                Mode::Async => exec_async(&mesh, &req, Some(expect), limit).await,
            }
        }
    })
    .await;
    for id in sessions.iter() {
        close_session(&ctx.mesh, id).await;
    }
    ctx.push(run.report(&name).tagged(
        Some(language.as_str()),
        Some(tier.as_str()),
        Some(mode.as_str()),
    ));
    Ok(())
}

/// The first execution of `samples` new sessions, one after another: `session-open` times
/// opening the session, `session-first` its first execution (a warm container is bound).
pub async fn first_session(ctx: &mut Ctx, language: Language, samples: u64) -> anyhow::Result<()> {
    let (code, expect, _) = tiny(language);
    let mut open = crate::driver::Run {
        concurrency: 1,
        ..Default::default()
    };
    let mut first = open.clone();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(300);
    for i in 0..samples {
        if Instant::now() > deadline {
            break;
        }
        eprint!("\rsession-first: {i}/{samples}   ");
        let t = Instant::now();
        let id = match open_session(&ctx.mesh, language).await {
            Ok(id) => id,
            Err(e) => {
                open.absorb(&Sample::failed("err:session-open", e.to_string()));
                continue;
            }
        };
        open.absorb(&Sample::timed(t.elapsed(), "ok"));
        let req = request(language, code, TierChoice::Session, Some(&id));
        first.absorb(&exec_sync(&ctx.mesh, &req, Some(expect)).await);
        close_session(&ctx.mesh, &id).await;
        // Closing returns the container; give the pool a bounded moment to refill so each
        // sample measures a warm start, as a session arriving at a quiet mesh would see.
        wait_until_quiet(ctx, messages::now_ms(), QUIET_BOUND).await;
    }
    note("");
    open.elapsed = started.elapsed();
    first.elapsed = open.elapsed;
    let lang = Some(language.as_str());
    ctx.push(
        open.report("session-open/c1")
            .tagged(lang, Some("session"), Some("sync")),
    );
    ctx.push(
        first
            .report("session-first/c1")
            .tagged(lang, Some("session"), Some("sync")),
    );
    Ok(())
}

/// `samples` ephemeral executions, one at a time, each started once the warm pool is full
/// again: the latency of the tier when a warm container is ready, as an agent that is not
/// saturating the node sees it. (The closed-loop `exec/*/ephemeral/*` series instead run
/// as fast as containers can be replaced, so they measure the container churn.)
pub async fn ephemeral_ready(
    ctx: &mut Ctx,
    language: Language,
    samples: u64,
) -> anyhow::Result<()> {
    let (code, expect, _) = tiny(language);
    let mut run = crate::driver::Run {
        concurrency: 1,
        ..Default::default()
    };
    let started = Instant::now();
    let deadline = started + Duration::from_secs(300);
    for i in 0..samples {
        if Instant::now() > deadline {
            break;
        }
        eprint!("\rephemeral-ready: {i}/{samples}   ");
        wait_until_quiet(ctx, messages::now_ms(), QUIET_BOUND).await;
        let req = request(language, code, TierChoice::Ephemeral, None);
        run.absorb(&exec_sync(&ctx.mesh, &req, Some(expect)).await);
    }
    note("");
    run.elapsed = started.elapsed();
    ctx.push(run.report("ephemeral-ready/c1").tagged(
        Some(language.as_str()),
        Some("ephemeral"),
        Some("sync"),
    ));
    Ok(())
}

/// Bounded poll (≤ `bound`) until the executor is quiet again: its warm pool back at its size
/// (containers started *and* warmed up, as its heartbeat says; a pool sized by demand at its
/// current target) and nothing running, in a heartbeat sent after `since_ms`. A sample taken
/// while the node still removes the last container or warms up its replacement would measure
/// that work too.
pub async fn wait_until_quiet(ctx: &Ctx, since_ms: u64, bound: Duration) {
    let deadline = Instant::now() + bound;
    let quiet = |beat: &Heartbeat| {
        let metric = |name: &str| beat.metrics.get(name).copied().unwrap_or(0.0);
        beat.sent_at >= since_ms
            && metric("warm_pool_size") >= metric("warm_pool_target").max(ctx.warm_pool as f64)
            && metric("running_executions") == 0.0
    };
    while Instant::now() < deadline {
        let beats = docker_heartbeats(ctx).await;
        if !beats.is_empty() && beats.iter().all(quiet) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The last heartbeat of every docker executor of the mesh (none when the bucket cannot be
/// read).
pub async fn docker_heartbeats(ctx: &Ctx) -> Vec<Heartbeat> {
    use futures::TryStreamExt;
    let Ok(kv) = ctx
        .mesh
        .js
        .get_key_value(ctx.mesh.subjects.nodes_bucket())
        .await
    else {
        return Vec::new();
    };
    let keys: Vec<String> = match kv.keys().await {
        Ok(keys) => keys.try_collect().await.unwrap_or_default(),
        Err(_) => Vec::new(),
    };
    let mut beats = Vec::new();
    for key in keys.iter().filter(|k| k.starts_with("docker-executor.")) {
        if let Ok(Some(value)) = kv.get(key).await {
            if let Ok(beat) = serde_json::from_slice::<Heartbeat>(&value) {
                beats.push(beat);
            }
        }
    }
    beats
}
