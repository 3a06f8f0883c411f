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

    /// The binary's parts that `selection` chose (`--controllers`, `--tasks`), each started
    /// under its selection name; says so when the selection left nothing to run (the process
    /// still serves its endpoints, and a manager still holds its lease).
    pub fn start_selected(
        selection: &crate::cli::Selection,
        parts: Vec<(
            &'static str,
            futures::future::BoxFuture<'static, anyhow::Result<()>>,
        )>,
        nothing: &str,
    ) -> Self {
        let mut set = Self::default();
        for (name, part) in parts {
            if selection.has(name) {
                set.spawn(name, part);
            }
        }
        if set.is_empty() {
            tracing::warn!("{nothing}");
        }
        set
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

    /// Waits for `stop`. A task that ends before it (with an error, or even Ok: tasks run until
    /// shutdown) is a failure the process must not hide by running on without it: returns it.
    pub async fn until_stopped<F: Future<Output = ()>>(
        &mut self,
        stop: F,
    ) -> Option<anyhow::Error> {
        tokio::pin!(stop);
        if self.is_empty() {
            stop.await;
            return None;
        }
        tokio::select! {
            // A stop also ends tasks (their tokens are children of the same one): when both are
            // ready, the stop is the reason, not a task that "stopped on its own".
            biased;
            _ = &mut stop => None,
            Some((name, res)) = self.first_exit() => Some(match res {
                Ok(()) => anyhow::anyhow!("{name} stopped on its own"),
                Err(e) => e.context(format!("{name} failed")),
            }),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_failing_task_is_reported_before_stop() {
        let mut t = Tasks::default();
        t.spawn("ok-forever", std::future::pending());
        t.spawn("broken", async { anyhow::bail!("no netlink socket") });
        let e = t.until_stopped(std::future::pending()).await.unwrap();
        let msg = format!("{e:#}");
        assert!(
            msg.contains("broken failed") && msg.contains("no netlink socket"),
            "{msg}"
        );
    }

    #[tokio::test]
    async fn a_task_ended_by_the_stop_is_not_a_failure() {
        let token = tokio_util::sync::CancellationToken::new();
        let mut t = Tasks::default();
        let child = token.child_token();
        t.spawn("drains-on-stop", async move {
            child.cancelled().await;
            Ok(())
        });
        token.cancel();
        tokio::task::yield_now().await;
        assert!(t.until_stopped(token.cancelled()).await.is_none());
    }

    #[tokio::test]
    async fn stop_wins_when_tasks_run() {
        let mut t = Tasks::default();
        t.spawn("ok-forever", std::future::pending());
        assert!(t.until_stopped(async {}).await.is_none());
        let mut empty = Tasks::default();
        assert!(empty.until_stopped(async {}).await.is_none());
    }
}
