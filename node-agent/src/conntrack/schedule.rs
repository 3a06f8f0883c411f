//! When rounds run: soon after the UDP model changes (watch events debounced, at most one
//! triggered round per --conntrack-min-interval, scoped to what the change touched; a change
//! no UDP flow is judged by runs none), and on Cilium's adaptive periodic timer, which only a
//! full round starts over: triggered rounds never put the periodic one off, and one that comes
//! when the periodic round is due or nearly due is widened into it. Never on a stale model,
//! and a round skipped for that is owed until a current model exists. A state machine over
//! explicit instants, driven by the worker (`worker::run`).

use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use groundskeeper_plumbing::watch::cache::Seen;

use super::decide::next_interval;
use super::model::Model;
use super::model::changes::{Changes, Trigger};
use super::model::focus::Focus;
use super::model::source::{Models, Skip};
use super::netlink::family::Family;
use super::pass::round::RoundSummary;

/// Debounce of watch events before the model is rebuilt and compared.
pub const COALESCE: Duration = Duration::from_millis(100);

/// The first periodic interval (clamped to the flags' bounds).
const FIRST_INTERVAL: Duration = Duration::from_secs(60);

/// The flags that time rounds.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Least time between two triggered rounds (--conntrack-min-interval).
    pub min_interval: Duration,
    pub gc_min: Duration,
    pub gc_max: Duration,
}

/// What runs a round: the kernel passes (and the fill Event), or a test's fake.
pub trait Rounds {
    /// `since`: what changed since the model the last round judged (`None` for the first).
    fn round(
        &mut self,
        model: Arc<Model>,
        focus: Option<Focus>,
        since: Option<Changes>,
    ) -> impl Future<Output = RoundSummary> + Send;
}

/// What is due when the scheduler wakes.
#[derive(Debug, PartialEq)]
pub enum Due {
    Nothing,
    /// A round was due but the model may be stale: nothing is deleted, the round is owed.
    Skipped {
        skip: Skip,
        periodic: bool,
    },
    /// A round over `model`; `focus` narrows a triggered one to what the change touched
    /// (`None`: a full round).
    Round {
        model: Arc<Model>,
        focus: Option<Box<Focus>>,
        /// The periodic round (due, nearly due, or owed): it adapts the interval.
        periodic: bool,
        /// What changed since the model the last round judged (`None` before the first).
        since: Option<Box<Changes>>,
    },
}

pub struct Scheduler {
    timing: Timing,
    /// The periodic interval, adapted after each periodic round.
    interval: Duration,
    /// The last model built, with the watch health it was built at. Weak: the model source
    /// alone holds it between rounds, so its next update changes it in place instead of
    /// copying it whole (it then moves, and this no longer upgrades; see `on_wake`).
    current: Option<(Weak<Model>, Seen)>,
    rebuild_at: Option<Instant>,
    pass_at: Option<Instant>,
    last_pass: Option<Instant>,
    /// What changed since the model the last round judged (a triggered round looks at that);
    /// `None` before the first round.
    judged: Option<Changes>,
    /// When the periodic round is due: one interval after the last full round ended. Only a
    /// full round sets it (or a periodic one skipped or due before the first model).
    gc_at: Instant,
    /// When the model changes by time alone (see [`Models::changes_in`]).
    settle_at: Option<Instant>,
    /// When flows to orphaned service IPs that a round kept finish their grace: a full round
    /// then deletes them instead of waiting for the periodic one.
    recheck_at: Option<Instant>,
    /// A round was skipped on a stale model: run one as soon as a current model exists, even
    /// if it equals the old one (what the skipped round would have cleaned is still there).
    owed: bool,
    /// The round skipped was a full one: the owed round is the periodic one.
    owed_full: bool,
}

impl Scheduler {
    pub fn new(timing: Timing, now: Instant) -> Self {
        let interval = FIRST_INTERVAL.clamp(timing.gc_min, timing.gc_max);
        Self {
            timing,
            interval,
            current: None,
            rebuild_at: None,
            pass_at: None,
            last_pass: None,
            judged: None,
            gc_at: now + interval,
            settle_at: None,
            recheck_at: None,
            owed: false,
            owed_full: false,
        }
    }

    /// A watch event that may change the model: rebuild once the burst is over.
    pub fn on_change(&mut self, now: Instant) {
        self.rebuild_at.get_or_insert(now + COALESCE);
    }

    /// The next instant something may be due.
    pub fn next_wake(&self) -> Instant {
        [
            self.rebuild_at,
            self.pass_at,
            self.settle_at,
            self.recheck_at,
            Some(self.gc_at),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(self.gc_at)
    }

    /// The periodic interval now.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Rebuilds the model when that is due, then says whether a round is.
    pub fn on_wake(&mut self, now: Instant, models: &impl Models) -> Due {
        // A periodic round also rebuilds: remembered deleted frontends expire with time alone.
        // A round that is due never waits out a debounce: it would run on a model older than
        // an event already seen (a backend back, whose flows it would delete).
        let due = |t: Option<Instant>| t.is_some_and(|t| t <= now);
        let full = self.gc_at <= now || due(self.recheck_at);
        let round_due = full || due(self.pass_at);
        if full || due(self.settle_at) || (round_due && self.rebuild_at.is_some()) {
            self.rebuild_at = Some(now);
        }
        if due(self.rebuild_at) {
            self.rebuild_at = None;
            // Consumed even if the watches are not healthy: their recovery asks for a rebuild.
            self.settle_at = None;
            if let Some((m, changes, stamp)) = models.model() {
                self.rebuilt(now, &m, changes, stamp);
                self.settle_at = models.changes_in().map(|d| now + d);
            }
        }
        let recheck = due(self.recheck_at);
        if !(self.gc_at <= now || recheck || due(self.pass_at)) {
            return Due::Nothing;
        }
        // A round due when the periodic one is due within a min interval is the periodic one
        // (full): triggered rounds coming every min interval can neither put it off nor run
        // right before it.
        let periodic = self.gc_at <= now + self.timing.min_interval || self.owed_full;
        if periodic || recheck {
            // This round is the full one the recheck asked for; a triggered round leaves it due.
            self.recheck_at = None;
        }
        let Some((held, stamp)) = self.current.clone() else {
            self.gc_at = now + self.interval; // not listed yet
            return Due::Nothing;
        };
        self.pass_at = None;
        // The model moves only when the source updated it without handing it out, which it
        // does only when the watches' health changed meanwhile: the stamp is stale then too.
        let model = held.upgrade();
        let Some(model) = model.filter(|_| stamp.may_act(&models.health()).is_ok()) else {
            let skip = Skip::StaleModel;
            self.owed = true;
            if periodic || recheck {
                // Owed as a full round; not due again before then (its time has passed).
                self.owed_full = true;
                self.gc_at = self.gc_at.max(now + self.interval);
            }
            // A rebuild is due once the watches are back (their InitDone asks for one).
            return Due::Skipped { skip, periodic };
        };
        self.last_pass = Some(now);
        if periodic {
            self.owed_full = false;
        }
        // A triggered round looks only at what changed since the model the last round judged;
        // a periodic round, an orphan recheck and the first round at everything.
        let since_judged = self.judged.replace(Changes::default());
        let focus = (!periodic && !recheck)
            .then(|| {
                since_judged
                    .as_ref()
                    .and_then(|c| c.triggered_focus(&model).map(Box::new))
            })
            .flatten();
        Due::Round {
            model,
            focus,
            periodic,
            since: since_judged.map(Box::new),
        }
    }

    /// `changes`: what changed since the last model handed out (the one in `current`).
    fn rebuilt(&mut self, now: Instant, m: &Arc<Model>, changes: Changes, stamp: Seen) {
        let earliest = self
            .last_pass
            .map_or(now, |t| t + self.timing.min_interval)
            .max(now);
        let trigger = match self.current {
            None => Trigger::Change, // the first model
            Some(_) => changes.trigger(m),
        };
        if let Some(judged) = self.judged.as_mut() {
            judged.merge(changes);
        }
        // Same model (a copy equal to it, or itself), confirmed by a current list: it is
        // current again.
        self.current = Some((Arc::downgrade(m), stamp));
        match trigger {
            Trigger::Change => {
                tracing::debug!(
                    ipv4_frontends = m[Family::V4].frontends.len(),
                    ipv6_frontends = m[Family::V6].frontends.len(),
                    "UDP service model changed"
                );
                self.pass_at.get_or_insert(earliest);
            }
            // A service without serving endpoints: an event about UDP services is a sync for
            // kube-proxy, which then deletes flows through it; a triggered round looks at them
            // (alone, as nothing else changed).
            Trigger::Unserved if Family::ALL.into_iter().any(|f| m[f].has_unserved()) => {
                self.pass_at.get_or_insert(earliest);
            }
            // Nothing a UDP flow is judged by (a TCP-only Service, its IPAddress): no round.
            Trigger::Unserved | Trigger::Nothing => {}
        }
        if std::mem::take(&mut self.owed) {
            self.pass_at.get_or_insert(earliest);
        }
    }

    /// A round ended at `now`: a periodic one adapts the interval; after a full one (`full`:
    /// it looked at everything) the next periodic round is one interval from now. A triggered
    /// round leaves the periodic one when it was.
    pub fn on_round(&mut self, now: Instant, periodic: bool, full: bool, summary: &RoundSummary) {
        if periodic {
            self.interval = next_interval(
                self.interval,
                summary.scanned,
                summary.deleted,
                self.timing.gc_min,
                self.timing.gc_max,
            );
        }
        if periodic || full {
            self.gc_at = now + self.interval;
        }
        if let Some(d) = summary.recheck_in {
            let at = now + d;
            self.recheck_at = Some(self.recheck_at.map_or(at, |r| r.min(at)));
        }
    }
}
