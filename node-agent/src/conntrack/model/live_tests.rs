//! The live model's rule, over generated sequences of Service, EndpointSlice, ServiceCIDR,
//! IPAddress and Node changes and passages of time: after every update it equals the model
//! built from scratch on the same inputs at the same instants (`build_facts`, then `Settle`
//! and `Tombstones`), and says the same about when it next changes by time alone.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use groundskeeper_plumbing::ObjectKey;
use testkit::rng::Rng;

use super::live::{Facts, Live};
use super::project::{self, ServiceFacts, SliceFacts};
use super::project_tests;
use crate::conntrack::model::reference::{Settle, Tombstones, slim};
use crate::conntrack::model::{self, Model, ServiceIpRange};

const NAMESPACES: [&str; 2] = ["default", "kube-system"];
pub(super) const SETTLE: Duration = Duration::from_secs(2);
pub(super) const RETENTION: Duration = Duration::from_secs(600);
pub(super) const STEPS_MS: [u64; 7] = [0, 0, 300, 1000, 2000, 5000, 601_000];

#[derive(Default)]
pub(super) struct World {
    services: BTreeMap<ObjectKey, ServiceFacts>,
    slices: BTreeMap<ObjectKey, SliceFacts>,
    pub(super) ranges: Vec<ServiceIpRange>,
    pub(super) allocated: Vec<IpAddr>,
    pub(super) node_ips: Vec<IpAddr>,
}

impl Facts for World {
    fn service(&self, ns: &str, name: &str) -> Option<(&ServiceFacts, Vec<&SliceFacts>)> {
        let service = self.services.get(&ObjectKey::new(ns, name))?;
        let slices = self
            .slices
            .iter()
            .filter(|(k, s)| k.namespace() == ns && s.service.as_deref() == Some(name))
            .map(|(_, s)| s)
            .collect();
        Some((service, slices))
    }
}

impl World {
    fn built_whole(&self) -> Model {
        model::reference::build_facts(
            self.services
                .iter()
                .map(|(k, v)| (k.namespace(), k.name(), v)),
            self.slices.iter().map(|(k, v)| (k.namespace(), v)),
        )
        .with_service_ranges(&self.ranges, self.allocated.iter().copied())
        .with_node_ips(&self.node_ips)
    }
}

fn ip(s: &str) -> IpAddr {
    super::addr::parse_ip(s).expect("a generated address parses")
}

/// One generated change to `w`; returns the services whose facts it touched.
pub(super) fn change(rng: &mut Rng, w: &mut World) -> (Vec<ObjectKey>, bool) {
    let ns = rng.pick(&NAMESPACES).to_string();
    let i = rng.below(6);
    let name = format!("s{i}");
    match rng.below(10) {
        0..=2 => {
            let v = project::service(&slim(&project_tests::service(rng, &ns, &name)));
            let key = ObjectKey::new(&ns, &name);
            w.services.insert(key.clone(), v);
            (vec![key], false)
        }
        3 => {
            let key = ObjectKey::new(&ns, &name);
            w.services.remove(&key);
            (vec![key], false)
        }
        4..=6 => {
            let owner = match rng.below(10) {
                0 => None,
                1 => Some(format!("s{}", rng.below(6))),
                _ => Some(name.clone()),
            };
            let whole = project_tests::slice(rng, &ns, "x", owner.as_deref());
            let key = ObjectKey::new(&ns, &format!("{name}-{}", rng.below(3)));
            let new = project::slice(&slim(&whole));
            let touched = [w.slices.get(&key), Some(&new)]
                .into_iter()
                .flatten()
                .filter_map(|s| s.service.as_deref())
                .map(|s| ObjectKey::new(&ns, s))
                .collect();
            w.slices.insert(key, new);
            (touched, false)
        }
        7 => {
            let key = ObjectKey::new(&ns, &format!("{name}-{}", rng.below(3)));
            let touched = w
                .slices
                .remove(&key)
                .and_then(|s| s.service)
                .map(|s| ObjectKey::new(&ns, &s))
                .into_iter()
                .collect();
            (touched, false)
        }
        8 => {
            let c = ["10.96.0.0/16", "fd00:10:96::/112", "10.97.0.0/24"];
            w.ranges = rng
                .some(&c, 50)
                .into_iter()
                .filter_map(ServiceIpRange::parse)
                .collect();
            w.allocated = (0..rng.below(4))
                .map(|_| ip(project_tests::addr(rng)))
                .collect();
            (Vec::new(), true)
        }
        _ => {
            w.node_ips = (0..rng.below(3))
                .map(|_| ip(project_tests::addr(rng)))
                .collect();
            (Vec::new(), true)
        }
    }
}

/// What the checks saw, so a generator that stops reaching a case fails the test.
#[derive(Default, Debug)]
struct Seen {
    shared: usize,
    settling: usize,
    settled: usize,
    deleted: usize,
    expired: usize,
    foreign: usize,
}

fn run(seed: u64, seen: &mut Seen) {
    let rng = &mut Rng(seed);
    let t0 = Instant::now();
    let mut now = t0;
    let mut w = World::default();
    let mut live = Live::new(SETTLE, RETENTION);
    let (mut settle, mut tombstones) = (Settle::new(SETTLE), Tombstones::new(RETENTION));
    let mut deleted_before = 0;
    for step in 0..60 {
        let mut touched = Vec::new();
        let mut globals = false;
        for _ in 0..1 + rng.below(3) {
            let (t, g) = change(rng, &mut w);
            touched.extend(t);
            globals |= g;
        }
        now += Duration::from_millis(rng.pick(&STEPS_MS));
        let expected = tombstones.apply(settle.apply(w.built_whole(), now), now);
        if globals {
            live.set_service_ips(&w.ranges, &w.allocated);
            live.set_node_ips(&w.node_ips);
        }
        live.update(touched.iter().map(|k| (k.namespace(), k.name())), &w, now);
        assert_eq!(**live.model(), expected, "seed {seed} step {step}");
        assert_eq!(
            live.next_change(now),
            settle.next_change(now),
            "seed {seed} step {step}: next settle"
        );
        for (_, fm) in expected.iter() {
            seen.settling += fm.settling_frontends.len();
            seen.foreign += fm.foreign_frontends.len();
            seen.settled += fm
                .services
                .values()
                .flat_map(|p| p.values())
                .filter(|c| c.serving.is_empty() && !c.settling)
                .count();
            seen.shared += fm
                .frontends
                .keys()
                .filter(|f| {
                    fm.services
                        .values()
                        .filter(|p| p.values().any(|c| c.frontends.contains(f)))
                        .count()
                        > 1
                })
                .count();
        }
        let deleted: usize = expected
            .iter()
            .map(|(_, fm)| fm.deleted_frontends.len())
            .sum();
        seen.deleted += deleted;
        seen.expired += usize::from(deleted < deleted_before);
        deleted_before = deleted;
    }
}

#[test]
fn the_live_model_is_the_model_built_from_scratch_after_every_change() {
    let mut seen = Seen::default();
    for seed in 0..400 {
        run(seed, &mut seen);
    }
    // Every case the live model handles apart must have come up, or the check proves little.
    for (what, n) in [
        ("frontends claimed by several services", seen.shared),
        ("settling frontends", seen.settling),
        ("ports settled without endpoints", seen.settled),
        ("deleted frontends", seen.deleted),
        ("tombstones gone (expired or claimed again)", seen.expired),
        ("foreign frontends", seen.foreign),
    ] {
        assert!(n > 50, "only {n} {what}: {seen:?}");
    }
}

#[test]
fn an_update_naming_nothing_changes_nothing() {
    let mut live = Live::new(SETTLE, RETENTION);
    let w = World::default();
    let before = live.model().clone();
    live.update(std::iter::empty(), &w, Instant::now());
    assert!(std::sync::Arc::ptr_eq(&before, live.model()));
}

/// A frontend that one claim alone holds keeps that claim's list of serving endpoints, not a
/// copy: a set per frontend would be megabytes more at 10k services of 10 endpoints. A frontend
/// two services claim holds the union, a list of its own.
#[test]
fn a_frontend_one_claim_holds_shares_that_claims_list() {
    use crate::conntrack::netlink::family::Family;
    use crate::conntrack::wire::{WireService, WireSlice};
    use serde_json::json;

    let service = |name: &str, external: &[&str]| -> ServiceFacts {
        let s: WireService = serde_json::from_value(json!({
            "metadata": {"namespace": "default", "name": name},
            "spec": {"clusterIP": if name == "dns" { "10.96.0.10" } else { "10.96.0.11" },
                     "externalIPs": external,
                     "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}]},
        }))
        .unwrap();
        project::service(&s)
    };
    let slice = |name: &str, ips: &[&str]| -> SliceFacts {
        let s: WireSlice = serde_json::from_value(json!({
            "metadata": {"namespace": "default", "name": format!("{name}-x"),
                         "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4",
            "ports": [{"name": "dns", "port": 5353, "protocol": "UDP"}],
            "endpoints": ips.iter().map(|ip| json!({"addresses": [ip]})).collect::<Vec<_>>(),
        }))
        .unwrap();
        project::slice(&s)
    };
    let key = |n: &str| ObjectKey::new("default", n);
    let mut w = World::default();
    w.services
        .insert(key("dns"), service("dns", &["192.0.2.9"]));
    w.slices
        .insert(key("dns-x"), slice("dns", &["10.244.1.5", "10.244.2.7"]));
    w.services
        .insert(key("other"), service("other", &["192.0.2.9"]));
    w.slices
        .insert(key("other-x"), slice("other", &["10.244.3.3"]));
    let mut live = Live::new(SETTLE, RETENTION);
    live.update(
        [("default", "dns"), ("default", "other")],
        &w,
        Instant::now(),
    );
    let m = &live.model()[Family::V4];
    let claim = |svc: &str| {
        m.services[svc]
            .get("dns")
            .expect("the claim is recorded")
            .serving
            .clone()
    };
    let (dns, other) = (claim("default/dns"), claim("default/other"));
    assert_eq!(dns.len(), 2);
    let at = |f: &str| &m.frontends[&f.parse().unwrap()];
    assert!(at("10.96.0.10:53").shares(&dns), "{m:?}");
    assert!(at("10.96.0.11:53").shares(&other), "{m:?}");
    let both = at("192.0.2.9:53");
    assert_eq!(both.len(), 3, "the union of both services' endpoints");
    assert!(!both.shares(&dns) && !both.shares(&other));
}
