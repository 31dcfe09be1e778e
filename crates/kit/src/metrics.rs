//! Prometheus metrics: the mesh's vocabulary ([`Metrics`], listed in
//! `docs/reference/configuration.md#metrics`) and the `/metrics` endpoint
//! that serves it ([`MetricsEndpoint`]: Prometheus text format 0.0.4 over hyper 1).
//!
//! Off unless `SANDMESH_METRICS_ADDR` is set; a service without an endpoint still updates a
//! detached [`Metrics`], so counting code never branches on it. Services of one process
//! configured with the same address share one endpoint and one set of metrics: `sandmesh up`
//! runs every service in one process, and one scrape shows all of them. Counters add up over
//! the services sharing them; gauges carry `service` and `node` labels, so two instances in
//! one process never overwrite each other's.
//!
//! Each service counts what it is the authority on: the scheduler final statuses (once per
//! stored result), executors warm-pool hits, confirmation decisions, the assessor risk levels.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// The one path served.
pub const PATH: &str = "/metrics";

/// Scrapes served at once; further connections are closed unanswered, so a flood of
/// connections cannot hold a service's memory.
const MAX_CONNECTIONS: usize = 32;

/// How long a client may take to send its request head (slow-loris bound).
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// Upper bounds of the execution duration buckets, in seconds: from a warm `print(1)` to the
/// longest timeouts.
const DURATION_BUCKETS: [f64; 13] = [
    0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// `status` and `tier` of a finished execution.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExecutionLabels {
    pub status: &'static str,
    pub tier: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TierLabel {
    pub tier: &'static str,
}

/// Which instance a gauge describes: `service` (docker-executor, aio-pool, ...) and its node
/// or instance id.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabels {
    pub service: &'static str,
    pub node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ServiceLabel {
    pub service: &'static str,
}

/// A warm pool: the service and the template whose image it keeps warm.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    pub service: &'static str,
    pub template: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackendLabel {
    pub backend: &'static str,
}

/// How a confirmation ended: `approved`, `denied` or `expired`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabel {
    pub decision: &'static str,
}

/// A risk assessment's `level` and what was assessed (`content_type`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RiskLabels {
    pub level: &'static str,
    pub content_type: &'static str,
}

type DurationHistogram = Family<TierLabel, Histogram, fn() -> Histogram>;

fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

/// The metrics a sandmesh process exposes (prefixed `sandbox_`). Counters
/// are named without `_total` here; the encoder appends it.
#[derive(Debug, Clone)]
pub struct Metrics {
    /// `sandbox_executions_total{status,tier}`: stored results (scheduler).
    pub executions: Family<ExecutionLabels, Counter>,
    /// `sandbox_execution_duration_seconds{tier}`: from the request's arrival to its result,
    /// without the time spent waiting for a person (scheduler).
    pub execution_duration: DurationHistogram,
    /// `sandbox_sessions_active{service,node}`: sessions holding a sandbox there.
    pub sessions_active: Family<NodeLabels, Gauge>,
    /// `sandbox_warm_pool_size{service,node}`: ready sandboxes waiting for work.
    pub warm_pool_size: Family<NodeLabels, Gauge>,
    /// `sandbox_template_warm_pool_size{service,template}`: ready sandboxes of a template's
    /// own image (the node's own image's are `warm_pool_size`).
    pub template_warm_pool_size: Family<PoolLabels, Gauge>,
    /// `sandbox_warm_pool_hits_total{service,template}`: work that found a warm sandbox.
    pub warm_pool_hits: Family<PoolLabels, Counter>,
    /// `sandbox_warm_pool_misses_total{service,template}`: work that had to start one cold.
    pub warm_pool_misses: Family<PoolLabels, Counter>,
    /// `sandbox_runtime_nodes_healthy{backend}`: executor nodes with a live heartbeat, as the
    /// scheduler's registry sees them.
    pub runtime_nodes_healthy: Family<BackendLabel, Gauge>,
    /// `sandbox_runtime_cpu_usage_percent{service,node}`: the executor host's CPU use.
    pub runtime_cpu_usage_percent: Family<NodeLabels, Gauge<f64, AtomicU64>>,
    /// `sandbox_runtime_memory_usage_bytes{service,node}`: the executor host's memory in use.
    pub runtime_memory_usage_bytes: Family<NodeLabels, Gauge>,
    /// `sandbox_confirmations_requested_total`: confirmations opened.
    pub confirmations_requested: Counter,
    /// `sandbox_confirmations_decided_total{decision}`: approved, denied or expired.
    pub confirmations_decided: Family<DecisionLabel, Counter>,
    /// `sandbox_risk_assessments_total{level,content_type}`.
    pub risk_assessments: Family<RiskLabels, Counter>,
}

impl Default for Metrics {
    /// A set registered nowhere: what a service updates when it has no endpoint.
    fn default() -> Self {
        Self {
            executions: Family::default(),
            execution_duration: Family::new_with_constructor(duration_histogram),
            sessions_active: Family::default(),
            warm_pool_size: Family::default(),
            template_warm_pool_size: Family::default(),
            warm_pool_hits: Family::default(),
            warm_pool_misses: Family::default(),
            runtime_nodes_healthy: Family::default(),
            runtime_cpu_usage_percent: Family::default(),
            runtime_memory_usage_bytes: Family::default(),
            confirmations_requested: Counter::default(),
            confirmations_decided: Family::default(),
            risk_assessments: Family::default(),
        }
    }
}

impl Metrics {
    /// A fresh set, registered in `registry`.
    fn registered(registry: &mut Registry) -> Self {
        let m = Self::default();
        let r = registry;
        r.register(
            "sandbox_executions",
            "Executions finished, by final status and tier",
            m.executions.clone(),
        );
        r.register(
            "sandbox_execution_duration_seconds",
            "Time from request to result, without waiting for a person",
            m.execution_duration.clone(),
        );
        r.register(
            "sandbox_sessions_active",
            "Sessions holding a sandbox on this node",
            m.sessions_active.clone(),
        );
        r.register(
            "sandbox_warm_pool_size",
            "Ready sandboxes waiting for work",
            m.warm_pool_size.clone(),
        );
        r.register(
            "sandbox_template_warm_pool_size",
            "Ready sandboxes of a template's own image",
            m.template_warm_pool_size.clone(),
        );
        r.register(
            "sandbox_warm_pool_hits",
            "Work that found a warm sandbox",
            m.warm_pool_hits.clone(),
        );
        r.register(
            "sandbox_warm_pool_misses",
            "Work that had to start a sandbox cold",
            m.warm_pool_misses.clone(),
        );
        r.register(
            "sandbox_runtime_nodes_healthy",
            "Executor nodes with a live heartbeat",
            m.runtime_nodes_healthy.clone(),
        );
        r.register(
            "sandbox_runtime_cpu_usage_percent",
            "CPU use of the executor's host, 0-100",
            m.runtime_cpu_usage_percent.clone(),
        );
        r.register(
            "sandbox_runtime_memory_usage_bytes",
            "Memory in use on the executor's host",
            m.runtime_memory_usage_bytes.clone(),
        );
        r.register(
            "sandbox_confirmations_requested",
            "Confirmations opened",
            m.confirmations_requested.clone(),
        );
        r.register(
            "sandbox_confirmations_decided",
            "Confirmations ended: approved, denied or expired",
            m.confirmations_decided.clone(),
        );
        r.register(
            "sandbox_risk_assessments",
            "Risk assessments, by level and content type",
            m.risk_assessments.clone(),
        );
        m
    }

    /// Counts one finished execution (call once per stored result).
    pub fn execution_finished(&self, status: &'static str, tier: &'static str, seconds: f64) {
        self.executions
            .get_or_create(&ExecutionLabels { status, tier })
            .inc();
        self.execution_duration
            .get_or_create(&TierLabel { tier })
            .observe(seconds);
    }

    /// Sets an executor host's resource gauges.
    pub fn host_resources(&self, at: &NodeLabels, r: &messages::heartbeat::Resources) {
        self.runtime_cpu_usage_percent
            .get_or_create(at)
            .set(r.cpu_usage_percent);
        let used = i64::try_from(r.memory_used_bytes).unwrap_or(i64::MAX);
        self.runtime_memory_usage_bytes.get_or_create(at).set(used);
    }
}

#[derive(Debug, thiserror::Error)]
#[error("serving metrics on {addr}: {source}")]
pub struct MetricsError {
    pub addr: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

/// The endpoints of this process by address. A socket is a process-wide resource: services
/// started in one process with the same address must share its listener, not fight over it.
/// Entries are weak, so an endpoint closes when the last service using it stops.
static ENDPOINTS: Mutex<BTreeMap<SocketAddr, Weak<MetricsEndpoint>>> = Mutex::new(BTreeMap::new());

/// A listening `/metrics` endpoint and the metrics it serves; stops serving when dropped.
#[derive(Debug)]
pub struct MetricsEndpoint {
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
}

impl MetricsEndpoint {
    /// This process's endpoint on `addr`, bound on first use. An address with port 0 binds a
    /// fresh port each time; [`MetricsEndpoint::addr`] says which. Its accept loop runs on the
    /// Tokio runtime of the first caller, so services sharing an address share a runtime (as
    /// `sandmesh up`'s do).
    pub fn shared(addr: SocketAddr) -> Result<Arc<Self>, MetricsError> {
        let mut endpoints = ENDPOINTS.lock().unwrap_or_else(|e| e.into_inner());
        endpoints.retain(|_, e| e.strong_count() > 0);
        if let Some(endpoint) = endpoints.get(&addr).and_then(Weak::upgrade) {
            return Ok(endpoint);
        }
        let error = |source| MetricsError { addr, source };
        // Bound synchronously under the lock: two services starting together get one socket.
        let listener = std::net::TcpListener::bind(addr).map_err(error)?;
        listener.set_nonblocking(true).map_err(error)?;
        let bound = listener.local_addr().map_err(error)?;
        let listener = TcpListener::from_std(listener).map_err(error)?;
        let mut registry = Registry::default();
        let metrics = Arc::new(Metrics::registered(&mut registry));
        let stop = CancellationToken::new();
        tokio::spawn(serve(listener, Arc::new(registry), stop.clone()));
        tracing::info!(addr = %bound, "serving Prometheus metrics on http://{bound}{PATH}");
        let endpoint = Arc::new(Self {
            addr: bound,
            metrics,
            stop,
        });
        endpoints.insert(bound, Arc::downgrade(&endpoint));
        Ok(endpoint)
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }
}

impl Drop for MetricsEndpoint {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn serve(listener: TcpListener, registry: Arc<Registry>, stop: CancellationToken) {
    let connections = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = stop.cancelled() => return,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!(error = %e, "metrics endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            tracing::warn!(%peer, "metrics endpoint: too many connections; closed one");
            continue;
        };
        let (registry, stop) = (registry.clone(), stop.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let service = hyper::service::service_fn(move |req| {
                let response = respond(&registry, &req);
                async move { Ok::<_, Infallible>(response) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => if let Err(e) = r {
                    tracing::debug!(%peer, error = %e, "metrics endpoint: connection ended");
                },
                () = stop.cancelled() => {}
            }
        });
    }
}

/// `GET`/`HEAD /metrics` → the metrics; another method → 405; another path → 404.
fn respond(registry: &Registry, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    if req.uri().path() != PATH {
        return plain(
            StatusCode::NOT_FOUND,
            "not found: metrics are at /metrics\n",
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = plain(StatusCode::METHOD_NOT_ALLOWED, "use GET\n");
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let mut text = String::new();
    if let Err(e) = prometheus_client::encoding::prometheus_text::encode(&mut text, registry) {
        tracing::error!(error = %e, "encoding metrics failed");
        return plain(StatusCode::INTERNAL_SERVER_ERROR, "encoding failed\n");
    }
    let mut r = Response::new(Full::new(Bytes::from(text)));
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static(prometheus_client::encoding::prometheus_text::CONTENT_TYPE),
    );
    r
}

fn plain(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}
