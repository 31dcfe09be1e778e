//! One cancellation token for a whole process, fired by SIGINT or SIGTERM, and the bound on
//! every NATS call made while stopping.

use std::future::Future;
use std::time::Duration;

use async_nats::connection::State;
use async_nats::Client;
use tokio_util::sync::CancellationToken;

/// How long one NATS call on the shutdown path may take. With the server gone, a flush, an
/// unsubscribe or a KV delete waits for a reconnect that may never come; a stopping process
/// gives up on it instead.
pub const NATS_STEP_LIMIT: Duration = Duration::from_secs(2);

/// Runs one NATS step of a shutdown for at most [`NATS_STEP_LIMIT`]; `None` (logged) when it
/// gave up. A client that is not connected skips the step at once: the steps of a stop add
/// up, and each would only wait for its limit.
pub async fn bounded<F: Future>(client: &Client, step: &str, call: F) -> Option<F::Output> {
    if client.connection_state() != State::Connected {
        // The disconnect itself was logged already; one line per skipped step is noise.
        tracing::debug!(step, "NATS is not connected; step skipped");
        return None;
    }
    match tokio::time::timeout(NATS_STEP_LIMIT, call).await {
        Ok(out) => Some(out),
        Err(_) => {
            tracing::warn!(step, limit = ?NATS_STEP_LIMIT, "NATS did not answer; step skipped");
            None
        }
    }
}

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
