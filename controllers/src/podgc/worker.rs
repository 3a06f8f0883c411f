//! PodGC's worker: a cycle every `--pod-gc-period` while the caches may be acted on, and one
//! as soon as they are current again when they were not.

use std::time::{Duration, Instant};

use groundskeeper_plumbing::watch::cache::{Health, Shared};
use tokio_util::sync::CancellationToken;

use super::cache::Caches;
use super::cycle::Cycle;
use super::metrics::Metrics;

/// How soon a cycle skipped on stale caches is tried again.
const STALE_RECHECK: Duration = Duration::from_secs(1);

pub struct Worker {
    pub cycle: Cycle,
    pub caches: Shared<Caches>,
    pub health: Health,
    pub metrics: Metrics,
    pub period: Duration,
    pub token: CancellationToken,
}

impl Worker {
    /// Cycles until the token is cancelled.
    pub async fn run(mut self) {
        loop {
            let wait = self.next().await;
            // Sliding period: measured from the end of this cycle, as wait.UntilWithContext does.
            tokio::select! {
                _ = self.token.cancelled() => break,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// One cycle, or its skip: how long until the next.
    async fn next(&mut self) -> Duration {
        // Every pass deletes on what the caches say (a pod count over the threshold, a node's
        // out-of-service taint, a namespace's opt-out): not while a watch is failing or
        // relisting and they may be stale, nor once one does mid-cycle (the stamp, checked
        // before each deletion starts).
        let seen = self.health.seen();
        if self.health.may_act(&seen).is_err() {
            tracing::warn!(unhealthy_watches = %groundskeeper_plumbing::logging::telemetry::joined(self.health.unhealthy()), "podgc cycle skipped: the pod, node or namespace cache may be stale; nothing deleted");
            // The skipped cycle runs as soon as the caches are current, not a period later.
            return STALE_RECHECK.min(self.period);
        }
        self.cycle.applier.seen = seen;
        let started = Instant::now();
        let summary = self.cycle.run(&self.caches).await;
        let seconds = started.elapsed().as_secs_f64();
        self.metrics.cycle_seconds.observe(seconds);
        summary.log(self.cycle.quarantine.len(), seconds);
        // The snapshot and the list pages since the last cycle are freed by now.
        groundskeeper_plumbing::process::release_free_memory();
        self.period
    }
}
