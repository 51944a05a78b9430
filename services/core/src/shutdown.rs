//! Graceful shutdown: the first SIGTERM or SIGINT cancels the returned token, a second one
//! exits at once.

use tokio_util::sync::CancellationToken;

/// Returns a token cancelled on the first SIGTERM/SIGINT; the second signal exits the process
/// with status 130.
pub fn on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutting down; a second signal exits at once");
        cancel.cancel();
        wait_for_signal().await;
        tracing::warn!("second signal, exiting now");
        std::process::exit(130);
    });
    token
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            // Without signal handlers we can only wait for Ctrl-C.
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
