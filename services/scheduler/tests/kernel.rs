//! Kernel cells through the whole mesh: a cell is an execution like any other, so a
//! risky one is assessed and parked for a person's approval (strict mode), and runs in the
//! session's kernel, with its variables, once approved. The real risk-assessor, confirmation,
//! workspace-store, docker-executor and scheduler over a real nats-server and real Docker.

use crate::common::{eventually, Mesh};
use messages::confirm::{ConfirmDecide, ConfirmList, ConfirmListReply, ConfirmScope, Confirmation};
use messages::exec::{Decision, ExecRequest, ExecResult, ExecStatus, Language, OutputKind, Tier};
use messages::risk::{RiskLevel, SecurityMode};
use messages::subjects::ConfirmOp;
use messages::Subjects;

fn cell(session: &str, code: &str) -> ExecRequest {
    ExecRequest {
        execution_id: Some(messages::new_id()),
        session_id: Some(session.into()),
        language: Language::Python,
        code: code.into(),
        kernel: true,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_risky_cell_parks_for_approval_then_runs_in_the_sessions_kernel() {
    let mesh = Mesh::builder()
        .real_risk()
        .confirm(&[])
        .real_workspace()
        .docker_executors(1)
        .scheduler(|c| c.security_mode = SecurityMode::Strict)
        .start()
        .await;
    let s = Subjects::default();
    let run = |req: ExecRequest| {
        let c = mesh.client.clone();
        async move {
            c.request::<_, ExecResult>(Subjects::default().exec(), &req)
                .await
        }
    };

    let r = run(cell("nb", "x = 41\nx")).await.unwrap();
    assert_eq!((r.status, r.tier), (ExecStatus::Ok, Tier::Session), "{r:?}");
    assert_eq!(r.risk.level, RiskLevel::Safe);
    assert_eq!(r.outputs[0].content.as_deref(), Some("41"), "{r:?}");

    // `import sys` is high risk: the cell waits for a person like any execution.
    let risky = cell("nb", "import sys\nprint('approved', x + 1)\nx * 2");
    let id = risky.execution_id.clone().unwrap();
    let running = tokio::spawn(run(risky));
    let pending = eventually("the cell's pending confirmation", || {
        let c = mesh.client.clone();
        let (subject, id) = (s.confirm(ConfirmOp::List), id.clone());
        async move {
            let list: ConfirmListReply = c.request(subject, &ConfirmList::default()).await.ok()?;
            list.confirmations
                .into_iter()
                .find(|c| c.execution_id.as_deref() == Some(id.as_str()))
        }
    })
    .await;
    assert!(!running.is_finished(), "parked, not run");
    let _: Confirmation = mesh
        .client
        .request(
            s.confirm(ConfirmOp::Decide),
            &ConfirmDecide {
                by_account: None,
                id: pending.id,
                approve: true,
                by: "tester".into(),
                reason: None,
                scope: ConfirmScope::Once,
            },
        )
        .await
        .unwrap();
    let r = running.await.unwrap().unwrap();
    assert_eq!(
        (r.status, r.stdout.as_str(), r.state_lost),
        (ExecStatus::Ok, "approved 42\n", false),
        "{r:?}"
    );
    assert_eq!(r.confirmation.decision, Decision::Approved);
    let result = r.outputs.iter().find(|o| o.kind == OutputKind::Result);
    assert_eq!(
        result.and_then(|o| o.content.as_deref()),
        Some("82"),
        "{r:?}"
    );

    // A kernel needs a session: a clear 400, not a fresh interpreter.
    let mut stray = cell("nb", "1");
    stray.session_id = None;
    let err = mesh
        .client
        .request::<_, ExecResult>(s.exec(), &stray)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("session"), "{err}");
    mesh.shutdown().await;
}
