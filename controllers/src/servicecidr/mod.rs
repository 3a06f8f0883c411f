//! The ServiceCIDR controller (kube-controller-manager's `service-cidr-controller`, v1.36):
//! protects ServiceCIDRs with a finalizer, marks them Ready, and lets a deleted one go only
//! when no allocated Service IP would be left without a ServiceCIDR, 10 s after deletion.

pub mod blockers;
pub mod cache;
pub mod conflict;
pub mod decide;
pub mod index;
pub mod metrics;
pub mod prefix;
pub mod sync;
pub mod writes;

#[cfg(test)]
mod sync_tests;

use std::sync::{Arc, Mutex};

use futures::{Stream, StreamExt};
use groundskeeper_plumbing::watch::watch;
use k8s_openapi::api::networking::v1::{IPAddress, ServiceCIDR};
use kube::{Api, runtime::watcher};
use tokio::sync::watch as signal;

use crate::{
    context::Context,
    workqueue::{RateLimit, WorkQueue},
};
use cache::{Cache, LABEL_MANAGED_BY, MANAGED_BY_ALLOCATOR};
use metrics::Metrics;
use sync::{Syncer, work};
use writes::KubeWrites;

pub const CONTROLLER_NAME: &str = "service-cidr-controller";

#[derive(clap::Args, Debug, Clone)]
pub struct ServiceCidrArgs {
    /// How many ServiceCIDRs are synced concurrently (1 to 64).
    #[arg(
        long,
        env = "SERVICE_CIDR_WORKERS",
        default_value_t = 5,
        value_parser = clap::value_parser!(u16).range(1..=64)
    )]
    pub service_cidr_workers: u16,
}

/// Watches ServiceCIDRs and allocator-managed IPAddresses on every replica; syncs only while
/// leading; returns once `ctx.base.token` is cancelled and in-flight syncs finished.
pub async fn run(ctx: Context, args: ServiceCidrArgs) -> anyhow::Result<()> {
    let metrics = Metrics::new();
    metrics.register(&ctx.base.registry)?;
    let cache = Arc::new(Mutex::new(Cache::default()));
    let queue: WorkQueue<String> = WorkQueue::new(RateLimit::default());

    let cidr_flag = ctx.base.readiness.register("servicecidr/servicecidrs");
    let ip_flag = ctx.base.readiness.register("servicecidr/ipaddresses");
    let (cidr_health, ip_health) = (cidr_flag.clone(), ip_flag.clone());
    let cidr_stream = watch(
        Api::<ServiceCIDR>::all(ctx.base.client.clone()),
        watcher::Config::default(),
        cidr_flag.clone(),
    );
    // Upstream's handlers ignore every other IPAddress, so they are not even fetched; one that
    // loses the label leaves the selection and arrives as a delete.
    let ip_config =
        watcher::Config::default().labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY_ALLOCATOR}"));
    let ip_stream = watch(
        Api::<IPAddress>::all(ctx.base.client.clone()),
        ip_config,
        ip_flag.clone(),
    );

    let (cidr_synced_tx, mut cidr_synced) = signal::channel(false);
    let (ip_synced_tx, mut ip_synced) = signal::channel(false);
    let feeders = [
        tokio::spawn(feed(
            cidr_stream,
            cache.clone(),
            queue.clone(),
            move |c: &mut Cache, ev: watcher::Event<ServiceCIDR>| match ev {
                watcher::Event::Init => {
                    c.begin_cidr_relist();
                    vec![]
                }
                watcher::Event::InitApply(o) | watcher::Event::Apply(o) => c.cidr_applied(o),
                watcher::Event::Delete(o) => c.cidr_deleted(&kube::ResourceExt::name_any(&o)),
                watcher::Event::InitDone => {
                    cidr_flag.mark_ready();
                    let _ = cidr_synced_tx.send(true);
                    c.finish_cidr_relist()
                }
            },
        )),
        tokio::spawn(feed(
            ip_stream,
            cache.clone(),
            queue.clone(),
            move |c: &mut Cache, ev: watcher::Event<IPAddress>| match ev {
                watcher::Event::Init => {
                    c.begin_ip_relist();
                    vec![]
                }
                watcher::Event::InitApply(o) | watcher::Event::Apply(o) => c.ip_applied(&o),
                watcher::Event::Delete(o) => c.ip_deleted(&kube::ResourceExt::name_any(&o)),
                watcher::Event::InitDone => {
                    ip_flag.mark_ready();
                    let _ = ip_synced_tx.send(true);
                    c.finish_ip_relist()
                }
            },
        )),
    ];

    let syncer = Arc::new(
        Syncer::new(
            cache,
            queue.clone(),
            KubeWrites::new(ctx.base.client.clone(), ctx.leadership.fence()),
            metrics,
            ctx.base.dry_run,
        )
        .with_watches(vec![cidr_health, ip_health]),
    );
    let token = ctx.base.token.clone();
    let started = tokio::select! {
        _ = token.cancelled() => false,
        _ = async {
            let _ = cidr_synced.wait_for(|s| *s).await;
            let _ = ip_synced.wait_for(|s| *s).await;
            tracing::info!(controller = CONTROLLER_NAME, "caches synced; waiting for leadership");
            ctx.leadership.acquired().await;
        } => true,
    };
    let mut workers = Vec::new();
    if started {
        tracing::info!(
            controller = CONTROLLER_NAME,
            workers = args.service_cidr_workers,
            dry_run = ctx.base.dry_run,
            "syncing ServiceCIDRs"
        );
        for _ in 0..args.service_cidr_workers {
            workers.push(tokio::spawn(work(syncer.clone())));
        }
        token.cancelled().await;
    }
    queue.shut_down();
    for w in workers {
        let _ = w.await;
    }
    for f in feeders {
        f.abort();
    }
    Ok(())
}

/// Applies each watch event to the cache and enqueues the keys it yields, until aborted.
async fn feed<K, S, F>(stream: S, cache: Arc<Mutex<Cache>>, queue: WorkQueue<String>, mut apply: F)
where
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
    F: FnMut(&mut Cache, watcher::Event<K>) -> Vec<String> + Send,
{
    futures::pin_mut!(stream);
    // plumbing::watch logs, counts and retries errors; it never yields one.
    while let Some(Ok(ev)) = stream.next().await {
        let keys = apply(&mut cache.lock().expect("cache lock"), ev);
        for k in keys {
            queue.add(k);
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::manager::Cli;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("controller-manager").chain(args.iter().copied()))
    }

    #[test]
    fn workers_default_to_five_and_bad_counts_are_named() {
        assert_eq!(parse(&[]).unwrap().service_cidr.service_cidr_workers, 5);
        assert_eq!(
            parse(&["--service-cidr-workers", "12"])
                .unwrap()
                .service_cidr
                .service_cidr_workers,
            12
        );
        for bad in ["0", "65", "-1", "many"] {
            let arg = format!("--service-cidr-workers={bad}");
            let e = parse(&[&arg]).unwrap_err().to_string();
            assert!(
                e.contains(bad) && e.contains("--service-cidr-workers"),
                "{e}"
            );
        }
    }
}
