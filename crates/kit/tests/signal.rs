//! SIGTERM fires the shutdown token (own test binary: the handler is process-wide).

use std::time::Duration;

#[tokio::test]
async fn sigterm_cancels_the_shutdown_token() {
    let token = kit::shutdown::on_signals();
    // Let the listener task register its handlers before the signal arrives.
    tokio::task::yield_now().await;
    let registered = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let status = std::process::Command::new("kill")
                .args(["-TERM", &std::process::id().to_string()])
                .status()
                .unwrap();
            assert!(status.success());
            if tokio::time::timeout(Duration::from_millis(200), token.cancelled())
                .await
                .is_ok()
            {
                return;
            }
        }
    })
    .await;
    assert!(registered.is_ok(), "SIGTERM did not cancel the token");
}
