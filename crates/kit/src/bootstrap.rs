//! Idempotent creation of the JetStream assets (`docs/architecture.md#jetstream-assets`). Whoever
//! needs an asset ensures it at start; creating one that exists is a no-op. Every asset gets
//! `replicas` copies (`SANDMESH_JS_REPLICAS`, [`crate::KitConfig::js_replicas`]): 3 on a three-node
//! cluster, so losing one server loses nothing. The calls retry through a cluster's leader
//! elections.

use std::future::Future;
use std::time::Duration;

use async_nats::jetstream::{self, context, kv, object_store, stream};
use messages::Subjects;

use crate::retry::{retry, RetryPolicy};
use crate::KitError;

fn js_err(what: &str, e: impl Into<crate::BoxError>) -> KitError {
    KitError::jetstream(what, e)
}

/// `SANDBOX_JOBS`: async exec requests, each consumed once (work-queue retention), deduplicated
/// on `Nats-Msg-Id` = execution id within `duplicate_window`.
pub async fn jobs_stream(
    js: &jetstream::Context,
    s: &Subjects,
    replicas: usize,
) -> Result<stream::Stream, KitError> {
    create_stream(
        js,
        stream::Config {
            num_replicas: replicas,
            name: s.jobs_stream(),
            subjects: vec![s.jobs_all()],
            retention: stream::RetentionPolicy::WorkQueue,
            duplicate_window: Duration::from_secs(600),
            max_age: Duration::from_secs(24 * 3600),
            storage: stream::StorageType::File,
            ..Default::default()
        },
    )
    .await
    .map_err(|e| js_err("creating the jobs stream", e))
}

/// `SANDBOX_RESULTS`: one result per execution id, readable by subject (direct get).
pub async fn results_stream(
    js: &jetstream::Context,
    s: &Subjects,
    replicas: usize,
) -> Result<stream::Stream, KitError> {
    create_stream(
        js,
        stream::Config {
            num_replicas: replicas,
            name: s.results_stream(),
            subjects: vec![s.results_all()],
            retention: stream::RetentionPolicy::Limits,
            max_messages_per_subject: 1,
            max_age: Duration::from_secs(7 * 24 * 3600),
            max_bytes: 1 << 30,
            allow_direct: true,
            duplicate_window: Duration::from_secs(600),
            storage: stream::StorageType::File,
            ..Default::default()
        },
    )
    .await
    .map_err(|e| js_err("creating the results stream", e))
}

/// `SANDBOX_AUDIT`: every audit event, kept by age and size.
pub async fn audit_stream(
    js: &jetstream::Context,
    s: &Subjects,
    replicas: usize,
) -> Result<stream::Stream, KitError> {
    create_stream(
        js,
        stream::Config {
            num_replicas: replicas,
            name: s.audit_stream(),
            subjects: vec![s.audit_all()],
            retention: stream::RetentionPolicy::Limits,
            max_age: Duration::from_secs(30 * 24 * 3600),
            max_bytes: 1 << 30,
            storage: stream::StorageType::File,
            ..Default::default()
        },
    )
    .await
    .map_err(|e| js_err("creating the audit stream", e))
}

async fn create_stream(
    js: &jetstream::Context,
    config: stream::Config,
) -> Result<stream::Stream, context::CreateStreamError> {
    let what = format!("creating stream {}", config.name);
    retry(&what, RetryPolicy::JETSTREAM, || {
        js.get_or_create_stream(config.clone())
    })
    .await
}

/// Opens KV bucket `config.bucket`, creating it (with `replicas` copies) when it does not
/// exist: for the kit's buckets and every service's own.
pub async fn ensure_bucket(
    js: &jetstream::Context,
    mut config: kv::Config,
    replicas: usize,
) -> Result<kv::Store, KitError> {
    config.num_replicas = replicas;
    let bucket = config.bucket.as_str();
    let store = open_or_create(
        &format!("KV bucket {bucket}"),
        || js.get_key_value(bucket),
        || js.create_key_value(config.clone()),
    )
    .await?;
    if let Some(ttl) = config.limit_markers {
        ensure_limit_markers(js, bucket, ttl).await?;
    }
    Ok(store)
}

/// A bucket made by an earlier version without limit markers (per-message TTLs and delete
/// markers) gets them: without, every purge with a TTL fails. JetStream lets a stream take
/// them on later (never give them up), so this is an update, not a rebuild.
async fn ensure_limit_markers(
    js: &jetstream::Context,
    bucket: &str,
    ttl: Duration,
) -> Result<(), KitError> {
    let what = format!("KV bucket {bucket}");
    let mut stream = js
        .get_stream(format!("KV_{bucket}"))
        .await
        .map_err(|e| KitError::nats(format!("looking up {what}"), e))?;
    let mut config = stream
        .info()
        .await
        .map_err(|e| KitError::nats(format!("reading {what}"), e))?
        .config
        .clone();
    if config.allow_message_ttl && config.subject_delete_marker_ttl.is_some() {
        return Ok(());
    }
    config.allow_message_ttl = true;
    config.subject_delete_marker_ttl = Some(ttl);
    js.update_stream(config)
        .await
        .map_err(|e| KitError::nats(format!("turning on limit markers of {what}"), e))?;
    tracing::info!(bucket, "limit markers turned on (the bucket predates them)");
    Ok(())
}

/// Opens object store `config.bucket`, creating it (with `replicas` copies) when missing.
pub async fn ensure_object_store(
    js: &jetstream::Context,
    mut config: object_store::Config,
    replicas: usize,
) -> Result<object_store::ObjectStore, KitError> {
    config.num_replicas = replicas;
    let bucket = config.bucket.as_str();
    open_or_create(
        &format!("object store {bucket}"),
        || js.get_object_store(bucket),
        || js.create_object_store(config.clone()),
    )
    .await
}

/// Opens the store `what` names with `get`, creating it with `create` when the look-up
/// fails, retried while JetStream is not ready. Another instance may create it between our
/// look-up and create, so a failed create looks again before it counts.
async fn open_or_create<T, GetErr, CreateErr, Get, GetFut, Create, CreateFut>(
    what: &str,
    get: Get,
    create: Create,
) -> Result<T, KitError>
where
    Get: Fn() -> GetFut,
    GetFut: Future<Output = Result<T, GetErr>>,
    Create: Fn() -> CreateFut,
    CreateFut: Future<Output = Result<T, CreateErr>>,
    CreateErr: std::error::Error + Send + Sync + 'static,
{
    let attempt = || async {
        match get().await {
            Ok(store) => Ok(store),
            Err(_) => match create().await {
                Ok(store) => Ok(store),
                Err(create_err) => get().await.map_err(|_| create_err),
            },
        }
    };
    retry(&format!("opening {what}"), RetryPolicy::JETSTREAM, attempt)
        .await
        .map_err(|e| js_err(&format!("creating {what}"), e))
}

/// `sandbox_nodes`: heartbeats with a per-key TTL; expired keys leave a purge marker that
/// watchers see (needs nats-server ≥ 2.11). Kept on disk, although every key is short-lived:
/// the bucket's creation time is the mesh's id ([`crate::mesh_id`]), which labels every
/// container, so the bucket must outlive a restart of the server. In memory it was made anew
/// by whichever service came first after a restart, and the containers of a node that died
/// before it carried an id no janitor of the mesh would judge any more.
pub async fn nodes_kv(
    js: &jetstream::Context,
    s: &Subjects,
    replicas: usize,
) -> Result<kv::Store, KitError> {
    ensure_bucket(
        js,
        kv::Config {
            bucket: s.nodes_bucket(),
            history: 1,
            limit_markers: Some(Duration::from_secs(60)),
            storage: stream::StorageType::File,
            ..Default::default()
        },
        replicas,
    )
    .await
}

/// `sandbox_sessions`: session → node, tier, container, state. Closed sessions' records are
/// purged after a retention time with a per-message TTL on the purge marker, so nothing stays
/// forever (needs nats-server ≥ 2.11).
pub async fn sessions_kv(
    js: &jetstream::Context,
    s: &Subjects,
    replicas: usize,
) -> Result<kv::Store, KitError> {
    ensure_bucket(
        js,
        kv::Config {
            bucket: s.sessions_bucket(),
            history: 1,
            limit_markers: Some(Duration::from_secs(60)),
            ..Default::default()
        },
        replicas,
    )
    .await
}

/// `sandbox_templates`: templates by name, kept until deleted.
pub async fn templates_kv(
    js: &jetstream::Context,
    s: &Subjects,
    replicas: usize,
) -> Result<kv::Store, KitError> {
    ensure_bucket(
        js,
        kv::Config {
            bucket: s.templates_bucket(),
            history: 1,
            ..Default::default()
        },
        replicas,
    )
    .await
}

/// `sandbox_confirmations`: pending and decided confirmations.
pub async fn confirmations_kv(
    js: &jetstream::Context,
    s: &Subjects,
    replicas: usize,
) -> Result<kv::Store, KitError> {
    ensure_bucket(
        js,
        kv::Config {
            bucket: s.confirmations_bucket(),
            history: 1,
            max_age: Duration::from_secs(7 * 24 * 3600),
            ..Default::default()
        },
        replicas,
    )
    .await
}
