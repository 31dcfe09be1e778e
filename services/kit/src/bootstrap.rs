//! Idempotent creation of the JetStream assets of DESIGN.md §2. Whoever needs an asset ensures
//! it at start; creating one that exists is a no-op.

use std::time::Duration;

use async_nats::jetstream::{self, kv, stream};
use messages::Subjects;

use crate::KitError;

fn js_err(what: &str, e: impl Into<crate::BoxError>) -> KitError {
    KitError::jetstream(what, e)
}

/// `SANDBOX_JOBS`: async exec requests, each consumed once (work-queue retention), deduplicated
/// on `Nats-Msg-Id` = execution id within `duplicate_window`.
pub async fn jobs_stream(
    js: &jetstream::Context,
    s: &Subjects,
) -> Result<stream::Stream, KitError> {
    js.get_or_create_stream(stream::Config {
        name: s.jobs_stream(),
        subjects: vec![s.jobs_all()],
        retention: stream::RetentionPolicy::WorkQueue,
        duplicate_window: Duration::from_secs(600),
        max_age: Duration::from_secs(24 * 3600),
        storage: stream::StorageType::File,
        ..Default::default()
    })
    .await
    .map_err(|e| js_err("creating the jobs stream", e))
}

/// `SANDBOX_RESULTS`: one result per execution id, readable by subject (direct get).
pub async fn results_stream(
    js: &jetstream::Context,
    s: &Subjects,
) -> Result<stream::Stream, KitError> {
    js.get_or_create_stream(stream::Config {
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
    })
    .await
    .map_err(|e| js_err("creating the results stream", e))
}

/// `SANDBOX_AUDIT`: every audit event, kept by age and size.
pub async fn audit_stream(
    js: &jetstream::Context,
    s: &Subjects,
) -> Result<stream::Stream, KitError> {
    js.get_or_create_stream(stream::Config {
        name: s.audit_stream(),
        subjects: vec![s.audit_all()],
        retention: stream::RetentionPolicy::Limits,
        max_age: Duration::from_secs(30 * 24 * 3600),
        max_bytes: 1 << 30,
        storage: stream::StorageType::File,
        ..Default::default()
    })
    .await
    .map_err(|e| js_err("creating the audit stream", e))
}

async fn bucket(js: &jetstream::Context, config: kv::Config) -> Result<kv::Store, KitError> {
    let name = config.bucket.clone();
    match js.get_key_value(&name).await {
        Ok(store) => Ok(store),
        Err(_) => match js.create_key_value(config).await {
            Ok(store) => Ok(store),
            // Another instance created it between our look-up and create.
            Err(create_err) => js
                .get_key_value(&name)
                .await
                .map_err(|_| js_err(&format!("creating KV bucket {name}"), create_err)),
        },
    }
}

/// `sandbox_nodes`: heartbeats with a per-key TTL; expired keys leave a purge marker that
/// watchers see (needs nats-server ≥ 2.11).
pub async fn nodes_kv(js: &jetstream::Context, s: &Subjects) -> Result<kv::Store, KitError> {
    bucket(
        js,
        kv::Config {
            bucket: s.nodes_bucket(),
            history: 1,
            limit_markers: Some(Duration::from_secs(60)),
            storage: stream::StorageType::Memory,
            ..Default::default()
        },
    )
    .await
}

/// `sandbox_sessions`: session → node, tier, container, state.
pub async fn sessions_kv(js: &jetstream::Context, s: &Subjects) -> Result<kv::Store, KitError> {
    bucket(
        js,
        kv::Config {
            bucket: s.sessions_bucket(),
            history: 1,
            ..Default::default()
        },
    )
    .await
}

/// `sandbox_confirmations`: pending and decided confirmations.
pub async fn confirmations_kv(
    js: &jetstream::Context,
    s: &Subjects,
) -> Result<kv::Store, KitError> {
    bucket(
        js,
        kv::Config {
            bucket: s.confirmations_bucket(),
            history: 1,
            max_age: Duration::from_secs(7 * 24 * 3600),
            ..Default::default()
        },
    )
    .await
}
