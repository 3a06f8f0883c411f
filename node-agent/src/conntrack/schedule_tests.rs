//! The scheduler driven by [`run`] on paused tokio time (as Cilium tests its CT GC loop), with
//! a fake model source and a fake round that records when it ran and what it looked at.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus::{IntCounterVec, Opts};
use tokio::sync::{Notify, oneshot};
use tokio::time::{Instant, sleep};

use super::model::changes::Changes;
use super::model::focus::{Focus, Scope};
use super::model::source::Models;
use super::model::{Addrs, Model};
use super::netlink::family::Family::V4;
use super::pass::round::RoundSummary;
use super::schedule::*;
use super::test_support::{ms, secs};
use super::worker::run;
use groundskeeper_plumbing::watch::cache::Seen;

pub(super) const HEALTHY: [Option<u64>; 5] = [Some(1); 5];

/// A DNS service on 10.96.0.10:53 served by `backends` (10.244.1.x:53).
pub(super) fn dns(backends: &[u8]) -> Model {
    let mut m = Model::default();
    m[V4].frontends.insert(
        "10.96.0.10:53".parse().unwrap(),
        backends
            .iter()
            .map(|b| format!("10.244.1.{b}:53").parse().unwrap())
            .collect(),
    );
    m
}

/// The watches as the test sets them.
pub(super) struct Watches {
    model: Mutex<Option<Model>>,
    health: Mutex<[Option<u64>; 5]>,
    builds: Mutex<usize>,
    /// What `changes_in` says after the next build.
    changes_in: Mutex<Option<Duration>>,
    /// The last model handed out (what the next one's changes are from); held, as the real
    /// source holds its model.
    last: Mutex<Arc<Model>>,
}

impl Watches {
    pub(super) fn new(model: Model) -> Self {
        Self {
            model: Mutex::new(Some(model)),
            health: Mutex::new(HEALTHY),
            builds: Mutex::new(0),
            changes_in: Mutex::new(None),
            last: Mutex::default(),
        }
    }

    pub(super) fn set_model(&self, m: Model) {
        *self.model.lock().unwrap() = Some(m);
    }

    pub(super) fn set_health(&self, h: [Option<u64>; 5]) {
        *self.health.lock().unwrap() = h;
    }

    fn builds(&self) -> usize {
        *self.builds.lock().unwrap()
    }
}

impl Models for Watches {
    fn model(&self) -> Option<(Arc<Model>, Changes, Seen)> {
        *self.builds.lock().unwrap() += 1;
        let h = self.health();
        if !h.is_current() {
            return None;
        }
        let m = Arc::new(self.model.lock().unwrap().clone()?);
        let mut last = self.last.lock().unwrap();
        let changes = Changes::between(&last, &m);
        *last = m.clone();
        Some((m, changes, h))
    }

    fn health(&self) -> Seen {
        Seen::from_epochs(*self.health.lock().unwrap())
    }

    fn unhealthy(&self) -> Vec<String> {
        vec!["conntrack/endpointslices (1s)".into()]
    }

    fn changes_in(&self) -> Option<Duration> {
        self.changes_in.lock().unwrap().take()
    }
}

/// One round as the fake saw it: when (since the start), periodic or not (the scheduler's
/// focus: `None` for a full round), over which model.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Ran {
    pub(super) at: Duration,
    pub(super) focus: Option<Focus>,
    pub(super) model: Model,
}

struct Recorder {
    start: Instant,
    ran: Arc<Mutex<Vec<Ran>>>,
    /// What each round reports, in order; the last one repeats.
    summaries: Vec<(usize, usize)>,
    /// What the first round says of orphans kept for their grace.
    recheck_in: Option<Duration>,
}

impl Rounds for Recorder {
    async fn round(
        &mut self,
        model: Arc<Model>,
        focus: Option<Focus>,
        _since: Option<Changes>,
    ) -> RoundSummary {
        let mut ran = self.ran.lock().unwrap();
        let i = ran.len().min(self.summaries.len().saturating_sub(1));
        ran.push(Ran {
            at: self.start.elapsed(),
            focus,
            model: (*model).clone(),
        });
        let (scanned, deleted) = self.summaries.get(i).copied().unwrap_or_default();
        RoundSummary {
            scanned,
            deleted,
            recheck_in: self.recheck_in.take(),
            ..RoundSummary::default()
        }
    }
}

/// The flags' defaults: --conntrack-min-interval 1s, --conntrack-gc-min 10s, --conntrack-gc-max 5m.
pub(super) const FLAGS: Timing = Timing {
    min_interval: Duration::from_secs(1),
    gc_min: Duration::from_secs(10),
    gc_max: Duration::from_secs(300),
};

/// What the scheduler sees and moves in a test: the watches, their change signal, the
/// `skipped` counter.
pub(super) struct World {
    pub(super) watches: Watches,
    pub(super) changed: Notify,
    pub(super) skipped: IntCounterVec,
    pub(super) timing: Timing,
    pub(super) recheck_in: Option<Duration>,
}

impl World {
    pub(super) fn new(model: Model) -> Self {
        Self {
            watches: Watches::new(model),
            changed: Notify::new(),
            skipped: IntCounterVec::new(Opts::new("skipped", "skipped"), &["reason"]).unwrap(),
            timing: FLAGS,
            recheck_in: None,
        }
    }

    pub(super) fn skipped(&self) -> u64 {
        self.skipped.with_label_values(&["stale-model"]).get()
    }

    /// The EndpointSlice watch fails: a model built before is stale from now on.
    pub(super) fn slices_fail(&self) {
        self.watches
            .set_health([Some(1), None, Some(1), Some(1), Some(1)]);
    }

    /// The EndpointSlice watch has relisted (a new health epoch); its InitDone wakes the
    /// scheduler.
    pub(super) fn slices_relisted(&self) {
        self.watches
            .set_health([Some(1), Some(2), Some(1), Some(1), Some(1)]);
        self.changed.notify_one();
    }

    /// Runs the scheduler until `script` ends, then stops it; returns the rounds that ran,
    /// each reporting the next of `summaries` (scanned, deleted).
    pub(super) async fn drive(
        &self,
        summaries: Vec<(usize, usize)>,
        script: impl std::future::Future<Output = ()>,
    ) -> Vec<Ran> {
        let start = Instant::now();
        let ran = Arc::new(Mutex::new(vec![]));
        let mut rounds = Recorder {
            start,
            ran: ran.clone(),
            summaries,
            recheck_in: self.recheck_in,
        };
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let stop = async move {
            let _ = stop_rx.await;
        };
        let driver = run(
            Scheduler::new(self.timing, start),
            &self.watches,
            &mut rounds,
            &self.changed,
            stop,
            &self.skipped,
        );
        let script = async move {
            script.await;
            let _ = stop_tx.send(());
        };
        tokio::join!(driver, script);
        ran.lock().unwrap().clone()
    }
}

/// The focus of a round after a change to the DNS service that took `ips` away.
fn focus(ips: &[&str]) -> Option<Focus> {
    let v4: HashSet<IpAddr> = ips.iter().map(|s| s.parse().unwrap()).collect();
    let mut f = Focus::default();
    f[V4] = Scope {
        frontends: ["10.96.0.10:53".parse().unwrap()].into(),
        node_ports: HashSet::new(),
        backends: v4,
    };
    Some(f)
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_changes_is_one_rebuild_and_one_round_after_the_debounce() {
    let w = World::new(dns(&[5, 6]));
    let ran = w
        .drive(vec![(10, 0)], async {
            for _ in 0..3 {
                w.changed.notify_one();
                sleep(ms(30)).await;
            }
            sleep(secs(1)).await;
        })
        .await;
    assert_eq!(w.watches.builds(), 1, "one rebuild for the burst");
    assert_eq!(
        ran,
        [Ran {
            at: COALESCE,
            focus: None,
            model: dns(&[5, 6])
        }],
        "the first round judges everything, 100 ms after the first event"
    );
}

#[tokio::test(start_paused = true)]
async fn triggered_rounds_are_min_interval_apart_and_focused_on_what_went() {
    let w = World::new(dns(&[5, 6]));
    let ran = w
        .drive(vec![(10, 0)], async {
            w.changed.notify_one();
            sleep(ms(300)).await;
            w.watches.set_model(dns(&[5]));
            w.changed.notify_one();
            sleep(secs(2)).await;
            // A change that leaves the model as it is runs nothing.
            w.changed.notify_one();
            sleep(secs(2)).await;
        })
        .await;
    let at: Vec<Duration> = ran.iter().map(|r| r.at).collect();
    assert_eq!(
        at,
        [COALESCE, COALESCE + secs(1)],
        "the second change is seen at 400 ms; its round waits for 1 s after the first"
    );
    assert_eq!(
        ran[1].focus,
        focus(&["10.244.1.6"]),
        "only the backend that went"
    );
    assert_eq!(ran[1].model, dns(&[5]));
}

#[tokio::test(start_paused = true)]
async fn the_periodic_interval_adapts_within_gc_min_and_gc_max() {
    // First interval 60 s. (scanned, deleted) -> next interval:
    // 50% deleted: 30 s; 1%: 45 s; none: 45 s; all: 4.5 s, held at gc-min 10 s; 0.1%: 15 s.
    let w = World::new(dns(&[5]));
    let summaries = vec![(100, 50), (100, 1), (100, 0), (100, 100), (1000, 1)];
    let ran = w.drive(summaries, sleep(secs(206))).await;
    let at: Vec<u64> = ran.iter().map(|r| r.at.as_secs()).collect();
    assert_eq!(at, [60, 90, 135, 180, 190, 205]);
    assert!(
        ran.iter().all(|r| r.focus.is_none()),
        "periodic rounds judge everything"
    );

    // Growing: held at gc-max.
    let w = World {
        timing: Timing {
            gc_max: secs(90),
            ..FLAGS
        },
        ..World::new(dns(&[5]))
    };
    let ran = w.drive(vec![(1000, 1)], sleep(secs(331))).await;
    let at: Vec<u64> = ran.iter().map(|r| r.at.as_secs()).collect();
    assert_eq!(
        at,
        [60, 150, 240, 330],
        "60 s, 1.5x = 90 s, then held at 90 s"
    );
}

#[tokio::test(start_paused = true)]
async fn a_round_skipped_on_a_stale_model_is_owed_until_the_model_is_current() {
    let w = World::new(dns(&[5]));
    let ran = w
        .drive(vec![(10, 0)], async {
            w.changed.notify_one();
            sleep(secs(1)).await;
            // The EndpointSlice watch fails; the periodic round at 60 s is skipped.
            w.watches
                .set_health([Some(1), None, Some(1), Some(1), Some(1)]);
            sleep(secs(69)).await;
            assert_eq!(w.skipped(), 1);
            // It relists (a new health epoch): the same model, now current, runs the owed
            // round at once, although nothing in it changed.
            w.watches
                .set_health([Some(1), Some(2), Some(1), Some(1), Some(1)]);
            w.changed.notify_one();
            sleep(secs(1)).await;
        })
        .await;
    let at: Vec<Duration> = ran.iter().map(|r| r.at).collect();
    assert_eq!(at, [COALESCE, secs(70) + COALESCE]);
    assert_eq!(w.skipped(), 1);
}

#[tokio::test(start_paused = true)]
async fn nothing_runs_before_the_watches_have_listed() {
    let w = World::new(dns(&[5]));
    w.watches.set_health([None; 5]);
    let ran = w.drive(vec![], sleep(secs(130))).await;
    assert!(ran.is_empty());
    assert_eq!(w.skipped(), 0, "no model yet is not a skip");
}

#[tokio::test(start_paused = true)]
async fn cancellation_stops_the_scheduler_with_a_round_pending() {
    let w = World::new(dns(&[5]));
    let start = Instant::now();
    let ran = w
        .drive(vec![(10, 0)], async {
            w.changed.notify_one();
            sleep(ms(50)).await; // stopped before the debounce is over
        })
        .await;
    assert!(ran.is_empty());
    assert_eq!(start.elapsed(), ms(50), "stopped at once");
}

/// What must NOT happen: a round due while an event is still in its debounce runs on the
/// model from before that event. Here a backend goes, its round is due at 1.1 s, and the
/// backend comes back at 1.05 s: the round must see it serving, not delete its flows.
#[tokio::test(start_paused = true)]
async fn a_due_round_never_runs_on_a_model_older_than_an_event_seen() {
    let w = World::new(dns(&[5, 6]));
    let ran = w
        .drive(vec![(10, 0)], async {
            w.changed.notify_one();
            sleep(ms(300)).await;
            w.watches.set_model(dns(&[5]));
            w.changed.notify_one();
            sleep(ms(750)).await; // 1.05 s: 6 is back, 50 ms before the round is due
            w.watches.set_model(dns(&[5, 6]));
            w.changed.notify_one();
            sleep(secs(2)).await;
        })
        .await;
    assert_eq!(ran.len(), 2, "{ran:?}");
    assert_eq!(
        ran[1].model,
        dns(&[5, 6]),
        "the round waits for no debounce: it rebuilds first"
    );
    let six: IpAddr = "10.244.1.6".parse().unwrap();
    assert!(
        ran[1]
            .focus
            .as_ref()
            .is_none_or(|f| !f[V4].backends.contains(&six)),
        "{:?}",
        ran[1].focus
    );
}

/// A service port without endpoints settles by time alone: the scheduler rebuilds the model
/// when `changes_in` says, without any watch event, and the change runs a triggered round.
#[tokio::test(start_paused = true)]
async fn a_model_that_changes_by_time_alone_is_rebuilt_then() {
    let w = World::new(dns(&[5, 6]));
    *w.watches.changes_in.lock().unwrap() = Some(secs(5));
    let ran = w
        .drive(vec![(10, 0)], async {
            w.changed.notify_one();
            sleep(secs(2)).await;
            // What the next build will say, with no event (the port has settled by then).
            w.watches.set_model(dns(&[5]));
            sleep(secs(5)).await;
        })
        .await;
    let at: Vec<Duration> = ran.iter().map(|r| r.at).collect();
    assert_eq!(at, [COALESCE, COALESCE + secs(5)], "{ran:?}");
    assert_eq!(ran[1].model, dns(&[5]));
    assert_eq!(ran[1].focus, focus(&["10.244.1.6"]));
    assert_eq!(
        w.watches.builds(),
        2,
        "one build at the settle, none in between"
    );
}

/// Flows to an orphaned service IP kept for their grace are deleted by a full round when the
/// grace ends, not one periodic interval later.
#[tokio::test(start_paused = true)]
async fn orphans_kept_for_their_grace_are_rechecked_when_it_ends() {
    let w = World {
        recheck_in: Some(secs(5)),
        ..World::new(dns(&[5]))
    };
    let ran = w
        .drive(vec![(10, 0)], async {
            w.changed.notify_one();
            sleep(secs(10)).await;
        })
        .await;
    let at: Vec<Duration> = ran.iter().map(|r| r.at).collect();
    assert_eq!(at, [COALESCE, COALESCE + secs(5)]);
    assert!(ran.iter().all(|r| r.focus.is_none()), "both full rounds");
}

/// A triggered round in between neither consumes a recheck a grace asked for nor puts it off:
/// the full round still runs when the grace ends.
#[tokio::test(start_paused = true)]
async fn a_triggered_round_in_between_keeps_the_recheck_due() {
    let w = World {
        recheck_in: Some(secs(5)),
        ..World::new(dns(&[5]))
    };
    let ran = w
        .drive(vec![(10, 0)], async {
            w.changed.notify_one();
            sleep(secs(2)).await;
            w.watches.set_model(dns(&[5, 6]));
            w.changed.notify_one();
            sleep(secs(6)).await;
        })
        .await;
    let at: Vec<Duration> = ran.iter().map(|r| r.at).collect();
    assert_eq!(ran.len(), 3, "{at:?}");
    assert!(ran[1].focus.is_some(), "the change runs a triggered round");
    assert_eq!(at[2], COALESCE + secs(5), "the recheck when the grace ends");
    assert!(ran[2].focus.is_none(), "the recheck is a full round");
}

/// A frontend whose service has no serving endpoint (settled): flows through it can appear at
/// any time and are all stale, and the model does not change when they do. So a watch event
/// that leaves the model as it is still runs a triggered round, over that frontend alone, and
/// every triggered round looks at it besides what its change touched.
#[tokio::test(start_paused = true)]
async fn a_frontend_without_endpoints_is_in_every_triggered_round() {
    let unserved: std::net::SocketAddr = "10.96.0.20:53".parse().unwrap();
    let with_unserved = |backends: &[u8]| {
        let mut m = dns(backends);
        m[V4].frontends.insert(unserved, Addrs::default());
        m
    };
    let w = World::new(with_unserved(&[5, 6]));
    let ran = w
        .drive(vec![(10, 0)], async {
            w.changed.notify_one();
            sleep(secs(2)).await;
            // An event that changes nothing in the model (another slice of the same service
            // naming a port it does not have, say).
            w.changed.notify_one();
            sleep(secs(2)).await;
            w.watches.set_model(with_unserved(&[5]));
            w.changed.notify_one();
            sleep(secs(2)).await;
        })
        .await;
    let at: Vec<Duration> = ran.iter().map(|r| r.at).collect();
    assert_eq!(
        at,
        [COALESCE, secs(2) + COALESCE, secs(4) + COALESCE],
        "the unchanged model still runs a round"
    );
    let mut alone = Focus::default();
    alone[V4].frontends.insert(unserved);
    assert_eq!(
        ran[1].focus,
        Some(alone),
        "the frontend without endpoints alone"
    );
    let mut with_change = focus(&["10.244.1.6"]).unwrap();
    with_change[V4].frontends.insert(unserved);
    assert_eq!(
        ran[2].focus,
        Some(with_change),
        "what the change touched, and the frontend without endpoints"
    );
}

/// Without a frontend lacking endpoints, an event that changes nothing runs nothing.
#[tokio::test(start_paused = true)]
async fn an_unchanged_model_with_every_frontend_served_runs_nothing() {
    let w = World::new(dns(&[5]));
    let ran = w
        .drive(vec![(10, 0)], async {
            w.changed.notify_one();
            sleep(secs(2)).await;
            w.changed.notify_one();
            sleep(secs(2)).await;
        })
        .await;
    assert_eq!(ran.len(), 1, "{ran:?}");
}
