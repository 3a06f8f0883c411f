//! The long-running tasks of a binary (controllers, node tasks), each named, drained together.

use std::future::Future;

use tokio::task::JoinSet;

pub type TaskResult = (&'static str, anyhow::Result<()>);

#[derive(Default)]
pub struct Tasks {
    set: JoinSet<TaskResult>,
}

impl Tasks {
    pub fn spawn<F>(&mut self, name: &'static str, task: F)
    where
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        tracing::info!(task = name, "starting");
        self.set.spawn(async move { (name, task.await) });
    }

    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    /// Resolves when the first task ends (a task should only end on shutdown, so an early end
    /// is a failure the binary must not hide), with its name and result.
    pub async fn first_exit(&mut self) -> Option<TaskResult> {
        match self.set.join_next().await? {
            Ok(r) => Some(r),
            Err(e) => Some(("unknown", Err(anyhow::anyhow!("task panicked: {e}")))),
        }
    }

    /// Waits for every task, logging how each ended.
    pub async fn drain(mut self) {
        while let Some((name, res)) = self.first_exit().await {
            match res {
                Ok(()) => tracing::info!(task = name, "stopped"),
                Err(e) => tracing::error!(task = name, error = %format!("{e:#}"), "failed"),
            }
        }
    }
}
