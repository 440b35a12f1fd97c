//! How a server or an agent is asked to stop: SIGINT or SIGTERM.

/// Resolves when SIGINT or SIGTERM arrives.
pub async fn shutdown() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("signal handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
}
