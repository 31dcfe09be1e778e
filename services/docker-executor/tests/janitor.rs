//! Nothing leaks for long: containers of a crashed executor are reaped (by another node as
//! soon as the crashed node's heartbeat expires, or by its successor with the same node id at
//! once), unowned containers of this node go, and containers of other meshes are left alone.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::{base_env, containers_with, run, unique_node, DockerRuns, Harness};
use docker_executor::docker::{
    ContainerId, ContainerKind, ContainerLimits, SandboxSpec, Sandboxes, SANDBOX_UID,
};
use messages::exec::{ExecResult, ExecStatus, Language};
use messages::subjects::ExecutorOp;
use messages::Subjects;
use test_support::{eventually, eventually_true, NatsServer};

/// The executor as its own process, so it can be killed like a crash.
struct Process(Child, String);

impl Process {
    fn spawn(nats: &NatsServer, node: &str, extra: &[(&str, &str)]) -> Self {
        let mut env = base_env(nats, node);
        for (k, v) in extra {
            env.insert(k.to_string(), v.to_string());
        }
        let child = Command::new(env!("CARGO_BIN_EXE_sandmesh-docker-executor"))
            .envs(env)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the executor");
        Self(child, node.to_string())
    }

    fn crash(&mut self) {
        self.0.kill().expect("SIGKILL");
        self.0.wait().expect("reaped");
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        crate::common::remove_node_containers(&self.1);
    }
}

/// Runs a session execution on `node` (retrying until the process serves).
async fn session_on(client: &async_nats::Client, node: &str, session: &str) -> ExecResult {
    let caller =
        kit::mesh_client(client.clone(), Default::default()).with_timeout(Duration::from_secs(60));
    let subject = Subjects::default().executor_node(node, ExecutorOp::Run);
    let req = run(Some(session), Language::Python, "print('alive')");
    eventually("the executor to serve", Duration::from_secs(60), || {
        let (caller, subject, req) = (&caller, &subject, &req);
        async move { caller.request(subject.clone(), req).await.ok() }
    })
    .await
}

async fn wait_count(docker: &bollard::Docker, label: &str, n: usize, within: Duration) {
    let what = format!("{n} containers labelled {label}");
    eventually_true(&what, within, || async {
        containers_with(docker, label).await.len() == n
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_executors_containers_go_when_its_heartbeat_expires() {
    let nats = NatsServer::start();
    let client = test_support::connect(&nats.url()).await;
    let docker = Sandboxes::connect().await.unwrap();
    // The survivor runs first, with the default 30 s sweep: its start-up sweep sees the other
    // node alive, so only the heartbeat's expiry can make it act in time.
    let survivor = Harness::start_on(nats, &[("SANDMESH_EXEC_WARM_POOL", "0")]).await;
    let crashed = unique_node("crash");
    // Heartbeats every 500 ms (base_env): the key's TTL is 1 s.
    let mut process = Process::spawn(
        &survivor.nats,
        &crashed,
        &[("SANDMESH_EXEC_WARM_POOL", "2")],
    );
    let r = session_on(&client, &crashed, "expiry-s").await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    let label = format!("sandmesh.node={crashed}");
    // Two warm containers (the pool refilled after the session took one) and the session's.
    wait_count(&docker, &label, 3, Duration::from_secs(30)).await;
    process.crash();
    // TTL (1 s) plus a few seconds, far below the 30 s sweep.
    wait_count(&docker, &label, 0, Duration::from_secs(6)).await;
    survivor.stop().await;
}

/// A node holding two session containers, SIGKILLed once both exist (the positive control:
/// they were there before the crash). Returns the process (dropped at the end of the test) and
/// the node's label.
async fn crash_with_two_sessions(
    nats: &NatsServer,
    client: &async_nats::Client,
    docker: &bollard::Docker,
    tag: &str,
) -> (Process, String) {
    let crashed = unique_node(tag);
    // No warm pool (nor one grown by the sessions' takes): the node holds its sessions alone.
    let no_pool = [
        ("SANDMESH_EXEC_WARM_POOL", "0"),
        ("SANDMESH_EXEC_WARM_POOL_MAX", "0"),
    ];
    let mut process = Process::spawn(nats, &crashed, &no_pool);
    for session in ["first", "second"] {
        let r = session_on(client, &crashed, &format!("{tag}-{session}")).await;
        assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    }
    let label = format!("sandmesh.node={crashed}");
    wait_count(docker, &label, 2, Duration::from_secs(30)).await;
    process.crash();
    assert_eq!(
        containers_with(docker, &label).await.len(),
        2,
        "a crash leaves them"
    );
    (process, label)
}

/// The heartbeat's TTL here (1 s) plus a few seconds, far below the 30 s periodic sweep: only
/// the watch on the heartbeat keys (or a start-up sweep) acts within it.
const REAPED_WITHIN: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_node_reaps_a_crashed_nodes_sessions_across_a_nats_restart() {
    let nats = NatsServer::start();
    let client = test_support::connect(&nats.url()).await;
    let docker = Sandboxes::connect().await.unwrap();
    let mut survivor = Harness::start_on(nats, &[("SANDMESH_EXEC_WARM_POOL", "0")]).await;
    let (_process, label) = crash_with_two_sessions(&survivor.nats, &client, &docker, "live").await;
    // The server restarts on its store, as a mesh's NATS does: the survivor reconnects, and
    // the crashed node's heartbeat still expires in the same mesh.
    survivor.nats.restart();
    wait_count(&docker, &label, 0, REAPED_WITHIN).await;
    let node_label = format!("sandmesh.node={}", survivor.node);
    survivor.stop().await;
    assert_eq!(containers_with(&docker, &node_label).await.len(), 0);
    assert_eq!(containers_with(&docker, &label).await.len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_started_after_a_crash_and_a_nats_restart_reaps_the_dead_nodes_sessions() {
    let mut nats = NatsServer::start();
    let client = test_support::connect(&nats.url()).await;
    let docker = Sandboxes::connect().await.unwrap();
    let (_process, label) = crash_with_two_sessions(&nats, &client, &docker, "after").await;
    nats.restart();
    // The default 30 s sweep: the start-up sweep must judge the dead node as one of its mesh.
    let newcomer = Harness::start_on(nats, &[("SANDMESH_EXEC_WARM_POOL", "0")]).await;
    wait_count(&docker, &label, 0, REAPED_WITHIN).await;
    let node_label = format!("sandmesh.node={}", newcomer.node);
    newcomer.stop().await;
    assert_eq!(containers_with(&docker, &node_label).await.len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leak_after_crash() {
    let nats = NatsServer::start();
    let client = test_support::connect(&nats.url()).await;
    let docker = Sandboxes::connect().await.unwrap();
    let crashed = unique_node("crash");
    let mut process = Process::spawn(&nats, &crashed, &[("SANDMESH_EXEC_WARM_POOL", "2")]);
    let r = session_on(&client, &crashed, "crash-s").await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    let label = format!("sandmesh.node={crashed}");
    // Two warm containers (the pool refilled after the session took one) and the session's.
    wait_count(&docker, &label, 3, Duration::from_secs(30)).await;
    process.crash();
    assert_eq!(
        containers_with(&docker, &label).await.len(),
        3,
        "a crash leaves them"
    );

    // Another node of the same mesh reaps them once the crashed node's heartbeat expires.
    let h = Harness::start_on(nats, &[("SANDMESH_EXEC_JANITOR_MS", "300")]).await;
    wait_count(&docker, &label, 0, Duration::from_secs(30)).await;
    let r = h
        .ephemeral(Language::Python, "print('still serving')")
        .await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_the_same_node_id_reaps_its_predecessor_at_once() {
    let nats = NatsServer::start();
    let client = test_support::connect(&nats.url()).await;
    let docker = Sandboxes::connect().await.unwrap();
    let node = unique_node("same");
    let mut process = Process::spawn(&nats, &node, &[("SANDMESH_EXEC_WARM_POOL", "1")]);
    assert_eq!(
        session_on(&client, &node, "same-s").await.status,
        ExecStatus::Ok
    );
    let label = format!("sandmesh.node={node}");
    wait_count(&docker, &label, 2, Duration::from_secs(30)).await;
    let before = containers_with(&docker, &label).await;
    process.crash();

    let mut env = process_env_for(&node);
    env.push(("SANDMESH_EXEC_WARM_POOL", "0"));
    let h = Harness::start_on(nats, &env).await;
    // The startup sweep: no heartbeat expiry to wait for, these are this node's own.
    eventually_true(
        "the predecessor's containers removed",
        Duration::from_secs(15),
        || async {
            let now = containers_with(&docker, &label).await;
            !before.iter().any(|c| now.contains(c))
        },
    )
    .await;
    h.stop().await;
}

fn process_env_for(node: &str) -> Vec<(&'static str, &str)> {
    vec![("SANDMESH_INSTANCE_ID", node)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_janitor_removes_unowned_containers_of_its_mesh_only() {
    let h = Harness::start_with(&[
        ("SANDMESH_EXEC_WARM_POOL", "1"),
        ("SANDMESH_EXEC_JANITOR_MS", "300"),
    ])
    .await;
    h.wait_warm(1).await;
    let hb = h.heartbeat().await.expect("heartbeat");
    assert_eq!(hb.capacity, 8);
    for gauge in [
        "running_executions",
        "warm_pool_size",
        "warm_pool_target",
        "active_sessions",
        "capacity",
    ] {
        assert!(
            hb.metrics.contains_key(gauge),
            "{gauge} in {:?}",
            hb.metrics
        );
    }
    let mesh = hb.labels.get("mesh").expect("mesh label").clone();
    let docker = h.backend.docker.clone();
    let spec = |node: &str, mesh: &str| SandboxSpec {
        image: crate::common::image().to_string(),
        node_id: node.to_string(),
        mesh: mesh.to_string(),
        workspace_mb: 8,
        tmp_mb: 8,
        nofile: 64,
        fsize_bytes: 1 << 20,
        uids: executor_node::UidRange::DOCKER,
        ports_dir: std::env::temp_dir().join("sandmesh-ports"),
    };
    let limits = ContainerLimits {
        memory_mb: 32,
        cpus: 0.1,
        pids: 16,
    };
    let mut made = Vec::new();
    for (node, mesh) in [
        (h.node.clone(), mesh.clone()),
        (unique_node("ghost"), mesh.clone()),
        (unique_node("other"), "another-mesh".to_string()),
    ] {
        let s = Sandboxes::new(docker.clone(), spec(&node, &mesh));
        let name = s.new_name();
        match s
            .start(
                ContainerId {
                    name: &name,
                    uid: SANDBOX_UID,
                },
                ContainerKind::Warm,
                None,
                limits,
                &[],
                None,
            )
            .await
        {
            Ok(_) => {}
            // The janitor may take a container labelled with its node between create and
            // start: that is the behaviour under test, only early.
            Err(_) if node == h.node => {}
            Err(e) => panic!("{e}"),
        }
        made.push((s, name));
    }
    let exists = |name: &str| {
        let docker = docker.clone();
        let name = name.to_string();
        async move { containers_with(&docker, "sandmesh=1").await.contains(&name) }
    };
    eventually_true(
        "unowned containers of this mesh removed",
        Duration::from_secs(20),
        || async { !exists(&made[0].1).await && !exists(&made[1].1).await },
    )
    .await;
    assert!(
        exists(&made[2].1).await,
        "another mesh's container is not ours to judge"
    );
    made[2].0.remove(&made[2].1).await;
    // The pool's own container was never touched.
    h.wait_warm(1).await;
    h.wait_containers(1).await;
    h.stop().await;
}
