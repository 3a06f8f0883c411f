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
pub mod worker;

#[cfg(test)]
mod decide_tests;
#[cfg(test)]
mod held_tests;

use std::sync::Arc;

use groundskeeper_plumbing::ObjectKey;
use groundskeeper_plumbing::life::component::Crew;
use groundskeeper_sysctl_rules::args::PolicyArgs;

use crate::context::Context;
use crate::sysctl::cache::{Change, Watched};
use crate::workqueue::{RateLimit, WorkQueue};
use apply::{Apply, KubeWrites};
use metrics::Metrics;
use worker::Worker;

/// The target of this file's log lines, which `RUST_LOG` filters select by: named after
/// the component (`sysctlplacement`), wherever its code sits.
const LOG_TARGET: &str = "groundskeeper_controllers::sysctlplacement";

pub const CONTROLLER_NAME: &str = "sysctl-placement";
/// The reporting controller of its Events (`plumbing::events::REPORTING_DOMAIN`'s scheme).
pub const REPORTER: &str = "groundskeeper.dev/sysctlplacement";

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
    let health = watched.health.clone();
    let mut life = ctx.life(CONTROLLER_NAME);
    let listed = life.feed(watched.changes(), health.clone(), {
        let (queue, cache, metrics) = (queue.clone(), cache.clone(), metrics.clone());
        move |change| {
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
        }
    });
    let worker = Arc::new(Worker {
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
    life.run(listed.wait(), || {
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
        Crew::default()
            .workers(args.sysctl_placement_workers.into(), worker)
            .on_stop(move || queue.shut_down())
    })
    .await
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
