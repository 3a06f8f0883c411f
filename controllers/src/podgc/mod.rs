//! PodGC's flags and `run`: force-deletes pods nobody else will clean up.
//!
//! As kube-controller-manager's PodGC does (v1.36): terminated pods above a threshold,
//! terminating pods on out-of-service nodes, pods whose node is gone, and terminating pods that
//! were never scheduled. Beyond upstream:
//! compact caches, UID preconditions on every delete, parallel deletes under a limit that
//! adapts to the apiserver's answers, and an opt-in policy for terminated pods (a TTL and
//! per-namespace overrides, `policy.rs`).

pub mod apply;
#[cfg(test)]
mod apply_tests;
pub mod cache;
pub mod cycle;
#[cfg(test)]
mod cycle_tests;
pub mod decide;
#[cfg(test)]
mod decide_tests;
pub mod facts;
#[cfg(test)]
mod facts_tests;
pub mod metrics;
pub mod notice;
pub mod outcome;
pub mod pending;
#[cfg(test)]
mod pending_tests;
pub mod policy;
#[cfg(test)]
mod policy_tests;
#[cfg(test)]
mod projection_tests;
pub mod quarantine;
pub mod recheck;
pub mod wire;
pub mod worker;

use std::{sync::Arc, time::Duration};

use clap::Args;
use groundskeeper_plumbing::{client::parse_duration, life::component::Crew, watch::cache::Health};

use crate::context::Context;
use apply::{Applier, KubeWrites};
use cycle::Cycle;
pub use decide::Mode;
use metrics::Metrics;
use quarantine::Quarantine;
use worker::Worker;

/// Its name in logs: kube-controller-manager's name for its PodGC.
pub const CONTROLLER_NAME: &str = "pod-garbage-collector-controller";

#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "PodGC controller")]
pub struct PodGcArgs {
    /// Which passes run: `all` (kube-controller-manager's four passes, and the TTL and
    /// namespace policy) or `ttl-only` (only the TTL and namespace policy, beside a
    /// kube-controller-manager whose PodGC cannot be turned off: --terminated-pod-gc-threshold
    /// is then not used, and no pod is deleted as out-of-service, orphaned or unscheduled).
    #[arg(
        long = "pod-gc-mode",
        env = "GROUNDSKEEPER_POD_GC_MODE",
        value_enum,
        default_value = "all"
    )]
    pub mode: Mode,

    /// Pause between the end of one PodGC cycle and the start of the next.
    #[arg(long = "pod-gc-period", visible_alias = "gc-period", env = "GROUNDSKEEPER_POD_GC_PERIOD",
          default_value = "20s", value_parser = positive_duration)]
    pub gc_period: Duration,

    /// Terminated pods (Succeeded, Failed, or no phase) kept before the oldest are deleted;
    /// 0 or less turns terminated-pod GC off.
    #[arg(
        long,
        env = "GROUNDSKEEPER_TERMINATED_POD_GC_THRESHOLD",
        default_value_t = 12500,
        allow_negative_numbers = true
    )]
    pub terminated_pod_gc_threshold: i64,

    /// Beyond upstream: a Succeeded or Failed pod is deleted once this long has passed since
    /// it terminated (its last container's finishedAt). 0 (the default) is off. Namespaces
    /// override it with the groundskeeper.dev/terminated-pod-ttl annotation (docs/podgc.md).
    #[arg(long, env = "GROUNDSKEEPER_TERMINATED_POD_TTL", default_value = "0s", value_parser = parse_duration)]
    pub terminated_pod_ttl: Duration,

    /// How long a node missing from the cache is left alone before a live GET decides whether
    /// its pods are orphans.
    #[arg(long = "pod-gc-orphan-quarantine", visible_alias = "orphan-quarantine",
          env = "GROUNDSKEEPER_POD_GC_ORPHAN_QUARANTINE", default_value = "40s", value_parser = parse_duration)]
    pub orphan_quarantine: Duration,

    /// Pod force-deletes in flight at once (each is a status patch and a delete, within the
    /// client's --kube-api-qps budget).
    #[arg(long = "pod-gc-concurrency", visible_alias = "gc-concurrency",
          env = "GROUNDSKEEPER_POD_GC_CONCURRENCY", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub gc_concurrency: u32,
}

/// The variables of the flags' former names, each with its new name: no longer read, so one set
/// would be ignored without a word.
const RETIRED_ENV: [(&str, &str); 3] = [
    ("GROUNDSKEEPER_GC_PERIOD", "GROUNDSKEEPER_POD_GC_PERIOD"),
    (
        "GROUNDSKEEPER_GC_CONCURRENCY",
        "GROUNDSKEEPER_POD_GC_CONCURRENCY",
    ),
    (
        "GROUNDSKEEPER_ORPHAN_QUARANTINE",
        "GROUNDSKEEPER_POD_GC_ORPHAN_QUARANTINE",
    ),
];

impl PodGcArgs {
    /// Refuses to start with a variable of a flag's former name set (`var` reads the
    /// environment), naming the variable to set instead.
    pub fn refuse_retired_env(var: impl Fn(&str) -> Option<String>) -> Result<(), String> {
        match RETIRED_ENV.iter().find(|(old, _)| var(old).is_some()) {
            Some((old, new)) => Err(format!(
                "{old} is no longer read: set {new} (or the flag) instead"
            )),
            None => Ok(()),
        }
    }
}

fn positive_duration(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err(format!("{s:?} must be longer than zero"));
    }
    Ok(d)
}

/// Runs PodGC until `ctx.base.token` is cancelled. Caches fill on every replica; cycles run only
/// on the leader.
pub async fn run(ctx: Context, args: PodGcArgs) -> anyhow::Result<()> {
    let metrics = Metrics::register(&ctx.base.registry)?;
    let cache::Watched {
        caches,
        flags,
        mut synced,
        task: watches,
    } = cache::start(&ctx.base);
    let health = Health::new(flags);
    let mut life = ctx.life(CONTROLLER_NAME);
    life.watches(watches);
    let cycle = Cycle {
        client: ctx.base.client.clone(),
        applier: Applier {
            health: health.clone(),
            live: Some(caches.clone()),
            ..Applier::new(
                Arc::new(KubeWrites::new(ctx.base.unretried_client.clone())),
                metrics.clone(),
                args.gc_concurrency as usize,
                ctx.base.dry_run,
                ctx.base.token.clone(),
                ctx.leadership.fence(),
            )
            .with_node_reads(Arc::new(recheck::KubeNodes::new(ctx.base.client.clone())))
        },
        quarantine: Quarantine::new(args.orphan_quarantine),
        mode: args.mode,
        threshold: args.terminated_pod_gc_threshold,
        ttl: Some(args.terminated_pod_ttl).filter(|d| !d.is_zero()),
        reported: notice::Reported::default(),
        events: ctx.events(notice::CONTROLLER),
    };
    let worker = Worker {
        cycle,
        caches,
        health,
        metrics,
        period: args.gc_period,
        token: ctx.base.token.clone(),
    };
    // Orphan detection must never run on a node cache that has not listed once.
    life.run(async move { synced.wait().await }, || {
        tracing::info!(
            mode = ?args.mode,
            gc_period = ?args.gc_period,
            threshold = args.terminated_pod_gc_threshold,
            orphan_quarantine = ?args.orphan_quarantine,
            concurrency = args.gc_concurrency,
            dry_run = ctx.base.dry_run,
            "podgc running"
        );
        Crew::default().task(worker.run())
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use testkit::cli::Flags;

    #[test]
    fn defaults_match_upstream() {
        let a = PodGcArgs::from_flags(&[]).unwrap();
        assert_eq!(a.gc_period, Duration::from_secs(20));
        assert_eq!(a.terminated_pod_gc_threshold, 12500);
        assert_eq!(a.orphan_quarantine, Duration::from_secs(40));
        assert_eq!(a.gc_concurrency, 16);
        assert_eq!(a.terminated_pod_ttl, Duration::ZERO, "the TTL is off");
    }

    #[test]
    fn values_parse() {
        let a = PodGcArgs::from_flags(&[
            "--gc-period=1s",
            "--terminated-pod-gc-threshold=-1",
            "--orphan-quarantine=0s",
            "--gc-concurrency=64",
            "--terminated-pod-ttl=2h",
        ])
        .unwrap();
        assert_eq!(a.terminated_pod_ttl, Duration::from_secs(7200));
        assert_eq!(a.gc_period, Duration::from_secs(1));
        assert_eq!(a.terminated_pod_gc_threshold, -1);
        assert_eq!(a.orphan_quarantine, Duration::ZERO);
        assert_eq!(a.gc_concurrency, 64);
    }

    /// The `--pod-gc-*` names, and the older names kept as aliases: a manifest written with
    /// either sets the same value.
    #[test]
    fn pod_gc_names_and_their_aliases() {
        for (new, old) in [
            ("--pod-gc-period=7s", "--gc-period=7s"),
            ("--pod-gc-orphan-quarantine=7s", "--orphan-quarantine=7s"),
            ("--pod-gc-concurrency=7", "--gc-concurrency=7"),
        ] {
            let (a, b) = (
                PodGcArgs::from_flags(&[new]).unwrap(),
                PodGcArgs::from_flags(&[old]).unwrap(),
            );
            let seven = |a: &PodGcArgs| {
                (
                    a.gc_period == Duration::from_secs(7),
                    a.orphan_quarantine == Duration::from_secs(7),
                    a.gc_concurrency == 7,
                )
            };
            assert_eq!(seven(&a), seven(&b), "{new} and {old}");
            assert_ne!(seven(&a), (false, false, false), "{new} set nothing");
        }
        assert_eq!(PodGcArgs::from_flags(&[]).unwrap().mode, Mode::All);
        let a = PodGcArgs::from_flags(&["--pod-gc-mode=ttl-only"]).unwrap();
        assert_eq!(a.mode, Mode::TtlOnly);
        let e = PodGcArgs::from_flags(&["--pod-gc-mode=sometimes"]).unwrap_err();
        assert!(e.contains("sometimes"), "{e}");
    }

    /// What each mode runs, over every sweep: `all` everything, `ttl-only` exactly the policy.
    #[test]
    fn ttl_only_runs_exactly_the_policy_sweeps() {
        for sweep in decide::Sweep::EVERY {
            assert!(Mode::All.runs(sweep), "{sweep:?}");
            assert_eq!(
                Mode::TtlOnly.runs(sweep),
                sweep.terminated_reason().is_some() && sweep != decide::Sweep::Terminated,
                "{sweep:?}"
            );
        }
        for sweep in decide::Sweep::ALL {
            assert!(
                !Mode::TtlOnly.runs(sweep),
                "upstream's {sweep:?} runs in ttl-only"
            );
        }
    }

    /// A variable of a former name refuses the start, naming the new one; the new names and an
    /// empty environment pass.
    #[test]
    fn retired_variables_are_refused_by_name() {
        for (old, new) in RETIRED_ENV {
            let e = PodGcArgs::refuse_retired_env(|k| (k == old).then(|| "5s".into())).unwrap_err();
            assert!(e.contains(old) && e.contains(new), "{e}");
            assert!(PodGcArgs::refuse_retired_env(|k| (k == new).then(|| "5s".into())).is_ok());
            // The new name is the flag's own variable.
            let flag = PodGcArgs::augment_args(clap::Command::new("x"));
            assert!(
                flag.get_arguments()
                    .any(|a| a.get_env().is_some_and(|e| e == new)),
                "{new} is no flag's variable"
            );
        }
        assert!(PodGcArgs::refuse_retired_env(|_| None).is_ok());
    }

    #[test]
    fn bad_values_are_named() {
        for (args, needle) in [
            (&["--gc-concurrency=0"][..], "0"),
            (&["--pod-gc-concurrency=0"][..], "0"),
            (&["--pod-gc-period=0s"][..], "0s"),
            (&["--gc-period=0s"][..], "0s"),
            (&["--gc-period=5x"][..], "5x"),
            (&["--orphan-quarantine=soon"][..], "soon"),
            (&["--terminated-pod-gc-threshold=many"][..], "many"),
            (&["--terminated-pod-ttl=1w"][..], "1w"),
            (&["--terminated-pod-ttl=-1h"][..], "-1h"),
        ] {
            let e = PodGcArgs::from_flags(args).unwrap_err();
            assert!(e.contains(needle), "{args:?}: {e}");
        }
    }
}
