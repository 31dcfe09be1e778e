//! [`EgressProxy`]: one container's Unix socket, its accept loop and its connections. The
//! proxy is an RAII guard: dropping it ends every connection and removes the socket file.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use messages::network::NetworkPolicy;
use tokio::net::{UnixListener, UnixStream};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::handler::Handler;
use crate::resolver::{Resolver, SystemResolver};
use crate::rules::EgressRules;
use crate::stats::{Counters, EgressEvent, EgressStats, Observer};
use crate::EgressError;

/// Largest request head (request line plus headers) read before answering 431. Bounded reads
/// keep one container from holding the proxy's memory.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Most headers in one request.
pub const MAX_HEADERS: usize = 64;
/// Most simultaneous client connections per container; more are closed at once.
pub const MAX_CONNECTIONS: usize = 256;

/// How to build an [`EgressProxy`]; see [`EgressProxy::builder`].
pub struct EgressProxyBuilder {
    policy: NetworkPolicy,
    resolver: Arc<dyn Resolver>,
    observer: Option<Observer>,
    header_timeout: Duration,
    connect_timeout: Duration,
}

impl EgressProxyBuilder {
    /// Resolves names through `resolver` instead of the system resolver.
    pub fn resolver(mut self, resolver: impl Resolver) -> Self {
        self.resolver = Arc::new(resolver);
        self
    }

    /// Calls `observer` with every decision (to audit it on `sandbox.v1.audit.egress`).
    pub fn observer(mut self, observer: impl Fn(&EgressEvent) + Send + Sync + 'static) -> Self {
        self.observer = Some(Arc::new(observer));
        self
    }

    /// How long a client may take to send a request head (slow clients are cut off).
    pub fn header_timeout(mut self, timeout: Duration) -> Self {
        self.header_timeout = timeout;
        self
    }

    /// How long resolving a name, and then dialing its address, may each take before the
    /// client gets 504.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Validates the policy and binds a new socket at `path` (which must not exist yet).
    /// Must be called inside a tokio runtime.
    pub fn bind(self, path: impl Into<PathBuf>) -> Result<EgressProxy, EgressError> {
        let rules = EgressRules::new(&self.policy).map_err(EgressError::Policy)?;
        let path = path.into();
        let listener = UnixListener::bind(&path).map_err(|source| EgressError::Bind {
            path: path.clone(),
            source,
        })?;
        let counters = Arc::new(Counters::default());
        let stop = CancellationToken::new();
        let handler = Arc::new(Handler {
            rules,
            resolver: self.resolver,
            observer: self.observer,
            counters: counters.clone(),
            connect_timeout: self.connect_timeout,
            stop: stop.clone(),
        });
        let accept = tokio::spawn(accept_loop(
            listener,
            handler,
            self.header_timeout,
            stop.clone(),
        ));
        Ok(EgressProxy {
            path,
            counters,
            stop,
            accept: Some(accept),
        })
    }
}

/// One container's egress proxy, serving its socket until closed or dropped.
pub struct EgressProxy {
    path: PathBuf,
    counters: Arc<Counters>,
    stop: CancellationToken,
    accept: Option<JoinHandle<()>>,
}

impl EgressProxy {
    /// A proxy for `policy` with the system resolver, no observer and default timeouts.
    pub fn builder(policy: NetworkPolicy) -> EgressProxyBuilder {
        EgressProxyBuilder {
            policy,
            resolver: Arc::new(SystemResolver),
            observer: None,
            header_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
        }
    }

    pub fn socket_path(&self) -> &Path {
        &self.path
    }

    /// The counters now.
    pub fn stats(&self) -> EgressStats {
        self.counters.snapshot()
    }

    /// Stops accepting, ends every connection, waits for the accept loop and removes the
    /// socket file.
    pub async fn close(mut self) {
        self.stop.cancel();
        if let Some(accept) = self.accept.take() {
            if let Err(e) = accept.await {
                tracing::warn!(error = %e, "egress accept loop failed");
            }
        }
    }
}

impl Drop for EgressProxy {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(accept) = self.accept.take() {
            accept.abort();
        }
        if let Err(e) = std::fs::remove_file(&self.path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot remove egress socket");
            }
        }
    }
}

async fn accept_loop(
    listener: UnixListener,
    handler: Arc<Handler>,
    header_timeout: Duration,
    stop: CancellationToken,
) {
    // Dropping the set (when this loop ends or is aborted) aborts every connection task.
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) if connections.len() < MAX_CONNECTIONS => {
                    connections.spawn(serve(stream, handler.clone(), header_timeout));
                }
                Ok(_) => tracing::warn!(limit = MAX_CONNECTIONS, "egress connection refused"),
                Err(e) => {
                    // Out of descriptors, typically: give connections a moment to finish.
                    tracing::warn!(error = %e, "egress accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
}

async fn serve(stream: UnixStream, handler: Arc<Handler>, header_timeout: Duration) {
    let service = service_fn(move |req| {
        let handler = handler.clone();
        async move { Ok::<_, Infallible>(handler.handle(req).await) }
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .max_buf_size(MAX_HEAD_BYTES)
        .max_headers(MAX_HEADERS);
    let served = builder
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades()
        .await;
    if let Err(e) = served {
        tracing::debug!(error = %e, "egress client connection ended");
    }
}
