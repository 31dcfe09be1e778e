//! confirmation: human-in-the-loop approval of risky work.
//!
//! Owns the `sandbox_confirmations` bucket — pending requests, decisions, session grants — and
//! the decision policy (`SANDMESH_CONFIRM_*`: auto-approve for development, auto-deny levels,
//! levels that need a person, timeouts that deny by default).
//!
//! Subjects (`Subjects::confirm(ConfirmOp::*)`, queue group shared by all instances):
//! - `sandbox.v1.confirm.request` `ConfirmRequest` → `Confirmation` (final with `wait`, else
//!   as stored; idempotent per `execution_id`)
//! - `sandbox.v1.confirm.decide` `ConfirmDecide` → `Confirmation` (409 if already decided)
//! - `sandbox.v1.confirm.get` `ConfirmGet` → `Confirmation`;
//!   `sandbox.v1.confirm.list` `ConfirmList` → `ConfirmListReply`
//! - events `sandbox.v1.confirm.pending.<id>` / `sandbox.v1.confirm.decided.<id>` (JSON
//!   `Confirmation`). `decided` is published for every final state — approved, denied, and
//!   timeout (also when nobody waits: every instance arms the expiry of every pending one) —
//!   so a caller that asked without `wait` can park and resume on it, or on `get`.
//! - audit `confirmation_requested` / `confirmation_decided`: this service is their only
//!   emitter, once per confirmation (`workflow.rs`).
//!
//! The bucket is the source of truth; decisions are compare-and-set, so two instances never
//! both decide, and a pending request survives restarts of this service and of NATS.
//!
//! ```text
//! run ── kit::Runtime ── endpoints request/decide/get/list ──► Root (actor, supervisor)
//!    │                                                          └─ Registry (linked; restarted
//!    │                                                             │  on death, state reloaded
//!    │                                                             │  from the bucket)
//!    │                                                             ├── watch task (feeds it)
//!    │                                                             └── TaskTracker: workflow
//!    │                                                                  steps, awaited on stop
//!    ├── kit HeartbeatActor (unlinked; pending, waiters)
//!    └── select!: shutdown, or the Root stopped (registry died too often) → run() fails
//! ```

pub mod audience;
pub mod config;
pub mod error;
pub mod listing;
pub mod policy;
pub mod registry;
pub mod root;
pub mod store;
pub mod validate;
pub mod watch;
pub mod workflow;

#[cfg(test)]
mod testing;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use kit::{actor_handler, CancellationToken, KitError, Runtime, ServiceInfo};
use messages::subjects::ConfirmOp;
use ractor::Actor;

pub use config::{ConfirmationConfig, PolicyConfig, TimeoutAction};
use registry::{Gauges, RegistryMsg};
use root::{Root, RootArgs};
use store::ConfirmationStore;
use workflow::KvWorkflow;

#[derive(Debug, thiserror::Error)]
pub enum ConfirmationError {
    #[error(transparent)]
    Kit(#[from] KitError),
    #[error("cannot start the confirmation actors")]
    Spawn(#[source] ractor::SpawnErr),
    /// The registry died more often than the root restarts it (the reason is in the log).
    #[error("the confirmation registry kept dying; this instance stopped")]
    RegistryLost,
}

pub const SERVICE_NAME: &str = messages::ServiceName::Confirmation.as_str();

/// Serves until `shutdown` fires, then answers every waiting request with a retryable 503
/// (their confirmations stay pending in the bucket) and stops gracefully. Fails when the
/// registry cannot be kept running.
pub async fn run(
    config: ConfirmationConfig,
    shutdown: CancellationToken,
) -> Result<(), ConfirmationError> {
    let info = ServiceInfo {
        name: SERVICE_NAME.into(),
        version: env!("CARGO_PKG_VERSION").into(),
        description: "human-in-the-loop approval of risky work".into(),
    };
    let mut runtime = Runtime::start(config.kit.clone(), info).await?;
    let subjects = runtime.subjects().clone();
    let kv =
        kit::bootstrap::confirmations_kv(&runtime.js, &subjects, config.kit.js_replicas).await?;
    let workflow = KvWorkflow {
        store: ConfirmationStore::new(kv),
        policy: Arc::new(policy::Policy::new(config.policy.clone())),
        client: runtime.client.clone(),
        subjects: subjects.clone(),
        auditor: runtime.auditor.clone(),
        scopes: Arc::new(config.operator_scopes.clone()),
        metrics: runtime.metrics.clone(),
    };
    let gauges = Arc::new(Gauges::default());
    let (root, mut root_task) = Actor::spawn(
        None,
        Root::default(),
        RootArgs {
            workflow,
            gauges: gauges.clone(),
            instance_id: config.kit.instance_id.clone(),
        },
    )
    .await
    .map_err(ConfirmationError::Spawn)?;

    let served = async {
        // (`as_named`: agents read their confirmations under the ids they chose.)
        runtime
            .serve(
                subjects.confirm(ConfirmOp::Request),
                as_named(actor_handler(root.clone(), RegistryMsg::Request)),
            )
            .await?;
        runtime
            .serve(
                subjects.confirm(ConfirmOp::Decide),
                as_named(actor_handler(root.clone(), RegistryMsg::Decide)),
            )
            .await?;
        runtime
            .serve(
                subjects.confirm(ConfirmOp::Get),
                as_named(actor_handler(root.clone(), RegistryMsg::Get)),
            )
            .await?;
        runtime
            .serve(
                subjects.confirm(ConfirmOp::List),
                as_named(actor_handler(root.clone(), RegistryMsg::List)),
            )
            .await?;
        let capacity = runtime.config.max_in_flight as u32;
        let probe_gauges = gauges.clone();
        runtime
            .start_heartbeat(Arc::new(move || {
                let pending = probe_gauges.pending.load(Ordering::Relaxed);
                let waiters = probe_gauges.waiters.load(Ordering::Relaxed);
                kit::heartbeat::Load {
                    capacity,
                    load: waiters as u32,
                    metrics: [
                        ("confirmations_pending".to_string(), pending as f64),
                        ("confirmation_waiters".to_string(), waiters as f64),
                    ]
                    .into(),
                    ..Default::default()
                }
            }))
            .await?;
        Ok::<(), KitError>(())
    }
    .await;
    if let Err(e) = served {
        root.stop(None);
        let _ = root_task.await;
        runtime.shutdown().await;
        return Err(e.into());
    }
    tracing::info!(instance = %runtime.config.instance_id, "confirmation service running");

    let outcome = tokio::select! {
        _ = shutdown.cancelled() => Ok(()),
        _ = &mut root_task => Err(ConfirmationError::RegistryLost),
    };
    tracing::info!("confirmation service stopping");
    if outcome.is_ok() {
        // Waiters first: shutdown waits for in-flight requests, and a waiter may wait for
        // minutes.
        let _ = ractor::call!(root, RegistryMsg::Drain);
    }
    runtime.shutdown().await;
    if outcome.is_ok() {
        root.stop(None);
        let _ = root_task.await;
    }
    outcome
}

/// Agents and operators read confirmations under the ids the agent chose (each record's ids
/// unscoped by its own tenant, which the record names); services get the stored form.
fn as_named<Req, Resp>(inner: kit::Handler<Req, Resp>) -> kit::Handler<Req, Resp>
where
    Req: Send + 'static,
    Resp: messages::confirm::Unscope + Send + 'static,
{
    kit::handler(move |ctx: kit::RequestContext, req: Req| {
        let inner = inner.clone();
        async move {
            let internal = ctx.caller == messages::tenancy::Caller::Internal;
            let reply = inner(ctx, req).await?;
            Ok(if internal { reply } else { reply.named() })
        }
    })
}
