//! `mixed`: a realistic blend of executions with hostile programs among them (fork bomb,
//! sleeper past its timeout, stdout bomb, memory bomb); results counted by program and status,
//! then the sandbox containers left behind counted against the warm pool.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::client::exec_sync;
use crate::docker;
use crate::driver::{drive, note, Load};
use crate::programs::{pick, MIXED};
use crate::report::{ContainerCount, MixedReport};
use crate::scenarios::{exec, Ctx};
use crate::stats::Counts;

pub async fn mixed(ctx: &mut Ctx, load: Load) -> anyhow::Result<()> {
    let by_program: Arc<Mutex<BTreeMap<&'static str, Counts>>> = Arc::default();
    let name = format!("mixed/c{}", load.concurrency);
    let (mesh, counts) = (ctx.mesh.clone(), by_program.clone());
    let run = drive(&name, load, move |_, seq| {
        let (mesh, counts) = (mesh.clone(), counts.clone());
        async move {
            let program = pick(MIXED, seq);
            let sample = exec_sync(&mesh, &(program.build)(), None).await;
            if let Ok(mut c) = counts.lock() {
                c.entry(program.name).or_default().add(&sample.status);
            }
            sample
        }
    })
    .await;
    ctx.push(run.report(&name));
    let containers_after = settle_containers(ctx).await;
    let by_program = by_program
        .lock()
        .map(|m| m.iter().map(|(k, v)| (k.to_string(), v.clone())).collect())
        .unwrap_or_default();
    ctx.report.mixed = Some(MixedReport {
        by_program,
        containers_after,
        warm_pool: ctx.warm_pool,
    });
    Ok(())
}

/// Containers are removed asynchronously after a run; poll (≤ 30 s) until nothing beyond the
/// warm pool remains, and report what is left then.
async fn settle_containers(ctx: &Ctx) -> ContainerCount {
    let Some(docker) = &ctx.docker else {
        return ContainerCount::default();
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        // A pool sized by demand may hold more than its floor: its target is no leak.
        let beats = exec::docker_heartbeats(ctx).await;
        let target = |b: &messages::heartbeat::Heartbeat| {
            b.metrics.get("warm_pool_target").copied().unwrap_or(0.0) as u64
        };
        let warm_pool = ctx.warm_pool.max(beats.iter().map(target).sum());
        let count = match docker::sandbox_containers(docker, ctx.mesh_id.as_deref()).await {
            Ok(list) => docker::count_containers(&list, warm_pool),
            Err(e) => {
                note(&format!("mixed: cannot list containers: {e}"));
                return ContainerCount::default();
            }
        };
        if count.leaked == 0 || Instant::now() > deadline {
            return count;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
