//! `sandmesh-confirmation`: the confirmation service as its own process.

use confirmation::ConfirmationConfig;
use kit::config::{exit_on_error, ProcessEnv};

#[tokio::main]
async fn main() {
    let config = exit_on_error(ConfirmationConfig::from_env(&ProcessEnv));
    let _telemetry = kit::telemetry::init(
        confirmation::SERVICE_NAME,
        config.kit.otlp_endpoint.as_deref(),
        config.kit.log_json,
    );
    let shutdown = kit::shutdown::on_signals();
    if let Err(e) = confirmation::run(config, shutdown).await {
        eprintln!("confirmation: {e}");
        std::process::exit(1);
    }
}
