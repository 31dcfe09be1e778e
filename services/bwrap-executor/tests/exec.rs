//! The Executor protocol on the bwrap backend: results, statuses and streaming as in Docker;
//! admission (bad input, tiers it does not run, capacity); heartbeat; drain.

use sandmesh_client::ClientError;
use std::time::Duration;

use crate::common::{pooled, request, run, BwrapRuns, Harness};
use futures::StreamExt;
use messages::exec::{ExecRequest, ExecStatus, Language, OutputChunk, Tier};
use messages::executor::{Backend, ExecutorDrain, ExecutorRun, RunKind};
use messages::subjects::ExecutorOp;
use messages::ErrorKind;

#[tokio::test]
async fn a_sandbox_runs_as_the_unprivileged_sandbox_user_on_its_own_host_name() {
    // Languages, files, exit codes and limits are the conformance suite's.
    let h = Harness::start().await;
    let r = h.exec(Language::Shell, "id -u; id -g; hostname; pwd").await;
    assert_eq!(
        (r.status, r.stdout.as_str()),
        (ExecStatus::Ok, "10001\n10001\nsandbox\n/workspace\n"),
        "{r:?}"
    );
    assert_eq!(r.node.as_deref(), Some(h.node.as_str()));
    assert_eq!(r.tier, Tier::Ephemeral);
    h.assert_clean().await;
    h.stop().await;
}

#[tokio::test]
async fn output_streams_as_chunks_while_it_runs() {
    let h = Harness::start().await;
    let mut req = request(
        Language::Python,
        "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.05)",
    );
    req.stream_output = true;
    let run = pooled(messages::new_id(), req);
    let mut chunks = h
        .client
        .subscribe(h.subjects.output_any(&run.execution_id))
        .await
        .unwrap();
    let r = h.call_node(&run).await.unwrap();
    assert_eq!(r.stdout, "0\n1\n2\n");
    let mut text = String::new();
    loop {
        let m = tokio::time::timeout(Duration::from_secs(10), chunks.next())
            .await
            .expect("chunks arrive")
            .unwrap();
        let c: OutputChunk = serde_json::from_slice(&m.payload).unwrap();
        if c.eof {
            break;
        }
        text.push_str(&c.data);
    }
    assert_eq!(text, "0\n1\n2\n");
    h.stop().await;
}

#[tokio::test]
async fn it_refuses_what_it_does_not_run_with_clear_errors() {
    let h = Harness::start().await;
    let refused = |r: Result<_, ClientError>| match r {
        Err(ClientError::Service { body: e, .. }) => e,
        other => panic!("expected a refusal, got {other:?}"),
    };
    // Sessions live in Docker containers.
    let request = ExecRequest {
        session_id: Some("s1".into()),
        ..request(Language::Python, "1")
    };
    let session = RunKind::Session {
        session_id: "s1".into(),
    };
    let session = ExecutorRun::new(messages::new_id(), request, session).unwrap();
    let e = refused(h.call_node(&session).await);
    assert_eq!(e.kind, ErrorKind::BadRequest);
    assert!(e.message.contains("ephemeral"), "{e:?}");
    // A run whose tier, container and session disagree is malformed before it is a run.
    let mut hostile = serde_json::to_value(run(Language::Python, "1", "x1")).unwrap();
    hostile["request"]["session_id"] = "s1".into();
    assert_eq!(
        refused(h.call_node(&hostile).await).kind,
        ErrorKind::BadRequest
    );
    // Bad ids, unknown limits, malformed and oversized payloads.
    let e = refused(h.call_node(&run(Language::Python, "1", "../x")).await);
    assert_eq!(e.kind, ErrorKind::BadRequest);
    let mut zero = run(Language::Python, "1", &messages::new_id());
    zero.edit_request(|r| r.timeout_ms = Some(0));
    assert_eq!(
        refused(h.call_node(&zero).await).kind,
        ErrorKind::BadRequest
    );
    let nul = run(Language::Python, "print(1)\0", &messages::new_id());
    assert_eq!(refused(h.call_node(&nul).await).kind, ErrorKind::BadRequest);
    let reply = h
        .client
        .request(
            h.node_subject(ExecutorOp::Run),
            "{\"execution_id\": 5".into(),
        )
        .await
        .unwrap();
    let code = reply
        .headers
        .as_ref()
        .and_then(|hd| hd.get("Nats-Service-Error-Code"));
    assert_eq!(code.map(|c| c.as_str()), Some("400"));
    let huge = vec![b'x'; 2 * 1024 * 1024];
    let reply = h
        .client
        .request(h.node_subject(ExecutorOp::Run), huge.into())
        .await;
    assert!(
        reply.is_err()
            || reply
                .unwrap()
                .headers
                .and_then(|hd| hd.get("Nats-Service-Error-Code").cloned())
                .is_some(),
        "an oversized payload is refused"
    );
    // Still serving.
    h.assert_recovered().await;
    h.stop().await;
}

#[tokio::test]
async fn the_heartbeat_offers_the_bwrap_backend() {
    let h = Harness::start().await;
    let hb = test_support::eventually("a heartbeat", Duration::from_secs(10), || async {
        h.heartbeat().await
    })
    .await;
    assert_eq!(hb.backends, vec![Backend::Bwrap]);
    assert!(hb.offers(Backend::Bwrap) && !hb.offers(Backend::Docker));
    assert_eq!(hb.capacity, 16);
    assert!(hb.labels.get("cgroup").is_some_and(|v| v.starts_with('v')));
    h.stop().await;
}

#[tokio::test]
async fn a_full_node_answers_429_and_a_draining_node_503() {
    let h = Harness::start_with(&[("SANDMESH_BWRAP_CAPACITY", "1")]).await;
    let slow = run(Language::Shell, "sleep 2", &messages::new_id());
    let busy = {
        let caller = h.caller.clone();
        let subject = h.node_subject(ExecutorOp::Run);
        tokio::spawn(async move {
            caller
                .request::<_, messages::exec::ExecResult>(subject, &slow)
                .await
        })
    };
    test_support::eventually_true("the slow run to start", Duration::from_secs(10), || async {
        !h.cgroups().is_empty()
    })
    .await;
    match h
        .call(&run(Language::Shell, "true", &messages::new_id()))
        .await
    {
        Err(ClientError::Service { body: e, .. }) => assert_eq!(e.kind, ErrorKind::Overloaded),
        other => panic!("expected 429, got {other:?}"),
    }
    // A drain waits for the running one, then refuses new work.
    let drain = h
        .subjects
        .executor_node_on(Backend::Bwrap, &h.node, ExecutorOp::Drain);
    let ack: messages::workspace::Ack = h.caller.request(drain, &ExecutorDrain {}).await.unwrap();
    assert!(ack.ok);
    let finished = busy.await.unwrap().unwrap();
    assert_eq!(
        finished.status,
        ExecStatus::Ok,
        "the running one finished: {finished:?}"
    );
    match h
        .call(&run(Language::Shell, "true", &messages::new_id()))
        .await
    {
        Err(ClientError::Service { body: e, .. }) => assert_eq!(e.kind, ErrorKind::Unavailable),
        other => panic!("expected 503, got {other:?}"),
    }
    h.assert_clean().await;
    h.stop().await;
}

#[tokio::test]
async fn background_processes_are_not_implemented_and_say_so() {
    let h = Harness::start().await;
    let subject = h
        .subjects
        .executor_node_on(Backend::Bwrap, &h.node, ExecutorOp::Proc);
    let call = messages::proc::ProcCall::List {
        session_id: "s1".into(),
    };
    match h
        .caller
        .request::<_, messages::proc::ProcReply>(subject, &call)
        .await
    {
        Err(ClientError::Service { body: e, .. }) => {
            assert_eq!((e.code, e.kind), (501, ErrorKind::NotImplemented));
            assert!(e.message.contains("bwrap"), "{e:?}");
        }
        other => panic!("expected 501, got {other:?}"),
    }
    // Control: the same node runs code.
    let r = h.exec(Language::Shell, "echo ok").await;
    assert_eq!(r.stdout, "ok\n", "{r:?}");
    h.stop().await;
}
