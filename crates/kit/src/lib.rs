//! The shared service runtime. Every sandmesh service is a small crate of actors; this kit is
//! the plumbing they would otherwise repeat:
//!
//! - [`config`]: `SANDMESH_*` configuration, all errors reported together (exit 64);
//! - [`connect`]: NATS connection with retry and logged events;
//! - [`serve`]: endpoints on the NATS services API (`$SRV.*` discovery), decoded by
//!   `Content-Type`, handed to actors, answered in the caller's encoding, bounded admission;
//! - [`mesh_client`]: how a service calls another — `sandmesh-client`'s typed clients, as any
//!   user calls the mesh, in MessagePack and carrying the trace context;
//! - [`heartbeat`]: the `Heartbeat` actor keeping `<service>.<instance>` alive in `sandbox_nodes`;
//! - [`peer_counts`]: what the other instances of a service hold per tenant (their heartbeats'
//!   reports), so a tenant's quota counts the mesh;
//! - [`metrics`]: Prometheus `/metrics`, off unless `SANDMESH_METRICS_ADDR`;
//! - [`http`]: the listening socket and the errors of the services that speak HTTP;
//! - [`pending`]: a service's subjects answer `unavailable` while what it needs is being built;
//! - [`resources`]: the host's CPU and memory, which executors report in their heartbeat;
//! - [`bootstrap`]: idempotent JetStream streams and buckets, `SANDMESH_JS_REPLICAS` replicas;
//! - [`retry`]: bounded retries of JetStream calls through a cluster's leader elections;
//! - [`audit`]: audit events into `SANDBOX_AUDIT`;
//! - [`telemetry`]: tracing, OpenTelemetry export and W3C trace context in NATS headers;
//! - [`shutdown`]: SIGINT/SIGTERM → one cancellation token; every NATS step of a stop bounded.
//!
//! [`Runtime`] ties them together for a service's `run(config, shutdown)`:
//!
//! ```text
//! Runtime ── ServiceHost (one task per endpoint → handler/actor per request)
//!        ├── HeartbeatActor (timer → KV put with TTL; deletes its key on stop)
//!        └── MetricsEndpoint, when configured (shared by the process's services on one
//!            address; an accept task, a task per scrape connection; closes with its last user)
//! ```

pub mod audit;
pub mod bootstrap;
pub mod config;
pub mod connect;
pub mod heartbeat;
pub mod http;
pub mod janitor;
pub mod metrics;
pub mod peer_counts;
pub mod pending;
pub mod resources;
pub mod retry;
pub mod serve;
pub mod shutdown;
pub mod telemetry;

use std::time::Duration;

use async_nats::{jetstream, Client};
use messages::Subjects;
use ractor::{Actor, ActorRef};
use sandmesh_client::MeshClient;
use serde::de::DeserializeOwned;
use serde::Serialize;

pub use audit::{AuditScope, Auditor};
pub use config::{ConfigError, ConfigReader, KitConfig};
pub use peer_counts::PeerCounts;
pub use retry::{retry, RetryPolicy};
pub use sandmesh_auth::QuotaBook;
pub use serve::{actor_handler, handler, EndpointOptions, Handler, RequestContext, ServiceInfo};
pub use tokio_util::sync::CancellationToken;

/// `e: cause: its cause…` — an error with its whole chain, for a message that leaves the
/// process (a reply, a log line on stderr).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// The client a service calls other services with: the one users call the mesh with, in
/// MessagePack (smaller and faster than JSON) and carrying the current span's trace context,
/// so one trace follows a request from service to service.
pub fn mesh_client(client: Client, subjects: Subjects) -> MeshClient {
    MeshClient::new(client, subjects).with_headers(telemetry::inject_current)
}

/// A cause from any of the crates the kit drives (async-nats has one error type per call).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What went wrong in the plumbing, with its cause kept: `source()` gives the underlying
/// error, and the message repeats it (as async-nats' errors do) so a log line is whole.
#[derive(Debug, thiserror::Error)]
pub enum KitError {
    #[error("cannot connect to NATS at {url}: {source}")]
    Connect {
        url: String,
        #[source]
        source: async_nats::ConnectError,
    },
    #[error("NATS: {what}: {source}")]
    Nats {
        what: String,
        #[source]
        source: BoxError,
    },
    #[error("JetStream: {what}: {source} (JetStream must be enabled, nats-server >= 2.11)")]
    JetStream {
        what: String,
        #[source]
        source: BoxError,
    },
    #[error("encoding {what}: {source}")]
    Encode {
        what: &'static str,
        #[source]
        source: messages::CodecError,
    },
    #[error("starting the {actor} actor: {source}")]
    Actor {
        actor: &'static str,
        #[source]
        source: ractor::SpawnErr,
    },
    #[error("the tenancy file: {0}")]
    Tenancy(#[from] sandmesh_auth::TenancyError),
    #[error("the tenancy file {file} holds no credentials for the service {service:?}")]
    NoCredentials { file: String, service: String },
    #[error(transparent)]
    Metrics(#[from] metrics::MetricsError),
}

impl KitError {
    /// A failed NATS call: `what` we were doing, and why it failed.
    pub fn nats(what: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Nats {
            what: what.into(),
            source: source.into(),
        }
    }

    /// A failed JetStream call: `what` we were doing, and why it failed.
    pub fn jetstream(what: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::JetStream {
            what: what.into(),
            source: source.into(),
        }
    }
}

/// The mesh a service belongs to: the creation time of the shared nodes bucket, the same for
/// every service on one NATS deployment and different for every other. Container owners
/// label their containers with it, so a janitor judges only its own mesh's.
pub async fn mesh_id(nodes_kv: &jetstream::kv::Store) -> Result<String, KitError> {
    let kv = nodes_kv.clone();
    let status = kv
        .status()
        .await
        .map_err(|e| KitError::jetstream("nodes bucket status", e))?;
    Ok(format!("{:x}", status.info.created.unix_timestamp_nanos()))
}

/// A running service instance: its connection, JetStream context, endpoints and heartbeat.
pub struct Runtime {
    pub config: KitConfig,
    pub info: ServiceInfo,
    pub client: Client,
    pub js: jetstream::Context,
    pub auditor: Auditor,
    /// The tenants' quotas (followed from the tenancy file), for the services that own a
    /// resource a tenant holds.
    pub quotas: std::sync::Arc<QuotaBook>,
    /// What this service counts; served on `/metrics` when `SANDMESH_METRICS_ADDR` is set.
    pub metrics: std::sync::Arc<metrics::Metrics>,
    /// Keeps the (possibly shared) endpoint serving while this service runs.
    metrics_endpoint: Option<std::sync::Arc<metrics::MetricsEndpoint>>,
    host: serve::ServiceHost,
    heartbeat: Option<ActorRef<heartbeat::HeartbeatMsg>>,
}

impl Runtime {
    /// Connects, ensures the assets every service uses (the heartbeat bucket and the audit
    /// stream) and starts the micro service. Each service creates its own other assets: its
    /// NATS user may touch no others.
    pub async fn start(config: KitConfig, info: ServiceInfo) -> Result<Self, KitError> {
        // First, so a taken port fails the start before anything is created.
        let metrics_endpoint = config
            .metrics_addr
            .map(metrics::MetricsEndpoint::shared)
            .transpose()?;
        let metrics = metrics_endpoint
            .as_ref()
            .map_or_else(Default::default, |e| e.metrics());
        let client = connect::connect(
            &config,
            &info.name,
            &format!("{}-{}", info.name, config.instance_id),
        )
        .await?;
        let js = jetstream::new(client.clone());
        bootstrap::nodes_kv(&js, &config.subjects, config.js_replicas).await?;
        bootstrap::audit_stream(&js, &config.subjects, config.js_replicas).await?;
        let quotas = std::sync::Arc::new(config.quota_book()?);
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
            quotas,
            metrics,
            metrics_endpoint,
            host,
            heartbeat: None,
        })
    }

    /// Where this service's metrics are served, if anywhere (the bound port when the
    /// configured one was 0).
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics_endpoint.as_ref().map(|e| e.addr())
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

    /// The shared nodes bucket (heartbeats) and the mesh id derived from it (see [`mesh_id`]).
    pub async fn nodes_and_mesh(&self) -> Result<(jetstream::kv::Store, String), KitError> {
        let kv = self
            .js
            .get_key_value(self.config.subjects.nodes_bucket())
            .await
            .map_err(|e| KitError::jetstream("nodes bucket", e))?;
        let mesh = mesh_id(&kv).await?;
        Ok((kv, mesh))
    }

    /// What the other instances of this service hold per tenant (their heartbeats'
    /// reports), for a quota counted mesh-wide.
    pub async fn peer_counts(&self) -> Result<peer_counts::PeerCounts, KitError> {
        let (nodes, _) = self.nodes_and_mesh().await?;
        Ok(peer_counts::PeerCounts::watch(
            nodes,
            &self.info.name,
            &self.config.instance_id,
        ))
    }

    /// This service's client of the others ([`mesh_client`]), on its connection and subjects.
    pub fn mesh(&self) -> MeshClient {
        mesh_client(self.client.clone(), self.subjects().clone())
    }

    /// Starts beating `<service>.<instance_id>` into `sandbox_nodes`.
    pub async fn start_heartbeat(&mut self, probe: heartbeat::LoadProbe) -> Result<(), KitError> {
        self.start_heartbeat_reporting(probe, None).await
    }

    /// [`Runtime::start_heartbeat`], each beat also reporting what this instance holds per
    /// tenant, which its peers' [`PeerCounts`] read.
    pub async fn start_heartbeat_reporting(
        &mut self,
        probe: heartbeat::LoadProbe,
        tenants: Option<heartbeat::TenantProbe>,
    ) -> Result<(), KitError> {
        let args = heartbeat::HeartbeatArgs {
            js: self.js.clone(),
            bucket: self.config.subjects.nodes_bucket(),
            service: self.info.name.clone(),
            instance_id: self.config.instance_id.clone(),
            version: self.info.version.clone(),
            interval: self.config.heartbeat_interval,
            probe,
            tenants,
        };
        let (actor, _) = Actor::spawn(None, heartbeat::HeartbeatActor, args)
            .await
            .map_err(|source| KitError::Actor {
                actor: "heartbeat",
                source,
            })?;
        self.heartbeat = Some(actor);
        Ok(())
    }

    /// Graceful stop: no new requests, in-flight ones finish (bounded by the grace period),
    /// heartbeat key removed, connection drained. Returns whether all requests finished.
    pub async fn shutdown(self) -> bool {
        let finished = self.host.shutdown(self.config.shutdown_grace).await;
        if let Some(hb) = self.heartbeat {
            // Its post_stop deletes the key: one bounded NATS step.
            let limit = shutdown::NATS_STEP_LIMIT + Duration::from_secs(1);
            let _ = hb.stop_and_wait(None, Some(limit)).await;
        }
        shutdown::bounded(&self.client, "flush", self.client.flush()).await;
        // A drain that cannot reach the server gives up.
        shutdown::bounded(&self.client, "drain", self.client.drain()).await;
        finished
    }
}
