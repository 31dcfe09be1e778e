//! A tenant flooding the mesh with long runs does not make another tenant's run wait for them,
//! with no quota set: tried as the flooding tenant's own agent beside another tenant's, over
//! real NATS, through the real scheduler and the real executor node's admission — over a
//! backend that starts no sandbox ([`NodeStandin`]): the node's slots are what is shared, and
//! its run log says in which order and beside what each run started. No wall time is asserted.

use std::time::Duration;

use crate::common::fakes::Run;
use crate::common::{Mesh, NodeStandin};
use messages::exec::{ExecRequest, ExecStatus, Language};
use messages::{ServiceName, Subjects};
use sandmesh_client::MeshClient;

const NODE: &str = "node-a";
const CAPACITY: usize = 2;
/// The flooder's runs: twice the node's slots, each long enough to still run when the other
/// tenant's run comes.
const FLOOD: usize = 2 * CAPACITY;

async fn agent(mesh: &Mesh, tenant: &str) -> MeshClient {
    MeshClient::new(
        crate::common::connect(&mesh.nats.agent_url(tenant)).await,
        Subjects::default(),
    )
    .with_timeout(Duration::from_secs(60))
}

fn request(id: &str, code: &str) -> ExecRequest {
    ExecRequest {
        execution_id: Some(id.into()),
        language: Language::Python,
        code: code.into(),
        timeout_ms: Some(30_000),
        ..Default::default()
    }
}

/// The node's runs so far, in the order they started.
fn runs(mesh: &Mesh) -> Vec<Run> {
    mesh.runs.lock().unwrap().clone()
}

fn of(run: &Run, tenant: &str) -> bool {
    run.execution_id.starts_with(&format!("{tenant}-"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_flooding_the_slots_does_not_make_another_wait_for_its_runs() {
    test_support::trace_to_test_output();
    let mut mesh = Mesh::builder()
        .risk()
        .workspace()
        .tenants(&["flood", "other"], &[])
        .start()
        .await;
    let probe = crate::common::connect(&mesh.url).await;
    let _node = NodeStandin::start(
        &mesh.nats.service_url(ServiceName::DockerExecutor),
        &probe,
        NODE,
        CAPACITY,
        mesh.runs.clone(),
        1,
    )
    .await;
    mesh.start_scheduler(mesh.config()).await;
    let (flood, other) = (agent(&mesh, "flood").await, agent(&mesh, "other").await);

    let flooding: Vec<_> = (0..FLOOD)
        .map(|i| {
            let flood = flood.clone();
            tokio::spawn(async move {
                flood
                    .exec()
                    .exec(&request(&format!("long-{i}"), "sleep:6000"))
                    .await
            })
        })
        .collect();
    // The positive control: alone, the flooder holds every slot.
    crate::common::eventually("the flooder to hold every slot", || {
        let started = runs(&mesh);
        async move {
            let all_its = started.len() == CAPACITY && started.iter().all(|r| of(r, "flood"));
            (all_its && started.iter().all(|r| !r.finished)).then_some(())
        }
    })
    .await;

    let mine = other
        .exec()
        .exec(&request("quick", "sleep:100"))
        .await
        .expect("the other tenant's run");
    assert_eq!(mine.status, ExecStatus::Ok, "{mine:?}");
    for f in flooding {
        let r = f.await.unwrap().expect("the flooder's run");
        assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    }

    let log = runs(&mesh);
    assert_eq!(log.len(), FLOOD + 1, "{log:#?}");
    let at = log
        .iter()
        .position(|r| of(r, "other"))
        .expect("the other tenant's run started");
    assert_eq!(
        at, CAPACITY,
        "it starts right after the flooder's first runs, before any queued one: {log:#?}"
    );
    assert_eq!(
        log[at].in_flight,
        CAPACITY + 1,
        "it started while the flooder still held every slot: it did not wait for a run of \
         the flooder to end: {log:#?}"
    );
    for queued in &log[at + 1..] {
        assert!(of(queued, "flood"), "{log:#?}");
        assert!(
            queued.in_flight <= CAPACITY,
            "the flooder takes no slot beyond the node's capacity: {log:#?}"
        );
    }
}
