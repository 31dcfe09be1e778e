//! Executions over real NATS in real containers: the ephemeral tier's containers, streaming,
//! admission. (What every backend must do alike — languages, stdin, env, files, exit codes,
//! limits — is the conformance suite, `tests/conformance.rs`.)

use sandmesh_client::ClientError;
use std::time::Duration;

use crate::common::{run, DockerRuns, Harness};
use futures::StreamExt;
use messages::exec::{ExecStatus, Language, Limits, OutputChunk, OutputStream, Tier};
use messages::ErrorKind;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ephemeral_python_runs_once_and_its_container_is_gone() {
    let h = Harness::start().await;
    let r = h.ephemeral(Language::Python, "print(1 + 1)").await;
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    assert_eq!(r.stdout, "2\n");
    assert_eq!(r.exit_code, Some(0));
    assert_eq!(r.tier, Tier::Ephemeral);
    assert_eq!(r.node.as_deref(), Some(h.node.as_str()));
    let usage = r.usage.expect("usage");
    assert!(usage.peak_memory_bytes > 1 << 20, "{usage:?}");
    // The used container is removed and the pool (size 1) refilled.
    h.wait_containers(1).await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_streams_in_order_while_the_code_runs() {
    let h = Harness::start().await;
    let mut req = run(
        None,
        Language::Python,
        "import sys, time\n\
         for i in range(5):\n\
         \x20   print('line', i, '→ é')\n\
         \x20   print('warn', i, file=sys.stderr)\n\
         \x20   time.sleep(0.05)",
    );
    req.edit_request(|r| r.stream_output = true);
    let mut sub = h
        .client
        .subscribe(h.subjects.output_any(&req.execution_id))
        .await
        .unwrap();
    h.client.flush().await.unwrap();
    let r = h.call(&req).await.unwrap();
    assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
    let mut chunks = Vec::new();
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(10), sub.next())
            .await
            .expect("chunks arrive")
            .expect("subscription open");
        let chunk: OutputChunk = serde_json::from_slice(&msg.payload).unwrap();
        let eof = chunk.eof;
        chunks.push(chunk);
        if eof {
            break;
        }
    }
    let seqs: Vec<u64> = chunks.iter().map(|c| c.seq).collect();
    assert_eq!(
        seqs,
        (0..chunks.len() as u64).collect::<Vec<_>>(),
        "no gaps"
    );
    assert!(chunks.len() > 3, "streamed in pieces: {chunks:?}");
    let text = |s: OutputStream| -> String {
        chunks
            .iter()
            .filter(|c| c.stream == s)
            .map(|c| c.data.as_str())
            .collect()
    };
    assert_eq!(text(OutputStream::Stdout), r.stdout);
    assert_eq!(text(OutputStream::Stderr), r.stderr);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_refuses_bad_requests_and_work_past_capacity() {
    let h = Harness::start_with(&[("SANDMESH_EXEC_CAPACITY", "1")]).await;
    let kind = |r: Result<_, ClientError>| {
        r.map(|_: messages::exec::ExecResult| ())
            .unwrap_err()
            .kind()
    };

    let mut bad = run(None, Language::Python, "print(1)");
    bad.edit_request(|r| {
        r.env.insert("LD_PRELOAD".into(), "/x.so".into());
    });
    assert_eq!(kind(h.call(&bad).await), ErrorKind::BadRequest);
    // Runs whose tier, container and session disagree cannot be built; sent anyway, they
    // are refused as malformed before anything runs.
    let valid = serde_json::to_value(run(None, Language::Python, "print(1)")).unwrap();
    for (tier, run_kind, session) in [
        ("session", "pooled", Some("s1")),
        ("session", "session", None),
        ("ephemeral", "session", Some("s1")),
        ("aio", "pooled", None),
    ] {
        let mut hostile = valid.clone();
        hostile["tier"] = tier.into();
        hostile["kind"] = run_kind.into();
        hostile["request"]["session_id"] = session.into();
        assert_eq!(
            kind(h.call(&hostile).await),
            ErrorKind::BadRequest,
            "{hostile}"
        );
    }
    let mut bad = run(None, Language::Python, "print(1)");
    bad.edit_request(|r| {
        r.limits = Some(Limits {
            cpus: Some(-1.0),
            ..Default::default()
        })
    });
    assert_eq!(kind(h.call(&bad).await), ErrorKind::BadRequest);
    let mut bad = run(None, Language::Python, "print(1)");
    bad.execution_id = "not a subject token".into();
    assert_eq!(kind(h.call(&bad).await), ErrorKind::BadRequest);

    // One execution holds the only slot; a second is refused at once with 429.
    let mut busy = run(
        None,
        Language::Python,
        "import time; print('started', flush=True); time.sleep(1.5)",
    );
    busy.edit_request(|r| r.stream_output = true);
    let mut sub = h
        .client
        .subscribe(h.subjects.output_any(&busy.execution_id))
        .await
        .unwrap();
    h.client.flush().await.unwrap();
    let first = {
        let caller = h.caller.clone();
        let subject = h.subjects.executor_run();
        let busy = busy.clone();
        tokio::spawn(async move {
            caller
                .request::<_, messages::exec::ExecResult>(subject, &busy)
                .await
        })
    };
    tokio::time::timeout(Duration::from_secs(20), sub.next())
        .await
        .expect("the first run starts");
    let second = run(None, Language::Python, "print(2)");
    assert_eq!(kind(h.call(&second).await), ErrorKind::Overloaded);
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.status, ExecStatus::Ok, "{first:?}");
    // The slot is free again.
    assert_eq!(h.call(&second).await.unwrap().stdout, "2\n");
    h.wait_containers(1).await;
    h.stop().await;
}
