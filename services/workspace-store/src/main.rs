//! `sandmesh-workspace-store`: the workspace store as its own process.

use workspace_store::WorkspaceConfig;

#[tokio::main]
async fn main() {
    let config = kit::config::exit_on_error(WorkspaceConfig::from_env(&kit::config::ProcessEnv));
    let _telemetry = kit::telemetry::init(
        workspace_store::SERVICE_NAME,
        config.kit.otlp_endpoint.as_deref(),
        config.kit.log_json,
    );
    let shutdown = kit::shutdown::on_signals();
    if let Err(e) = workspace_store::run(config, shutdown).await {
        tracing::error!(error = %e, "workspace-store failed");
        eprintln!("workspace-store: {e}");
        std::process::exit(1);
    }
}
