//! `sandmesh-gateway`: the HTTP API as its own process.

use gateway::GatewayConfig;
use kit::config::{exit_on_error, ProcessEnv};

#[tokio::main]
async fn main() {
    let config = exit_on_error(GatewayConfig::from_env(&ProcessEnv));
    let _telemetry = kit::telemetry::init(
        gateway::SERVICE_NAME,
        config.kit.otlp_endpoint.as_deref(),
        config.kit.log_json,
    );
    let shutdown = kit::shutdown::on_signals();
    if let Err(e) = gateway::run(config, shutdown).await {
        eprintln!("gateway: {}", kit::error_chain(&e));
        std::process::exit(1);
    }
}
