//! The ServiceCIDR controller (kube-controller-manager's `service-cidr-controller`, v1.36).
//!
//! It protects ServiceCIDRs with a finalizer, marks them Ready, and lets a deleted one go only
//! when no allocated Service IP would be left without a ServiceCIDR, 10 s after deletion.

pub mod apply;
pub mod blockers;
pub mod cache;
mod compact;
pub mod conflict;
pub mod decide;
pub mod index;
pub mod metrics;
pub mod prefix;
pub mod worker;

#[cfg(test)]
mod decide_tests;
#[cfg(test)]
mod index_tests;
#[cfg(test)]
mod worker_tests;

use std::sync::Arc;

use groundskeeper_plumbing::life::component::Crew;
use groundskeeper_plumbing::watch::cache::{Health, Shared};

use crate::{
    context::Context,
    workqueue::{RateLimit, WorkQueue, metrics::QueueMetricFamilies},
};
use apply::KubeWrites;
use cache::CidrCache;
use metrics::Metrics;
use worker::Worker;

pub const CONTROLLER_NAME: &str = "service-cidr-controller";
/// The reporting controller of its Events (`plumbing::events::REPORTING_DOMAIN`'s scheme).
pub const REPORTER: &str = "groundskeeper.dev/servicecidr";
/// Upstream's name for this controller's work queue (sic: it queues ServiceCIDRs), kept so that
/// `workqueue_*{name="ipaddresses"}` dashboards and alerts written for kube-controller-manager apply.
pub const QUEUE_NAME: &str = "ipaddresses";

#[derive(clap::Args, Debug, Clone)]
#[command(next_help_heading = "ServiceCIDR controller")]
pub struct ServiceCidrArgs {
    /// How many ServiceCIDRs are synced concurrently (1 to 64).
    #[arg(
        long,
        env = "GROUNDSKEEPER_SERVICE_CIDR_WORKERS",
        default_value_t = 5,
        value_parser = clap::value_parser!(u16).range(1..=64)
    )]
    pub service_cidr_workers: u16,
}

/// Watches ServiceCIDRs and allocator-managed IPAddresses on every replica; syncs only while
/// leading; returns once `ctx.base.token` is cancelled and in-flight syncs finished.
pub async fn run(ctx: Context, args: ServiceCidrArgs) -> anyhow::Result<()> {
    let metrics = Metrics::register(&ctx.base.registry)?;
    let cache = Shared::<CidrCache>::default();
    let queue: WorkQueue<String> = WorkQueue::named(
        RateLimit::default(),
        &QueueMetricFamilies::register(&ctx.base.registry)?,
        QUEUE_NAME,
    );

    let (flags, changes) =
        cache::watch(&ctx.base.readiness, ctx.base.client.clone(), cache.clone());
    let health = Health::new(flags);
    let mut life = ctx.life(CONTROLLER_NAME);
    let listed = life.feed(changes, health.clone(), {
        let queue = queue.clone();
        move |keys: Vec<String>| keys.into_iter().for_each(|k| queue.add(k))
    });
    let worker = Arc::new(
        Worker::new(
            cache,
            queue.clone(),
            KubeWrites::new(ctx.base.client.clone(), ctx.leadership.fence()),
            metrics,
            ctx.base.dry_run,
            ctx.events(REPORTER),
        )
        .with_health(health),
    );
    life.run(listed.wait(), || {
        tracing::info!(
            controller = CONTROLLER_NAME,
            workers = args.service_cidr_workers,
            dry_run = ctx.base.dry_run,
            "syncing ServiceCIDRs"
        );
        Crew::default()
            .workers(args.service_cidr_workers.into(), worker)
            .on_stop(move || queue.shut_down())
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::ServiceCidrArgs;
    use testkit::cli::Flags;

    #[test]
    fn workers_default_to_five_and_bad_counts_are_named() {
        assert_eq!(
            ServiceCidrArgs::from_flags(&[])
                .unwrap()
                .service_cidr_workers,
            5
        );
        assert_eq!(
            ServiceCidrArgs::from_flags(&["--service-cidr-workers", "12"])
                .unwrap()
                .service_cidr_workers,
            12
        );
        for bad in ["0", "65", "-1", "many"] {
            let arg = format!("--service-cidr-workers={bad}");
            let e = ServiceCidrArgs::from_flags(&[&arg]).unwrap_err();
            assert!(
                e.contains(bad) && e.contains("--service-cidr-workers"),
                "{e}"
            );
        }
    }
}
