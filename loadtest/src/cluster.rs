//! `--spawn-cluster`: the mesh of `--spawn-mesh`, but on three nats-servers clustered on
//! loopback with every JetStream asset at three replicas (`SANDMESH_JS_REPLICAS=3`), so the
//! same scenarios measure what replication costs on this machine. The servers get the
//! configuration `deploy/nats/cluster/` ships (`sandmesh_auth::ClusterNode`) with the
//! deployment's accounts; `sandmesh up` runs the services against them with their own
//! credentials from the tenancy file.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use messages::Subjects;
use sandmesh_auth::{ClusterNode, Role, Tenancy};

use crate::mesh::{free_port, spawn, Mesh, MeshProcess, SERVICES};

const NODES: usize = 3;

/// The running cluster and the mesh on it; stop `up` before the servers.
pub struct SpawnedCluster {
    pub up: MeshProcess,
    pub servers: Vec<MeshProcess>,
}

/// `SANDMESH_NATS_SERVER`, `.tools/bin/nats-server`, then PATH (as `sandmesh up` looks).
fn nats_server_bin() -> PathBuf {
    std::env::var_os("SANDMESH_NATS_SERVER")
        .map(PathBuf::from)
        .or_else(|| {
            let local = PathBuf::from(".tools/bin/nats-server");
            local.exists().then_some(local)
        })
        .unwrap_or_else(|| PathBuf::from("nats-server"))
}

/// Starts the three servers, then `sandmesh up` on them, and returns once every service
/// answers; with the admin's URL listing every server.
pub async fn spawn_cluster(
    sandmesh: &Path,
    data_dir: &Path,
    subjects: &Subjects,
    limit: Duration,
) -> anyhow::Result<(SpawnedCluster, String)> {
    let tenancy = Tenancy::generate(subjects);
    let tenancy_file = data_dir.join("tenancy.json");
    tenancy.save(&tenancy_file)?;
    let ports: Vec<(u16, u16, u16)> = (0..NODES)
        .map(|_| Ok((free_port()?, free_port()?, free_port()?)))
        .collect::<anyhow::Result<_>>()?;
    let bin = nats_server_bin();
    let mut servers = Vec::new();
    for (i, &(client, monitor, route)) in ports.iter().enumerate() {
        let dir = data_dir.join(format!("nats-{}", i + 1));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let node = ClusterNode {
            server_name: format!("nats-{}", i + 1),
            cluster_name: "sandmesh-loadtest".into(),
            listen: format!("127.0.0.1:{client}"),
            monitor: format!("127.0.0.1:{monitor}"),
            cluster_listen: format!("127.0.0.1:{route}"),
            routes: ports
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, p)| format!("nats-route://127.0.0.1:{}", p.2))
                .collect(),
            store_dir: dir.join("jetstream").display().to_string(),
            accounts: tenancy.accounts_config(),
        };
        let conf = dir.join("nats.conf");
        sandmesh_auth::write_private(&conf, &node.config())?;
        let conf = conf.display().to_string();
        let log = dir.join("nats.log");
        let label = format!("nats-server {}", i + 1);
        let args = ["-c", conf.as_str(), "-l", &log.display().to_string()];
        servers.push(spawn(&label, &bin, &args, &[], &data_dir.join("nats.out"))?);
    }
    let plain: Vec<String> = ports
        .iter()
        .map(|p| format!("nats://127.0.0.1:{}", p.0))
        .collect();
    let admin = tenancy
        .credentials(Role::Admin)
        .context("the tenancy has an admin")?;
    let admin_url = plain
        .iter()
        .map(|u| admin.url(u))
        .collect::<Vec<_>>()
        .join(",");

    // JetStream answers once the servers have elected a meta leader.
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(mesh) = Mesh::connect(&admin_url, subjects.clone(), Duration::from_secs(5)).await
        {
            if mesh.js.query_account().await.is_ok() {
                break;
            }
        }
        if Instant::now() > deadline {
            bail!("the NATS cluster did not form; see {}", data_dir.display());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let log = data_dir.join("sandmesh-up.log");
    let data = data_dir.join("mesh");
    let mut up = spawn(
        "sandmesh up",
        sandmesh,
        &["up", "--data-dir", &data.to_string_lossy()],
        &[
            ("SANDMESH_NATS_URL", plain.join(",")),
            ("SANDMESH_TENANCY_FILE", tenancy_file.display().to_string()),
            ("SANDMESH_JS_REPLICAS", NODES.to_string()),
        ],
        &log,
    )?;
    let mesh = Mesh::connect(&admin_url, subjects.clone(), Duration::from_secs(5)).await?;
    for &service in SERVICES {
        // In short waits, so a mesh that failed to start is seen at once.
        while !mesh.wait_for(service, 1, Duration::from_secs(2)).await {
            if let Some(status) = up.exited() {
                bail!("sandmesh up exited ({status}); see {}", log.display());
            }
            if Instant::now() > deadline {
                bail!(
                    "{service} did not answer within {limit:?}; see {}",
                    log.display()
                );
            }
        }
    }
    let cluster = SpawnedCluster { up, servers };
    Ok((cluster, admin_url))
}
