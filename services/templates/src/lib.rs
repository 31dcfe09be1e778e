//! templates: the environments code runs in, as data. Owns the `sandbox_templates` bucket (one
//! [`TemplateRecord`] per name, JSON) and puts the built-in templates there at start when they are
//! absent (an operator may change them; a deleted one comes back at the next start).
//!
//! Subjects (`Subjects::templates(TemplateOp::*)`, queue group shared by all instances):
//! - `sandbox.v1.templates.get` `TemplateRef` → `TemplateRecord` (404 for an unknown name)
//! - `sandbox.v1.templates.list` `TemplateList` → `TemplateListReply` (sorted by name)
//! - `sandbox.v1.templates.create` `Template` → `TemplateRecord` (409 when it exists)
//! - `sandbox.v1.templates.update` `Template` → `TemplateRecord` (404 when it does not)
//! - `sandbox.v1.templates.delete` `TemplateRef` → the deleted `TemplateRecord`
//!
//! Agents read, operators and the deployment's own users write: the writes check the
//! server-stamped caller (403 for an agent) besides the agents' NATS permissions, which do
//! not let them publish there at all. Building a template's image is not this service's: an
//! executor builds it where it runs (`containers::template`), on first use or ahead with
//! `sandmesh template build`.
//!
//! ```text
//! run ── kit::Runtime ── endpoints get/list/create/update/delete ──► Catalog (actor: the
//!    │                                                                bucket, writes in order)
//!    ├── kit HeartbeatActor (unlinked)
//!    └── select!: shutdown, or the Catalog stopped → run() fails
//! ```

pub mod catalog;
pub mod config;

use std::sync::Arc;

use kit::{actor_handler, CancellationToken, KitError, Runtime, ServiceInfo};
use messages::subjects::TemplateOp;
use ractor::Actor;

use catalog::{Catalog, CatalogMsg};
pub use config::TemplatesConfig;

pub const SERVICE_NAME: &str = messages::ServiceName::Templates.as_str();

#[derive(Debug, thiserror::Error)]
pub enum TemplatesError {
    #[error(transparent)]
    Kit(#[from] KitError),
    #[error("cannot start the catalog actor")]
    Spawn(#[source] ractor::SpawnErr),
    #[error("the catalog actor stopped; this instance stopped")]
    CatalogLost,
}

/// Serves until `shutdown` fires; fails when the catalog cannot start or dies.
pub async fn run(
    config: TemplatesConfig,
    shutdown: CancellationToken,
) -> Result<(), TemplatesError> {
    let info = ServiceInfo {
        name: SERVICE_NAME.into(),
        version: env!("CARGO_PKG_VERSION").into(),
        description: "templates: the environments code runs in".into(),
    };
    let mut runtime = Runtime::start(config.kit.clone(), info).await?;
    let subjects = runtime.subjects().clone();
    let kv = kit::bootstrap::templates_kv(&runtime.js, &subjects, config.kit.js_replicas).await?;
    let (catalog, mut catalog_task) = Actor::spawn(None, Catalog, kv)
        .await
        .map_err(TemplatesError::Spawn)?;
    let served = async {
        let at = |op| subjects.templates(op);
        runtime
            .serve(
                at(TemplateOp::Get),
                actor_handler(catalog.clone(), CatalogMsg::Get),
            )
            .await?;
        runtime
            .serve(
                at(TemplateOp::List),
                actor_handler(catalog.clone(), CatalogMsg::List),
            )
            .await?;
        runtime
            .serve(
                at(TemplateOp::Create),
                actor_handler(catalog.clone(), CatalogMsg::Create),
            )
            .await?;
        runtime
            .serve(
                at(TemplateOp::Update),
                actor_handler(catalog.clone(), CatalogMsg::Update),
            )
            .await?;
        runtime
            .serve(
                at(TemplateOp::Delete),
                actor_handler(catalog.clone(), CatalogMsg::Delete),
            )
            .await?;
        let capacity = runtime.config.max_in_flight as u32;
        runtime
            .start_heartbeat(Arc::new(move || kit::heartbeat::Load {
                capacity,
                ..Default::default()
            }))
            .await?;
        Ok::<(), KitError>(())
    }
    .await;
    if let Err(e) = served {
        catalog.stop(None);
        let _ = catalog_task.await;
        runtime.shutdown().await;
        return Err(e.into());
    }
    tracing::info!(instance = %runtime.config.instance_id, "templates service running");
    let outcome = tokio::select! {
        _ = shutdown.cancelled() => Ok(()),
        _ = &mut catalog_task => Err(TemplatesError::CatalogLost),
    };
    tracing::info!("templates service stopping");
    runtime.shutdown().await;
    if outcome.is_ok() {
        catalog.stop(None);
        let _ = catalog_task.await;
    }
    outcome
}
