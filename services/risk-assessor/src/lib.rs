//! risk-assessor: static, ADVISORY risk of Python, JavaScript and shell code and of browser
//! actions, under the strict or the permissive `SecurityMode`.
//! Isolation is the boundary; this only picks the tier and whether a person confirms.
//!
//! Owns the risk policy: rules as data (`policy/default.toml`, embedded, reproduces the seeds;
//! `SANDMESH_RISK_POLICY` overlays it), applied to real tree-sitter parses of the code so that
//! findings carry lines and byte spans, imports and aliases are resolved structurally, and a
//! shell script is judged pipeline by pipeline. Code that does not parse is never SAFE.
//!
//! Subject: `sandbox.v1.risk.assess` (`Subjects::risk_assess`) `AssessRequest` →
//! `RiskAssessment`, stateless, queue group shared by any number of instances.
//!
//! ```text
//! run ── kit::Runtime ── endpoint risk.assess ── task per request ──► AssessService
//!    │                                              (blocking pool, one permit per core)
//!    │                                                   └── Assessor (pure: policy + limits)
//!    └── HeartbeatActor (in-flight assessments)
//! ```
//! [`assess`] and [`Assessor`] are the same logic in-process (the scheduler's embedded mode).

mod assess;
mod browser;
mod code;
pub mod config;
mod files;
mod glob;
mod hits;
mod javascript;
pub mod policy;
mod python;
pub mod service;
mod shell;
mod syntax;

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use kit::{CancellationToken, EndpointOptions, KitError, Runtime, ServiceInfo};
use messages::risk::{AssessRequest, RiskAssessment};

pub use assess::{AssessError, Assessor, Limits};
pub use config::RiskAssessorConfig;
pub use policy::{Policy, PolicyError, DEFAULT_POLICY};
pub use service::{AssessService, WireAssessRequest};

pub const SERVICE_NAME: &str = messages::ServiceName::RiskAssessor.as_str();

#[derive(Debug, thiserror::Error)]
pub enum RiskAssessorError {
    #[error(transparent)]
    Kit(#[from] KitError),
}

/// Assesses with the default policy, default limits and strict mode (unless the request names
/// a mode). For callers in the same process; the service uses a configured [`Assessor`].
pub fn assess(request: &AssessRequest) -> Result<RiskAssessment, AssessError> {
    static DEFAULT: OnceLock<Assessor> = OnceLock::new();
    DEFAULT
        .get_or_init(|| {
            Assessor::new(
                Policy::default_policy(),
                Limits::default(),
                messages::risk::SecurityMode::Strict,
            )
        })
        .assess(request)
}

/// Serves `sandbox.v1.risk.assess` until `shutdown` fires, then stops gracefully.
pub async fn run(
    config: RiskAssessorConfig,
    shutdown: CancellationToken,
) -> Result<(), RiskAssessorError> {
    let info = ServiceInfo {
        name: SERVICE_NAME.into(),
        version: env!("CARGO_PKG_VERSION").into(),
        description: "static, advisory risk assessment of code and browser actions".into(),
    };
    let assessor = Arc::new(Assessor::new(config.policy, config.limits, config.mode));
    let mut runtime = Runtime::start(config.kit.clone(), info).await?;
    let service = Arc::new(AssessService::new(assessor, runtime.metrics.clone()));
    let subject = runtime.subjects().risk_assess();
    // JSON may escape each byte of content into six (`\u0000`), so the payload bound is wider
    // than the content ceiling; the handler enforces the ceiling itself (413).
    let options = EndpointOptions {
        max_payload: (config.limits.max_content_bytes * 6 + 64 * 1024).max(1024 * 1024),
        max_in_flight: runtime.config.max_in_flight,
    };
    let handler_service = service.clone();
    let served = async {
        runtime
            .serve_with(
                subject,
                options,
                kit::handler(move |_ctx, wire: WireAssessRequest| {
                    handler_service.clone().handle(wire)
                }),
            )
            .await?;
        let capacity = runtime.config.max_in_flight as u32;
        let probe = service.clone();
        runtime
            .start_heartbeat(Arc::new(move || kit::heartbeat::Load {
                capacity,
                load: probe.in_flight.load(Ordering::Relaxed) as u32,
                metrics: [(
                    "risk_assessments_total".to_string(),
                    probe.total.load(Ordering::Relaxed) as f64,
                )]
                .into(),
                ..Default::default()
            }))
            .await?;
        Ok::<(), KitError>(())
    }
    .await;
    if let Err(e) = served {
        runtime.shutdown().await;
        return Err(e.into());
    }
    tracing::info!(instance = %runtime.config.instance_id, mode = ?config.mode, "risk-assessor running");
    shutdown.cancelled().await;
    tracing::info!("risk-assessor stopping");
    runtime.shutdown().await;
    Ok(())
}
