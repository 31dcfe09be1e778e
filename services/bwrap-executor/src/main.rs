//! `sandmesh-bwrap-executor`: the bwrap-executor as its own process.

use bwrap_executor::{BwrapConfig, SERVICE_NAME};
use kit::config::{exit_on_error, ProcessEnv};

#[tokio::main]
async fn main() {
    let config = exit_on_error(BwrapConfig::from_env(&ProcessEnv));
    let _telemetry = kit::telemetry::init(
        SERVICE_NAME,
        config.node.kit.otlp_endpoint.as_deref(),
        config.node.kit.log_json,
    );
    let shutdown = kit::shutdown::on_signals();
    if let Err(e) = bwrap_executor::run(config, shutdown).await {
        tracing::error!(error = %e, "bwrap-executor failed");
        eprintln!("bwrap-executor: {}", kit::error_chain(&e));
        std::process::exit(1);
    }
}
