//! Strict mode's person-in-the-loop, from the attacker's side: code that reaches a shell
//! through another module's attribute (`pty.os.system`), or that hides it in a file sent with
//! harmless code, goes through the real risk-assessor and the real confirmation service, and
//! reaches no executor until a person approves. Once approved it does run (the control: the
//! probe would see the run if the gate let it through).

use crate::common::{eventually, Mesh};
use messages::confirm::{ConfirmDecide, ConfirmList, ConfirmListReply, ConfirmScope, Confirmation};
use messages::exec::{
    ContentEncoding, Decision, ExecRequest, ExecResult, ExecStatus, FileSpec, Language,
};
use messages::risk::{RiskLevel, SecurityMode};
use messages::subjects::ConfirmOp;
use messages::Subjects;

fn request(code: &str, files: Vec<FileSpec>) -> ExecRequest {
    ExecRequest {
        execution_id: Some(messages::new_id()),
        language: Language::Python,
        code: code.into(),
        files,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn aliased_and_file_borne_shell_calls_wait_for_a_person() {
    let mesh = Mesh::builder()
        .real_risk()
        .confirm(&[])
        .executor("node-a", 2)
        .scheduler(|c| c.security_mode = SecurityMode::Strict)
        .start()
        .await;
    let s = Subjects::default();
    let payload = "import pty\npty.os.system('id')\n";
    let module = FileSpec {
        path: "code/x.py".into(),
        content: payload.into(),
        encoding: ContentEncoding::Utf8,
    };
    let cases = [
        (request(payload, Vec::new()), None),
        (request("import x", vec![module]), Some("code/x.py")),
    ];
    for (attack, file) in cases {
        let id = attack.execution_id.clone().unwrap();
        let client = mesh.client.clone();
        let running = tokio::spawn(async move {
            client
                .request::<_, ExecResult>(Subjects::default().exec(), &attack)
                .await
        });
        let pending = eventually("the attack's pending confirmation", || {
            let c = mesh.client.clone();
            let id = id.clone();
            async move {
                let list: ConfirmListReply = c
                    .request(
                        Subjects::default().confirm(ConfirmOp::List),
                        &ConfirmList::default(),
                    )
                    .await
                    .ok()?;
                list.confirmations
                    .into_iter()
                    .find(|c| c.execution_id.as_deref() == Some(id.as_str()))
            }
        })
        .await;
        assert_eq!(pending.risk.level, RiskLevel::Critical, "{pending:?}");
        assert!(
            pending
                .risk
                .findings
                .iter()
                .any(|f| f.rule == "py.os_system"),
            "{pending:?}"
        );
        if let Some(path) = file {
            // The person sees the file the code runs, with what was found in it.
            let shown = pending.files.iter().find(|f| f.path == path);
            let shown = shown.unwrap_or_else(|| panic!("{path} not shown: {pending:?}"));
            assert_eq!(shown.bytes, payload.len() as u64);
            assert_eq!(shown.excerpt, payload);
            assert_eq!(shown.sha256.len(), 64);
            let in_file = pending
                .risk
                .findings
                .iter()
                .find(|f| f.rule == "py.os_system");
            assert_eq!(in_file.and_then(|f| f.path.as_deref()), Some(path));
            assert!(pending.summary.contains(path), "{}", pending.summary);
        }
        assert!(!running.is_finished(), "parked, not answered");
        let ran = |id: &str| {
            mesh.runs
                .lock()
                .unwrap()
                .iter()
                .any(|r| r.execution_id == id)
        };
        assert!(
            !ran(&id),
            "nothing reached an executor before a person decided"
        );

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
        assert_eq!(r.status, ExecStatus::Ok, "{r:?}");
        assert_eq!(r.confirmation.decision, Decision::Approved);
        assert!(ran(&id), "approved, it reached the executor");
    }
    mesh.shutdown().await;
}
