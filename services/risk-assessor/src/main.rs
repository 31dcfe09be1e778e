//! `sandmesh-risk-assessor`: the risk-assessor as its own process.

use kit::config::{exit_on_error, ProcessEnv};
use risk_assessor::RiskAssessorConfig;

#[tokio::main]
async fn main() {
    let config = exit_on_error(RiskAssessorConfig::from_env(&ProcessEnv));
    let _telemetry = kit::telemetry::init(
        risk_assessor::SERVICE_NAME,
        config.kit.otlp_endpoint.as_deref(),
        config.kit.log_json,
    );
    let shutdown = kit::shutdown::on_signals();
    if let Err(e) = risk_assessor::run(config, shutdown).await {
        tracing::error!(error = %e, "risk-assessor failed");
        eprintln!("risk-assessor: {e}");
        std::process::exit(1);
    }
}
