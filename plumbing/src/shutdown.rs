//! One cancellation token for every task: SIGTERM or SIGINT cancels it, every task drains, and
//! the process exits within a bounded time.

use std::time::Duration;
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

    pub fn is_triggered(&self) -> bool {
        self.token.is_cancelled()
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

    /// Waits for `task` but gives up after `grace` once shutdown was requested, so that a stuck
    /// API call can not keep the pod in Terminating until the kubelet's SIGKILL.
    pub async fn drain<F: std::future::Future>(
        &self,
        grace: Duration,
        task: F,
    ) -> Option<F::Output> {
        tokio::pin!(task);
        tokio::select! {
            out = &mut task => Some(out),
            _ = async { self.cancelled().await; tokio::time::sleep(grace).await } => {
                tracing::warn!(grace_seconds = grace.as_secs_f64(), "tasks did not drain in time; exiting anyway");
                None
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn drain_gives_up_after_grace() {
        let s = Shutdown::new();
        s.trigger();
        let out = s
            .drain(Duration::from_secs(5), std::future::pending::<()>())
            .await;
        assert!(out.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn drain_returns_finished_task() {
        let s = Shutdown::new();
        let out = s.drain(Duration::from_secs(5), async { 7 }).await;
        assert_eq!(out, Some(7));
    }
}
