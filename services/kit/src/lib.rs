//! The shared service runtime. Every sandmesh service is a small crate of actors; this kit is
//! the plumbing they would otherwise repeat:
//!
//! - [`config`]: `SANDMESH_*` configuration, all errors reported together (exit 64);
//! - [`connect`]: NATS connection with retry and logged events;
//! - [`serve`]: endpoints on the NATS services API (`$SRV.*` discovery), decoded by
//!   `Content-Type`, handed to actors, answered in the caller's encoding, bounded admission;
//! - [`call`]: typed request-reply to other services, error headers checked;
//! - [`heartbeat`]: the `Heartbeat` actor keeping `<service>.<instance>` alive in `sandbox_nodes`;
//! - [`bootstrap`]: idempotent JetStream streams and buckets;
//! - [`audit`]: audit events into `SANDBOX_AUDIT`;
//! - [`objects`]: object store reads without a consumer per read;
//! - [`telemetry`]: tracing, OpenTelemetry export and W3C trace context in NATS headers;
//! - [`shutdown`]: SIGINT/SIGTERM → one cancellation token.
//!
//! [`Runtime`] ties them together for a service's `run(config, shutdown)`:
//!
//! ```text
//! Runtime ── ServiceHost (one task per endpoint → handler/actor per request)
//!        └── HeartbeatActor (timer → KV put with TTL; deletes its key on stop)
//! ```

pub mod audit;
pub mod bootstrap;
pub mod call;
pub mod config;
pub mod connect;
pub mod heartbeat;
pub mod objects;
pub mod serve;
pub mod shutdown;
pub mod telemetry;

use std::time::Duration;

use async_nats::{jetstream, Client};
use messages::Subjects;
use ractor::{Actor, ActorRef};
use serde::de::DeserializeOwned;
use serde::Serialize;

pub use audit::{AuditScope, Auditor};
pub use call::{CallError, Caller};
pub use config::{ConfigError, ConfigReader, KitConfig};
pub use serve::{actor_handler, handler, EndpointOptions, Handler, RequestContext, ServiceInfo};
pub use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
pub enum KitError {
    #[error("cannot connect to NATS at {0}")]
    Connect(String),
    #[error("NATS: {0}")]
    Nats(String),
    #[error("JetStream: {0} (JetStream must be enabled, nats-server >= 2.11)")]
    JetStream(String),
    #[error("actor: {0}")]
    Actor(String),
}

/// A running service instance: its connection, JetStream context, endpoints and heartbeat.
pub struct Runtime {
    pub config: KitConfig,
    pub info: ServiceInfo,
    pub client: Client,
    pub js: jetstream::Context,
    pub auditor: Auditor,
    host: serve::ServiceHost,
    heartbeat: Option<ActorRef<heartbeat::HeartbeatMsg>>,
}

impl Runtime {
    /// Connects, ensures the shared JetStream assets and starts the micro service.
    pub async fn start(config: KitConfig, info: ServiceInfo) -> Result<Self, KitError> {
        let client =
            connect::connect(&config, &format!("{}-{}", info.name, config.instance_id)).await?;
        let js = jetstream::new(client.clone());
        bootstrap::all(&js, &config.subjects).await?;
        let host = serve::ServiceHost::start(&client, &info, &config.instance_id).await?;
        let auditor = Auditor::new(
            js.clone(),
            config.subjects.clone(),
            &info.name,
            &config.instance_id,
        );
        Ok(Self {
            config,
            info,
            client,
            js,
            auditor,
            host,
            heartbeat: None,
        })
    }

    pub fn subjects(&self) -> &Subjects {
        &self.config.subjects
    }

    /// Default endpoint options: 1 MiB payloads, `SANDMESH_MAX_IN_FLIGHT` concurrent requests.
    pub fn endpoint_options(&self) -> EndpointOptions {
        EndpointOptions {
            max_in_flight: self.config.max_in_flight,
            ..Default::default()
        }
    }

    pub async fn serve<Req, Resp>(
        &self,
        subject: String,
        handler: Handler<Req, Resp>,
    ) -> Result<(), KitError>
    where
        Req: DeserializeOwned + Send + 'static,
        Resp: Serialize + Send + 'static,
    {
        self.host
            .serve(subject, self.endpoint_options(), handler)
            .await
    }

    pub async fn serve_with<Req, Resp>(
        &self,
        subject: String,
        options: EndpointOptions,
        handler: Handler<Req, Resp>,
    ) -> Result<(), KitError>
    where
        Req: DeserializeOwned + Send + 'static,
        Resp: Serialize + Send + 'static,
    {
        self.host.serve(subject, options, handler).await
    }

    /// A caller for other services with the given default timeout.
    pub fn caller(&self, timeout: Duration) -> Caller {
        Caller::new(self.client.clone(), timeout)
    }

    /// Starts beating `<service>.<instance_id>` into `sandbox_nodes`.
    pub async fn start_heartbeat(&mut self, probe: heartbeat::LoadProbe) -> Result<(), KitError> {
        let args = heartbeat::HeartbeatArgs {
            js: self.js.clone(),
            bucket: self.config.subjects.nodes_bucket(),
            service: self.info.name.clone(),
            instance_id: self.config.instance_id.clone(),
            version: self.info.version.clone(),
            interval: self.config.heartbeat_interval,
            probe,
        };
        let (actor, _) = Actor::spawn(None, heartbeat::HeartbeatActor, args)
            .await
            .map_err(|e| KitError::Actor(format!("heartbeat: {e}")))?;
        self.heartbeat = Some(actor);
        Ok(())
    }

    /// Graceful stop: no new requests, in-flight ones finish (bounded by the grace period),
    /// heartbeat key removed, connection drained. Returns whether all requests finished.
    pub async fn shutdown(self) -> bool {
        let finished = self.host.shutdown(self.config.shutdown_grace).await;
        if let Some(hb) = self.heartbeat {
            let _ = hb.stop_and_wait(None, Some(Duration::from_secs(5))).await;
        }
        let _ = self.client.flush().await;
        let _ = tokio::time::timeout(Duration::from_secs(5), self.client.drain()).await;
        finished
    }
}
