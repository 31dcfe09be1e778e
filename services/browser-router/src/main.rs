//! `sandmesh-browser-router`: the browser-router as its own process.

use browser_router::BrowserConfig;
use kit::config::{exit_on_error, ProcessEnv};

#[tokio::main]
async fn main() {
    let config = exit_on_error(BrowserConfig::from_env(&ProcessEnv));
    let _telemetry = kit::telemetry::init(
        "browser-router",
        config.kit.otlp_endpoint.as_deref(),
        config.kit.log_json,
    );
    let shutdown = kit::shutdown::on_signals();
    if let Err(e) = browser_router::run(config, shutdown).await {
        tracing::error!(error = %e, "browser-router failed");
        eprintln!("browser-router: {e}");
        std::process::exit(1);
    }
}
