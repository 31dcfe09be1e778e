//! Waiting for a person never holds capacity: executions that need approval are
//! parked in KV, give their admission permit back, and resume on the decision — on another
//! scheduler instance too — or are denied when the confirmation expires. The real confirmation
//! service decides; the other peers are stand-ins over a real nats-server.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::common::*;
use async_nats::jetstream::message::PublishMessage;
use futures::StreamExt;
use messages::confirm::{ConfirmDecide, ConfirmList, ConfirmListReply, ConfirmScope, Confirmation};
use messages::exec::{
    AwaitingConfirmation, Decision, ExecRequest, ExecResult, ExecStatus, Language, ResultGet,
    ResultLookup, NOTIFY_HEADER, STATUS_AWAITING_CONFIRMATION, STATUS_HEADER,
};
use messages::subjects::ConfirmOp;
use messages::{ErrorKind, Subjects};

/// Code the risk stand-in rates high: it needs a person's approval.
const RISKY: &str = "import os\nos.system('id')";

fn req(id: &str, code: &str) -> ExecRequest {
    ExecRequest {
        execution_id: Some(id.into()),
        language: Language::Python,
        code: code.into(),
        ..Default::default()
    }
}

async fn submit(mesh: &Mesh, id: &str, code: &str) {
    let payload = serde_json::to_vec(&req(id, code)).unwrap();
    let ack = mesh
        .js
        .send_publish(
            Subjects::default().jobs_exec(),
            PublishMessage::build()
                .payload(payload.into())
                .message_id(id),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(!ack.duplicate);
}

async fn lookup(mesh: &Mesh, id: &str) -> Option<ResultLookup> {
    let get = ResultGet {
        wait_ms: None,
        execution_id: id.into(),
    };
    mesh.client
        .request(Subjects::default().results_get(), &get)
        .await
        .ok()
}

async fn result(mesh: &Mesh, id: &str) -> ExecResult {
    eventually(&format!("the result of {id}"), || async move {
        match lookup(mesh, id).await {
            Some(ResultLookup::Done { result }) => Some(*result),
            _ => None,
        }
    })
    .await
}

/// The pending confirmations by execution id.
async fn pending(mesh: &Mesh) -> BTreeMap<String, Confirmation> {
    let list = ConfirmList {
        limit: Some(1000),
        ..Default::default()
    };
    let reply: ConfirmListReply = mesh
        .client
        .request(Subjects::default().confirm(ConfirmOp::List), &list)
        .await
        .unwrap();
    reply
        .confirmations
        .into_iter()
        .filter_map(|c| Some((c.execution_id.clone()?, c)))
        .collect()
}

async fn decide(mesh: &Mesh, confirmation_id: &str, approve: bool) {
    let decide = ConfirmDecide {
        by_account: None,
        id: confirmation_id.into(),
        approve,
        by: "tester".into(),
        reason: Some("test".into()),
        scope: ConfirmScope::Once,
    };
    let _: Confirmation = mesh
        .client
        .request(Subjects::default().confirm(ConfirmOp::Decide), &decide)
        .await
        .unwrap();
}

/// Keys in the parked executions bucket.
async fn parked(mesh: &Mesh) -> usize {
    let bucket = Subjects::default().parked_executions_bucket();
    let kv = mesh.js.get_key_value(bucket).await.unwrap();
    match kv.keys().await {
        Ok(keys) => {
            keys.filter(|k| futures::future::ready(k.is_ok()))
                .count()
                .await
        }
        Err(_) => 0,
    }
}

#[tokio::test]
async fn a_hundred_parked_executions_hold_no_capacity() {
    let tune = |c: &mut scheduler::SchedulerConfig| {
        c.max_queue = 16;
        c.confirm_timeout = Duration::from_secs(30);
    };
    let mut mesh = Mesh::builder()
        .risk()
        .confirm(&[])
        .executor("node-a", 8)
        .scheduler(tune)
        .start()
        .await;
    let ids: Vec<String> = (0..100).map(|i| format!("parked-{i:03}")).collect();
    for id in &ids {
        submit(&mesh, id, RISKY).await;
    }
    let waiting = eventually("100 executions waiting for a person", || async {
        let p = pending(&mesh).await;
        (p.len() == 100 && parked(&mesh).await == 100).then_some(p)
    })
    .await;
    assert!(mesh.runs.lock().unwrap().is_empty(), "nothing ran yet");

    // More parked than the queue has permits, yet ordinary work runs: never a 429.
    for wave in 0..3 {
        let calls: Vec<_> = (0..8)
            .map(|i| {
                let c = mesh.client.clone();
                let r = req(&format!("ordinary-{wave}-{i}"), "print(1)");
                tokio::spawn(async move {
                    c.request::<_, ExecResult>(Subjects::default().exec(), &r)
                        .await
                })
            })
            .collect();
        for call in calls {
            assert_eq!(call.await.unwrap().unwrap().status, ExecStatus::Ok);
        }
    }
    match lookup(&mesh, &ids[0]).await {
        Some(ResultLookup::Pending {
            awaiting_confirmation: Some(a),
            ..
        }) => assert_eq!(a.confirmation_id, waiting[&ids[0]].id),
        other => panic!("a parked execution is pending a confirmation: {other:?}"),
    }

    // Approving one runs it.
    decide(&mesh, &waiting[&ids[0]].id, true).await;
    let first = result(&mesh, &ids[0]).await;
    assert_eq!(first.status, ExecStatus::Ok, "{first:?}");
    assert_eq!(first.confirmation.decision, Decision::Approved);

    // A restart while they are parked; ten are approved while no scheduler runs.
    mesh.stop_scheduler().await;
    for id in &ids[1..11] {
        decide(&mesh, &waiting[id].id, true).await;
    }
    let mut config = mesh.config();
    tune(&mut config);
    mesh.start_scheduler(config).await;
    for id in &ids[11..51] {
        decide(&mesh, &waiting[id].id, true).await;
    }
    for id in &ids[51..80] {
        decide(&mesh, &waiting[id].id, false).await;
    }
    // The last twenty expire: denied on timeout.
    let mut seen = BTreeSet::new();
    for (i, id) in ids.iter().enumerate() {
        let r = result(&mesh, id).await;
        let expected = match i {
            0..=50 => (ExecStatus::Ok, Decision::Approved),
            51..=79 => (ExecStatus::Denied, Decision::Denied),
            _ => (ExecStatus::Denied, Decision::Timeout),
        };
        assert_eq!((r.status, r.confirmation.decision), expected, "{id}: {r:?}");
        seen.insert(r.execution_id);
    }
    assert_eq!(
        seen.len(),
        100,
        "every parked execution reached a terminal result"
    );
    let ran = mesh.runs.lock().unwrap().clone();
    for id in &ids[..51] {
        assert_eq!(
            ran.iter().filter(|r| &r.execution_id == id).count(),
            1,
            "{id}"
        );
    }
    eventually("the parked bucket to empty", || async {
        (parked(&mesh).await == 0).then_some(())
    })
    .await;
    mesh.shutdown().await;
}

#[tokio::test]
async fn a_sync_caller_is_told_at_once_that_it_waits_for_a_person() {
    let mesh = Mesh::builder()
        .risk()
        .confirm(&[])
        .executor("node-a", 4)
        .scheduler(|c| c.max_queue = 1)
        .start()
        .await;
    let nc = mesh.client.nats().clone();

    // Opted in: on the reply subject, a notice first, then the result.
    let inbox = nc.new_inbox();
    let mut replies = nc.subscribe(inbox.clone()).await.unwrap();
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(NOTIFY_HEADER, "1");
    headers.insert("Content-Type", "application/json");
    let payload = serde_json::to_vec(&req("notified", RISKY)).unwrap();
    nc.publish_with_reply_and_headers(Subjects::default().exec(), inbox, headers, payload.into())
        .await
        .unwrap();
    let notice = tokio::time::timeout(WAIT, replies.next())
        .await
        .expect("a notice in time")
        .unwrap();
    let status = notice.headers.as_ref().and_then(|h| h.get(STATUS_HEADER));
    assert_eq!(
        status.map(|v| v.as_str()),
        Some(STATUS_AWAITING_CONFIRMATION)
    );
    let awaiting: AwaitingConfirmation = serde_json::from_slice(&notice.payload).unwrap();
    assert_eq!(awaiting.execution_id, "notified");
    assert!(awaiting.expires_at > messages::now_ms());
    // Its permit is free while it waits: the queue of one takes other work.
    let other = mesh.exec(&req("meanwhile", "print(1)")).await.unwrap();
    assert_eq!(other.status, ExecStatus::Ok);
    decide(&mesh, &awaiting.confirmation_id, true).await;
    let reply = tokio::time::timeout(WAIT, replies.next())
        .await
        .expect("the result in time")
        .unwrap();
    let r: ExecResult = serde_json::from_slice(&reply.payload).unwrap();
    assert_eq!(
        (r.status, r.confirmation.decision),
        (ExecStatus::Ok, Decision::Approved)
    );
    assert_eq!(r.confirmation.by.as_deref(), Some("tester"));

    // A plain request-reply caller just gets the final result. The queue holds one, and the
    // resumed execution's permit may be held a moment after its result reached its caller
    // (the parked entry is removed after the result is stored): 429 means try again.
    let plain = tokio::spawn({
        let c = mesh.client.clone();
        async move {
            loop {
                let asked = c
                    .request::<_, ExecResult>(Subjects::default().exec(), &req("plain", RISKY))
                    .await;
                match asked {
                    Err(e) if e.kind() == ErrorKind::Overloaded => {
                        tokio::time::sleep(Duration::from_millis(20)).await
                    }
                    other => break other,
                }
            }
        }
    });
    let c = eventually("the plain caller's confirmation", || async {
        pending(&mesh).await.remove("plain")
    })
    .await;
    decide(&mesh, &c.id, false).await;
    let r = plain.await.unwrap().unwrap();
    assert_eq!(
        (r.status, r.confirmation.decision),
        (ExecStatus::Denied, Decision::Denied)
    );
    assert_eq!(r.error.unwrap().kind, ErrorKind::Denied);
    mesh.shutdown().await;
}

#[tokio::test]
async fn an_async_job_parks_and_resumes() {
    let mesh = Mesh::builder()
        .risk()
        .confirm(&[])
        .executor("node-a", 4)
        .scheduler(|_| {})
        .start()
        .await;
    submit(&mesh, "async-parked", RISKY).await;
    let awaiting = eventually("the job to park", || async {
        match lookup(&mesh, "async-parked").await {
            Some(ResultLookup::Pending {
                awaiting_confirmation: Some(a),
                ..
            }) => Some(a),
            _ => None,
        }
    })
    .await;
    // Acked once parked: nothing of it is left in the jobs stream.
    eventually("the job to be acked", || async {
        let mut jobs = mesh
            .js
            .get_stream(Subjects::default().jobs_stream())
            .await
            .ok()?;
        (jobs.info().await.ok()?.state.messages == 0).then_some(())
    })
    .await;
    assert!(mesh.runs.lock().unwrap().is_empty());
    decide(&mesh, &awaiting.confirmation_id, true).await;
    let r = result(&mesh, "async-parked").await;
    assert_eq!(
        (r.status, r.confirmation.decision),
        (ExecStatus::Ok, Decision::Approved)
    );
    assert!(r.timing.confirm_ms > 0);
    let kinds = eventually("the parked and resumed audit events", || async {
        let k = audit_kinds(&mesh.url, "async-parked").await;
        k.iter().any(|k| k == "finished").then_some(k)
    })
    .await;
    for kind in ["parked", "resumed"] {
        assert_eq!(
            kinds.iter().filter(|k| *k == kind).count(),
            1,
            "{kind} in {kinds:?}"
        );
    }
    mesh.shutdown().await;
}

#[tokio::test]
async fn an_expired_confirmation_denies_the_execution() {
    let mesh = Mesh::builder()
        .risk()
        .confirm(&[])
        .executor("node-a", 4)
        .scheduler(|c| c.confirm_timeout = Duration::from_secs(1))
        .start()
        .await;
    let r = mesh.exec(&req("expires", RISKY)).await.unwrap();
    assert_eq!(
        (r.status, r.confirmation.decision),
        (ExecStatus::Denied, Decision::Timeout),
        "{r:?}"
    );
    assert!(mesh.runs.lock().unwrap().is_empty(), "nothing ran");
    mesh.shutdown().await;
}
