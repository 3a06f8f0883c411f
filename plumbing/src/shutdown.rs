//! The process's shutdown signal: SIGTERM or SIGINT cancels its token; the stages then drain
//! in order, each within the grace (`life::stages`).

use tokio_util::sync::CancellationToken;

#[derive(Clone, Default)]
pub struct Shutdown {
    token: CancellationToken,
}

impl Shutdown {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn token(&self) -> CancellationToken {
        self.token.clone()
    }

    pub fn trigger(&self) {
        self.token.cancel();
    }

    pub async fn cancelled(&self) {
        self.token.cancelled().await
    }

    /// Cancels the token on the first SIGTERM or SIGINT.
    pub fn cancel_on_signals(&self) {
        let token = self.token.clone();
        tokio::spawn(async move {
            let signal = wait_for_signal().await;
            tracing::info!(signal, "shutdown requested; draining");
            token.cancel();
        });
    }
}

#[cfg(unix)]
async fn wait_for_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("install SIGINT handler");
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}
