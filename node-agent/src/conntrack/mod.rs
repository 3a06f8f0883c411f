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
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
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
    let worker = worker::Worker::start(args.conntrack_netns.clone(), metrics, shared.base.dry_run)?;

    let changed = Arc::new(Notify::new());
    let svc_ready = shared.base.readiness.register("conntrack/services");
    let eps_ready = shared.base.readiness.register("conntrack/endpointslices");
    // Same selection as kube-proxy's informers (without a proxy name).
    let svc_cfg =
        watcher::Config::default().labels(&format!("!{}", model::LABEL_SERVICE_PROXY_NAME));
    let eps_cfg = watcher::Config::default().labels(&format!(
        "!{},!{}",
        model::LABEL_SERVICE_PROXY_NAME,
        model::LABEL_HEADLESS
    ));
    let (services, svc_events) = watch_store(
        Api::<Service>::all(shared.base.client.clone()),
        svc_cfg,
        svc_ready.clone(),
    );
    let (slices, eps_events) = watch_store(
        Api::<EndpointSlice>::all(shared.base.client.clone()),
        eps_cfg,
        eps_ready.clone(),
    );
    let watches = futures::future::join(
        follow(svc_events, svc_ready.clone(), changed.clone()),
        follow(eps_events, eps_ready.clone(), changed.clone()),
    );
    let lists = Lists {
        services,
        slices,
        ready: [svc_ready, eps_ready],
    };
    tokio::select! {
        _ = watches => anyhow::bail!("conntrack watches ended"),
        r = schedule(&shared, &args, &worker, &lists, &changed) => r,
    }
}

struct Lists {
    services: Store<Service>,
    slices: Store<EndpointSlice>,
    ready: [ReadyFlag; 2],
}

/// The watches' health epochs a model was built at (see [`ReadyFlag::health`]).
type Stamp = [Option<u64>; 2];

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
        [self.ready[0].health(), self.ready[1].health()]
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
        let m = model::build(services.iter().map(|s| &**s), slices.iter().map(|s| &**s));
        // Health changed while the stores were read: the model may mix old and new.
        (self.health() == before).then_some((m, before))
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
    shared: &Shared,
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
    let mut gc_at = Instant::now() + interval;
    let mut fill_events = fill::Notifier::new(
        shared.base.client.clone(),
        &shared.node_name,
        shared.base.dry_run,
    );
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
            _ = shared.base.token.cancelled() => return Ok(()),
            _ = changed.notified() => {
                rebuild_at.get_or_insert(Instant::now() + COALESCE);
                continue;
            }
            _ = tokio::time::sleep_until(wake) => {}
        }
        let now = Instant::now();
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
        let summary = worker.round(model).await;
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
        ])
        .unwrap();
        let c = &cli.conntrack;
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
        assert_eq!(may_clean(&[Some(3), Some(7)], &[Some(3), Some(7)]), Ok(()));
        // The EndpointSlice watch is failing (apiserver down): skip.
        assert_eq!(
            may_clean(&[Some(3), Some(7)], &[Some(3), None]),
            Err(Skip::StaleModel)
        );
        // Relisting after the outage: still skip until the list is in.
        assert_eq!(
            may_clean(&[Some(3), Some(7)], &[None, Some(7)]),
            Err(Skip::StaleModel)
        );
        // Back and healthy, but the model predates the outage (epochs moved): skip until the
        // model is rebuilt from the new lists.
        assert_eq!(
            may_clean(&[Some(3), Some(7)], &[Some(3), Some(10)]),
            Err(Skip::StaleModel)
        );
        // A model built while a watch was not healthy is never acted on.
        assert_eq!(
            may_clean(&[Some(3), None], &[Some(3), None]),
            Err(Skip::StaleModel)
        );
        assert_eq!(Skip::StaleModel.label(), "stale-model");
    }
}
