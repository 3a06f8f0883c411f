//! The cache's bookkeeping over generated watch events (updates, deletes, slices moving to
//! another service, relists that drop objects): after every event, the live model brought up
//! to date from what the cache marked as changed equals the model built from scratch from
//! all the facts the cache holds.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use groundskeeper_plumbing::ObjectKey;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher::Event;
use serde_json::json;
use testkit::rng::Rng;

use super::model::LABEL_SERVICE_NAME;
use super::model::live::Live;
use super::model::project_tests;
use super::model::reference::{Settle, Tombstones};
use super::model::source::ServiceCache;
use super::test_support::slim_event;

const NAMESPACES: [&str; 2] = ["default", "kube-system"];
const SETTLE: Duration = Duration::from_secs(2);
const RETENTION: Duration = Duration::from_secs(600);

/// A Service whose UDP port its slices usually serve (the shared generators rarely line a
/// slice up with its service, and a slice that serves nothing proves nothing here).
fn service(rng: &mut Rng, ns: &str, name: &str) -> Service {
    if rng.chance(30) {
        return project_tests::service(rng, ns, name);
    }
    serde_json::from_value(json!({
        "metadata": {"namespace": ns, "name": name},
        "spec": {"clusterIP": rng.pick(&["10.96.0.10", "10.96.0.11", "10.96.0.12"]),
                 "ports": [{"name": "dns", "port": 53, "protocol": "UDP",
                            "nodePort": rng.chance(30).then_some(30053)}]},
    }))
    .expect("a generated Service parses")
}

fn slice(rng: &mut Rng, ns: &str, name: &str, owner: Option<&str>) -> EndpointSlice {
    if rng.chance(30) {
        return project_tests::slice(rng, ns, name, owner);
    }
    let endpoints: Vec<_> = (0..rng.below(3))
        .map(|_| {
            json!({"addresses": [rng.pick(&["10.244.0.1", "10.244.0.2", "10.244.0.3"])],
                   "conditions": {"serving": rng.chance(80)}})
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"namespace": ns, "name": name,
                     "labels": owner.map(|o| json!({LABEL_SERVICE_NAME: o}))},
        "addressType": "IPv4",
        "ports": [{"name": "dns", "port": 5353, "protocol": "UDP"}],
        "endpoints": endpoints,
    }))
    .expect("a generated EndpointSlice parses")
}

/// A relist: every object of `kept` that the coin keeps, plus the new ones.
fn relist<K: Clone>(rng: &mut Rng, kept: &mut BTreeMap<ObjectKey, K>, fold: impl Fn(Event<K>)) {
    fold(Event::Init);
    kept.retain(|_, _| rng.chance(70));
    for o in kept.values() {
        fold(Event::InitApply(o.clone()));
    }
    fold(Event::InitDone);
}

/// Returns how many slice events changed the model (the check must see many).
fn run(seed: u64) -> usize {
    let rng = &mut Rng(seed);
    let cache = std::cell::RefCell::new(ServiceCache::default());
    let mut live = Live::new(SETTLE, RETENTION);
    let (mut settle, mut tombstones) = (Settle::new(SETTLE), Tombstones::new(RETENTION));
    let mut services: BTreeMap<ObjectKey, Service> = BTreeMap::new();
    let mut slices: BTreeMap<ObjectKey, EndpointSlice> = BTreeMap::new();
    // Each event decoded as the agent's watch decodes it.
    let svc = |ev| {
        cache.borrow_mut().fold_services(slim_event(ev));
    };
    let slc = |ev| {
        cache.borrow_mut().fold_slices(slim_event(ev));
    };
    svc(Event::Init);
    svc(Event::InitDone);
    slc(Event::Init);
    slc(Event::InitDone);
    let mut now = Instant::now();
    let mut slice_changes = 0;
    let mut before = None;
    for step in 0..40 {
        let mut slice_event = false;
        let ns = rng.pick(&NAMESPACES).to_string();
        let name = format!("s{}", rng.below(5));
        match rng.below(12) {
            0..=3 => {
                let s = service(rng, &ns, &name);
                services.insert(ObjectKey::new(&ns, &name), s.clone());
                svc(Event::Apply(s));
            }
            4 => {
                if let Some(s) = services.remove(&ObjectKey::new(&ns, &name)) {
                    svc(Event::Delete(s));
                }
            }
            5..=8 => {
                let owner = match rng.below(10) {
                    0 => None,
                    1..=3 => Some(format!("s{}", rng.below(5))),
                    _ => Some(name.clone()),
                };
                let slice_name = format!("{name}-{}", rng.below(2));
                let s = slice(rng, &ns, &slice_name, owner.as_deref());
                slices.insert(ObjectKey::new(&ns, &slice_name), s.clone());
                slc(Event::Apply(s));
                slice_event = true;
            }
            9 => {
                let key = ObjectKey::new(&ns, &format!("{name}-{}", rng.below(2)));
                if let Some(s) = slices.remove(&key) {
                    slc(Event::Delete(s));
                    slice_event = true;
                }
            }
            10 => relist(rng, &mut services, svc),
            _ => relist(rng, &mut slices, slc),
        }
        now += Duration::from_millis(rng.pick(&[0, 500, 3000]));
        let mut c = cache.borrow_mut();
        let expected = tombstones.apply(settle.apply(c.built_whole(), now), now);
        c.update(&mut live, now);
        assert_eq!(**live.model(), expected, "seed {seed} step {step}");
        let served = |m: &super::model::Model| {
            m.iter()
                .map(|(_, fm)| fm.frontends.clone())
                .collect::<Vec<_>>()
        };
        let now_served = served(&expected);
        if slice_event && before.as_ref() != Some(&now_served) {
            slice_changes += 1;
        }
        before = Some(now_served);
    }
    slice_changes
}

#[test]
fn the_live_model_follows_the_cache_through_every_watch_event() {
    let changed: usize = (0..300).map(run).sum();
    assert!(
        changed > 500,
        "only {changed} slice events changed what a frontend serves"
    );
}
