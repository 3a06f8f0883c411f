//! Stale UDP conntrack cleanup (kube-proxy v1.36 CleanStaleEntries, spec section 3), driven
//! by Service and EndpointSlice watches instead of a proxy sync: after a UDP service's serving
//! endpoints change (debounced) and periodically with Cilium's adaptive interval.

pub mod clean;
pub mod fill;
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
use groundskeeper_plumbing::watch::watch_store;
use groundskeeper_plumbing::{ReadyFlag, client::parse_duration};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{IPAddress, ServiceCIDR};
use kube::Api;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::context::Context;

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

pub async fn run(ctx: Context, args: ConntrackArgs) -> anyhow::Result<()> {
    args.validate().map_err(anyhow::Error::msg)?;
    let sysctl_args = args.sysctls.clone();
    let dry_run = ctx.base.dry_run;
    tokio::task::spawn_blocking(move || {
        sysctls::apply_and_log(&sysctl_args, &sysctls::Roots::default(), dry_run)
    })
    .await?;
    let metrics = Metrics::register(&ctx.base.registry)?;
    let worker = worker::Worker::start(
        args.conntrack_netns.clone(),
        metrics,
        ctx.base.dry_run,
        args.conntrack_orphan_grace,
    )?;

    let changed = Arc::new(Notify::new());
    let svc_ready = ctx.base.readiness.register("conntrack/services");
    let eps_ready = ctx.base.readiness.register("conntrack/endpointslices");
    let cidr_ready = ctx.base.readiness.register("conntrack/servicecidrs");
    let addr_ready = ctx.base.readiness.register("conntrack/ipaddresses");
    let node_ready = ctx.base.readiness.register("conntrack/node");
    // All services, also those another proxy handles (service-proxy-name): their frontends
    // are recorded as foreign, so a label change is not mistaken for a deletion.
    let svc_cfg = watcher::Config::default();
    let node_cfg = watcher::Config::default().fields(&format!("metadata.name={}", ctx.node_name));
    let eps_cfg = watcher::Config::default().labels(&format!(
        "!{},!{}",
        model::LABEL_SERVICE_PROXY_NAME,
        model::LABEL_HEADLESS
    ));
    let (services, svc_events) = watch_store(
        Api::<Service>::all(ctx.base.client.clone()),
        svc_cfg,
        svc_ready.clone(),
    );
    let (slices, eps_events) = watch_store(
        Api::<EndpointSlice>::all(ctx.base.client.clone()),
        eps_cfg,
        eps_ready.clone(),
    );
    let watches = futures::future::join(
        follow(svc_events, svc_ready.clone(), changed.clone()),
        follow(eps_events, eps_ready.clone(), changed.clone()),
    );
    let (cidrs, cidr_events) = watch_store(
        Api::<ServiceCIDR>::all(ctx.base.client.clone()),
        watcher::Config::default(),
        cidr_ready.clone(),
    );
    let (addresses, addr_events) = watch_store(
        Api::<IPAddress>::all(ctx.base.client.clone()),
        watcher::Config::default(),
        addr_ready.clone(),
    );
    let (nodes, node_events) = watch_store(
        Api::<Node>::all(ctx.base.client.clone()),
        node_cfg,
        node_ready.clone(),
    );
    let more_watches = futures::future::join3(
        follow(cidr_events, cidr_ready.clone(), changed.clone()),
        follow(addr_events, addr_ready.clone(), changed.clone()),
        follow(node_events, node_ready.clone(), changed.clone()),
    );
    let watches = futures::future::join(watches, more_watches);
    let lists = Lists {
        services,
        slices,
        cidrs,
        addresses,
        nodes,
        ready: [svc_ready, eps_ready, cidr_ready, addr_ready, node_ready],
        tombstones: std::sync::Mutex::new(model::Tombstones::new(deleted_retention(&args))),
    };
    tokio::select! {
        _ = watches => anyhow::bail!("conntrack watches ended"),
        r = schedule(&ctx, &args, &worker, &lists, &changed) => r,
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
    /// Every watch the model is built from: a half-listed or failing IPAddress cache would
    /// make allocated IPs look orphaned just as a stale EndpointSlice cache would make serving
    /// endpoints look removed, so passes need all of them healthy.
    ready: [ReadyFlag; WATCHES],
    tombstones: std::sync::Mutex<model::Tombstones>,
}

/// Services, EndpointSlices, ServiceCIDRs, IPAddresses, this Node.
const WATCHES: usize = 5;

/// The watches' health epochs a model was built at (see [`ReadyFlag::health`]).
type Stamp = [Option<u64>; WATCHES];

/// Why a pass did not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Skip {
    /// A watch failed, is relisting, or changed health since the model was built: the model
    /// may say an endpoint is gone that came back meanwhile, and deleting its flows would cut
    /// live traffic. Better to leave a stale entry a little longer.
    StaleModel,
}

impl Skip {
    fn label(self) -> &'static str {
        match self {
            Skip::StaleModel => "stale-model",
        }
    }
}

/// Whether a pass may act on a model built at `built` when the watches now are at `now`:
/// only when every watch was healthy then, is healthy now, and nothing happened in between.
fn may_clean(built: &Stamp, now: &Stamp) -> Result<(), Skip> {
    if built.iter().all(Option::is_some) && built == now {
        Ok(())
    } else {
        Err(Skip::StaleModel)
    }
}

impl Lists {
    fn health(&self) -> Stamp {
        std::array::from_fn(|i| self.ready[i].health())
    }

    /// The model with the health it was built at; `None` while a watch is not healthy (a
    /// half-listed or failing cache would make serving endpoints look removed).
    fn model(&self) -> Option<(clean::Model, Stamp)> {
        let before = self.health();
        if !before.iter().all(Option::is_some) {
            return None;
        }
        let services = self.services.state();
        let slices = self.slices.state();
        let mut m = model::build(services.iter().map(|s| &**s), slices.iter().map(|s| &**s));
        let cidrs = self.cidrs.state();
        let addresses = self.addresses.state();
        m = m.with_service_ips(cidrs.iter().map(|c| &**c), addresses.iter().map(|a| &**a));
        let node = self.nodes.state().into_iter().next();
        m = m.with_node(node.as_deref());
        // Health changed while the stores were read: the model may mix old and new.
        if self.health() != before {
            return None;
        }
        let mut t = self.tombstones.lock().unwrap_or_else(|p| p.into_inner());
        Some((t.apply(m, std::time::Instant::now()), before))
    }
}

/// Asks for a model rebuild after each change the store has applied.
async fn follow<K>(
    events: impl futures::Stream<Item = watcher::Result<watcher::Event<K>>>,
    ready: ReadyFlag,
    changed: Arc<Notify>,
) {
    futures::pin_mut!(events);
    // plumbing::watch logs, counts and retries errors; it never yields one.
    while let Some(Ok(ev)) = events.next().await {
        match ev {
            watcher::Event::InitDone => {
                // The store has swapped in the list: healthy before the rebuild is asked for.
                ready.mark_ready();
                changed.notify_one();
            }
            watcher::Event::Apply(_) | watcher::Event::Delete(_) => changed.notify_one(),
            watcher::Event::Init | watcher::Event::InitApply(_) => {}
        }
    }
}

/// Decides when rounds run: soon after the UDP model changes (at most one per
/// --conntrack-min-interval), and on the adaptive periodic timer.
async fn schedule(
    ctx: &Context,
    args: &ConntrackArgs,
    worker: &worker::Worker,
    lists: &Lists,
    changed: &Notify,
) -> anyhow::Result<()> {
    let far = Duration::from_secs(365 * 24 * 3600);
    let mut interval = Duration::from_secs(60).clamp(args.conntrack_gc_min, args.conntrack_gc_max);
    let mut current: Option<(Arc<clean::Model>, Stamp)> = None;
    let mut rebuild_at: Option<Instant> = None;
    let mut pass_at: Option<Instant> = None;
    let mut last_pass: Option<Instant> = None;
    let mut judged: Option<Arc<clean::Model>> = None;
    let mut gc_at = Instant::now() + interval;
    let mut fill_events =
        fill::Notifier::new(ctx.base.client.clone(), &ctx.node_name, ctx.base.dry_run);
    // A pass was skipped on a stale model: run one as soon as a current model exists, even if
    // it equals the old one (what the skipped pass would have cleaned is still there).
    let mut owed = false;
    loop {
        let wake = [rebuild_at, pass_at, Some(gc_at)]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(Instant::now() + far);
        tokio::select! {
            _ = ctx.base.token.cancelled() => return Ok(()),
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
            if let Some((m, stamp)) = lists.model() {
                let earliest = last_pass.map_or(now, |t| t + args.conntrack_min_interval);
                if current.as_ref().map(|(c, _)| &**c) != Some(&m) {
                    tracing::debug!(
                        ipv4_frontends = m.ipv4.frontends.len(),
                        ipv6_frontends = m.ipv6.frontends.len(),
                        "UDP service model changed"
                    );
                    current = Some((Arc::new(m), stamp));
                    pass_at.get_or_insert(earliest.max(now));
                } else if let Some((_, s)) = current.as_mut() {
                    // Same model, confirmed by a current list: it is current again.
                    *s = stamp;
                }
                if std::mem::take(&mut owed) {
                    pass_at.get_or_insert(earliest.max(now));
                }
            }
        }
        let periodic = gc_at <= now;
        if !(periodic || pass_at.is_some_and(|t| t <= now)) {
            continue;
        }
        let Some((model, stamp)) = current.clone() else {
            gc_at = now + interval; // not listed yet
            continue;
        };
        pass_at = None;
        if let Err(skip) = may_clean(&stamp, &lists.health()) {
            worker
                .metrics()
                .skipped
                .with_label_values(&[skip.label()])
                .inc();
            let stale: Vec<String> = lists
                .ready
                .iter()
                .filter(|f| !f.is_healthy())
                .map(|f| format!("{} ({:?})", f.name(), f.stale_for()))
                .collect();
            tracing::warn!(reason = skip.label(), periodic, unhealthy_watches = ?stale, "conntrack pass skipped: the Service/EndpointSlice model may be stale; nothing deleted");
            owed = true;
            gc_at = now + interval;
            // A rebuild is due once the watches are back (their InitDone asks for one).
            continue;
        }
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
        if let Some(f) = summary.fill {
            fill_events.observe(f).await;
        }
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

    use super::{Skip, may_clean};

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
    fn passes_act_only_on_a_model_built_from_healthy_unchanged_watches() {
        // Built while both watches were healthy, nothing happened since: clean.
        assert_eq!(
            may_clean(
                &[Some(3), Some(7), Some(1), Some(1), Some(1)],
                &[Some(3), Some(7), Some(1), Some(1), Some(1)]
            ),
            Ok(())
        );
        // The EndpointSlice watch is failing (apiserver down): skip.
        assert_eq!(
            may_clean(
                &[Some(3), Some(7), Some(1), Some(1), Some(1)],
                &[Some(3), None, Some(1), Some(1), Some(1)]
            ),
            Err(Skip::StaleModel)
        );
        // Relisting after the outage: still skip until the list is in.
        assert_eq!(
            may_clean(
                &[Some(3), Some(7), Some(1), Some(1), Some(1)],
                &[None, Some(7), Some(1), Some(1), Some(1)]
            ),
            Err(Skip::StaleModel)
        );
        // Back and healthy, but the model predates the outage (epochs moved): skip until the
        // model is rebuilt from the new lists.
        assert_eq!(
            may_clean(
                &[Some(3), Some(7), Some(1), Some(1), Some(1)],
                &[Some(3), Some(10), Some(1), Some(1), Some(1)]
            ),
            Err(Skip::StaleModel)
        );
        // A model built while a watch was not healthy is never acted on.
        assert_eq!(
            may_clean(
                &[Some(3), None, Some(1), Some(1), Some(1)],
                &[Some(3), None, Some(1), Some(1), Some(1)]
            ),
            Err(Skip::StaleModel)
        );
        // The IPAddress watch is failing: allocated IPs could look orphaned, so skip too.
        assert_eq!(
            may_clean(
                &[Some(3), Some(7), Some(1), Some(1), Some(1)],
                &[Some(3), Some(7), Some(1), None, Some(1)]
            ),
            Err(Skip::StaleModel)
        );
        assert_eq!(Skip::StaleModel.label(), "stale-model");
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
