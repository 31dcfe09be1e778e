//! Accepted work outlives the mesh's failures. Session jobs are published;
//! then the scheduler process is SIGKILLed (a new one takes over), the only executor node dies
//! like a killed process and its replacement comes only 30 s later, and nats-server itself is
//! killed and restarted on its file-backed store. Every accepted job still ends `ok` with its
//! own output, exactly once, the dead node's containers are reaped by the live one, and nothing
//! of the run remains after the stop. Real services, real Docker, a real (SIGKILLed) scheduler
//! binary.

use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::docker::containers_of;
use crate::common::{eventually, publish_job, stored_result, Mesh};
use async_nats::jetstream;
use messages::exec::{ExecRequest, ExecStatus, Language};
use messages::Subjects;

const SESSIONS: usize = 8;
const JOBS_PER_SESSION: usize = 6;
/// How long no executor exists at all.
const EXECUTOR_GAP: Duration = Duration::from_secs(30);

/// The scheduler binary as its own process (SIGKILL-able), on the admin's connection.
fn scheduler_process(url: &str, instance: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_sandmesh-scheduler"))
        .env("SANDMESH_NATS_URL", url)
        .env("SANDMESH_INSTANCE_ID", instance)
        .env("SANDMESH_HEARTBEAT_MS", "500")
        .env("SANDMESH_SCHED_JOB_ACK_WAIT_MS", "3000")
        .env("SANDMESH_SCHED_CLAIM_TTL_MS", "3000")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the sandmesh-scheduler binary starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn accepted_jobs_outlive_a_killed_scheduler_a_30_s_executor_gap_and_a_nats_restart() {
    let mut mesh = Mesh::builder()
        .real_risk()
        .confirm(&[])
        .real_workspace()
        .docker_executors(1)
        .start()
        .await;
    let mut scheduler = scheduler_process(&mesh.url, "chaos-first");
    mesh.wait_ready().await;
    let first_node = mesh.docker_nodes().pop().expect("one executor node");

    let s = Subjects::default();
    let js = jetstream::new(mesh.client.nats().clone());
    let mut accepted = BTreeSet::new();
    for j in 0..JOBS_PER_SESSION {
        for session in 0..SESSIONS {
            let id = format!("chaos-{session}-{j}-{}", messages::new_id());
            let r = ExecRequest {
                execution_id: Some(id.clone()),
                session_id: Some(format!("chaos-s{session}")),
                language: Language::Python,
                code: format!("import time\ntime.sleep(0.2)\nprint({id:?})"),
                ..Default::default()
            };
            publish_job(&js, &r).await;
            accepted.insert(id);
        }
    }
    let stored = |id: String| {
        let js = js.clone();
        async move { stored_result(&js, &id).await }
    };
    let count_stored = || async {
        let mut n = 0;
        for id in &accepted {
            n += usize::from(stored(id.clone()).await.is_some());
        }
        n
    };

    // 1. The scheduler is SIGKILLed with work in flight; another process takes over.
    eventually("a first stored result", || async {
        (count_stored().await > 0).then_some(())
    })
    .await;
    scheduler.kill().unwrap();
    scheduler.wait().unwrap();
    let mut scheduler = scheduler_process(&mesh.url, "chaos-second");
    mesh.wait_ready().await;

    // 2. The only executor dies like a killed process; none exists for 30 s.
    mesh.crash_docker_executor(&first_node).await;
    let crashed_at = Instant::now();
    tokio::time::sleep(EXECUTOR_GAP).await;
    let second_node = mesh.start_docker_executor("chaos").await;
    eprintln!(
        "chaos: executor back after {:?}; {} of {} stored",
        crashed_at.elapsed(),
        count_stored().await,
        accepted.len()
    );

    // 3. nats-server is killed and started again on its store.
    mesh.nats.restart();

    // Every accepted job ends ok with its own output, exactly once.
    for id in &accepted {
        let r = eventually(&format!("the result of {id}"), || stored(id.clone())).await;
        assert_eq!(r.status, ExecStatus::Ok, "{id}: {r:?}");
        assert_eq!(r.stdout, format!("{id}\n"), "{id}: {r:?}");
    }
    let mut stream = js.get_stream(s.results_stream()).await.unwrap();
    let state = stream.info().await.unwrap().state.clone();
    assert_eq!(state.messages, accepted.len() as u64, "one result per job");
    assert_eq!(
        state.last_sequence, state.messages,
        "no result written twice"
    );

    // The dead node's containers were reaped by the live one.
    eventually(&format!("{first_node}'s containers reaped"), || async {
        containers_of(&first_node)
            .expect("docker ps")
            .is_empty()
            .then_some(())
    })
    .await;

    // A graceful stop leaves nothing behind.
    Command::new("kill")
        .args(["-TERM", &scheduler.id().to_string()])
        .status()
        .unwrap();
    scheduler.wait().unwrap();
    mesh.shutdown().await;
    assert_eq!(
        containers_of(&second_node).expect("docker ps"),
        Vec::<String>::new()
    );
    assert_eq!(
        containers_of(&first_node).expect("docker ps"),
        Vec::<String>::new()
    );
}
