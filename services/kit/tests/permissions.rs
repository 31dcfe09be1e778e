//! DESIGN.md §5.3 over a real nats-server running `deploy/nats/permissions.conf`: a client
//! reaches the public API but can never reach an executor directly.

mod common;

use std::time::Duration;

use futures::StreamExt;
use messages::Subjects;
use test_support::{repo_root, NatsServer};

const ENV: &[(&str, &str)] = &[
    ("SANDMESH_CLIENT_PASSWORD", "client-pw"),
    ("SANDMESH_SCHEDULER_PASSWORD", "scheduler-pw"),
    ("SANDMESH_EXECUTOR_PASSWORD", "executor-pw"),
    ("SANDMESH_RISK_PASSWORD", "risk-pw"),
    ("SANDMESH_CONFIRMATION_PASSWORD", "confirmation-pw"),
    ("SANDMESH_WORKSPACE_PASSWORD", "workspace-pw"),
];

async fn connect(url: &str, user: &str, password: &str) -> async_nats::Client {
    async_nats::ConnectOptions::with_user_and_password(user.into(), password.into())
        .connect(url)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_client_cannot_reach_an_executor_but_the_scheduler_can() {
    let path = repo_root().join("deploy/nats/permissions.conf");
    let permissions = std::fs::read_to_string(path).unwrap();
    let nats = NatsServer::start_with_env(&permissions, ENV);
    let s = Subjects::default();

    let executor = connect(&nats.url(), "executor", "executor-pw").await;
    let mut work = executor.subscribe(s.executor_run()).await.unwrap();
    executor.flush().await.unwrap();
    let responder = tokio::spawn(async move {
        let mut received = Vec::new();
        while let Some(msg) = work.next().await {
            received.push(String::from_utf8_lossy(&msg.payload).to_string());
            if let Some(reply) = msg.reply {
                executor.publish(reply, "ran".into()).await.unwrap();
            }
        }
        received
    });

    // The client is refused by the server: the request never reaches the executor.
    let client = connect(&nats.url(), "client", "client-pw").await;
    let attempt = tokio::time::timeout(
        Duration::from_secs(3),
        client.request(s.executor_run(), "from-client".into()),
    )
    .await;
    assert!(
        !matches!(attempt, Ok(Ok(_))),
        "a client got an executor reply: {attempt:?}"
    );
    // Nor can it listen in on executor traffic.
    let mut spy = client.subscribe(s.executor_all()).await.unwrap();

    // The scheduler reaches the executor.
    let scheduler = connect(&nats.url(), "scheduler", "scheduler-pw").await;
    let reply = scheduler
        .request(s.executor_run(), "from-scheduler".into())
        .await
        .unwrap();
    assert_eq!(&reply.payload[..], b"ran");
    let spied = tokio::time::timeout(Duration::from_millis(500), spy.next()).await;
    assert!(
        !matches!(spied, Ok(Some(_))),
        "a client subscription saw executor traffic"
    );

    // The client can still use the public API (a stand-in risk service answers).
    let risk = common::start_echo_as(&nats.url(), "risk", "risk-pw", &s.risk_assess()).await;
    let client = connect(&nats.url(), "client", "client-pw").await;
    let reply = client
        .request(s.risk_assess(), r#"{"text":"hi"}"#.into())
        .await;
    let reply = reply.unwrap_or_else(|e| panic!("{e}: {}", nats.log()));
    assert!(String::from_utf8_lossy(&reply.payload).contains("hi"));
    risk.shutdown().await;

    drop(scheduler);
    responder.abort();
    let received = responder.await.unwrap_or_default();
    assert!(!received.iter().any(|p| p == "from-client"));
}
