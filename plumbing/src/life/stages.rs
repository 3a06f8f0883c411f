//! A process's life: its parts in stages, each with its own token, stopped and drained one
//! after another in the order given, each within the grace. The controller-manager's order is
//! the controllers, then the webhook (it answers until nothing can act any more), then the
//! leader election (the lease is released last).

use std::time::Duration;

use futures::future::{FutureExt, select_all};
use tokio_util::sync::CancellationToken;

use super::tasks::Tasks;

/// One stage: its tasks, and the token that stops them.
pub struct Stage {
    name: &'static str,
    token: CancellationToken,
    tasks: Tasks,
}

impl Stage {
    pub fn new(name: &'static str) -> Self {
        Self {
            name,
            token: CancellationToken::new(),
            tasks: Tasks::default(),
        }
    }

    /// The token this stage's tasks stop on: cancelled only when its turn to drain comes.
    pub fn token(&self) -> CancellationToken {
        self.token.clone()
    }

    pub fn tasks(&mut self) -> &mut Tasks {
        &mut self.tasks
    }

    /// Takes `tasks` (started elsewhere on this stage's token) as this stage's.
    pub fn with(mut self, tasks: Tasks) -> Self {
        self.tasks = tasks;
        self
    }
}

/// The stages of a process, in the order they drain.
pub struct Stages(Vec<Stage>);

impl Stages {
    pub fn new(stages: impl IntoIterator<Item = Stage>) -> Self {
        Self(stages.into_iter().collect())
    }

    /// Waits for `stop` (the shutdown signal). A task of any stage that ends before it is a
    /// failure the process must not hide by running on without it: returns it. The stop wins
    /// when both are ready.
    pub async fn until_stopped(
        &mut self,
        stop: impl std::future::Future<Output = ()>,
    ) -> Option<anyhow::Error> {
        let running: Vec<_> = self
            .0
            .iter_mut()
            .filter(|s| !s.tasks.is_empty())
            .map(|s| s.tasks.until_stopped(std::future::pending()).boxed())
            .collect();
        if running.is_empty() {
            stop.await;
            return None;
        }
        tokio::select! {
            biased;
            _ = stop => None,
            (failed, _, _) = select_all(running) => failed,
        }
    }

    /// Stops the stages one after another: cancels a stage's token, waits up to `grace` for its
    /// tasks, then goes on to the next, whether they drained or not.
    pub async fn drain(self, grace: Duration) {
        for stage in self.0 {
            stage.token.cancel();
            if tokio::time::timeout(grace, stage.tasks.drain())
                .await
                .is_err()
            {
                tracing::warn!(
                    stage = stage.name,
                    grace_seconds = grace.as_secs_f64(),
                    "did not drain in time; going on without it"
                );
            }
        }
    }
}
