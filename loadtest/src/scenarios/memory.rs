//! `idle-rss`: each service started on its own (`sandmesh serve <name>`) against the mesh's
//! NATS, left idle, and its resident memory read from /proc.

use std::time::{Duration, Instant};

use messages::ServiceName;

use crate::driver::note;
use crate::mesh::{self, SERVICES};
use crate::report::IdleMemory;
use crate::rss;
use crate::scenarios::Ctx;

/// How long a service is watched once it answers: the figure is the resident set at the end,
/// after start-up allocations settled.
const SETTLE: Duration = Duration::from_secs(3);

pub async fn idle_rss(ctx: &mut Ctx, services: &[ServiceName]) -> anyhow::Result<()> {
    let names = if services.is_empty() {
        SERVICES
    } else {
        services
    };
    for &service in names {
        let name = service.as_str();
        let before = ctx
            .mesh
            .instances(service, Duration::from_millis(500))
            .await;
        let env = vec![
            ("SANDMESH_NATS_URL", ctx.mesh.url.clone()),
            ("SANDMESH_INSTANCE_ID", format!("loadtest-idle-{name}")),
            ("SANDMESH_PREFIX", ctx.mesh.subjects.prefix().to_string()),
        ];
        let log = ctx.work_dir.join(format!("idle-{name}.log"));
        let mut process = mesh::spawn(name, &ctx.sandmesh_bin, &["serve", name], &env, &log)?;
        let up = ctx
            .mesh
            .wait_for(service, before + 1, Duration::from_secs(60))
            .await;
        if !up {
            process.stop(Duration::from_secs(10));
            note(&format!(
                "idle-rss: {name} did not come up; see {}",
                log.display()
            ));
            continue;
        }
        let until = Instant::now() + SETTLE;
        let mut last = rss::read_pid(process.pid());
        while Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(250)).await;
            last = rss::read_pid(process.pid()).or(last);
        }
        process.stop(Duration::from_secs(15));
        if let Some(m) = last {
            note(&format!(
                "idle-rss: {name} {:.1} MB (peak {:.1} MB)",
                m.rss_mb(),
                m.peak_mb()
            ));
            ctx.report.idle_memory.push(IdleMemory {
                service: name.to_string(),
                rss_mb: (m.rss_mb() * 10.0).round() / 10.0,
                peak_mb: (m.peak_mb() * 10.0).round() / 10.0,
            });
        }
    }
    Ok(())
}
