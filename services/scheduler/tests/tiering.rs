//! The light backend's tiering, end to end: the real risk-assessor, a real docker-executor, a
//! real bwrap-executor and the scheduler over a real nats-server. SAFE ephemeral work without
//! a session goes to the bwrap node; everything else runs in Docker as before; and
//! `SANDMESH_EPHEMERAL_BACKEND` decides.

use sandmesh_client::ClientError;
use std::collections::HashMap;
use std::time::Duration;

use crate::common::Mesh;
use messages::exec::{ExecRequest, ExecResult, ExecStatus, Language, Tier, TierChoice};
use messages::executor::Backend;
use messages::subjects::ExecutorOp;
use messages::{ErrorKind, Subjects};
use scheduler::tier::EphemeralBackend;

/// A bwrap-executor node on the mesh; returns its id once it serves.
async fn start_bwrap(mesh: &Mesh) -> (String, kit::CancellationToken) {
    let image = crate::common::docker::image().await;
    let node = format!("tier-bwrap-{}", messages::new_id().to_ascii_lowercase());
    let env: HashMap<String, String> = [
        ("SANDMESH_NATS_URL", mesh.url.clone()),
        ("SANDMESH_INSTANCE_ID", node.clone()),
        ("SANDMESH_HEARTBEAT_MS", "500".into()),
        ("SANDMESH_EXEC_IMAGE", image),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let config = bwrap_executor::BwrapConfig::from_env(&env).unwrap();
    let stop = kit::CancellationToken::new();
    tokio::spawn(bwrap_executor::run(config, stop.clone()));
    let subject = Subjects::default().executor_node_on(Backend::Bwrap, &node, ExecutorOp::Run);
    let pooled = messages::executor::RunKind::Pooled;
    let probe = messages::executor::ExecutorRun::new(String::new(), ExecRequest::default(), pooled)
        .unwrap();
    crate::common::eventually("the bwrap executor to serve", || {
        let subject = subject.clone();
        let probe = probe.clone();
        async move {
            match mesh.client.request::<_, ExecResult>(subject, &probe).await {
                Err(ClientError::Service { body: _, .. }) => Some(()),
                _ => None,
            }
        }
    })
    .await;
    (node, stop)
}

fn req(code: &str, tier: TierChoice) -> ExecRequest {
    ExecRequest {
        language: Language::Python,
        code: code.into(),
        tier,
        ..Default::default()
    }
}

/// Runs until the scheduler's registry knows the bwrap node (its first heartbeat), so the
/// placement under test is not the one before it.
async fn exec_on(mesh: &Mesh, r: &ExecRequest, node: &str) -> ExecResult {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let result = mesh.exec(r).await.expect("exec");
        if result.node.as_deref() == Some(node) || tokio::time::Instant::now() > deadline {
            return result;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn safe_ephemeral_work_runs_in_bubblewrap_and_the_rest_in_docker() {
    let mesh = Mesh::builder()
        .real_risk()
        .confirm(&[])
        .docker_executors(1)
        .tenants(&["acme"], &[])
        .scheduler(|_| {})
        .start()
        .await;
    let (bwrap, stop) = start_bwrap(&mesh).await;
    let docker = mesh.docker_nodes()[0].clone();
    let light = exec_on(&mesh, &req("print(1)", TierChoice::Auto), &bwrap).await;
    assert_eq!(
        (light.status, light.stdout.as_str()),
        (ExecStatus::Ok, "1\n"),
        "{light:?}"
    );
    assert_eq!(
        light.node.as_deref(),
        Some(bwrap.as_str()),
        "SAFE ephemeral → bwrap"
    );
    assert_eq!(light.tier, Tier::Ephemeral);
    // The protocol's longest id, from a tenant's agent: valid on the bwrap path too (scoped by
    // the tenant it is 69 characters, which this backend once refused).
    let acme = sandmesh_client::MeshClient::new(
        crate::common::connect(&mesh.nats.agent_url("acme")).await,
        Subjects::default(),
    );
    let longest = "x".repeat(messages::validate::MAX_ID_LEN);
    let mut long = req("print(4)", TierChoice::Auto);
    long.execution_id = Some(longest.clone());
    let r = acme.exec().exec(&long).await.unwrap();
    assert_eq!(
        (r.status, r.node.as_deref(), r.execution_id.as_str()),
        (ExecStatus::Ok, Some(bwrap.as_str()), longest.as_str()),
        "{r:?}"
    );
    // A client asking for more isolation gets a container.
    let strict = mesh
        .exec(&req("print(2)", TierChoice::Session))
        .await
        .unwrap();
    assert_eq!(strict.status, ExecStatus::Ok, "{strict:?}");
    assert_eq!(
        strict.node.as_deref(),
        Some(docker.as_str()),
        "tier session → Docker"
    );
    // A bwrap node that goes away: light work falls back to Docker (auto).
    stop.cancel();
    let fallback = crate::common::eventually("light work to fall back to Docker", || async {
        let r = mesh.exec(&req("print(3)", TierChoice::Auto)).await.ok()?;
        (r.node.as_deref() == Some(docker.as_str())).then_some(r)
    })
    .await;
    assert_eq!(fallback.stdout, "3\n");
    mesh.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_ephemeral_backend_setting_decides() {
    let mesh = Mesh::builder()
        .real_risk()
        .confirm(&[])
        .docker_executors(1)
        .scheduler(|c| c.ephemeral_backend = EphemeralBackend::Docker)
        .start()
        .await;
    let (_bwrap, stop) = start_bwrap(&mesh).await;
    let docker = mesh.docker_nodes()[0].clone();
    // Give the registry the bwrap node's heartbeat, then check it is ignored.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for _ in 0..3 {
        let r = mesh.exec(&req("print(1)", TierChoice::Auto)).await.unwrap();
        assert_eq!(r.node.as_deref(), Some(docker.as_str()), "{r:?}");
    }
    stop.cancel();
    mesh.shutdown().await;

    // bwrap only, and no bwrap node: light work is unavailable, not silently Docker.
    let mesh = Mesh::builder()
        .real_risk()
        .confirm(&[])
        .docker_executors(1)
        .scheduler(|c| c.ephemeral_backend = EphemeralBackend::Bwrap)
        .start()
        .await;
    match mesh.exec(&req("print(1)", TierChoice::Auto)).await {
        Err(ClientError::Service { body: e, .. }) => {
            assert_eq!(e.kind, ErrorKind::Unavailable, "{e:?}");
            assert!(e.message.contains("bwrap"), "{e:?}");
        }
        Ok(r) => assert!(
            r.error.is_some_and(|e| e.message.contains("bwrap")),
            "unexpected run"
        ),
        Err(e) => panic!("{e}"),
    }
    mesh.shutdown().await;
}

/// Templates run on the light backend too: SAFE ephemeral work naming `python-data`
/// runs in a bwrap sandbox on that template's tree, importing what the sandbox image lacks,
/// and its result names the template and image as Docker's would; the same work under a
/// network policy needs an egress proxy, so it runs in Docker instead of being refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn template_work_runs_in_bubblewrap_unless_it_needs_the_network() {
    let mesh = Mesh::builder()
        .real_risk()
        .confirm(&[])
        .docker_executors(1)
        .templates()
        .scheduler(|c| {
            c.network_ceiling =
                messages::network::NetworkPolicy::ceiling("pkgs.example.org", "").unwrap();
        })
        .start()
        .await;
    let (bwrap, stop) = start_bwrap(&mesh).await;
    let docker = mesh.docker_nodes()[0].clone();
    let data = ExecRequest {
        template: Some("python-data".into()),
        // The first run may export the template's tree (tens of seconds) before it starts.
        timeout_ms: Some(30_000),
        ..req(
            "import numpy; print(numpy.arange(3).sum())",
            TierChoice::Auto,
        )
    };
    let light = exec_on(&mesh, &data, &bwrap).await;
    assert_eq!(
        (light.status, light.stdout.as_str(), light.node.as_deref()),
        (ExecStatus::Ok, "3\n", Some(bwrap.as_str())),
        "{light:?}"
    );
    let ran = light.template.expect("the result names its template");
    assert_eq!(ran.name, "python-data");
    assert!(
        ran.image.starts_with("sandmesh/template-python-data:"),
        "{ran:?}"
    );
    let networked = ExecRequest {
        network: Some(messages::network::NetworkPolicy {
            allow_domains: vec!["pkgs.example.org".into()],
            ..Default::default()
        }),
        ..data
    };
    let r = mesh.exec(&networked).await.expect("exec");
    assert_eq!(
        (r.status, r.stdout.as_str(), r.node.as_deref()),
        (ExecStatus::Ok, "3\n", Some(docker.as_str())),
        "{r:?}"
    );
    stop.cancel();
    mesh.shutdown().await;
}
