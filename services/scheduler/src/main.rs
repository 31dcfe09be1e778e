//! `sandmesh-scheduler`: the scheduler as its own process.

use scheduler::SchedulerConfig;

#[tokio::main]
async fn main() {
    let config = kit::config::exit_on_error(SchedulerConfig::from_env(&kit::config::ProcessEnv));
    let _telemetry = kit::telemetry::init(
        scheduler::SERVICE_NAME,
        config.kit.otlp_endpoint.as_deref(),
        config.kit.log_json,
    );
    let shutdown = kit::shutdown::on_signals();
    if let Err(e) = scheduler::run(config, shutdown).await {
        tracing::error!(error = %e, "scheduler failed");
        eprintln!("scheduler: {e}");
        std::process::exit(1);
    }
}
