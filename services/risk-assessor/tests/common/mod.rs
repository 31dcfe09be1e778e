//! A real nats-server and the risk-assessor running in-process against it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use kit::CancellationToken;
use messages::codec::{self, Encoding};
use messages::risk::{AssessRequest, ContentType};
use risk_assessor::RiskAssessorConfig;
use test_support::NatsServer;

pub struct Running {
    pub nats: NatsServer,
    pub client: async_nats::Client,
    pub subject: String,
    pub instance_id: String,
    shutdown: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

/// Starts NATS and the service, and waits (bounded) until the endpoint answers.
pub async fn start(extra_env: &[(&str, &str)]) -> Running {
    let nats = NatsServer::start();
    let mut env: HashMap<String, String> = HashMap::new();
    env.insert("SANDMESH_NATS_URL".into(), nats.url());
    let instance_id = format!("ra-{}", messages::new_id().to_ascii_lowercase());
    env.insert("SANDMESH_INSTANCE_ID".into(), instance_id.clone());
    for (k, v) in extra_env {
        env.insert(k.to_string(), v.to_string());
    }
    let config = RiskAssessorConfig::from_env(&env).expect("valid config");
    let subject = config.kit.subjects.risk_assess();
    let shutdown = CancellationToken::new();
    let token = shutdown.clone();
    let task = tokio::spawn(async move {
        risk_assessor::run(config, token)
            .await
            .expect("service runs");
    });
    let client = test_support::connect(&nats.url()).await;
    let running = Running {
        nats,
        client,
        subject,
        instance_id,
        shutdown,
        task: Some(task),
    };
    let probe = AssessRequest {
        content: "ls".into(),
        content_type: ContentType::Shell,
        params: None,
        mode: None,
        files: Vec::new(),
    };
    let body = Encoding::Json.encode(&probe).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let reply = running.raw(Some(codec::JSON), body.clone()).await;
        if reply.is_ok() {
            return running;
        }
        assert!(
            Instant::now() < deadline,
            "service never answered: {reply:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

impl Running {
    /// Sends raw bytes with an optional Content-Type; returns the reply message.
    pub async fn raw(
        &self,
        content_type: Option<&str>,
        body: Vec<u8>,
    ) -> Result<async_nats::Message, async_nats::RequestError> {
        let mut headers = HeaderMap::new();
        if let Some(ct) = content_type {
            headers.insert(codec::CONTENT_TYPE, ct);
        }
        self.client
            .send_request(
                self.subject.clone(),
                async_nats::Request::new()
                    .payload(body.into())
                    .headers(headers)
                    .timeout(Some(Duration::from_secs(30))),
            )
            .await
    }

    /// Stops the service (NATS keeps running until `self` is dropped).
    pub async fn stop(&mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(30), task)
                .await
                .expect("service stops in time")
                .expect("service task");
        }
    }
}
