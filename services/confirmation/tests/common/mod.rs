//! Test harness: confirmation instances running `run` in-process against a real nats-server,
//! a JSON caller, and bounded waits for events and readiness.

use sandmesh_client::{ClientError, MeshClient};
use std::future::Future;
use std::time::Duration;

use async_nats::jetstream;
use confirmation::{ConfirmationConfig, ConfirmationError, PolicyConfig};
use futures::StreamExt;
use kit::CancellationToken;
use messages::confirm::{ConfirmDecide, ConfirmGet, ConfirmRequest, ConfirmScope, Confirmation};
use messages::risk::{Finding, RiskAssessment, RiskLevel};
use messages::subjects::ConfirmOp;
use messages::{Encoding, Subjects};
use tokio::task::JoinHandle;

/// Every wait in these tests is bounded by this.
pub const BOUND: Duration = Duration::from_secs(20);

pub async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within {BOUND:?}"))
}

/// `test_support::eventually`, bounded by [`BOUND`].
pub async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    test_support::eventually(what, BOUND, check).await
}

pub async fn connect(url: &str) -> async_nats::Client {
    let (options, plain) = test_support::connect_options(url);
    options
        .retry_on_initial_connect()
        .connect(plain)
        .await
        .expect("connect to nats")
}

/// One confirmation service instance running in this process.
pub struct Instance {
    token: CancellationToken,
    handle: JoinHandle<Result<(), ConfirmationError>>,
}

pub fn config(url: &str, instance_id: &str, policy: PolicyConfig) -> ConfirmationConfig {
    let mut c = ConfirmationConfig::for_url(url);
    c.kit.instance_id = instance_id.to_string();
    c.kit.heartbeat_interval = Duration::from_millis(200);
    c.kit.shutdown_grace = Duration::from_secs(5);
    c.policy = policy;
    c
}

impl Instance {
    pub async fn start(url: &str, instance_id: &str) -> Self {
        Self::start_with(url, instance_id, PolicyConfig::default()).await
    }

    /// Starts and returns once this very instance beats (its endpoints are served by then).
    pub async fn start_with(url: &str, instance_id: &str, policy: PolicyConfig) -> Self {
        let token = CancellationToken::new();
        let handle = tokio::spawn(confirmation::run(
            config(url, instance_id, policy),
            token.clone(),
        ));
        let js = jetstream::new(connect(url).await);
        let key = messages::heartbeat::heartbeat_key(confirmation::SERVICE_NAME, instance_id);
        eventually(&format!("instance {instance_id} ready"), || {
            let js = js.clone();
            let key = key.clone();
            async move {
                let kv = js.get_key_value("sandbox_nodes").await.ok()?;
                kv.get(&key).await.ok().flatten().map(|_| ())
            }
        })
        .await;
        Self { token, handle }
    }

    /// Waits for `run` to end by itself (without a stop signal) and returns its outcome.
    pub async fn ended(self) -> Result<(), ConfirmationError> {
        within("run ends", self.handle).await.expect("run task")
    }

    /// Graceful stop through the cancellation token, as a signal would.
    pub async fn stop(self) {
        self.token.cancel();
        within("instance stops", self.handle)
            .await
            .expect("run task")
            .expect("run ends cleanly");
    }
}

pub fn caller(client: &async_nats::Client) -> MeshClient {
    kit::mesh_client(client.clone(), Default::default())
        .with_timeout(Duration::from_secs(30))
        .with_encoding(Encoding::Json)
}

/// A subscription to every confirmation event, in place before the test asks anything.
pub async fn confirm_events(client: &async_nats::Client) -> async_nats::Subscriber {
    let sub = client
        .subscribe(subjects().confirm_events_all())
        .await
        .unwrap();
    client.flush().await.unwrap();
    sub
}

pub fn subjects() -> Subjects {
    Subjects::default()
}

pub fn risk(level: RiskLevel, rules: &[&str]) -> RiskAssessment {
    RiskAssessment {
        level,
        reason: format!("{} finding(s)", rules.len()),
        requires_confirmation: true,
        requires_isolation: true,
        suggested_tier: messages::exec::Tier::Session,
        findings: rules
            .iter()
            .map(|r| Finding {
                rule: r.to_string(),
                severity: level,
                description: format!("matched {r}"),
                line: Some(1),
                start: None,
                end: None,
                path: None,
            })
            .collect(),
    }
}

pub fn request(session: Option<&str>, rules: &[&str], wait: bool) -> ConfirmRequest {
    ConfirmRequest {
        execution_id: Some(messages::new_id()),
        session_id: session.map(str::to_string),
        risk: risk(RiskLevel::High, rules),
        summary: "python code opens a socket".into(),
        code_excerpt: "import socket".into(),
        files: Vec::new(),
        kind: Default::default(),
        requested_by: Some("agent-7".into()),
        timeout_ms: Some(60_000),
        wait,
        tenant: None,
    }
}

pub async fn ask(c: &MeshClient, req: &ConfirmRequest) -> Result<Confirmation, ClientError> {
    c.request(subjects().confirm(ConfirmOp::Request), req).await
}

pub async fn get(c: &MeshClient, id: &str) -> Result<Confirmation, ClientError> {
    c.request(
        subjects().confirm(ConfirmOp::Get),
        &ConfirmGet { id: id.to_string() },
    )
    .await
}

pub fn decision(id: &str, approve: bool, by: &str, scope: ConfirmScope) -> ConfirmDecide {
    ConfirmDecide {
        id: id.to_string(),
        approve,
        by: by.to_string(),
        reason: (!approve).then(|| "not on a Friday".to_string()),
        scope,
        by_account: None,
    }
}

pub async fn decide(c: &MeshClient, d: &ConfirmDecide) -> Result<Confirmation, ClientError> {
    c.request(subjects().confirm(ConfirmOp::Decide), d).await
}

/// Asks with `wait` in the background (the reply arrives when the decision does).
pub fn ask_in_background(
    c: &MeshClient,
    req: ConfirmRequest,
) -> JoinHandle<Result<Confirmation, ClientError>> {
    let c = c.clone();
    tokio::spawn(async move { ask(&c, &req).await })
}

/// The next confirmation event on `subject` (a wildcard), decoded.
pub async fn next_event(sub: &mut async_nats::Subscriber) -> (String, Confirmation) {
    let msg = within("confirmation event", sub.next())
        .await
        .expect("subscription open");
    let record = serde_json::from_slice(&msg.payload).expect("event is a JSON Confirmation");
    (msg.subject.to_string(), record)
}

/// Waits for the pending event of the request for `execution_id`.
pub async fn pending_event(sub: &mut async_nats::Subscriber, execution_id: &str) -> Confirmation {
    loop {
        let (_, record) = next_event(sub).await;
        if record.execution_id.as_deref() == Some(execution_id) {
            return record;
        }
    }
}

/// The load gauges this instance last reported in its heartbeat.
pub async fn heartbeat_metric(
    js: &jetstream::Context,
    instance_id: &str,
    metric: &str,
) -> Option<f64> {
    let kv = js.get_key_value(subjects().nodes_bucket()).await.ok()?;
    let key = messages::heartbeat::heartbeat_key(confirmation::SERVICE_NAME, instance_id);
    let value = kv.get(&key).await.ok()??;
    let hb: messages::heartbeat::Heartbeat = serde_json::from_slice(&value).ok()?;
    hb.metrics.get(metric).copied()
}

/// Audit events recorded for one execution, in order.
pub async fn audit_events(
    js: &jetstream::Context,
    execution_id: &str,
) -> Vec<messages::audit::AuditEvent> {
    let stream = js.get_stream(subjects().audit_stream()).await.unwrap();
    let consumer = stream
        .create_consumer(jetstream::consumer::pull::Config {
            filter_subject: subjects().audit_all(),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut batch = consumer
        .batch()
        .max_messages(10_000)
        .expires(Duration::from_millis(200))
        .messages()
        .await
        .unwrap();
    let mut out = Vec::new();
    while let Some(Ok(msg)) = batch.next().await {
        let event: messages::audit::AuditEvent = serde_json::from_slice(&msg.payload).unwrap();
        if event.execution_id.as_deref() == Some(execution_id) {
            out.push(event);
        }
    }
    out
}

/// `(instance_id, requests served on `subject`)` for each of the `instances` running, from
/// `$SRV.INFO` and `$SRV.STATS`.
pub async fn requests_served(
    client: &async_nats::Client,
    subject: &str,
    instances: usize,
) -> Vec<(String, usize)> {
    let infos = gather(
        client,
        format!("$SRV.INFO.{}", confirmation::SERVICE_NAME),
        instances,
    )
    .await;
    let mut out = Vec::new();
    for info in infos {
        let info: async_nats::service::Info = serde_json::from_slice(&info).unwrap();
        let stats = client
            .request(
                format!("$SRV.STATS.{}.{}", confirmation::SERVICE_NAME, info.id),
                "".into(),
            )
            .await
            .unwrap();
        let stats: async_nats::service::Stats = serde_json::from_slice(&stats.payload).unwrap();
        let served = stats
            .endpoints
            .iter()
            .filter(|e| e.subject == subject)
            .map(|e| e.requests)
            .sum();
        out.push((info.metadata["instance_id"].clone(), served));
    }
    out
}

/// The first `count` replies to one request (the services protocol answers once per instance).
async fn gather(client: &async_nats::Client, subject: String, count: usize) -> Vec<bytes::Bytes> {
    let inbox = client.new_inbox();
    let mut sub = client.subscribe(inbox.clone()).await.unwrap();
    client
        .publish_with_reply(subject, inbox, "".into())
        .await
        .unwrap();
    let mut out = Vec::new();
    while out.len() < count {
        let msg = within("$SRV replies", sub.next()).await.unwrap();
        out.push(msg.payload);
    }
    out
}
