//! `sandmesh-templates`: the templates service as its own process.

use kit::config::{exit_on_error, ProcessEnv};
use templates::TemplatesConfig;

#[tokio::main]
async fn main() {
    let config = exit_on_error(TemplatesConfig::from_env(&ProcessEnv));
    let _telemetry = kit::telemetry::init(
        templates::SERVICE_NAME,
        config.kit.otlp_endpoint.as_deref(),
        config.kit.log_json,
    );
    let shutdown = kit::shutdown::on_signals();
    if let Err(e) = templates::run(config, shutdown).await {
        eprintln!("templates: {e}");
        std::process::exit(1);
    }
}
