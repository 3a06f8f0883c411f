//! The unseen-backend rule over generated histories, without a kernel: a proxy that programs
//! every EndpointSlice change at once, an agent whose model lags it by less than the grace, and
//! passes at random times, triggered (scoped to the frontend) or full, with the full passes a
//! grace asks for as the scheduler makes them. A flow to a backend that serves in the proxy's
//! world is never deleted; a flow to a backend the agent saw stop serving goes in the first
//! pass after that; a triggered pass never deletes a flow to a backend never seen serving, and
//! every such flow is gone once the history is over.
//!
//! Histories with flapping readiness re-use backends: a backend the agent saw removed and then
//! saw serving again is never "seen removed" until a later removal, and its flows are kept
//! whenever the agent sees it serve. The one exception is the window docs/conntrack.md names:
//! a backend back in the proxy's world whose return the agent has not seen yet (its flows are
//! judged by its earlier turn).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use testkit::rng::Rng;

use super::removed::Key;
use crate::conntrack::model::FamilyModel;
use crate::conntrack::model::focus::Scope;
use crate::conntrack::netlink::family::Family::V4;
use crate::conntrack::netlink::msg::{Entry, IPPROTO_UDP};
use crate::conntrack::pass::{PassState, run_focused_pass};
use crate::conntrack::test_support::KernelLike;

const GRACE: Duration = Duration::from_secs(5);

fn frontend() -> SocketAddr {
    "10.96.0.10:53".parse().unwrap()
}

fn backend(i: usize) -> SocketAddr {
    SocketAddr::new([10, 244, (i / 200) as u8, (i % 200) as u8 + 1].into(), 53)
}

/// The flow a client makes to `b` once the proxy DNATs to it.
fn flow(b: SocketAddr) -> Entry {
    let client = SocketAddr::new([10, 0, 0, 1].into(), 40000);
    Entry {
        id: Some(1),
        ..Entry::dnat(IPPROTO_UDP, client, frontend(), b)
    }
}

fn model(serving: &BTreeSet<SocketAddr>) -> FamilyModel {
    let mut m = FamilyModel::default();
    m.frontends
        .insert(frontend(), serving.iter().copied().collect());
    m
}

/// The proxy's serving set after each change, in time order; the first always serves (the
/// zero-endpoint rule is another one). Without `flapping`, backends are never re-used (a
/// rollout's new pods get new addresses); with it, an added backend is often one removed
/// before (a pod whose readiness flaps keeps its IP).
struct History(Vec<(Duration, BTreeSet<SocketAddr>)>);

impl History {
    fn generate(rng: &mut Rng, steps: usize, flapping: bool) -> Self {
        let mut serving: BTreeSet<SocketAddr> = [backend(0)].into();
        let mut gone: Vec<SocketAddr> = Vec::new();
        let mut next = 1;
        let mut at = Duration::ZERO;
        let mut out = vec![(at, serving.clone())];
        for _ in 0..steps {
            at += Duration::from_millis(rng.below_u64(3000));
            let removable: Vec<SocketAddr> = serving.iter().copied().skip(1).collect();
            if removable.is_empty() || rng.chance(55) {
                if flapping && !gone.is_empty() && rng.chance(60) {
                    let back = gone.swap_remove(rng.below(gone.len()));
                    serving.insert(back);
                } else {
                    serving.insert(backend(next));
                    next += 1;
                }
            } else {
                let b = rng.pick(&removable);
                serving.remove(&b);
                gone.push(b);
            }
            out.push((at, serving.clone()));
        }
        Self(out)
    }

    /// Whether `b` was removed at least once by `t` (and so, serving at `t`, is back).
    fn came_back(&self, b: SocketAddr, t: Duration) -> bool {
        let mut served = false;
        for (_, s) in self.0.iter().take_while(|(at, _)| *at <= t) {
            if s.contains(&b) {
                served = true;
            } else if served {
                return true;
            }
        }
        false
    }

    /// The serving set as of `t`.
    fn at(&self, t: Duration) -> &BTreeSet<SocketAddr> {
        let i = self.0.partition_point(|(at, _)| *at <= t);
        &self.0[i.saturating_sub(1)].1
    }
}

#[test]
fn a_lagging_agent_never_deletes_a_serving_flow_and_a_seen_removal_goes_at_once() {
    for seed in 0..300u64 {
        check(seed, false);
    }
}

#[test]
fn a_flapping_backend_seen_serving_again_is_not_remembered_removed() {
    for seed in 0..300u64 {
        check(seed, true);
    }
}

fn check(seed: u64, flapping: bool) {
    {
        let mut rng = Rng(seed);
        let history = History::generate(&mut rng, 40, flapping);
        let lag = Duration::from_millis(rng.below_u64(GRACE.as_millis() as u64 - 200));
        let start = Instant::now();
        let mut state = PassState {
            orphan_grace: GRACE,
            ..PassState::default()
        };
        let mut table = KernelLike::default();
        let mut judged: Option<BTreeSet<SocketAddr>> = None;
        // Every backend a model the agent judged showed serving.
        let mut seen_serving: BTreeSet<SocketAddr> = BTreeSet::new();
        let mut recheck_at: Option<Duration> = None;
        let scope = Scope {
            frontends: [frontend()].into(),
            ..Scope::default()
        };
        let end = history.0.last().unwrap().0 + GRACE * 2;
        let mut t = Duration::ZERO;
        while t <= end {
            // The proxy programs what serves now; its clients' flows appear.
            let proxy = history.at(t);
            for b in proxy {
                if !table.entries.contains(&flow(*b)) {
                    table.entries.push(flow(*b));
                }
            }
            // A round: the agent's model is the proxy's world `lag` ago.
            let agent = history.at(t.saturating_sub(lag)).clone();
            let now = start + t;
            if let Some(old) = &judged {
                state
                    .graces
                    .removed
                    .observe(&model(old), &model(&agent), now);
            }
            // What the agent sees serve is never remembered as removed, however often it
            // came and went before.
            for b in &agent {
                assert!(
                    !state.graces.removed.saw(Key::Frontend(frontend()), *b),
                    "seed {seed}, at {t:?}: {b} serves in the agent's model and is still \
                     remembered removed"
                );
            }
            // Full when a grace asked for it, or now and then (the periodic one).
            let full = recheck_at.is_some_and(|r| r <= t) || rng.chance(20);
            let before = table.entries.clone();
            let report = run_focused_pass(
                &mut table,
                V4,
                &model(&agent),
                &mut state,
                (!full).then_some(&scope),
                now,
            )
            .unwrap();
            if full {
                recheck_at = None;
            }
            if let Some(d) = report.orphans_due_in {
                let at = t + d;
                recheck_at = Some(recheck_at.map_or(at, |r| r.min(at)));
            }
            if !full {
                for e in before.iter().filter(|e| !table.entries.contains(e)) {
                    let b = SocketAddr::new(e.reply.src, e.reply.src_port);
                    // Re-used, a backend may be back and gone again between two rounds: seen
                    // serving before that is what counts.
                    let seen = judged.as_ref().is_some_and(|j| j.contains(&b))
                        || (flapping && seen_serving.contains(&b));
                    assert!(
                        seen,
                        "seed {seed}, at {t:?}: a triggered pass deleted the flow to {b}, never \
                         seen serving"
                    );
                }
            }
            for b in proxy {
                // The window docs/conntrack.md names: back in the proxy's world after a
                // removal, while the agent does not see it back yet. Its flows are judged by
                // its earlier turn: seen removed then, or looked unseen since then.
                if !agent.contains(b) && history.came_back(*b, t) {
                    continue;
                }
                assert!(
                    table.entries.contains(&flow(*b)),
                    "seed {seed}, lag {lag:?}, at {t:?}: the flow to {b}, serving in the proxy's \
                     world, was deleted"
                );
            }
            for b in judged.iter().flatten().filter(|b| !agent.contains(b)) {
                assert!(
                    !table.entries.contains(&flow(*b)),
                    "seed {seed}, at {t:?}: the flow to {b}, seen removed, survived the pass"
                );
            }
            seen_serving.extend(agent.iter().copied());
            judged = Some(agent);
            t += Duration::from_millis(100 + rng.below_u64(1500));
        }
        // Every backend that stopped serving is gone once the history is over.
        let last = history.at(end);
        for e in &table.entries {
            let b = SocketAddr::new(e.reply.src, e.reply.src_port);
            assert!(
                last.contains(&b),
                "seed {seed}: a flow to {b} outlived the grace"
            );
        }
    }
}
