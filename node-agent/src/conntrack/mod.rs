//! Stale UDP conntrack cleanup (kube-proxy v1.36 CleanStaleEntries, spec section 3), driven
//! by Service and EndpointSlice watches instead of a proxy sync: after a UDP service's serving
//! endpoints change (debounced) and periodically with Cilium's adaptive interval.

pub mod clean;
pub mod model;
pub mod msg;
pub mod netns;
pub mod pass;
pub mod socket;
pub mod sysctls;
mod worker;

#[cfg(test)]
mod kernel_tests;

use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use futures::StreamExt;
use groundskeeper_plumbing::{ReadyFlag, client::parse_duration};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{IPAddress, ServiceCIDR};
use kube::Api;
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::agent::Shared;

pub use worker::Metrics;

#[derive(Args, Debug, Clone)]
pub struct ConntrackArgs {
    /// Least time between two cleanup passes triggered by endpoint changes (kube-proxy's
    /// --min-sync-period plays this role upstream).
    #[arg(long, env = "CONNTRACK_MIN_INTERVAL", default_value = "1s", value_parser = parse_duration)]
    pub conntrack_min_interval: Duration,

    /// Shortest interval of the periodic pass (it shortens when passes find many stale entries).
    #[arg(long, env = "CONNTRACK_GC_MIN", default_value = "10s", value_parser = parse_duration)]
    pub conntrack_gc_min: Duration,

    /// Longest interval of the periodic pass (it lengthens when passes find almost nothing).
    #[arg(long, env = "CONNTRACK_GC_MAX", default_value = "5m", value_parser = parse_duration)]
    pub conntrack_gc_max: Duration,

    /// How long an IP inside a ServiceCIDR must look unallocated (no IPAddress object) before
    /// the flows DNATed to it are deleted; must exceed the lag of the IPAddress watch.
    #[arg(long, env = "CONNTRACK_ORPHAN_GRACE", default_value = "60s", value_parser = parse_duration)]
    pub conntrack_orphan_grace: Duration,

    /// Clean the conntrack table of this named network namespace (/run/netns/NAME) instead
    /// of the agent's own. For tests and agents not running on the host network.
    #[arg(long, env = "CONNTRACK_NETNS")]
    pub conntrack_netns: Option<String>,

    #[command(flatten)]
    pub sysctls: sysctls::ConntrackSysctlArgs,
}

impl ConntrackArgs {
    /// Checks what clap cannot check field by field.
    pub fn validate(&self) -> Result<(), String> {
        if self.conntrack_gc_min.is_zero() {
            return Err("--conntrack-gc-min must be above 0".into());
        }
        if self.conntrack_gc_min > self.conntrack_gc_max {
            return Err(format!(
                "--conntrack-gc-min ({:?}) is above --conntrack-gc-max ({:?})",
                self.conntrack_gc_min, self.conntrack_gc_max
            ));
        }
        Ok(())
    }
}

/// Debounce of watch events before the model is rebuilt and compared.
const COALESCE: Duration = Duration::from_millis(100);

pub async fn run(shared: Shared, args: ConntrackArgs) -> anyhow::Result<()> {
    args.validate().map_err(anyhow::Error::msg)?;
    let sysctl_args = args.sysctls.clone();
    let dry_run = shared.base.dry_run;
    tokio::task::spawn_blocking(move || {
        sysctls::apply_and_log(&sysctl_args, &sysctls::Roots::default(), dry_run)
    })
    .await?;
    let metrics = Metrics::register(&shared.base.registry)?;
    let worker = worker::Worker::start(
        args.conntrack_netns.clone(),
        metrics,
        shared.base.dry_run,
        args.conntrack_orphan_grace,
    )?;

    let changed = Arc::new(Notify::new());
    let (services, svc_writer) = reflector::store::<Service>();
    let (slices, eps_writer) = reflector::store::<EndpointSlice>();
    let (cidrs, cidr_writer) = reflector::store::<ServiceCIDR>();
    let (addresses, addr_writer) = reflector::store::<IPAddress>();
    let (nodes, node_writer) = reflector::store::<Node>();
    let svc_ready = shared.base.readiness.register("conntrack: services");
    let eps_ready = shared.base.readiness.register("conntrack: endpointslices");
    let cidr_ready = shared.base.readiness.register("conntrack: servicecidrs");
    let addr_ready = shared.base.readiness.register("conntrack: ipaddresses");
    let node_ready = shared.base.readiness.register("conntrack: node");
    // All services, also those another proxy handles (service-proxy-name): their frontends
    // are recorded as foreign, so a label change is not mistaken for a deletion.
    let svc_cfg = watcher::Config::default();
    let node_cfg =
        watcher::Config::default().fields(&format!("metadata.name={}", shared.node_name));
    let eps_cfg = watcher::Config::default().labels(&format!(
        "!{},!{}",
        model::LABEL_SERVICE_PROXY_NAME,
        model::LABEL_HEADLESS
    ));
    let watches = futures::future::join(
        watch(
            Api::all(shared.base.client.clone()),
            svc_cfg,
            svc_writer,
            svc_ready.clone(),
            changed.clone(),
            "services",
        ),
        watch(
            Api::all(shared.base.client.clone()),
            eps_cfg,
            eps_writer,
            eps_ready.clone(),
            changed.clone(),
            "endpointslices",
        ),
    );
    let more_watches = futures::future::join3(
        watch(
            Api::all(shared.base.client.clone()),
            watcher::Config::default(),
            cidr_writer,
            cidr_ready.clone(),
            changed.clone(),
            "servicecidrs",
        ),
        watch(
            Api::all(shared.base.client.clone()),
            watcher::Config::default(),
            addr_writer,
            addr_ready.clone(),
            changed.clone(),
            "ipaddresses",
        ),
        watch(
            Api::all(shared.base.client.clone()),
            node_cfg,
            node_writer,
            node_ready.clone(),
            changed.clone(),
            "node",
        ),
    );
    let watches = futures::future::join(watches, more_watches);
    let lists = Lists {
        services,
        slices,
        cidrs,
        addresses,
        nodes,
        ready: [svc_ready, eps_ready],
        service_ips_ready: [cidr_ready, addr_ready],
        tombstones: std::sync::Mutex::new(model::Tombstones::new(deleted_retention(&args))),
    };
    tokio::select! {
        _ = watches => anyhow::bail!("conntrack watches ended"),
        r = schedule(&shared, &args, &worker, &lists, &changed) => r,
    }
}

/// How long the frontends of a deleted service (or of a removed port, ExternalIP, VIP,
/// nodePort) are remembered: 10 minutes, far beyond kube-proxy's rules lag (its sync period
/// is 30 s) after which no new flow is DNATed through them, and at least two periodic
/// intervals, so a periodic pass also sweeps the flows made while the rules lagged.
fn deleted_retention(args: &ConntrackArgs) -> Duration {
    Duration::from_secs(600).max(args.conntrack_gc_max.saturating_mul(2))
}

struct Lists {
    services: Store<Service>,
    slices: Store<EndpointSlice>,
    cidrs: Store<ServiceCIDR>,
    addresses: Store<IPAddress>,
    nodes: Store<Node>,
    ready: [ReadyFlag; 2],
    /// The orphan rule only runs once both have listed: a half-listed IPAddress cache would
    /// make allocated IPs look orphaned.
    service_ips_ready: [ReadyFlag; 2],
    tombstones: std::sync::Mutex<model::Tombstones>,
}

impl Lists {
    fn model(&self) -> Option<clean::Model> {
        // A half-listed cache would make serving endpoints look removed.
        if !self.ready.iter().all(ReadyFlag::is_ready) {
            return None;
        }
        let services = self.services.state();
        let slices = self.slices.state();
        let mut m = model::build(services.iter().map(|s| &**s), slices.iter().map(|s| &**s));
        if self.service_ips_ready.iter().all(ReadyFlag::is_ready) {
            let cidrs = self.cidrs.state();
            let addresses = self.addresses.state();
            m = m.with_service_ips(cidrs.iter().map(|c| &**c), addresses.iter().map(|a| &**a));
        }
        let node = self.nodes.state().into_iter().next();
        m = m.with_node(node.as_deref());
        let mut t = self.tombstones.lock().unwrap_or_else(|p| p.into_inner());
        Some(t.apply(m, std::time::Instant::now()))
    }
}

async fn watch<K>(
    api: Api<K>,
    cfg: watcher::Config,
    writer: Writer<K>,
    ready: ReadyFlag,
    changed: Arc<Notify>,
    what: &'static str,
) where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + Send
        + Sync
        + serde::de::DeserializeOwned
        + 'static,
{
    let stream = watcher(api, cfg).default_backoff().reflect(writer);
    futures::pin_mut!(stream);
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(watcher::Event::InitDone) => {
                ready.mark_ready();
                changed.notify_one();
            }
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => changed.notify_one(),
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(watch = what, error = %e, "watch failed; retrying with backoff")
            }
        }
    }
}

/// Decides when rounds run: soon after the UDP model changes (at most one per
/// --conntrack-min-interval), and on the adaptive periodic timer.
async fn schedule(
    shared: &Shared,
    args: &ConntrackArgs,
    worker: &worker::Worker,
    lists: &Lists,
    changed: &Notify,
) -> anyhow::Result<()> {
    let far = Duration::from_secs(365 * 24 * 3600);
    let mut interval = Duration::from_secs(60).clamp(args.conntrack_gc_min, args.conntrack_gc_max);
    let mut current: Option<Arc<clean::Model>> = None;
    let mut rebuild_at: Option<Instant> = None;
    let mut pass_at: Option<Instant> = None;
    let mut last_pass: Option<Instant> = None;
    let mut judged: Option<Arc<clean::Model>> = None;
    let mut gc_at = Instant::now() + interval;
    loop {
        let wake = [rebuild_at, pass_at, Some(gc_at)]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(Instant::now() + far);
        tokio::select! {
            _ = shared.base.token.cancelled() => return Ok(()),
            _ = changed.notified() => {
                rebuild_at.get_or_insert(Instant::now() + COALESCE);
                continue;
            }
            _ = tokio::time::sleep_until(wake) => {}
        }
        let now = Instant::now();
        // A periodic pass also rebuilds: remembered deleted frontends expire with time alone.
        if gc_at <= now {
            rebuild_at = Some(now);
        }
        if rebuild_at.is_some_and(|t| t <= now) {
            rebuild_at = None;
            if let Some(m) = lists.model()
                && current.as_deref() != Some(&m)
            {
                tracing::debug!(
                    ipv4_frontends = m.ipv4.frontends.len(),
                    ipv6_frontends = m.ipv6.frontends.len(),
                    "UDP service model changed"
                );
                current = Some(Arc::new(m));
                let earliest = last_pass.map_or(now, |t| t + args.conntrack_min_interval);
                pass_at.get_or_insert(earliest.max(now));
            }
        }
        let periodic = gc_at <= now;
        if !(periodic || pass_at.is_some_and(|t| t <= now)) {
            continue;
        }
        let Some(model) = current.clone() else {
            gc_at = now + interval; // not listed yet
            continue;
        };
        pass_at = None;
        last_pass = Some(now);
        // A triggered pass looks only at the backends the change took away since the model
        // the last round judged; a periodic pass (and the first) at everything.
        let focus = (!periodic)
            .then(|| {
                judged
                    .as_deref()
                    .and_then(|j| clean::Focus::between(j, &model))
            })
            .flatten();
        judged = Some(model.clone());
        let summary = worker.round(model, focus).await;
        if periodic {
            interval = clean::next_interval(
                interval,
                summary.scanned,
                summary.deleted,
                args.conntrack_gc_min,
                args.conntrack_gc_max,
            );
        }
        gc_at = Instant::now() + interval;
        tracing::debug!(next_periodic_in = ?interval, "conntrack round done");
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::agent::Cli;

    fn parse(flags: &[&str]) -> Result<Cli, String> {
        Cli::try_parse_from(std::iter::once("node-agent").chain(flags.iter().copied()))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn flags_as_the_chart_passes_them() {
        let cli = parse(&[
            "--conntrack-min-interval=2s",
            "--conntrack-gc-min=10s",
            "--conntrack-gc-max=5m",
            "--conntrack-max-per-core=32768",
            "--conntrack-tcp-be-liberal=true",
            "--conntrack-udp-timeout-stream=2m",
            "--conntrack-orphan-grace=30s",
        ])
        .unwrap();
        let c = &cli.conntrack;
        assert_eq!(c.conntrack_orphan_grace.as_secs(), 30);
        assert_eq!(c.conntrack_min_interval.as_secs(), 2);
        assert_eq!(c.conntrack_gc_max.as_secs(), 300);
        assert_eq!(c.sysctls.conntrack_max_per_core, Some(32768));
        assert!(c.sysctls.conntrack_tcp_be_liberal);
        assert!(c.validate().is_ok());
    }

    #[test]
    fn bad_intervals_are_rejected_naming_the_value() {
        let e = parse(&["--conntrack-gc-min=soon"]).err().unwrap();
        assert!(e.contains("soon"), "{e}");
        let cli = parse(&["--conntrack-gc-min=10m", "--conntrack-gc-max=5m"]).unwrap();
        let e = cli.conntrack.validate().unwrap_err();
        assert!(e.contains("600s") && e.contains("300s"), "{e}");
        let cli = parse(&["--conntrack-gc-min=0s"]).unwrap();
        assert!(cli.conntrack.validate().is_err());
    }

    #[test]
    fn deleted_frontends_are_remembered_ten_minutes_or_two_gc_max() {
        for (gc_max, want) in [("5m", 600), ("1h", 7200), ("10s", 600)] {
            let cli = parse(&[
                "--conntrack-gc-min=1s",
                &format!("--conntrack-gc-max={gc_max}"),
            ])
            .unwrap();
            assert_eq!(
                super::deleted_retention(&cli.conntrack).as_secs(),
                want,
                "gc-max {gc_max}"
            );
        }
        let cli = parse(&[]).unwrap();
        assert_eq!(
            cli.conntrack.conntrack_orphan_grace.as_secs(),
            60,
            "default grace"
        );
    }
}
