//! The periodic (full) round under a steady stream of triggered ones: on paused tokio time
//! through [`run`], and as a property of the state machine over generated schedules (change
//! times, round lengths, round summaries that move the adaptive interval, orphan rechecks,
//! changes that need a full round): a full round follows the last one within the interval it
//! left plus one min interval, whatever triggers in between.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use testkit::rng::Rng;
use tokio::time::{Instant, sleep};

use super::decide::next_interval;
use super::model::Model;
use super::netlink::family::Family::V4;
use super::pass::round::RoundSummary;
use super::schedule::*;
use super::schedule_tests::{Ran, Watches, World, dns};
use super::test_support::{ms, secs};

/// The flags of the black-box case (`conntrack_schedule_cluster.rs`): gc-min 5 s, gc-max 15 s.
const BUSY: Timing = Timing {
    min_interval: Duration::from_secs(1),
    gc_min: Duration::from_secs(5),
    gc_max: Duration::from_secs(15),
};

/// The DNS service served by the `k`th backend of a long sequence: each `k` a model of its
/// own, so every change is one.
fn served_by(k: u32) -> Model {
    let mut m = Model::default();
    let backend: SocketAddr = format!("10.244.{}.{}:53", k / 200, k % 200 + 1)
        .parse()
        .unwrap();
    m[V4]
        .frontends
        .insert("10.96.0.10:53".parse().unwrap(), [backend].into());
    m
}

/// A change every second for `n` seconds, each to a model of its own.
async fn a_change_every_second(w: &World, n: u32) {
    for k in 1..=n {
        w.watches.set_model(served_by(k));
        w.changed.notify_one();
        sleep(secs(1)).await;
    }
}

/// When the full rounds (no focus) of `ran` started.
fn full_rounds(ran: &[Ran]) -> Vec<Duration> {
    ran.iter()
        .filter(|r| r.focus.is_none())
        .map(|r| r.at)
        .collect()
}

/// The flags of the black-box case (gc-max 15 s), with a change every second rather than every
/// 3 s, so a triggered round is due at every min interval; nothing deleted (the interval stays
/// 15 s). A full round every interval at the latest, and not more often than one min interval
/// early; a triggered round for every other change.
#[tokio::test(start_paused = true)]
async fn full_rounds_keep_their_interval_while_a_change_triggers_a_round_every_second() {
    let w = World {
        timing: BUSY,
        ..World::new(served_by(0))
    };
    let ran = w
        .drive(vec![(100, 0)], a_change_every_second(&w, 150))
        .await;
    let full = full_rounds(&ran);
    let gaps: Vec<Duration> = full.windows(2).map(|p| p[1] - p[0]).collect();
    assert!(full.len() >= 10, "full rounds at {full:?}");
    assert_eq!(full[0], COALESCE, "the first round looks at everything");
    for g in &gaps {
        assert!(
            (secs(14)..=secs(16)).contains(g),
            "15 s apart, give or take the 1 s min interval: {full:?}"
        );
    }
    let triggered = ran.len() - full.len();
    assert!(
        triggered >= 130,
        "{triggered} triggered rounds for 150 changes"
    );
    let at: Vec<Duration> = ran.iter().map(|r| r.at).collect();
    assert!(
        at.windows(2).all(|p| p[1] - p[0] >= secs(1)),
        "no round runs within the min interval of another: {at:?}"
    );
}

/// The defaults (gc-min 10 s, gc-max 5 min), every round deleting half of what it scans: the
/// periodic rounds alone adapt the interval (60 s, 30 s, 15 s, 8 s held at 10 s), the triggered
/// rounds every second in between neither adapt it nor put the periodic round off, and each
/// periodic round is the triggered round that came one min interval before it was due.
#[tokio::test(start_paused = true)]
async fn the_interval_adapts_on_periodic_rounds_alone_while_changes_keep_coming() {
    let w = World::new(served_by(0));
    let ran = w
        .drive(vec![(100, 50)], a_change_every_second(&w, 140))
        .await;
    let full = full_rounds(&ran);
    let gaps: Vec<Duration> = full.windows(2).map(|p| p[1] - p[0]).collect();
    assert_eq!(
        gaps,
        [
            secs(59),
            secs(29),
            secs(14),
            secs(9),
            secs(9),
            secs(9),
            secs(9)
        ],
        "full rounds at {full:?}"
    );
    assert_eq!(ran.len(), 140, "one round per change");
}

/// A periodic round skipped on a stale model is owed as a full round: the model changed
/// meanwhile, and the owed round still looks at everything (the skipped round would have).
#[tokio::test(start_paused = true)]
async fn a_periodic_round_skipped_on_a_stale_model_is_owed_as_a_full_one() {
    let w = World::new(dns(&[5]));
    let ran = w
        .drive(vec![(10, 0)], async {
            w.changed.notify_one();
            sleep(secs(1)).await;
            w.slices_fail();
            sleep(secs(68)).await; // the periodic round at 60.1 s is skipped
            assert_eq!(w.skipped(), 1);
            w.watches.set_model(dns(&[6]));
            w.slices_relisted();
            sleep(secs(2)).await;
        })
        .await;
    let at: Vec<Duration> = ran.iter().map(|r| r.at).collect();
    assert_eq!(at, [COALESCE, secs(69) + COALESCE]);
    assert_eq!(ran[1].focus, None, "the owed round is the skipped full one");
    assert_eq!(ran[1].model, dns(&[6]));
}

/// One generated schedule: the flags, when changes come, and what rounds report and take.
struct Schedule {
    timing: Timing,
    /// (when, what): a new model, the same model again, or other Node addresses (a change
    /// that needs a full round).
    changes: Vec<(Duration, Change)>,
    summaries: Vec<RoundSummary>,
    /// How long each round takes, under one min interval.
    lengths: Vec<Duration>,
    horizon: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Change {
    Backend,
    Same,
    NodeAddress,
}

fn schedule(seed: u64) -> Schedule {
    let rng = &mut Rng(seed);
    let min_interval = ms(rng.pick(&[500, 1000, 2000]));
    let gc_min = secs(rng.pick(&[5, 10]));
    let gc_max = gc_min.max(secs(rng.pick(&[5, 15, 60, 300])));
    let horizon = gc_max * 12;
    let mut changes = Vec::new();
    let mut t = Duration::ZERO;
    while t < horizon {
        // Bursts faster than the debounce, a change every min interval or so, and quiet
        // stretches in which only the periodic round runs.
        t += match rng.below(40) {
            0..=11 => ms(rng.below_u64(150)),
            12..=38 => ms(rng.below_u64(3 * min_interval.as_millis() as u64)),
            _ => ms(rng.below_u64(2 * gc_max.as_millis() as u64)),
        };
        let what = match rng.below(20) {
            0 => Change::NodeAddress,
            1..=3 => Change::Same,
            _ => Change::Backend,
        };
        changes.push((t, what));
    }
    let summaries = (0..4000)
        .map(|_| {
            let (scanned, deleted) =
                rng.pick(&[(100, 0), (100, 1), (100, 50), (100, 95), (1000, 1)]);
            RoundSummary {
                scanned,
                deleted,
                recheck_in: rng.chance(10).then(|| ms(100 + rng.below_u64(10_000))),
                ..RoundSummary::default()
            }
        })
        .collect();
    let lengths = (0..4000)
        .map(|_| ms(rng.below_u64(min_interval.as_millis() as u64)))
        .collect();
    Schedule {
        timing: Timing {
            min_interval,
            gc_min,
            gc_max,
        },
        changes,
        summaries,
        lengths,
        horizon,
    }
}

/// One round as the state machine handed it out.
#[derive(Debug)]
struct Round {
    start: Duration,
    end: Duration,
    full: bool,
    periodic: bool,
    /// The interval once the round was over.
    interval: Duration,
}

/// What the schedule's checks saw across seeds, so a generator that stops reaching a case
/// fails the test.
#[derive(Debug, Default)]
struct Tally {
    periodic: usize,
    other_full: usize,
    triggered: usize,
    /// Periodic rounds that started before their time (widened from a triggered one).
    widened: usize,
    /// Full rounds after which the interval was not what it was before.
    adapted: usize,
}

/// The models a schedule's changes make, and when each change was made.
struct Source {
    watches: Watches,
    backend: u32,
    node: u8,
    made: Vec<Duration>,
}

impl Source {
    fn model(backend: u32, node: u8) -> Model {
        let ip: IpAddr = format!("192.168.0.{node}").parse().unwrap();
        served_by(backend).with_node_ips(&[ip])
    }

    fn apply(&mut self, what: Change, at: Duration) {
        match what {
            Change::Backend => self.backend += 1,
            Change::NodeAddress => self.node = self.node.wrapping_add(1),
            Change::Same => return,
        }
        self.made.push(at);
        self.watches.set_model(Self::model(self.backend, self.node));
    }
}

/// Drives a [`Scheduler`] as [`run`] does, on simulated time: a change notifies it (delivered
/// after the round in progress, if any), and it wakes when it says. Returns the rounds and
/// when each model change was made.
fn simulate(sch: &Schedule) -> (Vec<Round>, Vec<Duration>) {
    let start = Instant::now();
    let mut src = Source {
        watches: Watches::new(Source::model(0, 0)),
        backend: 0,
        node: 0,
        made: Vec::new(),
    };
    let mut s = Scheduler::new(sch.timing, start);
    let mut rounds = Vec::new();
    let mut next = sch.changes.iter().peekable();
    let mut t = Duration::ZERO;
    loop {
        let wake = s.next_wake() - start;
        if let Some((at, what)) = next.next_if(|(at, _)| *at <= wake && *at < sch.horizon) {
            t = t.max(*at);
            src.apply(*what, *at);
            s.on_change(start + t);
            continue;
        }
        if wake >= sch.horizon {
            return (rounds, src.made);
        }
        t = t.max(wake);
        let Due::Round {
            focus, periodic, ..
        } = s.on_wake(start + t, &src.watches)
        else {
            assert!(
                s.next_wake() > start + t,
                "woke at {t:?} for nothing, again at once"
            );
            continue;
        };
        let i = rounds.len();
        let end = t + sch.lengths[i % sch.lengths.len()];
        // Changes made while the round runs: notified once it is over.
        let mut notified = false;
        while let Some((at, what)) = next.next_if(|(at, _)| *at <= end && *at < sch.horizon) {
            src.apply(*what, *at);
            notified = true;
        }
        let full = focus.is_none();
        s.on_round(
            start + end,
            periodic,
            full,
            &sch.summaries[i % sch.summaries.len()],
        );
        rounds.push(Round {
            start: t,
            end,
            full,
            periodic,
            interval: s.interval(),
        });
        t = end;
        if notified {
            s.on_change(start + t);
        }
    }
}

/// The rules over one generated schedule; `tally` counts what was exercised.
fn check(seed: u64, tally: &mut Tally) {
    let sch = schedule(seed);
    let (rounds, made) = simulate(&sch);
    let Timing {
        min_interval,
        gc_min,
        gc_max,
    } = sch.timing;
    let at = |r: &Round| format!("seed {seed} {:?}, round at {:?}", sch.timing, r.start);
    let mut last_full: Option<&Round> = None;
    let mut before = next_interval(secs(60), 0, 0, gc_min, gc_max);
    for (i, r) in rounds.iter().enumerate() {
        if let Some(prev) = last_full.filter(|_| r.full) {
            let gap = r.start - prev.end;
            assert!(
                gap <= prev.interval + min_interval,
                "{}: {gap:?} after the last full round, interval {:?}",
                at(r),
                prev.interval
            );
            if r.periodic {
                assert!(
                    gap + min_interval >= prev.interval,
                    "{}: periodic {gap:?} after the last full round, interval {:?}",
                    at(r),
                    prev.interval
                );
                tally.widened += usize::from(gap < prev.interval);
            }
        }
        if !r.full && i > 0 {
            assert!(
                r.start - rounds[i - 1].start >= min_interval,
                "{}: a triggered round within the min interval of the last round",
                at(r)
            );
        }
        match (r.periodic, r.full) {
            (true, _) => tally.periodic += 1,
            (false, true) => tally.other_full += 1,
            (false, false) => tally.triggered += 1,
        }
        // The periodic round alone adapts the interval, by Cilium's rule.
        let want = if r.periodic {
            let summary = &sch.summaries[i % sch.summaries.len()];
            next_interval(before, summary.scanned, summary.deleted, gc_min, gc_max)
        } else {
            before
        };
        assert_eq!(r.interval, want, "{}", at(r));
        tally.adapted += usize::from(r.interval != before);
        before = r.interval;
        if r.full {
            last_full = Some(r);
        }
    }
    // Every change is judged soon: a round starts after it (a change made when a round is due
    // is in its model) within the debounce, one min interval and the round it may have had to
    // wait for.
    let bound = COALESCE + min_interval * 2;
    for c in made {
        if c + bound >= sch.horizon {
            continue;
        }
        assert!(
            rounds.iter().any(|r| r.start >= c && r.start <= c + bound),
            "seed {seed} {:?}: no round within {bound:?} of the change at {c:?}",
            sch.timing
        );
    }
}

#[test]
fn a_full_round_follows_the_last_within_its_interval_plus_one_min_interval_whatever_triggers() {
    let mut tally = Tally::default();
    for seed in 0..200 {
        check(seed, &mut tally);
    }
    println!("{tally:?}");
    testkit::rng::reached(
        &[
            ("periodic rounds", tally.periodic, 6000),
            ("other full rounds", tally.other_full, 2500),
            ("triggered rounds", tally.triggered, 12_000),
            (
                "periodic rounds widened from a triggered one",
                tally.widened,
                500,
            ),
            ("full rounds that moved the interval", tally.adapted, 3000),
        ],
        &tally,
    );
}
