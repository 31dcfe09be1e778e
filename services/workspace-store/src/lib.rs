//! workspace-store: every session's workspace, shared by all
//! instances and surviving restarts because it lives in JetStream only:
//!
//! - contents in the object store `<prefix>_workspace_blobs` (chunked, so files of any size);
//! - an index in KV `<prefix>_workspace_index`: one key per file or directory, one meta key
//!   per session with its totals — the quota is a compare-and-set on that key — and one
//!   revision key per session (`messages::workspace::revision_key`), put after every change,
//!   so executors learn whether their copy is current with one KV read and no request here.
//!
//! Subjects (`sandbox.v1.workspace.<op>`, request → reply):
//! `init` WsInit → WsUsage · `write` WsWrite → WsEntry · `read` WsRead → WsFile ·
//! `list` WsList → WsListing · `stat` WsPath → WsEntry · `delete` WsPath → Ack ·
//! `snapshot` WsSnapshot → WsArchive · `restore` WsRestore → WsRestored ·
//! `usage` WsUsageRequest → WsUsage · `cleanup` WsCleanup → WsCleaned ·
//! `upload` WsUploadChunk → WsUploadAck · `fetch` WsFetch → WsFile.
//!
//! An agent's `read`, `stat`, `list`, `write` and `delete` of a session whose background
//! processes run wait for the session's node to carry the container's changes here first
//! ([`container_sync`]).
//!
//! Large content never travels in one message. Anyone (a tenant's agent too) sends it in
//! `upload` chunks and names the upload in the write or restore (`uploads`), reads a large
//! file by ranges (`read` with offset and length) and a large snapshot's staged object by
//! ranges (`fetch`). Services may instead hand over an object they put under
//! `upload/<token>` and fetch the object a whole-file read or a snapshot names.
//! `sandmesh-client`'s `WorkspaceClient` does all of it for callers.
//!
//! ```text
//! run ── Runtime (kit: endpoints, each request its own tracked task, heartbeat)
//!     │     └─ Workspaces: Files · Snapshots · Restores · Cleanup (each over the Index's
//!     │        Tree and the Blobs), called with the request's caller as a value
//!     └─ Sweeper (interval → TTL sweep under a KV lock)
//! ```
//!
//! All state is in JetStream, so operations on different sessions — and on one session,
//! thanks to compare-and-set — run side by side: no actor orders them.

pub mod archive;
pub mod blobs;
pub mod cleanup;
pub mod config;
pub mod container_sync;
pub mod error;
pub mod files;
pub mod index;
pub mod keys;
pub mod restore;
pub mod snapshot;
pub mod store;
pub mod sweeper;
pub mod uploads;
pub mod workspaces;

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use kit::{
    CancellationToken, EndpointOptions, Handler, KitError, RequestContext, Runtime, ServiceInfo,
};
use messages::subjects::WorkspaceOp;
use messages::tenancy::Caller;
use messages::workspace::{NamesSession, ShowsSession};
use messages::ErrorBody;
use ractor::Actor;

pub use config::WorkspaceConfig;
pub use error::StoreError;
pub use workspaces::Workspaces;

use blobs::Blobs;
use container_sync::ContainerSync;
use index::Index;
use sweeper::{Sweeper, SweeperArgs};
use uploads::Uploads;

pub const SERVICE_NAME: &str = messages::ServiceName::WorkspaceStore.as_str();

#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    #[error(transparent)]
    Kit(#[from] KitError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("actor: {0}")]
    Actor(String),
}

pub fn service_info() -> ServiceInfo {
    ServiceInfo {
        name: SERVICE_NAME.into(),
        version: env!("CARGO_PKG_VERSION").into(),
        description: "Per-session workspaces: files, quotas, TTL cleanup, tar snapshots".into(),
    }
}

/// Scopes the session a request names by its caller's tenant before the store sees it, and
/// unscopes the reply: an agent reaches only its own tenant's workspaces, and
/// another tenant's session id names a workspace that does not exist for it (404). Sweeping
/// every idle workspace (`cleanup` without a session) is for the services only.
fn tenant_scoped<Req, Resp>(inner: Handler<Req, Resp>) -> Handler<Req, Resp>
where
    Req: NamesSession + Send + 'static,
    Resp: ShowsSession + Send + 'static,
{
    kit::handler(move |ctx: RequestContext, mut req: Req| {
        let inner = inner.clone();
        async move {
            let tenant = ctx.caller.tenant().cloned();
            if tenant.is_some() && req.names_object() {
                // Objects are the services' hand-over; an agent could name another tenant's.
                return Err(ErrorBody::denied(
                    "agents move large content with workspace.upload, not by object name",
                ));
            }
            // (as stored, as the caller named it), to unscope error messages too.
            let mut names = None;
            match req.session_mut() {
                Some(id) => {
                    let scoped = ctx.caller.scope("session_id", id)?;
                    names = Some((scoped.clone(), std::mem::replace(id, scoped)));
                }
                None if tenant.is_some() => {
                    return Err(ErrorBody::denied(
                        "name the session whose workspace to clean up",
                    ))
                }
                None => {}
            }
            inner(ctx, req)
                .await
                .map(|reply| reply.unscoped(tenant.as_ref()))
                .map_err(|mut e| {
                    if let (Some((scoped, named)), Some(_)) = (&names, &tenant) {
                        e.message = e.message.replace(scoped.as_str(), named);
                    }
                    e
                })
        }
    })
}

/// Syncs an agent's session from its container before `inner` reads it (`ContainerSync`); the
/// request's session is scoped already.
fn synced_first<Req, Resp>(
    sync: &Arc<ContainerSync>,
    inner: Handler<Req, Resp>,
) -> Handler<Req, Resp>
where
    Req: NamesSession + Send + 'static,
    Resp: Send + 'static,
{
    let sync = sync.clone();
    kit::handler(move |ctx: RequestContext, mut req: Req| {
        let (inner, sync) = (inner.clone(), sync.clone());
        async move {
            let session = req.session_mut().map(|id| id.clone());
            if let (Some(_), Some(session)) = (ctx.caller.tenant(), session) {
                sync.before_read(&session).await;
            }
            inner(ctx, req).await
        }
    })
}

/// An endpoint's handler: the store's operation `op`, called in the request's own task (kit
/// tracks it and shutdown waits for it) with the caller as a value, counted in the in-flight
/// load the heartbeat reports; a failure of the store itself is logged.
fn operation<Req, Resp, F, Fut>(store: &Arc<Workspaces>, op: F) -> Handler<Req, Resp>
where
    Req: Send + 'static,
    Resp: Send + 'static,
    F: Fn(Arc<Workspaces>, Caller, Req) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Resp, StoreError>> + Send + 'static,
{
    let store = store.clone();
    let op = Arc::new(op);
    kit::handler(move |ctx: RequestContext, req: Req| {
        let (store, op) = (store.clone(), op.clone());
        async move {
            let metrics = store.metrics.clone();
            metrics.in_flight.fetch_add(1, Ordering::Relaxed);
            let outcome = op(store, ctx.caller, req).await;
            metrics.in_flight.fetch_sub(1, Ordering::Relaxed);
            outcome.map_err(|e| {
                if e.is_the_stores() {
                    tracing::warn!(error = %e, "workspace operation failed");
                }
                ErrorBody::from(e)
            })
        }
    })
}

/// Runs one instance until `shutdown` is cancelled (then stops gracefully).
pub async fn run(
    config: WorkspaceConfig,
    shutdown: CancellationToken,
) -> Result<(), WorkspaceError> {
    let mut runtime = Runtime::start(config.kit.clone(), service_info()).await?;
    let subjects = runtime.subjects().clone();
    let replicas = runtime.config.js_replicas;
    let index = Index::open(&runtime.js, &subjects.workspace_index_bucket(), replicas).await?;
    let blobs = Blobs::open(&runtime.js, &subjects.workspace_objects_bucket(), replicas).await?;
    let uploads = Uploads::open(&runtime.js, &subjects, config.upload_ttl, replicas).await?;
    let store = Arc::new(Workspaces::new(
        &config,
        index,
        blobs,
        uploads,
        runtime.auditor.clone(),
        runtime.quotas.clone(),
    ));

    let options = EndpointOptions {
        max_payload: runtime.client.server_info().max_payload,
        max_in_flight: config.kit.max_in_flight,
    };
    let sync = Arc::new(ContainerSync::new(
        runtime.client.clone(),
        runtime.js.clone(),
        &subjects,
    ));
    macro_rules! serve {
        ($op:ident, |$s:ident, $by:pat, $r:ident| $call:expr) => {
            serve!(@ $op, operation(&store, |$s, $by, $r| async move { $call.await }))
        };
        // An agent's reads see what the session's running processes wrote, and its changes
        // land after what they wrote (a run after a change refetches the container's
        // workspace).
        ($op:ident, synced, |$s:ident, $by:pat, $r:ident| $call:expr) => {
            serve!(@ $op, synced_first(
                &sync,
                operation(&store, |$s, $by, $r| async move { $call.await }),
            ))
        };
        (@ $op:ident, $handler:expr) => {
            runtime
                .serve_with(
                    subjects.workspace(WorkspaceOp::$op),
                    options,
                    tenant_scoped($handler),
                )
                .await?;
        };
    }
    serve!(Init, |s, _, r| s.files.init(r));
    serve!(Write, synced, |s, by, r| s.files.write(&by, r));
    serve!(Read, synced, |s, by, r| s.files.read(&by, r));
    serve!(List, synced, |s, _, r| s.files.list(r));
    serve!(Stat, synced, |s, _, r| s.files.stat(r));
    serve!(Delete, synced, |s, by, r| s.files.delete(&by, r));
    serve!(Usage, |s, _, r| s.files.usage(r));
    serve!(Snapshot, |s, _, r| s.snapshots.snapshot(r));
    serve!(Fetch, |s, _, r| s.snapshots.fetch(r));
    serve!(Restore, |s, by, r| s.restores.restore(&by, r));
    serve!(Cleanup, |s, by, r| s.cleanup.cleanup(&by, r));
    serve!(Upload, |s, _, r| s.uploads.append(r));

    let actor_err = |e: ractor::SpawnErr| WorkspaceError::Actor(e.to_string());
    let (sweeper, mut sweeper_task) = Actor::spawn(
        None,
        Sweeper,
        SweeperArgs {
            store: store.clone(),
            interval: config.sweep_interval,
            holder: config.kit.instance_id.clone(),
        },
    )
    .await
    .map_err(actor_err)?;

    let metrics = store.metrics.clone();
    let capacity = config.kit.max_in_flight as u32;
    runtime
        .start_heartbeat(Arc::new(move || {
            let get = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed) as f64;
            kit::heartbeat::Load {
                capacity,
                load: metrics.in_flight.load(Ordering::Relaxed) as u32,
                metrics: [
                    ("workspace_writes_total", get(&metrics.writes)),
                    ("workspace_reads_total", get(&metrics.reads)),
                    ("workspace_bytes_written_total", get(&metrics.bytes_written)),
                    ("workspace_bytes_read_total", get(&metrics.bytes_read)),
                    ("workspace_snapshots_total", get(&metrics.snapshots)),
                    ("workspace_restores_total", get(&metrics.restores)),
                    (
                        "workspace_sessions_cleaned_total",
                        get(&metrics.sessions_cleaned),
                    ),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
                ..Default::default()
            }
        }))
        .await?;
    tracing::info!(instance = %config.kit.instance_id, "workspace-store serving");

    let outcome = tokio::select! {
        _ = shutdown.cancelled() => Ok(()),
        _ = &mut sweeper_task => Err(WorkspaceError::Actor("the sweeper stopped".into())),
    };
    runtime.shutdown().await;
    sweeper.stop(None);
    outcome
}
