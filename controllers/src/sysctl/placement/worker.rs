//! The placement's worker: a gated pod's key off the queue, judged on the cache against every
//! known node, and the placement (or the hold) written.

use std::time::Duration;

use groundskeeper_plumbing::ObjectKey;
use groundskeeper_plumbing::life::component::Work;
use groundskeeper_plumbing::watch::cache::{Health, Shared};
use groundskeeper_sysctl_rules::args::PolicyArgs;
use groundskeeper_sysctl_rules::crd::SysctlPolicy;

use super::LOG_TARGET;
use super::apply::{Apply, Writes};
use super::decide::{Placement, place, same_hold};
use super::metrics::Metrics;
use crate::sysctl::cache::SysctlCache;
use crate::sysctl::facts::NodeFacts;
use crate::workqueue::WorkQueue;

/// How soon a pod is tried again while the watches may not be acted on.
const UNHEALTHY_RETRY: Duration = Duration::from_secs(1);

/// One evaluation of a gated pod: the cache read, the decision, the write.
pub struct Worker<W> {
    pub policy: PolicyArgs,
    pub cache: Shared<SysctlCache>,
    pub health: Health,
    pub queue: WorkQueue<ObjectKey>,
    pub apply: Apply<W>,
    pub metrics: Metrics,
}

/// What an evaluation did, for the metrics and the queue.
#[derive(Debug, PartialEq, Eq)]
pub enum Done {
    /// Nothing to do (gone, already ungated, or held for the same reason as before).
    Nothing,
    Placed,
    Anywhere,
    Held,
    DryRun,
    /// The watches may not be acted on now: try again shortly.
    NotNow,
}

impl<W: Writes> Worker<W> {
    /// Takes one key from the queue; false once the queue is shut down.
    pub async fn process_next(&self) -> bool {
        let Some(key) = self.queue.get().await else {
            return false;
        };
        let result = match self.evaluate(&key).await {
            Ok(Done::NotNow) => {
                self.queue.add_after(key.clone(), UNHEALTHY_RETRY);
                None
            }
            Ok(done) => {
                self.queue.forget(&key);
                match done {
                    Done::Placed => Some("placed"),
                    Done::Anywhere => Some("anywhere"),
                    Done::Held => Some("held"),
                    Done::DryRun => Some("dry_run"),
                    Done::Nothing | Done::NotNow => None,
                }
            }
            // Changed or gone since the read: the watch brings what is there now.
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {
                self.queue.forget(&key);
                Some("conflict")
            }
            Err(e) => {
                tracing::warn!(target: LOG_TARGET, pod = %key, error = %e, "placing the pod failed; retrying with backoff");
                self.queue.add_rate_limited(key.clone());
                Some("error")
            }
        };
        if let Some(r) = result {
            self.metrics.placements.with_label_values(&[r]).inc();
        }
        self.queue.done(&key);
        true
    }

    /// Judges pod `key` on the cache and writes what follows.
    pub async fn evaluate(&self, key: &ObjectKey) -> Result<Done, kube::Error> {
        // Before the read: what is decided on it is only as current as the watches are now.
        let seen = self.health.seen();
        let name = key.to_string();
        let (pod, placement) = {
            let c = self.cache.lock();
            let Some(pod) = c.gated.get(key).cloned() else {
                return Ok(Done::Nothing);
            };
            let refs: Vec<&SysctlPolicy> = c.policies.values().collect();
            let nodes: Vec<(&str, &NodeFacts)> =
                c.nodes.iter().map(|(n, f)| (n.as_str(), f)).collect();
            let placement = place(
                &self.policy,
                &name,
                &pod.facts,
                pod.sysctl_names(),
                &pod.own,
                &nodes,
                &refs,
            );
            (pod, placement)
        };
        if self.health.may_act(&seen).is_err() {
            return Ok(Done::NotNow);
        }
        let dry = |done| {
            if self.apply.dry_run() {
                Done::DryRun
            } else {
                done
            }
        };
        match placement {
            Placement::Anywhere => {
                self.apply
                    .place(key, &pod, None, "every known node admits its sysctls")
                    .await?;
                Ok(dry(Done::Anywhere))
            }
            Placement::Narrow {
                required,
                admitting,
                forbidding,
            } => {
                let what = format!(
                    "set required node affinity to the {admitting} nodes that admit its sysctls ({forbidding} forbid them)"
                );
                self.apply.place(key, &pod, Some(&required), &what).await?;
                Ok(dry(Done::Placed))
            }
            // Held for the same causes as written, whatever the numbers of nodes now.
            Placement::Hold { causes, .. }
                if pod
                    .held
                    .as_deref()
                    .is_some_and(|old| same_hold(old, pod.sysctl_names(), &causes)) =>
            {
                Ok(Done::Nothing)
            }
            Placement::Hold { reason, .. } => {
                self.apply.hold(key, &pod, &reason).await?;
                Ok(Done::Held)
            }
        }
    }
}

impl<W: Writes> Work for Worker<W> {
    async fn process_next(&self) -> bool {
        Worker::process_next(self).await
    }
}
