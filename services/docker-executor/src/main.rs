//! `sandmesh-docker-executor`: the docker-executor as its own process.

use docker_executor::janitor::SERVICE_NAME;
use docker_executor::ExecutorConfig;
use kit::config::{exit_on_error, ProcessEnv};

#[tokio::main]
async fn main() {
    let config = exit_on_error(ExecutorConfig::from_env(&ProcessEnv));
    let _telemetry = kit::telemetry::init(
        SERVICE_NAME,
        config.kit.otlp_endpoint.as_deref(),
        config.kit.log_json,
    );
    let shutdown = kit::shutdown::on_signals();
    if let Err(e) = docker_executor::run(config, shutdown).await {
        tracing::error!(error = %e, "docker-executor failed");
        eprintln!("docker-executor: {e}");
        std::process::exit(1);
    }
}
