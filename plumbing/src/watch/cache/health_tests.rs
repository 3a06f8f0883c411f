//! The rule of [`super::Health`] over generated histories of real watch flags: any watch not
//! listed, failing, relisting or silent when the cache was read or now, or any change of a
//! watch's health in between, forbids acting; otherwise acting is allowed.

use std::time::Duration;

use tokio::time::Instant;

use testkit::rng::Rng;

use super::{Health, Seen, Stale};
use crate::{Readiness, ReadyFlag};

/// What the plumbing does to a watch's flag.
#[derive(Debug, Clone, Copy)]
enum Op {
    /// A full list applied (`InitDone` folded in).
    Listed,
    /// A list began (`Init`).
    Relisting,
    /// A watch or list error.
    Failed,
    /// No event or bookmark past `--watch-silent-after`.
    Silent,
}

const OPS: [Op; 4] = [Op::Listed, Op::Relisting, Op::Failed, Op::Silent];

/// The reference: a watch's state as the docs define it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Model {
    listed: bool,
    failing: bool,
    relisting: bool,
}

impl Model {
    fn healthy(self) -> bool {
        self.listed && !self.failing && !self.relisting
    }

    fn after(mut self, op: Op) -> Self {
        match op {
            Op::Listed => {
                self = Model {
                    listed: true,
                    failing: false,
                    relisting: false,
                }
            }
            Op::Relisting => self.relisting = true,
            Op::Failed | Op::Silent => self.failing = true,
        }
        self
    }
}

fn apply(flag: &ReadyFlag, op: Op) {
    match op {
        Op::Listed => flag.mark_ready(),
        Op::Relisting => flag.relist_started(),
        Op::Failed => flag.failed(&"connection refused", Duration::from_millis(200)),
        Op::Silent => flag.silent_since(&"no event or bookmark", Instant::now()),
    }
}

/// A read of the cache, with what the reference says about it.
struct Read {
    seen: Seen,
    all_healthy: bool,
    changed: bool,
}

#[test]
fn acts_only_on_what_every_watch_kept_current_since_it_was_read() {
    let (mut allowed, mut refused) = (0, 0);
    for seed in 0..400u64 {
        let mut rng = Rng(seed);
        let readiness = Readiness::default();
        let n = 1 + rng.below_u64(5) as usize;
        let flags: Vec<ReadyFlag> = (0..n)
            .map(|i| readiness.register(format!("c/w{i}")))
            .collect();
        let health = Health::new(flags.clone());
        let mut models = vec![Model::default(); n];
        let mut reads: Vec<Read> = Vec::new();
        // Mostly lists, so that all-healthy states are common.
        for step in 0..60 {
            match rng.below_u64(10) {
                0..=5 => {
                    let i = rng.below_u64(n as u64) as usize;
                    let op = if rng.below_u64(2) == 0 {
                        Op::Listed
                    } else {
                        OPS[rng.below_u64(4) as usize]
                    };
                    apply(&flags[i], op);
                    let before = models[i];
                    models[i] = before.after(op);
                    if models[i] != before {
                        reads.iter_mut().for_each(|r| r.changed = true);
                    }
                }
                6..=7 => reads.push(Read {
                    seen: health.seen(),
                    all_healthy: models.iter().all(|m| m.healthy()),
                    changed: false,
                }),
                _ => {}
            }
            let now_healthy = models.iter().all(|m| m.healthy());
            assert_eq!(health.is_current(), now_healthy, "seed {seed} step {step}");
            assert_eq!(
                health.listed(),
                models.iter().all(|m| m.listed),
                "seed {seed} step {step}"
            );
            assert_eq!(
                health.unhealthy().len(),
                models.iter().filter(|m| !m.healthy()).count(),
                "seed {seed} step {step}"
            );
            for (k, r) in reads.iter().enumerate() {
                let got = health.may_act(&r.seen);
                let want = if !r.all_healthy || !now_healthy {
                    Err(Stale::NotHealthy)
                } else if r.changed {
                    Err(Stale::ChangedSince)
                } else {
                    Ok(())
                };
                assert_eq!(
                    got, want,
                    "seed {seed} step {step} read {k}: models {models:?}"
                );
                if got.is_ok() {
                    allowed += 1;
                } else {
                    refused += 1;
                }
            }
        }
    }
    // The generator reaches both answers often, or the property says little.
    assert!(allowed > 1000 && refused > 1000, "{allowed} / {refused}");
}

#[test]
fn a_watch_not_yet_listed_forbids_acting_and_listing_allows_it() {
    let readiness = Readiness::default();
    let (a, b) = (readiness.register("c/a"), readiness.register("c/b"));
    let health = Health::new([a.clone(), b.clone()]);
    a.mark_ready();
    let early = health.seen();
    assert_eq!(health.may_act(&early), Err(Stale::NotHealthy));
    assert!(!health.listed());
    b.mark_ready();
    assert!(health.listed());
    assert_eq!(
        health.may_act(&early),
        Err(Stale::NotHealthy),
        "read too early"
    );
    let seen = health.seen();
    assert_eq!(health.may_act(&seen), Ok(()));
    b.silent_since(&"no bookmark", Instant::now());
    assert_eq!(health.may_act(&seen), Err(Stale::NotHealthy), "silent");
    assert_eq!(health.unhealthy().len(), 1);
    assert!(health.unhealthy()[0].starts_with("c/b ("));
    b.mark_ready();
    assert_eq!(health.may_act(&seen), Err(Stale::ChangedSince), "relisted");
    assert!(health.listed(), "a failure does not undo the first list");
}

#[test]
fn no_watches_may_always_act() {
    let health = Health::default();
    assert_eq!(health.may_act(&health.seen()), Ok(()));
    assert_eq!(
        Seen::from_epochs([Some(1), None]).may_act(&Seen::from_epochs([Some(1), None])),
        Err(Stale::NotHealthy)
    );
    assert_eq!(
        Seen::from_epochs([Some(1)]).may_act(&Seen::from_epochs([Some(1), Some(1)])),
        Err(Stale::NotHealthy),
        "a different set of watches"
    );
}
