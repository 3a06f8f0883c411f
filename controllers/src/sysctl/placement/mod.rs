//! The sysctl placement controller: places each pod the gate webhook gated
//! (`sysctl::webhook::gate`) on the nodes whose kubelet and SysctlPolicy admit its sysctls.
//!
//! For each gated pod the leader judges every known node as the binding webhook would, then in
//! one conditional update sets a required node affinity to the admitting nodes (ANDed with the
//! pod's own) and removes the gate; the scheduler does the rest. A pod no node admits stays
//! gated (Pending, never Failed, so no controller recreates it) with a condition and an Event
//! saying why, and is judged again whenever a Node's facts or a SysctlPolicy change.

pub mod apply;
pub mod decide;
pub mod metrics;

#[cfg(test)]
mod decide_tests;
#[cfg(test)]
mod held_tests;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use groundskeeper_plumbing::ObjectKey;
use groundskeeper_plumbing::watch::cache::{Health, Shared};
use groundskeeper_sysctl_rules::args::PolicyArgs;
use groundskeeper_sysctl_rules::crd::SysctlPolicy;
use tokio::sync::watch as signal;

use crate::context::Context;
use crate::sysctl::cache::{Change, SysctlCache, Watched};
use crate::sysctl::facts::NodeFacts;
use crate::workqueue::{RateLimit, WorkQueue};
use apply::{Apply, KubeWrites, Writes};
use decide::{Placement, place, same_hold};
use metrics::Metrics;

/// The target of this file's log lines, which `RUST_LOG` filters select by: named after
/// the component (`sysctlplacement`), wherever its code sits.
const LOG_TARGET: &str = "groundskeeper_controllers::sysctlplacement";

pub const CONTROLLER_NAME: &str = "sysctl-placement";
/// The reporting controller of its Events (`plumbing::events::REPORTING_DOMAIN`'s scheme).
pub const REPORTER: &str = "groundskeeper.dev/sysctlplacement";
/// How soon a pod is tried again while the watches may not be acted on.
const UNHEALTHY_RETRY: Duration = Duration::from_secs(1);

#[derive(clap::Args, Debug, Clone)]
#[command(next_help_heading = "Sysctl placement controller")]
pub struct PlacementArgs {
    /// How many gated pods are placed concurrently (1 to 64).
    #[arg(
        long,
        env = "GROUNDSKEEPER_SYSCTL_PLACEMENT_WORKERS",
        default_value_t = 4,
        value_parser = clap::value_parser!(u16).range(1..=64)
    )]
    pub sysctl_placement_workers: u16,
}

/// Follows gated pods, Nodes and SysctlPolicies through the process's sysctl watches
/// (`watched`) on every replica; places only while leading; returns once `ctx.base.token` is
/// cancelled and in-flight placements finished.
pub async fn run(
    ctx: Context,
    args: PlacementArgs,
    policy: PolicyArgs,
    watched: Watched,
) -> anyhow::Result<()> {
    let metrics = Metrics::register(&ctx.base.registry)?;
    let cache = watched.cache.clone();
    let queue: WorkQueue<ObjectKey> = WorkQueue::new(RateLimit::default());
    let (health, changes) = (watched.health.clone(), watched.changes());
    let (listed_tx, mut listed) = signal::channel(false);
    let feeder = tokio::spawn({
        let (queue, health, cache, metrics) = (
            queue.clone(),
            health.clone(),
            cache.clone(),
            metrics.clone(),
        );
        async move {
            let mut changes = std::pin::pin!(changes);
            while let Some(change) = changes.next().await {
                let c = cache.lock();
                metrics.gated.set(c.gated.len() as i64);
                metrics.oldest_gated.set(
                    c.gated
                        .values()
                        .map(|g| g.created)
                        .filter(|&t| t > 0)
                        .min()
                        .unwrap_or(0),
                );
                match change {
                    Change::None => {}
                    Change::Pod(key) => queue.add(key),
                    Change::All => c.gated.keys().for_each(|k| queue.add(k.clone())),
                }
                drop(c);
                if health.listed() {
                    listed_tx.send_if_modified(|l| !std::mem::replace(l, true));
                }
            }
        }
    });
    let placer = Arc::new(Placer {
        policy,
        cache: cache.clone(),
        health,
        queue: queue.clone(),
        apply: Apply::new(
            KubeWrites::new(ctx.base.client.clone(), ctx.leadership.fence()),
            ctx.base.dry_run,
            ctx.events(REPORTER),
        ),
        metrics,
    });
    let token = ctx.base.token.clone();
    let started = tokio::select! {
        _ = token.cancelled() => false,
        _ = async {
            let _ = listed.wait_for(|l| *l).await;
            tracing::info!(target: LOG_TARGET, controller = CONTROLLER_NAME, "caches synced; waiting for leadership");
            ctx.leadership.acquired().await;
        } => true,
    };
    let mut workers = Vec::new();
    if started {
        tracing::info!(target: LOG_TARGET,
            controller = CONTROLLER_NAME,
            workers = args.sysctl_placement_workers,
            dry_run = ctx.base.dry_run,
            "placing gated pods"
        );
        // What was gated before this replica led is queued by the first list; queue it again
        // in case that happened before the leadership was won.
        for k in cache.lock().gated.keys() {
            queue.add(k.clone());
        }
        for _ in 0..args.sysctl_placement_workers {
            let p = placer.clone();
            workers.push(tokio::spawn(async move { while p.process_next().await {} }));
        }
        token.cancelled().await;
    }
    queue.shut_down();
    for w in workers {
        let _ = w.await;
    }
    feeder.abort();
    Ok(())
}

/// One evaluation of a gated pod: the cache read, the decision, the write.
pub struct Placer<W> {
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

impl<W: Writes> Placer<W> {
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

#[cfg(test)]
mod tests {
    use super::PlacementArgs;

    #[test]
    fn workers_default_to_four_and_bad_counts_are_named() {
        let parse = testkit::cli::args::<PlacementArgs>;
        assert_eq!(parse(&[]).unwrap().sysctl_placement_workers, 4);
        let e = parse(&["--sysctl-placement-workers=0"]).unwrap_err();
        assert!(e.contains("--sysctl-placement-workers"), "{e}");
    }
}
