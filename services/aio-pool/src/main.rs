//! `sandmesh-aio-pool`: the aio-pool as its own process.

use aio_pool::janitor::SERVICE_NAME;
use aio_pool::AioPoolConfig;
use kit::config::{exit_on_error, ProcessEnv};

#[tokio::main]
async fn main() {
    let config = exit_on_error(AioPoolConfig::from_env(&ProcessEnv));
    let _telemetry = kit::telemetry::init(
        SERVICE_NAME,
        config.kit.otlp_endpoint.as_deref(),
        config.kit.log_json,
    );
    let shutdown = kit::shutdown::on_signals();
    if let Err(e) = aio_pool::run(config, shutdown).await {
        tracing::error!(error = %e, "aio-pool failed");
        eprintln!("aio-pool: {}", aio_pool::error_chain(&e));
        std::process::exit(1);
    }
}
