//! `sandmesh-console`: the operators' web page as its own process.

use console::ConsoleConfig;
use kit::config::{exit_on_error, ProcessEnv};

#[tokio::main]
async fn main() {
    let config = exit_on_error(ConsoleConfig::from_env(&ProcessEnv));
    let _telemetry = kit::telemetry::init(
        console::SERVICE_NAME,
        config.kit.otlp_endpoint.as_deref(),
        config.kit.log_json,
    );
    let shutdown = kit::shutdown::on_signals();
    if let Err(e) = console::run(config, shutdown).await {
        eprintln!("console: {}", kit::error_chain(&e));
        std::process::exit(1);
    }
}
