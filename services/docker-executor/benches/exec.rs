//! `print(1)` through the docker-executor (ephemeral and session tiers, over NATS, msgpack,
//! as the scheduler calls it) against a bare Docker-API exec of the same command in an
//! already running container of the same image and hardening — measured in the same run,
//! interleaved, and given as ratios. Also: the first run of a new session with a warm
//! container ready and with none (cold start).
//!
//! ```sh
//! cargo bench -p sandmesh-docker-executor --bench exec            # ROUNDS=100 by default
//! ```

use sandmesh_client::MeshClient;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use docker_executor::docker::{
    ContainerId, ContainerKind, ContainerLimits, SandboxSpec, Sandboxes,
};
use docker_executor::probe::{exec_capture, percentile};
use docker_executor::ExecutorConfig;
use kit::CancellationToken;
use messages::exec::{ExecRequest, ExecResult, ExecStatus, Language};
use messages::executor::{ExecutorRun, RunKind};
use messages::subjects::ExecutorOp;
use test_support::NatsServer;

struct Mesh {
    _nats: NatsServer,
    caller: MeshClient,
    config: ExecutorConfig,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), docker_executor::ExecutorError>>,
}

async fn start(image: &str, pool: usize) -> Mesh {
    let nats = NatsServer::start();
    let env: HashMap<String, String> = [
        ("SANDMESH_NATS_URL", nats.url()),
        ("SANDMESH_EXEC_IMAGE", image.to_string()),
        ("SANDMESH_EXEC_WARM_POOL", pool.to_string()),
        // A fixed pool: `settle` waits for exactly `pool` ready containers.
        ("SANDMESH_EXEC_WARM_POOL_MAX", pool.to_string()),
        ("SANDMESH_EXEC_WORKSPACE", "off".to_string()),
        ("SANDMESH_EXEC_CAPACITY", "32".to_string()),
        // Fast gauges: the bench waits for the pool to settle between ephemeral samples.
        ("SANDMESH_HEARTBEAT_MS", "100".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let config = ExecutorConfig::from_env(&env).unwrap();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(docker_executor::run(config.clone(), shutdown.clone()));
    let client = test_support::connect(&nats.url()).await;
    let caller = kit::mesh_client(client, Default::default()).with_timeout(Duration::from_secs(60));
    let mesh = Mesh {
        _nats: nats,
        caller,
        config,
        shutdown,
        task,
    };
    // Ready when the node's own endpoint answers.
    let probe = messages::executor::ExecutorClose {
        session_id: "ready".into(),
    };
    let subject = mesh
        .config
        .node
        .kit
        .subjects
        .executor_node(mesh.config.node_id(), ExecutorOp::Close);
    while mesh
        .caller
        .request::<_, messages::workspace::Ack>(subject.clone(), &probe)
        .await
        .is_err()
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    mesh
}

impl Mesh {
    /// One run: in `session`'s container on this node, else pooled on any node.
    async fn run(&self, session: Option<&str>) -> Duration {
        let id = messages::new_id();
        let request = ExecRequest {
            execution_id: Some(id.clone()),
            session_id: session.map(str::to_string),
            language: Language::Python,
            code: "print(1)".into(),
            ..Default::default()
        };
        let kind = match session {
            Some(s) => RunKind::Session {
                session_id: s.into(),
            },
            None => RunKind::Pooled,
        };
        let run = ExecutorRun::new(id, request, kind).unwrap();
        let subjects = &self.config.node.kit.subjects;
        let subject = match session {
            Some(_) => subjects.executor_node(self.config.node_id(), ExecutorOp::Run),
            None => subjects.executor_run(),
        };
        let started = Instant::now();
        let r: ExecResult = self.caller.request(subject, &run).await.unwrap();
        let took = started.elapsed();
        assert_eq!(
            (r.status, r.stdout.as_str()),
            (ExecStatus::Ok, "1\n"),
            "{r:?}"
        );
        took
    }

    /// Waits until the pool holds `warm` ready containers and the node no more than
    /// `containers` in all: used ones removed, refills started and warmed. Ephemeral samples
    /// then measure one execution, not one racing the previous one's clean-up on 2 CPUs.
    async fn settle(&self, warm: f64, containers: f64) {
        let js = async_nats::jetstream::new(self.caller.nats().clone());
        let kv = js
            .get_key_value(self.config.node.kit.subjects.nodes_bucket())
            .await
            .unwrap();
        let key = messages::heartbeat::heartbeat_key(
            docker_executor::SERVICE_NAME,
            self.config.node_id(),
        );
        loop {
            if let Ok(Some(v)) = kv.get(&key).await {
                let hb: messages::heartbeat::Heartbeat = serde_json::from_slice(&v).unwrap();
                let gauge = |k: &str| hb.metrics.get(k).copied().unwrap_or(-1.0);
                if gauge("warm_pool_size") == warm && gauge("containers") <= containers {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.unwrap().unwrap();
    }
}

fn summary(name: &str, mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    let (p50, p99) = (percentile(&samples, 50.0), percentile(&samples, 99.0));
    println!(
        "{name:<28} n={:<4} p50 {:>7.1} ms   p99 {:>7.1} ms",
        samples.len(),
        p50.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3
    );
    (p50, p99)
}

fn ratio(name: &str, (a50, a99): (Duration, Duration), (b50, b99): (Duration, Duration)) {
    println!(
        "{name:<28} p50 {:.2}x   p99 {:.2}x",
        a50.as_secs_f64() / b50.as_secs_f64(),
        a99.as_secs_f64() / b99.as_secs_f64()
    );
}

#[tokio::main]
async fn main() {
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let supervisor = docker_executor::image::build_supervisor().expect("supervisor");
    let image = docker_executor::image::build_image(&supervisor).expect("image");
    println!("image {image}, {rounds} rounds, python3 print(1)\n");

    let mesh = start(&image, 2).await;
    // The baseline: a running container of the same image and hardening.
    let docker = Sandboxes::connect().await.unwrap();
    // Its own node id: the executor's janitor removes unowned containers of its node.
    let mut spec = SandboxSpec::from_config(&mesh.config, "bench-baseline");
    spec.node_id = format!("bench-baseline-{}", messages::new_id().to_ascii_lowercase());
    let baseline = Sandboxes::new(docker.clone(), spec);
    let name = baseline.new_name();
    let limits = ContainerLimits {
        memory_mb: 256,
        cpus: 1.0,
        pids: 128,
    };
    let uid = baseline.uids.take().unwrap();
    let id = ContainerId {
        name: &name,
        uid: uid.uid(),
    };
    baseline
        .start(id, ContainerKind::Warm, None, limits, &[], None)
        .await
        .unwrap();
    let bare = || async {
        let started = Instant::now();
        let out = exec_capture(&docker, &name, &["python3", "-c", "print(1)"])
            .await
            .unwrap();
        assert_eq!((out.exit_code, out.stdout.as_str()), (Some(0), "1\n"));
        started.elapsed()
    };

    // Warm-up: page cache, connections, the session's container.
    for _ in 0..5 {
        bare().await;
        mesh.run(Some("bench")).await;
    }
    mesh.settle(2.0, 3.0).await;

    let (mut b_s, mut s, mut b_e, mut e) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..rounds {
        // Interleaved, so drift (other load, page cache) hits both sides alike.
        b_s.push(bare().await);
        s.push(mesh.run(Some("bench")).await);
        if i % 2 == 0 {
            mesh.settle(2.0, 3.0).await;
            b_e.push(bare().await);
            e.push(mesh.run(None).await);
        }
    }
    let bare_s = summary("bare docker exec (session)", b_s);
    let session = summary("session tier", s);
    let bare_e = summary("bare docker exec (ephem.)", b_e);
    let ephemeral = summary("ephemeral tier", e);
    println!();
    ratio("session / bare", session, bare_s);
    ratio("ephemeral / bare", ephemeral, bare_e);

    // A new session's first run: with a warm container ready, and cold (empty pool).
    let mut warm_first = Vec::new();
    for i in 0..10 {
        mesh.settle(2.0, 3.0 + i as f64).await;
        warm_first.push(mesh.run(Some(&format!("first-{i}"))).await);
    }
    println!();
    summary("new session, warm pool", warm_first);
    baseline.remove(&name).await;
    mesh.stop().await;

    let cold = start(&image, 0).await;
    let mut cold_first = Vec::new();
    for i in 0..10 {
        cold_first.push(cold.run(Some(&format!("cold-{i}"))).await);
    }
    summary("new session, cold start", cold_first);
    cold.stop().await;
}
