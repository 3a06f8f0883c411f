//! Conntrack's worker: the loop that drives the [`Scheduler`] on the model's changes and its
//! wakes, and runs the rounds it says are due.

use std::future::Future;

use prometheus::IntCounterVec;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::model::source::Models;
use super::schedule::{Due, Rounds, Scheduler};

/// Drives `scheduler` until `stop` completes (the shutdown token): waits for a change or the next wake, runs the
/// rounds that are due, and reports skipped ones (a warning naming the unhealthy watches, and
/// `skipped{reason}`).
pub async fn run(
    mut scheduler: Scheduler,
    models: &impl Models,
    rounds: &mut impl Rounds,
    changed: &Notify,
    stop: impl Future<Output = ()>,
    skipped: &IntCounterVec,
) {
    let mut stop = std::pin::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = changed.notified() => {
                scheduler.on_change(Instant::now());
                continue;
            }
            _ = tokio::time::sleep_until(scheduler.next_wake()) => {}
        }
        match scheduler.on_wake(Instant::now(), models) {
            Due::Nothing => {}
            Due::Skipped { skip, periodic } => {
                skipped.with_label_values(&[skip.label()]).inc();
                let stale = models.unhealthy();
                tracing::warn!(reason = skip.label(), periodic, unhealthy_watches = %groundskeeper_plumbing::logging::telemetry::joined(&stale), "conntrack pass skipped: the Service/EndpointSlice model may be stale; nothing deleted");
            }
            Due::Round {
                model,
                focus,
                periodic,
                since,
            } => {
                let full = focus.is_none();
                let summary = rounds
                    .round(model, focus.map(|f| *f), since.map(|c| *c))
                    .await;
                scheduler.on_round(Instant::now(), periodic, full, &summary);
                tracing::debug!(periodic, full, next_periodic_in = ?scheduler.interval(), "conntrack round done");
            }
        }
    }
}
