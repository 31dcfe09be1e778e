//! `sandmesh confirm` as a person runs it: the real binary against a confirmation service
//! running in this process over a real nats-server.

use std::process::{Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use confirmation::ConfirmationConfig;
use kit::CancellationToken;
use messages::confirm::{ConfirmDecide, ConfirmRequest, ConfirmScope, ConfirmState};
use messages::risk::{Finding, RiskAssessment, RiskLevel};
use messages::Subjects;
use sandmesh_client::{ConfirmClient, MeshClient};
use test_support::{eventually, NatsServer};
use tokio::io::AsyncBufReadExt;

use crate::common::SANDMESH;
const BOUND: Duration = Duration::from_secs(30);

struct Service {
    token: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), confirmation::ConfirmationError>>,
}

impl Service {
    async fn start(url: &str) -> (Self, ConfirmClient) {
        let token = CancellationToken::new();
        let task = tokio::spawn(confirmation::run(
            ConfirmationConfig::for_url(url),
            token.clone(),
        ));
        let nats = test_support::connect(url).await;
        let confirm = MeshClient::new(nats, Subjects::default()).confirm();
        eventually("confirmation answers", BOUND, || {
            let confirm = confirm.clone();
            async move { confirm.list(&Default::default()).await.ok() }
        })
        .await;
        (Self { token, task }, confirm)
    }

    async fn stop(self) {
        self.token.cancel();
        let ended = tokio::time::timeout(BOUND, self.task).await;
        ended.expect("stops in time").expect("task").expect("clean");
    }
}

fn pending(rule: &str) -> ConfirmRequest {
    ConfirmRequest {
        execution_id: Some(messages::new_id()),
        session_id: Some("s1".into()),
        risk: RiskAssessment {
            level: RiskLevel::High,
            requires_confirmation: true,
            findings: vec![Finding {
                rule: rule.into(),
                severity: RiskLevel::High,
                description: format!("matched {rule}"),
                line: Some(1),
                start: None,
                end: None,
                path: None,
            }],
            ..Default::default()
        },
        summary: "python code opens a socket".into(),
        timeout_ms: Some(60_000),
        wait: false,
        ..Default::default()
    }
}

/// Runs `sandmesh <args>` to completion against the mesh at `url`.
async fn sandmesh(url: &str, args: &[&str]) -> Output {
    crate::common::sandmesh(url, args, BOUND).await
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test]
async fn approve_and_deny_decide_and_a_repeat_is_refused() {
    let nats = NatsServer::start();
    let url = nats.url();
    let (service, confirm) = Service::start(&url).await;
    let one = confirm.request(&pending("net.socket")).await.unwrap();
    let two = confirm.request(&pending("fs.write")).await.unwrap();

    let list = sandmesh(&url, &["confirm", "list", "--session", "s1"]).await;
    assert!(list.status.success(), "{}", text(&list.stderr));
    let listed = text(&list.stdout);
    assert!(
        listed.contains(&one.id) && listed.contains(&two.id),
        "{listed}"
    );

    let approve = [
        "confirm", "approve", &one.id, "--scope", "session", "--by", "alice",
    ];
    assert!(sandmesh(&url, &approve).await.status.success());
    let approved = confirm.get(&one.id).await.unwrap();
    assert_eq!(approved.state, ConfirmState::Approved);
    assert_eq!(approved.scope, ConfirmScope::Session);
    assert_eq!(approved.by.as_deref(), Some("alice"));
    // Already decided: refused with exit code 1 and the service's reason; the first stands.
    let again = sandmesh(&url, &approve).await;
    assert_eq!(again.status.code(), Some(1), "{}", text(&again.stderr));
    assert!(
        text(&again.stderr).contains(&one.id),
        "{}",
        text(&again.stderr)
    );

    let deny = [
        "confirm",
        "deny",
        &two.id,
        "--reason",
        "writes outside",
        "--by",
        "bob",
    ];
    assert!(sandmesh(&url, &deny).await.status.success());
    let denied = confirm.get(&two.id).await.unwrap();
    assert_eq!(denied.state, ConfirmState::Denied);
    assert_eq!(denied.reason.as_deref(), Some("writes outside"));

    let unknown = sandmesh(&url, &["confirm", "approve", &messages::new_id()]).await;
    assert_eq!(unknown.status.code(), Some(1));
    service.stop().await;
}

#[tokio::test]
async fn watch_prints_the_queue_and_its_changes() {
    let nats = NatsServer::start();
    let url = nats.url();
    let (service, confirm) = Service::start(&url).await;
    let before = confirm.request(&pending("net.socket")).await.unwrap();

    let mut watch = tokio::process::Command::new(SANDMESH)
        .args(["confirm", "watch"])
        .env("SANDMESH_NATS_URL", &url)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("sandmesh confirm watch runs");
    let out = Arc::new(Mutex::new(String::new()));
    let mut lines = tokio::io::BufReader::new(watch.stdout.take().unwrap()).lines();
    let reader = {
        let out = out.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let mut out = out.lock().unwrap();
                out.push_str(&line);
                out.push('\n');
            }
        })
    };
    let printed = |needles: Vec<String>| {
        let out = out.clone();
        async move {
            let text = out.lock().unwrap().clone();
            needles
                .iter()
                .all(|n| text.contains(n.as_str()))
                .then_some(())
        }
    };
    // The queue is printed after the watch subscribed, so later changes cannot be missed.
    eventually("the queue is printed", BOUND, || {
        printed(vec![before.id.clone()])
    })
    .await;
    assert!(out.lock().unwrap().starts_with("1 pending"));

    let after = confirm.request(&pending("fs.write")).await.unwrap();
    let decide = ConfirmDecide {
        by_account: None,
        id: before.id.clone(),
        approve: true,
        by: "alice".into(),
        reason: None,
        scope: ConfirmScope::Once,
    };
    confirm.decide(&decide).await.unwrap();
    let changes = vec![format!("+ {}", after.id), format!("- {}", before.id)];
    eventually("both changes are printed", BOUND, || {
        printed(changes.clone())
    })
    .await;
    eventually("the queue size follows", BOUND, || {
        printed(vec!["(1 pending)".into(), "by alice".into()])
    })
    .await;

    watch.start_kill().expect("the watch stops");
    let _ = tokio::time::timeout(BOUND, watch.wait()).await;
    let _ = tokio::time::timeout(BOUND, reader).await;
    service.stop().await;
}

#[tokio::test]
async fn audit_prints_the_decisions_and_ends_at_the_end_of_the_trail() {
    let nats = NatsServer::start();
    let url = nats.url();
    let (service, confirm) = Service::start(&url).await;
    let asked = confirm.request(&pending("net.socket")).await.unwrap();
    let approve = ["confirm", "approve", &asked.id, "--by", "alice"];
    assert!(sandmesh(&url, &approve).await.status.success());

    // Audit events are stored in the background; each run ends by itself at the trail's end.
    let args = ["audit", "--kind", "confirmation_decided", "--json"];
    let printed = eventually("the decision in the audit trail", BOUND, || async {
        let out = sandmesh(&url, &args).await;
        assert!(out.status.success(), "{}", text(&out.stderr));
        let lines = text(&out.stdout);
        lines.contains(&asked.id).then_some(lines)
    })
    .await;
    let events: Vec<serde_json::Value> = printed
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON event per line"))
        .collect();
    assert_eq!(events.len(), 1, "{printed}");
    assert_eq!(events[0]["kind"], "confirmation_decided");
    assert_eq!(events[0]["details"]["by"], "alice");
    service.stop().await;
}
