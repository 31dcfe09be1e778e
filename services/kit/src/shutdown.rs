//! One cancellation token for a whole process, fired by SIGINT or SIGTERM.

use tokio_util::sync::CancellationToken;

/// Fires on the first SIGINT or SIGTERM. Clone the token into everything that must stop.
pub fn on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let fired = token.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown signal received");
        fired.cancel();
    });
    token
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops this process");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
