//! The CPU the conntrack model costs per EndpointSlice change, in process (no cluster, no
//! kernel): the whole rebuild the agent made before (`reference::build_facts`, then `Settle` and
//! `Tombstones`) beside the live model's update of the one service that changed, at 1k and 10k
//! Services of one UDP port and one slice of 10 endpoints each. Prints figures; asserts nothing.
//!
//!   cargo bench -p groundskeeper-node-agent --bench model_update [-- SERVICES]
//!
//! The agent's own figure (`agent_scale`, `agent_cpu_per_change_*`) also holds the watch event
//! and the triggered pass each change causes; this one is the model's part alone. The live
//! model is measured three times: alone; while the previous model is still held and then
//! compared whole (the cost of a scheduler that kept the model it
//! judged, so an update copied it first, and compared the two); and as the scheduler uses it
//! now, with only a `Weak` held: each change handed out with what it changed, added up, and
//! the focus of a triggered round computed from that (one round per change).

use std::collections::HashMap;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use groundskeeper_node_agent::conntrack::model::changes::Changes;
use groundskeeper_node_agent::conntrack::model::focus::Scope;
use groundskeeper_node_agent::conntrack::model::live::{Facts, Live};
use groundskeeper_node_agent::conntrack::model::project::{ServiceFacts, SliceFacts, UdpPort};
use groundskeeper_node_agent::conntrack::model::reference::{self, Settle, Tombstones};
use groundskeeper_node_agent::conntrack::netlink::family::{Family, PerFamily};
use groundskeeper_plumbing::ObjectKey;
use testkit::figures::bench;

const ENDPOINTS_PER_SLICE: usize = 10;
const NAMESPACES: usize = 20;
const CHANGES: usize = 200;

/// As the agent's `ServiceCache` keeps them: by key, each service's slices by their keys.
struct World {
    services: HashMap<ObjectKey, ServiceFacts>,
    slices: HashMap<ObjectKey, SliceFacts>,
    slices_of: HashMap<ObjectKey, Vec<ObjectKey>>,
}

impl Facts for World {
    fn service(&self, ns: &str, name: &str) -> Option<(&ServiceFacts, Vec<&SliceFacts>)> {
        let key = ObjectKey::new(ns, name);
        let service = self.services.get(&key)?;
        let slices = self
            .slices_of
            .get(&key)
            .into_iter()
            .flatten()
            .filter_map(|s| self.slices.get(s))
            .collect();
        Some((service, slices))
    }
}

fn v4(n: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(u32::try_from(n).unwrap_or(0)))
}

fn ns_name(i: usize) -> (String, String) {
    (format!("scale-{}", i % NAMESPACES), format!("svc-{i}"))
}

/// The serving addresses of service `i`'s slice; `generation` moves them.
fn serving(i: usize, generation: usize) -> Box<[IpAddr]> {
    let mut ips: Vec<IpAddr> = (0..ENDPOINTS_PER_SLICE)
        .map(|e| v4(0x0a40_0000 + i * ENDPOINTS_PER_SLICE + e + generation * 7))
        .collect();
    ips.sort_unstable();
    ips.into()
}

fn world(services: usize) -> World {
    let mut w = World {
        services: HashMap::new(),
        slices: HashMap::new(),
        slices_of: HashMap::new(),
    };
    for i in 0..services {
        let (ns, name) = ns_name(i);
        let service = ServiceFacts {
            foreign: false,
            ips: PerFamily([vec![v4(0x0a60_0000 + i)].into(), Box::default()]),
            ports: vec![UdpPort {
                name: "dns".into(),
                port: 53,
                node_port: None,
            }]
            .into(),
        };
        let slice = SliceFacts {
            service: Some(name.as_str().into()),
            ports: vec![("dns".into(), Some(5353))].into(),
            serving: serving(i, 0),
        };
        let slice_name = format!("{name}-abcde");
        let (key, slice_key) = (ObjectKey::new(&ns, &name), ObjectKey::new(&ns, &slice_name));
        w.services.insert(key.clone(), service);
        w.slices.insert(slice_key.clone(), slice);
        w.slices_of.insert(key, vec![slice_key]);
    }
    w
}

/// Replaces the endpoints of the `k`th changed service's slice; returns that service.
fn change(w: &mut World, services: usize, k: usize) -> (String, String) {
    let i = (k * 37) % services;
    let (ns, name) = ns_name(i);
    let slice = w
        .slices
        .get_mut(&ObjectKey::new(&ns, &format!("{name}-abcde")))
        .expect("the slice exists");
    slice.serving = serving(i, k + 1);
    (ns, name)
}

fn per_change_ms(t: Duration) -> f64 {
    t.as_secs_f64() * 1000.0 / CHANGES as f64
}

fn size_tag(services: usize) -> String {
    match services {
        n if n >= 1000 && n % 1000 == 0 => format!("{}k", n / 1000),
        n => n.to_string(),
    }
}

fn row(services: usize) {
    let size = size_tag(services);
    let settle_after = Duration::from_secs(1);
    let retention = Duration::from_secs(600);
    let now = Instant::now();

    // Before: every change rebuilt the whole model.
    let mut w = world(services);
    let (mut settle, mut tombstones) = (Settle::new(settle_after), Tombstones::new(retention));
    let t0 = Instant::now();
    for k in 0..CHANGES {
        change(&mut w, services, k);
        let m = reference::build_facts(
            w.services.iter().map(|(k, v)| (k.namespace(), k.name(), v)),
            w.slices.iter().map(|(k, v)| (k.namespace(), v)),
        );
        black_box(tombstones.apply(settle.apply(m, now), now));
    }
    let rebuild = per_change_ms(t0.elapsed());

    // Now: the live model redoes the service that changed.
    let mut w = world(services);
    let mut live = Live::new(settle_after, retention);
    let all: Vec<ObjectKey> = w.services.keys().cloned().collect();
    live.update(all.iter().map(|k| (k.namespace(), k.name())), &w, now);
    live.take_changes();
    let t0 = Instant::now();
    for k in 0..CHANGES {
        let (ns, name) = change(&mut w, services, k);
        live.update([(ns.as_str(), name.as_str())], &w, now);
    }
    let update = per_change_ms(t0.elapsed());

    // The same while the previous model is held (copied first), and compared as the scheduler
    // compares it.
    let t0 = Instant::now();
    for k in 0..CHANGES {
        let held = live.model().clone();
        let (ns, name) = change(&mut w, services, CHANGES + k);
        live.update([(ns.as_str(), name.as_str())], &w, now);
        black_box(*held == **live.model());
    }
    let shared = per_change_ms(t0.elapsed());
    live.take_changes();

    // The scheduler's path now: a Weak held between rounds, the changes handed out with each
    // model, added up since the round judged, and the round's focus from them.
    let t0 = Instant::now();
    let mut focused = 0;
    for k in 0..CHANGES {
        let held = Arc::downgrade(live.model());
        let (ns, name) = change(&mut w, services, 2 * CHANGES + k);
        live.update([(ns.as_str(), name.as_str())], &w, now);
        let (m, changes) = (live.model().clone(), live.take_changes());
        let mut judged = Changes::default();
        black_box(changes.changed(&m));
        judged.merge(changes);
        let focus = judged.focus(&m);
        focused += focus.map_or(0, |f| f.iter().map(|(_, s)| s.frontends.len()).sum());
        black_box(held);
    }
    let scheduled = per_change_ms(t0.elapsed());
    assert_eq!(
        focused, CHANGES,
        "each focus is the changed service's frontend"
    );

    // What a triggered round adds to that focus: every frontend and nodePort without a serving
    // endpoint, found by a scan of the model's frontends (`Changes::triggered_focus`).
    let m = live.model().clone();
    let t0 = Instant::now();
    for _ in 0..CHANGES {
        let mut scope = Scope::default();
        for fam in Family::ALL {
            scope.add_unserved(&m[fam]);
        }
        black_box(scope);
    }
    let unserved_scan = per_change_ms(t0.elapsed());

    println!(
        "{services} services: the scan for frontends without a serving endpoint, once per triggered round: {unserved_scan:.4} ms"
    );
    bench(
        &format!("model_unserved_scan_per_round_{size}_services"),
        unserved_scan,
        "ms",
    );
    println!(
        "{services} services: whole rebuild {rebuild:.3} ms per change; live update {update:.3} ms; live update with the previous model held and compared {shared:.3} ms; live update with what it changed and the focus, as scheduled now {scheduled:.3} ms"
    );
    bench(
        &format!("model_rebuild_per_change_{size}_services"),
        rebuild,
        "ms",
    );
    bench(
        &format!("model_update_per_change_{size}_services"),
        update,
        "ms",
    );
    bench(
        &format!("model_update_held_per_change_{size}_services"),
        shared,
        "ms",
    );
    bench(
        &format!("model_update_scheduled_per_change_{size}_services"),
        scheduled,
        "ms",
    );
}

fn main() {
    let services: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    for n in [services / 10, services] {
        if n > 0 {
            row(n);
        }
    }
}
