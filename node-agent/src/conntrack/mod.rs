//! Stale UDP conntrack cleanup (kube-proxy v1.36 CleanStaleEntries, docs/upstream.md), driven
//! by Service and EndpointSlice watches instead of a proxy sync: after a UDP service's serving
//! endpoints change (debounced) and periodically with Cilium's adaptive interval.

pub mod apply;
pub mod cache;
pub mod decide;
pub mod metrics;
pub mod model;
pub mod netlink;
#[cfg(any(test, feature = "testing"))]
pub mod netns;
pub mod pass;
pub mod schedule;
pub mod tuning;
pub mod wire;
pub mod worker;

#[cfg(test)]
mod cache_tests;
#[cfg(test)]
mod decide_tests;
#[cfg(test)]
mod focus_tests;
#[cfg(test)]
mod kernel_tests;
#[cfg(test)]
mod schedule_periodic_tests;
#[cfg(test)]
mod schedule_tests;
#[cfg(test)]
mod stream_tests;
#[cfg(test)]
mod test_support;
#[cfg(test)]
mod trigger_tests;
#[cfg(test)]
mod tuning_tests;
#[cfg(test)]
mod wire_tests;

use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use groundskeeper_plumbing::client::parse_duration;
use groundskeeper_plumbing::life::component::{Crew, Life};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::context::Context;
use model::Model;
use model::changes::Changes;
use model::focus::Focus;
use pass::fill::Notifier;
use pass::round::{RoundSummary, RoundThread};

pub use metrics::Metrics;

/// Bounds of --conntrack-no-endpoint-settle.
const MIN_SETTLE: Duration = Duration::from_secs(1);
const MAX_SETTLE: Duration = Duration::from_secs(600);
/// Least --conntrack-orphan-grace: many times the IPAddress watch's lag
/// (benches/ipaddress_watch_lag.rs; docs/benchmarks.md), a wide margin for a loaded apiserver.
const MIN_ORPHAN_GRACE: Duration = Duration::from_secs(1);

#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Conntrack cleanup")]
pub struct ConntrackArgs {
    /// Least time between two cleanup passes triggered by endpoint changes (kube-proxy's
    /// --min-sync-period plays this role upstream).
    #[arg(long, env = "GROUNDSKEEPER_CONNTRACK_MIN_INTERVAL", default_value = "1s", value_parser = parse_duration)]
    pub conntrack_min_interval: Duration,

    /// Shortest interval of the periodic pass (it shortens when passes find many stale entries).
    #[arg(long, env = "GROUNDSKEEPER_CONNTRACK_GC_MIN", default_value = "10s", value_parser = parse_duration)]
    pub conntrack_gc_min: Duration,

    /// Longest interval of the periodic pass (it lengthens when passes find almost nothing).
    #[arg(long, env = "GROUNDSKEEPER_CONNTRACK_GC_MAX", default_value = "5m", value_parser = parse_duration)]
    pub conntrack_gc_max: Duration,

    /// How long an IP inside a ServiceCIDR must look unallocated (no IPAddress object) before
    /// the flows DNATed to it are deleted, and how long a backend the agent never saw serve a
    /// frontend or nodePort must look so before flows to it through that key are; must exceed
    /// the lag of the IPAddress and EndpointSlice watches behind kube-proxy.
    #[arg(long, env = "GROUNDSKEEPER_CONNTRACK_ORPHAN_GRACE", default_value = "5s", value_parser = parse_duration)]
    pub conntrack_orphan_grace: Duration,

    /// How long a live service port must have had no serving endpoint before every UDP flow
    /// through its frontends is deleted (kubernetes#139629); an EndpointSlice deleted and
    /// re-created within it cuts nothing. A deleted service's flows go at once.
    #[arg(long, env = "GROUNDSKEEPER_CONNTRACK_NO_ENDPOINT_SETTLE", default_value = "1s", value_parser = parse_duration)]
    pub conntrack_no_endpoint_settle: Duration,

    /// Clean the conntrack table of this named network namespace (/run/netns/NAME) instead
    /// of the agent's own. For tests and agents not running on the host network.
    #[arg(long, env = "GROUNDSKEEPER_CONNTRACK_NETNS")]
    pub conntrack_netns: Option<String>,

    #[command(flatten)]
    pub tuning: tuning::ConntrackSysctlArgs,
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
        let settle = self.conntrack_no_endpoint_settle;
        if !(MIN_SETTLE..=MAX_SETTLE).contains(&settle) {
            return Err(format!(
                "--conntrack-no-endpoint-settle ({settle:?}) must be between {MIN_SETTLE:?} \
                 (an EndpointSlice re-created within a shorter gap would cut a live service's \
                 flows) and {MAX_SETTLE:?} (one-way senders stay blackholed meanwhile)"
            ));
        }
        if self.conntrack_orphan_grace < MIN_ORPHAN_GRACE {
            return Err(format!(
                "--conntrack-orphan-grace ({:?}) must be at least {MIN_ORPHAN_GRACE:?}: it covers \
                 the lag of the IPAddress watch",
                self.conntrack_orphan_grace
            ));
        }
        Ok(())
    }
}

pub async fn run(ctx: Context, args: ConntrackArgs) -> anyhow::Result<()> {
    args.validate().map_err(anyhow::Error::msg)?;
    let sysctl_args = args.tuning.clone();
    let dry_run = ctx.base.dry_run;
    tokio::task::spawn_blocking(move || {
        tuning::apply_and_log(&sysctl_args, &tuning::Roots::default(), dry_run)
    })
    .await?;
    let metrics = Metrics::register(&ctx.base.registry)?;
    let mut rounds = Cleanup {
        rounds: RoundThread::start(
            args.conntrack_netns.clone(),
            metrics.clone(),
            apply::table(dry_run),
            args.conntrack_orphan_grace,
        )?,
        fill: Notifier::new(ctx.base.client.clone(), &ctx.node_name, dry_run),
    };
    let changed = Arc::new(Notify::new());
    let (models, watches) = cache::start(
        &ctx,
        deleted_retention(&args),
        args.conntrack_no_endpoint_settle,
        changed.clone(),
    );
    let timing = schedule::Timing {
        min_interval: args.conntrack_min_interval,
        gc_min: args.conntrack_gc_min,
        gc_max: args.conntrack_gc_max,
    };
    let scheduler = schedule::Scheduler::new(timing, Instant::now());
    // No gate: every agent cleans its own node's table, on its model once current (the
    // scheduler's question). The watches must run as long as it does.
    let token = ctx.base.token.clone();
    let mut life = Life::new("conntrack", token.clone());
    life.watches(watches);
    life.run(async {}, move || {
        Crew::default().task(async move {
            let stop = token.cancelled();
            worker::run(
                scheduler,
                &models,
                &mut rounds,
                &changed,
                stop,
                &metrics.skipped,
            )
            .await
        })
    })
    .await
}

/// How long the frontends of a deleted service (or of a removed port, ExternalIP, VIP,
/// nodePort) are remembered: 10 minutes, far beyond kube-proxy's rules lag (its sync period
/// is 30 s) after which no new flow is DNATed through them, and at least two periodic
/// intervals, so a periodic pass also sweeps the flows made while the rules lagged.
fn deleted_retention(args: &ConntrackArgs) -> Duration {
    Duration::from_secs(600).max(args.conntrack_gc_max.saturating_mul(2))
}

/// A round in the agent: both families' passes on the netlink thread, then the fill Event.
struct Cleanup {
    rounds: RoundThread,
    fill: Notifier,
}

impl schedule::Rounds for Cleanup {
    async fn round(
        &mut self,
        model: Arc<Model>,
        focus: Option<Focus>,
        since: Option<Changes>,
    ) -> RoundSummary {
        let summary = self.rounds.run(model, focus, since).await;
        if let Some(f) = summary.fill {
            self.fill.observe(f).await;
        }
        summary
    }
}

#[cfg(test)]
mod tests {
    use super::ConntrackArgs;
    use testkit::cli::Flags;

    #[test]
    fn flags_as_the_chart_passes_them() {
        let cli = ConntrackArgs::from_flags(&[
            "--conntrack-min-interval=2s",
            "--conntrack-gc-min=10s",
            "--conntrack-gc-max=5m",
            "--conntrack-max-per-core=32768",
            "--conntrack-tcp-be-liberal=true",
            "--conntrack-udp-timeout-stream=2m",
            "--conntrack-orphan-grace=30s",
        ])
        .unwrap();
        let c = &cli;
        assert_eq!(c.conntrack_orphan_grace.as_secs(), 30);
        assert_eq!(c.conntrack_min_interval.as_secs(), 2);
        assert_eq!(c.conntrack_gc_max.as_secs(), 300);
        assert_eq!(c.tuning.conntrack_max_per_core, Some(32768));
        assert!(c.tuning.conntrack_tcp_be_liberal);
        assert!(c.validate().is_ok());
    }

    #[test]
    fn bad_intervals_are_rejected_naming_the_value() {
        let e = ConntrackArgs::from_flags(&["--conntrack-gc-min=soon"])
            .err()
            .unwrap();
        assert!(e.contains("soon"), "{e}");
        let cli = ConntrackArgs::from_flags(&["--conntrack-gc-min=10m", "--conntrack-gc-max=5m"])
            .unwrap();
        let e = cli.validate().unwrap_err();
        assert!(e.contains("600s") && e.contains("300s"), "{e}");
        let cli = ConntrackArgs::from_flags(&["--conntrack-gc-min=0s"]).unwrap();
        assert!(cli.validate().is_err());
    }

    #[test]
    fn settle_and_grace_out_of_bounds_are_rejected_naming_the_value() {
        let cases = [
            ("--conntrack-no-endpoint-settle=500ms", "500ms"),
            ("--conntrack-no-endpoint-settle=11m", "660s"),
            ("--conntrack-no-endpoint-settle=0s", "0ns"),
            ("--conntrack-orphan-grace=100ms", "100ms"),
        ];
        for (flag, shown) in cases {
            let cli = ConntrackArgs::from_flags(&[flag]).unwrap();
            let e = cli.validate().unwrap_err();
            let name = flag.split('=').next().unwrap();
            assert!(e.contains(name) && e.contains(shown), "{flag}: {e}");
        }
        let cli = ConntrackArgs::from_flags(&["--conntrack-no-endpoint-settle=10m"]).unwrap();
        assert!(cli.validate().is_ok());
        let e = ConntrackArgs::from_flags(&["--conntrack-no-endpoint-settle=soon"])
            .err()
            .unwrap();
        assert!(e.contains("soon"), "{e}");
    }

    #[test]
    fn deleted_frontends_are_remembered_ten_minutes_or_two_gc_max() {
        for (gc_max, want) in [("5m", 600), ("1h", 7200), ("10s", 600)] {
            let cli = ConntrackArgs::from_flags(&[
                "--conntrack-gc-min=1s",
                &format!("--conntrack-gc-max={gc_max}"),
            ])
            .unwrap();
            assert_eq!(
                super::deleted_retention(&cli).as_secs(),
                want,
                "gc-max {gc_max}"
            );
        }
        let cli = ConntrackArgs::from_flags(&[]).unwrap();
        assert_eq!(cli.conntrack_orphan_grace.as_secs(), 5, "default grace");
        assert_eq!(
            cli.conntrack_no_endpoint_settle.as_secs(),
            1,
            "default settle"
        );
    }
}
