//! Small real stand-ins for the services around the scheduler, served over a real nats-server
//! with the kit — enough behaviour to drive every branch of the scheduler's logic. The true
//! services are exercised in `e2e.rs` (and the real confirmation service everywhere it parks).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::HeaderMap;
use kit::serve::ServiceHost;
use kit::{EndpointOptions, ServiceInfo};
use messages::confirm::{ConfirmRequest, ConfirmState, Confirmation};
use messages::exec::{ExecResult, ExecStatus, Tier};
use messages::executor::{ExecutorClose, ExecutorRun, RunKind};
use messages::heartbeat::Heartbeat;
use messages::risk::{AssessRequest, RiskAssessment, RiskLevel};
use messages::subjects::{ConfirmOp, ExecutorOp, WorkspaceOp};
use messages::workspace::{Ack, WsInit, WsUsage};
use messages::{ErrorBody, ErrorKind, Subjects};

use super::{connect, WAIT};

fn info(name: &str) -> ServiceInfo {
    ServiceInfo {
        name: name.into(),
        version: "0.0.1".into(),
        description: "test stand-in".into(),
    }
}

// === risk-assessor ===

/// `rm -rf /` → reject; `os.system` → high, needs confirmation; `import os` → medium; else safe.
pub fn assess(req: &AssessRequest) -> RiskAssessment {
    let code = &req.content;
    if code.contains("rm -rf /") {
        RiskAssessment {
            level: RiskLevel::Critical,
            reason: "deletes the filesystem".into(),
            suggested_tier: Tier::Reject,
            ..Default::default()
        }
    } else if code.contains("os.system") {
        RiskAssessment {
            level: RiskLevel::High,
            reason: "runs shell commands".into(),
            requires_confirmation: true,
            requires_isolation: true,
            suggested_tier: Tier::Session,
            ..Default::default()
        }
    } else if code.contains("urllib") && !req.under_network_policy() {
        RiskAssessment {
            level: RiskLevel::High,
            reason: "network request".into(),
            requires_confirmation: true,
            suggested_tier: Tier::Session,
            ..Default::default()
        }
    } else if code.contains("import os") {
        RiskAssessment {
            level: RiskLevel::Medium,
            reason: "uses os".into(),
            suggested_tier: Tier::Ephemeral,
            ..Default::default()
        }
    } else {
        RiskAssessment {
            level: RiskLevel::Safe,
            reason: "nothing risky".into(),
            suggested_tier: Tier::Ephemeral,
            ..Default::default()
        }
    }
}

pub async fn host(url: &str, name: &str, instance: &str) -> ServiceHost {
    ServiceHost::start(&connect(url).await, &info(name), instance)
        .await
        .expect("service host")
}

pub async fn serve_risk(url: &str) -> ServiceHost {
    let h = host(url, "risk-standin", "r1").await;
    h.serve(
        Subjects::default().risk_assess(),
        EndpointOptions::default(),
        kit::handler(|_, req: AssessRequest| async move { Ok(assess(&req)) }),
    )
    .await
    .unwrap();
    h
}

// === confirmation ===

pub async fn serve_confirm(
    url: &str,
    approve: bool,
    asked: Arc<Mutex<Vec<ConfirmRequest>>>,
) -> ServiceHost {
    let h = host(url, "confirm-standin", "c1").await;
    h.serve(
        Subjects::default().confirm(ConfirmOp::Request),
        EndpointOptions::default(),
        kit::handler(move |_, req: ConfirmRequest| {
            asked.lock().unwrap().push(req.clone());
            async move {
                Ok(Confirmation {
                    id: messages::new_id(),
                    state: if approve {
                        ConfirmState::Approved
                    } else {
                        ConfirmState::Denied
                    },
                    execution_id: req.execution_id,
                    by: Some(if approve { "alice" } else { "policy:deny" }.into()),
                    reason: Some("test policy".into()),
                    ..Default::default()
                })
            }
        }),
    )
    .await
    .unwrap();
    h
}

// === workspace-store ===

pub async fn serve_workspace(url: &str) -> ServiceHost {
    let h = host(url, "workspace-standin", "w1").await;
    h.serve(
        Subjects::default().workspace(WorkspaceOp::Init),
        EndpointOptions::default(),
        kit::handler(|_, req: WsInit| async move {
            Ok(WsUsage {
                session_id: req.session_id,
                bytes: 0,
                files: 0,
                quota_bytes: 0,
                last_modified: messages::now_ms(),
            })
        }),
    )
    .await
    .unwrap();
    h
}

// === docker-executor ===

/// One run an executor stand-in took.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub execution_id: String,
    pub node: String,
    pub session_id: Option<String>,
    pub restored: bool,
    pub tier: Tier,
    pub kind: RunKind,
    /// The egress policy the executor was told to enforce.
    pub network: Option<messages::network::NetworkPolicy>,
    /// Runs of this log still going when this one started, itself included.
    pub in_flight: usize,
    pub finished: bool,
}

pub type Runs = Arc<Mutex<Vec<Run>>>;

/// An executor stand-in: heartbeats as `docker-executor.<node>`, serves its node subjects and
/// the shared queue group. Code `sleep:<ms>` sleeps first; `fail:<code>` answers that error;
/// `busy:<ms>` answers 429 until that long after the run's first attempt.
pub struct FakeExecutor {
    pub node: String,
    host: Option<ServiceHost>,
    beat: tokio::task::JoinHandle<()>,
    client: async_nats::Client,
}

fn parse_after(code: &str, tag: &str) -> Option<u64> {
    let rest = &code[code.find(tag)? + tag.len()..];
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// One run as the stand-ins "run" it (the code conventions of [`FakeExecutor`]), logged in
/// `runs`.
pub(crate) async fn fake_run(
    node: String,
    runs: Runs,
    run: ExecutorRun,
) -> Result<ExecResult, ErrorBody> {
    let index = {
        let mut log = runs.lock().unwrap();
        let in_flight = log.iter().filter(|r| !r.finished).count() + 1;
        log.push(Run {
            execution_id: run.execution_id.clone(),
            node: node.clone(),
            session_id: run.session_id().map(Into::into),
            restored: run.session_restored,
            tier: run.tier(),
            kind: run.kind().clone(),
            network: run.network.clone(),
            in_flight,
            finished: false,
        });
        log.len() - 1
    };
    let code = &run.request().code;
    if let Some(ms) = parse_after(code, "busy:") {
        // A full executor: refuses (429) until `ms` after the first attempt at this run.
        static FIRST_SEEN: Mutex<BTreeMap<String, std::time::Instant>> =
            Mutex::new(BTreeMap::new());
        let first = *FIRST_SEEN
            .lock()
            .unwrap()
            .entry(run.execution_id.clone())
            .or_insert_with(std::time::Instant::now);
        if first.elapsed() < Duration::from_millis(ms) {
            runs.lock().unwrap()[index].finished = true;
            return Err(ErrorBody::overloaded("busy"));
        }
    }
    if let Some(ms) = parse_after(code, "sleep:") {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    runs.lock().unwrap()[index].finished = true;
    if let Some(status) = parse_after(code, "fail:") {
        return Err(ErrorBody::new(
            ErrorKind::from_code(status as u16),
            "asked to fail",
        ));
    }
    Ok(ExecResult {
        execution_id: run.execution_id,
        status: ExecStatus::Ok,
        exit_code: Some(0),
        stdout: format!("ran on {node}\n"),
        node: Some(node),
        session_restored: run.session_restored,
        ..Default::default()
    })
}

impl FakeExecutor {
    pub async fn start(url: &str, node: &str, capacity: u32, runs: Runs) -> Self {
        Self::start_with(url, node, capacity, runs, Duration::from_secs(2), 1).await
    }

    /// A stand-in whose heartbeat keys live `ttl`, on a nodes bucket of `replicas` copies.
    pub async fn start_with(
        url: &str,
        node: &str,
        capacity: u32,
        runs: Runs,
        ttl: Duration,
        replicas: usize,
    ) -> Self {
        let client = connect(url).await;
        let host = ServiceHost::start(&client, &info("docker-executor"), node)
            .await
            .unwrap();
        let s = Subjects::default();
        for subject in [s.executor_run(), s.executor_node(node, ExecutorOp::Run)] {
            let (n, r) = (node.to_string(), runs.clone());
            host.serve(
                subject,
                EndpointOptions::default(),
                kit::handler(move |_, run: ExecutorRun| fake_run(n.clone(), r.clone(), run)),
            )
            .await
            .unwrap();
        }
        host.serve(
            s.executor_node(node, ExecutorOp::Close),
            EndpointOptions::default(),
            kit::handler(|_, _: ExecutorClose| async { Ok(Ack { ok: true }) }),
        )
        .await
        .unwrap();
        let js = async_nats::jetstream::new(client.clone());
        kit::bootstrap::nodes_kv(&js, &s, replicas).await.unwrap();
        let beat = tokio::spawn(heartbeat(js, node.to_string(), capacity, ttl));
        // Visible in KV before anyone places work.
        let kv = async_nats::jetstream::new(client.clone())
            .get_key_value(s.nodes_bucket())
            .await
            .unwrap();
        let key = format!("docker-executor.{node}");
        crate::eventually("the first heartbeat", WAIT, || {
            let (kv, key) = (kv.clone(), key.clone());
            async move { kv.get(key).await.ok().flatten() }
        })
        .await;
        Self {
            node: node.to_string(),
            host: Some(host),
            beat,
            client,
        }
    }

    /// Dies like a killed process: no more answers, no more heartbeats, the key left to expire.
    pub async fn crash(mut self) {
        self.beat.abort();
        if let Some(h) = self.host.take() {
            h.shutdown(Duration::from_millis(10)).await;
        }
    }

    /// Stops cleanly: endpoints gone and the heartbeat key deleted.
    pub async fn stop(mut self) {
        self.beat.abort();
        if let Some(h) = self.host.take() {
            h.shutdown(Duration::from_secs(1)).await;
        }
        let kv = async_nats::jetstream::new(self.client.clone())
            .get_key_value(Subjects::default().nodes_bucket())
            .await
            .unwrap();
        kv.delete(format!("docker-executor.{}", self.node))
            .await
            .unwrap();
    }
}

/// Beats every 300 ms with a TTL of `ttl` (2 s: like the kit's heartbeat).
async fn heartbeat(js: async_nats::jetstream::Context, node: String, capacity: u32, ttl: Duration) {
    let s = Subjects::default();
    let subject = format!("$KV.{}.docker-executor.{node}", s.nodes_bucket());
    loop {
        let hb = Heartbeat {
            service: "docker-executor".into(),
            instance_id: node.clone(),
            capacity,
            sent_at: messages::now_ms(),
            ..Default::default()
        };
        let mut headers = HeaderMap::new();
        headers.insert("Nats-TTL", format!("{}s", ttl.as_secs().max(1)).as_str());
        if let Ok(ack) = js
            .publish_with_headers(
                subject.clone(),
                headers,
                serde_json::to_vec(&hb).unwrap().into(),
            )
            .await
        {
            let _ = ack.await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Every audit event stored so far for `execution_id`, oldest first.
pub async fn audit_kinds(url: &str, execution_id: &str) -> Vec<String> {
    audit_events(url)
        .await
        .into_iter()
        .filter(|e| e.execution_id.as_deref() == Some(execution_id))
        .map(|e| e.kind().as_str().to_string())
        .collect()
}

/// Every audit event stored so far, oldest first.
pub async fn audit_events(url: &str) -> Vec<messages::audit::AuditEvent> {
    use async_nats::jetstream::consumer::{pull, DeliverPolicy};
    use futures::StreamExt;
    let js = async_nats::jetstream::new(connect(url).await);
    let stream = js
        .get_stream(Subjects::default().audit_stream())
        .await
        .unwrap();
    let consumer = stream
        .create_consumer(pull::Config {
            deliver_policy: DeliverPolicy::All,
            ..Default::default()
        })
        .await
        .unwrap();
    let pending = consumer.clone().info().await.unwrap().num_pending as usize;
    let mut out = Vec::new();
    if pending == 0 {
        return out;
    }
    let mut batch = consumer
        .batch()
        .max_messages(pending)
        .expires(Duration::from_secs(2))
        .messages()
        .await
        .unwrap();
    while let Some(Ok(m)) = batch.next().await {
        out.push(serde_json::from_slice(&m.payload).unwrap());
    }
    out
}
