//! The rule of [`Changes`], over generated sequences of Service, EndpointSlice, ServiceCIDR,
//! IPAddress and Node changes and passages of time applied to the live model: the changes it
//! hands out, added up since a round judged the model, give exactly the focus the whole-model
//! comparison gives (`Focus::between` over a copy of the judged model and the current one), and say
//! whether the model changed exactly when the two models differ, and whether the change asks
//! for a triggered round exactly when the two models differ in more than IPs allocated, or IPs
//! released that no UDP frontend of either has; and the round's record of backends seen
//! removed (`Removed::observe`) is the same from the changes as from the two whole models.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use testkit::rng::Rng;

use super::changes::{Changes, Trigger};
use super::live::Live;
use super::live_tests::{RETENTION, SETTLE, STEPS_MS, World, change};
use super::removed::{Key, Removed};
use crate::conntrack::model::Model;
use crate::conntrack::model::focus::Focus;
use crate::conntrack::netlink::family::Family;

/// What the checks saw, so a generator that stops reaching a case fails the test.
#[derive(Default, Debug)]
struct Seen {
    /// Focuses compared that narrow the pass (some key, service or backend in them).
    scoped: usize,
    /// ... with backends taken away.
    backends: usize,
    /// ... that are whole passes (a global field changed).
    whole: usize,
    /// Changes handed out that changed nothing in the end (noted, then back as they were).
    undone: usize,
    /// Rounds judged with changes added up over more than one model handed out.
    merged: usize,
    /// Backends seen removed from a key between two rounds.
    removed: usize,
    /// Changes that asked for no triggered round though the model changed (IPs allocated, or
    /// released that no UDP frontend has).
    quiet: usize,
    /// ... and changes that asked for one for an IP released that a UDP frontend has alone.
    released_udp: usize,
}

/// Whether a change from `old` to `new` may make a UDP flow stale, from the whole models: they
/// differ in more than their allocated IPs, or an IP allocated in `old` and not in `new` is the
/// address of some UDP frontend (live, settling, another proxy's, deleted) of either.
fn stales(old: &Model, new: &Model) -> bool {
    Family::ALL.into_iter().any(|fam| {
        let (o, n) = (&old[fam], &new[fam]);
        let mut same_ips = o.clone();
        same_ips.allocated = n.allocated.clone();
        let udp: HashSet<IpAddr> = [o, n]
            .iter()
            .flat_map(|m| m.frontend_keys())
            .map(|f| f.ip())
            .collect();
        same_ips != *n
            || o.allocated
                .difference(&n.allocated)
                .any(|ip| udp.contains(ip))
    })
}

fn run(seed: u64, seen: &mut Seen) {
    let rng = &mut Rng(seed);
    let mut now = Instant::now();
    let mut w = World::default();
    let mut live = Live::new(SETTLE, RETENTION);
    // The last model handed out, and the model the last round judged with what changed since
    // (the scheduler's state; the copy of the judged model is the reference).
    let mut handed = Model::default();
    let mut judged: Option<(Model, Changes, usize)> = None;
    for step in 0..60 {
        let mut touched = Vec::new();
        let mut globals = false;
        for _ in 0..1 + rng.below(3) {
            let (t, g) = change(rng, &mut w);
            touched.extend(t);
            globals |= g;
        }
        now += Duration::from_millis(rng.pick(&STEPS_MS));
        // Global changes make whole passes: rarer, so most rounds compare scoped focuses.
        if globals && rng.below(8) == 0 {
            live.set_service_ips(&w.ranges, &w.allocated);
            live.set_node_ips(&w.node_ips);
        } else if rng.below(12) == 0 {
            // Allocated IPs alone: a frontend's IP allocated, or one released.
            let frontends: Vec<IpAddr> = live
                .model()
                .iter()
                .flat_map(|(_, fm)| fm.frontends.keys().chain(&fm.deleted_frontends))
                .map(|f| f.ip())
                .collect();
            if rng.chance(50) && !frontends.is_empty() {
                w.allocated.push(rng.pick(&frontends));
            } else if !w.allocated.is_empty() {
                w.allocated.remove(rng.below(w.allocated.len()));
            }
            live.set_service_ips(&w.ranges, &w.allocated);
        }
        live.update(touched.iter().map(|k| (k.namespace(), k.name())), &w, now);
        // Not handed out (the watches' health changed meanwhile): the changes stay in `live`.
        if rng.below(4) == 0 {
            continue;
        }
        let m: Arc<Model> = live.model().clone();
        let changes = live.take_changes();
        let differs = handed != *m;
        assert_eq!(changes.changed(&m), differs, "seed {seed} step {step}");
        let change = changes.trigger(&m) == Trigger::Change;
        assert_eq!(change, stales(&handed, &m), "seed {seed} step {step}");
        seen.undone += usize::from(!differs && !changes.is_empty());
        handed = (*m).clone();
        if let Some((_, since, handouts)) = judged.as_mut() {
            since.merge(changes);
            *handouts += 1;
        }
        if rng.below(3) != 0 {
            continue;
        }
        // A round judges `m`.
        if let Some((old, since, handouts)) = judged.take() {
            let expected = Focus::between(&old, &m);
            assert_eq!(since.focus(&m), expected, "seed {seed} step {step}");
            assert_eq!(since.changed(&m), old != *m, "seed {seed} step {step}");
            let change = since.trigger(&m) == Trigger::Change;
            assert_eq!(change, stales(&old, &m), "seed {seed} step {step}");
            seen.quiet += usize::from(old != *m && !change);
            let mut same_ips = old.clone();
            for fam in Family::ALL {
                same_ips[fam].allocated = m[fam].allocated.clone();
            }
            seen.released_udp += usize::from(same_ips == *m && change);
            // The round's record of backends seen removed, from the changes' partial models,
            // is the one from the whole models.
            let (part_old, part_new) = (since.old(), since.now_in(&m));
            for fam in Family::ALL {
                let (mut whole, mut part) = (Removed::default(), Removed::default());
                whole.observe(&old[fam], &m[fam], now);
                part.observe(&part_old[fam], &part_new[fam], now);
                assert_eq!(part.len(), whole.len(), "seed {seed} step {step}");
                let frontends = old[fam]
                    .frontends
                    .iter()
                    .map(|(f, s)| (Key::Frontend(*f), s));
                let node_ports = old[fam]
                    .node_ports
                    .iter()
                    .map(|(p, s)| (Key::NodePort(*p), s));
                for (key, served) in frontends.chain(node_ports) {
                    for b in served {
                        assert_eq!(part.saw(key, *b), whole.saw(key, *b), "seed {seed}");
                    }
                }
                seen.removed += whole.len();
            }
            match &expected {
                None => seen.whole += 1,
                Some(f) if f.iter().any(|(_, s)| !s.is_empty()) => {
                    seen.scoped += 1;
                    seen.backends += usize::from(f.iter().any(|(_, s)| !s.backends.is_empty()));
                }
                Some(_) => {}
            }
            seen.merged += usize::from(handouts > 1);
        }
        judged = Some(((*m).clone(), Changes::default(), 0));
    }
}

#[test]
fn the_changes_added_up_since_a_round_give_the_focus_the_whole_models_give() {
    let mut seen = Seen::default();
    for seed in 0..400 {
        run(seed, &mut seen);
    }
    // Backends taken away need a serving endpoint gone from a live key: the generated slices
    // seldom serve a generated service's port, hence the lower floor.
    testkit::rng::reached(
        &[
            ("scoped focuses", seen.scoped, 50),
            ("focuses with backends taken away", seen.backends, 10),
            ("whole passes", seen.whole, 50),
            (
                "changes undone before they were handed out",
                seen.undone,
                50,
            ),
            ("rounds over changes of several models", seen.merged, 50),
            ("backends seen removed between rounds", seen.removed, 50),
            (
                "changes to allocated IPs alone that run no round",
                seen.quiet,
                50,
            ),
            (
                "IPs released that a UDP frontend has, alone",
                seen.released_udp,
                5,
            ),
        ],
        &seen,
    );
}

#[test]
fn an_update_changes_the_model_in_place_when_only_a_weak_reference_is_held() {
    let mut w = World::default();
    let mut live = Live::new(SETTLE, RETENTION);
    let rng = &mut Rng(7);
    let now = Instant::now();
    // Services until some are held (generated services may claim nothing).
    while live.model().iter().all(|(_, fm)| fm.services.len() < 2) {
        let (touched, _) = change(rng, &mut w);
        live.update(touched.iter().map(|k| (k.namespace(), k.name())), &w, now);
    }
    let names = |m: &Model| -> Vec<(String, usize)> {
        m.iter()
            .flat_map(|(_, fm)| fm.services.keys())
            .map(|k| (k.clone(), k.as_ptr() as usize))
            .collect()
    };
    let before = names(live.model());
    let weak = Arc::downgrade(live.model());
    // A change to no service the model holds: every held name must be the same allocation.
    live.set_node_ips(&["192.0.2.1".parse().unwrap()]);
    live.update([("default", "absent")], &w, now);
    assert!(
        weak.upgrade().is_none(),
        "the weak reference no longer upgrades"
    );
    assert_eq!(names(live.model()), before, "the model was copied");
    // While an Arc is held (a round judging it), an update copies it.
    let held = live.model().clone();
    live.set_node_ips(&[]);
    assert_ne!(names(live.model()), names(&held));
}
