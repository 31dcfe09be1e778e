//! `ExecClient` and `SessionClient` against the real mesh: scheduler, risk-assessor,
//! confirmation, workspace-store and one docker-executor over a real nats-server and the real
//! Docker daemon.

use std::time::Duration;

use crate::common::{Mesh, BOUND};
use futures::StreamExt;
use messages::exec::{ExecRequest, ExecStatus, Language, OutputStream, TierChoice};
use messages::session::{SessionOpen, SessionState};
use messages::ServiceName;
use sandmesh_client::ErrorKind;

async fn mesh() -> Mesh {
    Mesh::new()
        .await
        .risk_assessor()
        .confirmation()
        .workspace_store()
        .docker_executor()
        .await
        .scheduler()
        .ready(ServiceName::Scheduler)
        .await
        .ready(ServiceName::DockerExecutor)
        .await
}

fn python(code: &str) -> ExecRequest {
    ExecRequest {
        execution_id: Some(messages::new_id()),
        language: Language::Python,
        code: code.into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_and_async_executions_reach_their_results() {
    let mesh = mesh().await;
    let exec = mesh.client.exec();

    let result = exec.exec(&python("print(1)")).await.unwrap();
    assert_eq!(
        (result.status, result.stdout.as_str()),
        (ExecStatus::Ok, "1\n")
    );
    let nul = exec.exec(&python("print(1)\0")).await.unwrap_err();
    assert_eq!(nul.kind(), ErrorKind::BadRequest, "{nul}");

    // Async: accepted once per execution id; a retried submit is a duplicate, not a rerun.
    let req = python("print(2)");
    let first = exec.submit(&req).await.unwrap();
    assert_eq!(Some(&first.execution_id), req.execution_id.as_ref());
    assert!(!first.duplicate);
    assert!(exec.submit(&req).await.unwrap().duplicate);
    let result = exec.wait_result(&first.execution_id, BOUND).await.unwrap();
    assert_eq!(
        (result.status, result.stdout.as_str()),
        (ExecStatus::Ok, "2\n")
    );
    let stored = exec
        .result(&first.execution_id)
        .await
        .unwrap()
        .expect("stored");
    assert_eq!(stored.execution_id, first.execution_id);

    let unknown = messages::new_id();
    let e = exec.result(&unknown).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    let e = exec
        .wait_result(&unknown, Duration::from_millis(300))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    mesh.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_streams_in_order_and_ends_with_the_run() {
    let mesh = mesh().await;
    let exec = mesh.client.exec();
    let mut req = python("for i in range(3):\n    print('line', i, flush=True)");
    req.stream_output = true;
    let id = req.execution_id.clone().unwrap();
    let chunks = exec.output(&id).await.unwrap();
    let result = exec.exec(&req).await.unwrap();

    let chunks: Vec<_> = tokio::time::timeout(BOUND, chunks.collect::<Vec<_>>())
        .await
        .expect("the stream ends after its eof chunk");
    let chunks: Vec<_> = chunks.into_iter().map(|c| c.unwrap()).collect();
    let seqs: Vec<u64> = chunks.iter().map(|c| c.seq).collect();
    assert_eq!(
        seqs,
        (0..chunks.len() as u64).collect::<Vec<_>>(),
        "no gaps"
    );
    assert!(chunks.last().unwrap().eof);
    let stdout: String = chunks
        .iter()
        .filter(|c| c.stream == OutputStream::Stdout)
        .map(|c| c.data.as_str())
        .collect();
    assert_eq!(stdout, result.stdout);
    assert_eq!(stdout, "line 0\nline 1\nline 2\n");
    mesh.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_open_run_list_and_close() {
    let mesh = mesh().await;
    let sessions = mesh.client.sessions();
    let open = SessionOpen {
        language: Some(Language::Python),
        ..Default::default()
    };
    let session = sessions.open(&open).await.unwrap();
    let id = session.session_id.clone();

    // SAFE code: anything riskier would wait for a person's approval.
    let mut req = python("print(3)");
    req.session_id = Some(id.clone());
    req.tier = TierChoice::Session;
    let result = mesh.client.exec().exec(&req).await.unwrap();
    assert_eq!(result.status, ExecStatus::Ok, "{result:?}");
    assert_eq!(result.session_id.as_deref(), Some(id.as_str()));

    // The use count is bookkeeping done after the reply, off its path.
    test_support::eventually_true("the session to count its execution", BOUND, || async {
        sessions.get(&id).await.unwrap().executions == 1
    })
    .await;
    let listed = sessions.list(None).await.unwrap();
    assert!(listed.iter().any(|s| s.session_id == id), "{listed:?}");
    assert_eq!(
        sessions.close(&id).await.unwrap().state,
        SessionState::Closed
    );
    let e = sessions.get(&messages::new_id()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    mesh.stop().await;
}
