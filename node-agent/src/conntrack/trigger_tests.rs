//! What a tenant's TCP-only churn triggers, over generated clusters, through the agent's own
//! watch folding (`cache.rs`), live model and scheduler: two agents see the same UDP Services,
//! EndpointSlices and IPAddresses at the same times, and one of them also sees TCP-only Services
//! created, updated and deleted with their EndpointSlices and IPAddresses. Both must run the same
//! rounds at the same times looking at the same things: a TCP-only change runs no round, not
//! even one over UDP services without endpoints, and widens no UDP change's round.
//!
//! The generated tenant never gets an IP a UDP service had (the allocator could hand one out
//! again; its release would then rightly be a UDP change), and events are at least a debounce
//! apart (a TCP event in the same 100 ms as a UDP one rebuilds the model a little earlier).

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{IPAddress, ServiceCIDR};
use kube::runtime::watcher::Event;
use serde_json::json;
use testkit::rng::Rng;
use tokio::time::Instant;

use super::model::focus::Focus;
use super::model::live::Live;
use super::model::source::{Models, ServiceCache};
use super::model::{LABEL_SERVICE_NAME, Model};
use super::pass::round::RoundSummary;
use super::schedule::{Due, Scheduler, Timing};
use super::schedule_tests::HEALTHY;
use super::test_support::slim_event;
use super::test_support::{ms, secs};
use groundskeeper_plumbing::watch::cache::Seen;

const NS: &str = "default";
const TIMING: Timing = Timing {
    min_interval: Duration::from_secs(1),
    gc_min: Duration::from_secs(10),
    gc_max: Duration::from_secs(300),
};

/// One watch event, of any of the kinds the agent watches (a handful at a time: their sizes
/// do not matter).
#[derive(Clone)]
#[allow(clippy::large_enum_variant)]
enum Watched {
    Service(Event<Service>),
    Slice(Event<EndpointSlice>),
    Address(Event<IPAddress>),
    Cidr(Event<ServiceCIDR>),
    Node(Event<Node>),
}

fn service(name: &str, ip: &str, udp: bool, node_port: Option<u16>, external: &[&str]) -> Service {
    let mut ports = vec![json!({"name": "http", "port": 80, "protocol": "TCP"})];
    if udp {
        ports.push(json!({"name": "dns", "port": 53, "protocol": "UDP", "nodePort": node_port}));
    }
    serde_json::from_value(json!({
        "metadata": {"namespace": NS, "name": name},
        "spec": {"type": if node_port.is_some() { "NodePort" } else { "ClusterIP" },
                 "clusterIP": ip, "clusterIPs": [ip], "externalIPs": external, "ports": ports},
    }))
    .unwrap()
}

/// The slice of `svc`: its UDP port's endpoints (a TCP-only service's slice has a TCP port).
fn slice(svc: &str, udp: bool, endpoints: &[String]) -> EndpointSlice {
    let port = if udp {
        json!({"name": "dns", "port": 5353, "protocol": "UDP"})
    } else {
        json!({"name": "http", "port": 8080, "protocol": "TCP"})
    };
    let eps: Vec<_> = endpoints
        .iter()
        .map(|a| json!({"addresses": [a], "conditions": {"ready": true}}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"namespace": NS, "name": format!("{svc}-1"),
                     "labels": {LABEL_SERVICE_NAME: svc}},
        "addressType": "IPv4", "ports": [port], "endpoints": eps,
    }))
    .unwrap()
}

fn address(ip: &str, svc: &str) -> IPAddress {
    testkit::networking::allocated_ip(ip, NS, svc)
}

/// An agent's model source: the cache its watches fill and its live model.
struct Source {
    cache: Mutex<ServiceCache>,
    live: Mutex<Live>,
    /// The simulated time the model source reads.
    now: Mutex<std::time::Instant>,
}

/// An agent: its model source, its scheduler, the rounds it ran.
struct Agent {
    src: Source,
    start: Instant,
    scheduler: Scheduler,
    rounds: Vec<(Duration, Option<Focus>)>,
}

impl Models for Source {
    fn model(&self) -> Option<(Arc<Model>, super::model::changes::Changes, Seen)> {
        let mut live = self.live.lock().unwrap();
        let now = *self.now.lock().unwrap();
        self.cache.lock().unwrap().update(&mut live, now);
        Some((live.model().clone(), live.take_changes(), self.health()))
    }

    fn health(&self) -> Seen {
        Seen::from_epochs(HEALTHY)
    }

    fn unhealthy(&self) -> Vec<String> {
        vec![]
    }

    fn changes_in(&self) -> Option<Duration> {
        let now = *self.now.lock().unwrap();
        self.live.lock().unwrap().next_change(now)
    }
}

impl Agent {
    fn new(start: Instant) -> Self {
        Self {
            src: Source {
                cache: Mutex::default(),
                live: Mutex::new(Live::new(secs(1), secs(600))),
                now: Mutex::new(start.into_std()),
            },
            start,
            scheduler: Scheduler::new(TIMING, start),
            rounds: Vec::new(),
        }
    }

    /// Folds `ev` in as the watch does; the scheduler hears of it when the fold asks.
    fn see(&mut self, ev: Watched, at: Duration) {
        let c = &mut self.src.cache.lock().unwrap();
        let wake = match ev {
            Watched::Service(e) => c.fold_services(slim_event(e)),
            Watched::Slice(e) => c.fold_slices(slim_event(e)),
            Watched::Address(e) => c.fold_addresses(slim_event(e)),
            Watched::Cidr(e) => c.fold_cidrs(e),
            Watched::Node(e) => c.fold_nodes(e),
        };
        if wake {
            self.scheduler.on_change(self.start + at);
        }
    }

    /// Runs what falls due before `until` (rounds take no time here).
    fn run_until(&mut self, until: Duration) {
        while self.scheduler.next_wake() < self.start + until {
            let t = self.scheduler.next_wake();
            *self.src.now.lock().unwrap() = t.into_std();
            if let Due::Round {
                focus, periodic, ..
            } = self.scheduler.on_wake(t, &self.src)
            {
                let full = focus.is_none();
                self.rounds.push((t - self.start, focus.map(|f| *f)));
                let summary = RoundSummary {
                    scanned: 10,
                    ..RoundSummary::default()
                };
                self.scheduler.on_round(t, periodic, full, &summary);
            }
        }
    }

    fn model(&self) -> Model {
        (**self.src.live.lock().unwrap().model()).clone()
    }
}

/// A UDP service of the generated cluster: name, ClusterIP, endpoints.
type Udp = (String, String, Vec<String>);

/// What one generated run saw, so a generator that stops reaching a case fails the test.
#[derive(Debug, Default)]
struct Tally {
    tenant_events: usize,
    tenant_releases: usize,
    /// Tenant changes made while a UDP service had no serving endpoint.
    tenant_beside_unserved: usize,
    rounds: usize,
    full_rounds: usize,
}

fn endpoints(rng: &mut Rng) -> Vec<String> {
    (0..rng.below(3))
        .map(|_| format!("10.244.0.{}", 1 + rng.below(6)))
        .collect()
}

fn run(seed: u64, tally: &mut Tally) {
    let rng = &mut Rng(seed);
    let start = Instant::now();
    // [0]: UDP and the tenant's TCP churn; [1]: UDP alone.
    let mut agents = [Agent::new(start), Agent::new(start)];
    let both = |agents: &mut [Agent; 2], ev: Watched, at: Duration| {
        for a in agents.iter_mut() {
            a.see(ev.clone(), at);
        }
    };
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "n"},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.7"}]}}))
    .unwrap();
    let cidr = testkit::networking::service_cidr("kubernetes", ["10.96.0.0/16"]);
    let mut udp: Vec<Udp> = Vec::new();
    let mut next_udp = 0;
    for _ in 0..1 + rng.below(3) {
        next_udp += 1;
        let name = format!("udp{next_udp}");
        udp.push((name, format!("10.96.0.{next_udp}"), endpoints(rng)));
    }
    // Every watch lists; the tenant's services do not exist yet.
    let t0 = ms(10);
    for ev in [
        Watched::Cidr(Event::Apply(cidr)),
        Watched::Node(Event::Apply(node)),
    ] {
        both(&mut agents, ev, t0);
    }
    for (name, ip, eps) in &udp {
        let np = rng.chance(30).then_some(30053);
        for ev in [
            Watched::Address(Event::Apply(address(ip, name))),
            Watched::Service(Event::Apply(service(name, ip, true, np, &[]))),
            Watched::Slice(Event::Apply(slice(name, true, eps))),
        ] {
            both(&mut agents, ev, t0);
        }
    }
    // The tenant's TCP-only services (name, IP, has a slice), and IPs of deleted UDP services
    // not yet released.
    let mut tenant: Vec<(String, String, bool)> = Vec::new();
    let (mut next_tcp, mut releases) = (0, Vec::<(String, String)>::new());
    let mut t = t0;
    for _ in 0..60 {
        t += ms(rng.pick(&[200, 300, 700, 1100, 2500, 4000]));
        for a in agents.iter_mut() {
            a.run_until(t);
        }
        if rng.chance(60) {
            // The tenant: A alone sees it.
            tally.tenant_events += 1;
            let unserved = agents[1].model().iter().any(|(_, m)| m.has_unserved());
            tally.tenant_beside_unserved += usize::from(unserved);
            let evs: Vec<Watched> = match rng.below(6) {
                0 | 1 => {
                    next_tcp += 1;
                    let (name, ip) = (format!("tcp{next_tcp}"), format!("10.96.1.{next_tcp}"));
                    let external = ["192.0.2.9"];
                    let svc = service(&name, &ip, false, None, &external[..rng.below(2)]);
                    let with_slice = rng.chance(70);
                    tenant.push((name.clone(), ip.clone(), with_slice));
                    let mut evs = vec![
                        Watched::Address(Event::Apply(address(&ip, &name))),
                        Watched::Service(Event::Apply(svc)),
                    ];
                    if with_slice {
                        let eps = endpoints(rng);
                        evs.push(Watched::Slice(Event::Apply(slice(&name, false, &eps))));
                    }
                    evs
                }
                2 | 3 if !tenant.is_empty() => {
                    let (name, ip, with_slice) = tenant.remove(rng.below(tenant.len()));
                    tally.tenant_releases += 1;
                    let mut evs = vec![Watched::Service(Event::Delete(service(
                        &name,
                        &ip,
                        false,
                        None,
                        &[],
                    )))];
                    if with_slice {
                        evs.push(Watched::Slice(Event::Delete(slice(&name, false, &[]))));
                    }
                    evs.push(Watched::Address(Event::Delete(address(&ip, &name))));
                    evs
                }
                4 if !tenant.is_empty() => {
                    // Its pods come and go: the slice's endpoints, or its ExternalIPs.
                    let (name, ip, with_slice) = tenant[rng.below(tenant.len())].clone();
                    if with_slice {
                        let eps = endpoints(rng);
                        vec![Watched::Slice(Event::Apply(slice(&name, false, &eps)))]
                    } else {
                        let svc = service(&name, &ip, false, None, &["192.0.2.8"]);
                        vec![Watched::Service(Event::Apply(svc))]
                    }
                }
                _ => {
                    // An IPAddress updated (labels): the same IP.
                    let (name, ip) = match tenant.first() {
                        Some((n, ip, _)) => (n.clone(), ip.clone()),
                        None => (udp[0].0.clone(), udp[0].1.clone()),
                    };
                    vec![Watched::Address(Event::Apply(address(&ip, &name)))]
                }
            };
            for ev in evs {
                agents[0].see(ev, t);
            }
            continue;
        }
        // A UDP change: both see it.
        let evs: Vec<Watched> = match rng.below(8) {
            0 if !releases.is_empty() => {
                let (name, ip) = releases.remove(0);
                vec![Watched::Address(Event::Delete(address(&ip, &name)))]
            }
            1 if udp.len() > 1 => {
                let (name, ip, _) = udp.remove(rng.below(udp.len()));
                releases.push((name.clone(), ip.clone()));
                vec![
                    Watched::Service(Event::Delete(service(&name, &ip, true, None, &[]))),
                    Watched::Slice(Event::Delete(slice(&name, true, &[]))),
                ]
            }
            2 if next_udp < 250 => {
                next_udp += 1;
                let (name, ip) = (format!("udp{next_udp}"), format!("10.96.0.{next_udp}"));
                let eps = endpoints(rng);
                udp.push((name.clone(), ip.clone(), eps.clone()));
                vec![
                    Watched::Address(Event::Apply(address(&ip, &name))),
                    Watched::Service(Event::Apply(service(&name, &ip, true, None, &[]))),
                    Watched::Slice(Event::Apply(slice(&name, true, &eps))),
                ]
            }
            _ => {
                let i = rng.below(udp.len());
                udp[i].2 = endpoints(rng);
                vec![Watched::Slice(Event::Apply(slice(
                    &udp[i].0, true, &udp[i].2,
                )))]
            }
        };
        for ev in evs {
            both(&mut agents, ev, t);
        }
    }
    // Long enough for the periodic round.
    for a in agents.iter_mut() {
        a.run_until(t + secs(70));
    }
    let [churned, alone] = &agents;
    assert_eq!(
        churned.rounds, alone.rounds,
        "seed {seed}: the rounds (when, what they looked at) with the tenant's churn, then without"
    );
    let (mut a, mut b) = (churned.model(), alone.model());
    for m in [&mut a, &mut b] {
        for fm in &mut m.0 {
            fm.allocated
                .retain(|ip: &IpAddr| ip.to_string().starts_with("10.96.0."));
        }
    }
    assert_eq!(
        a, b,
        "seed {seed}: the models differ beyond the tenant's IPs"
    );
    tally.rounds += alone.rounds.len();
    tally.full_rounds += alone.rounds.iter().filter(|(_, f)| f.is_none()).count();
}

#[test]
fn a_tenants_tcp_only_services_and_ip_addresses_change_no_round() {
    let mut tally = Tally::default();
    for seed in 0..150 {
        run(seed, &mut tally);
    }
    println!("{tally:?}");
    testkit::rng::reached(
        &[
            ("tenant events", tally.tenant_events, 3000),
            ("tenant IPs released", tally.tenant_releases, 600),
            (
                "tenant events beside a UDP service without endpoints",
                tally.tenant_beside_unserved,
                300,
            ),
            ("rounds", tally.rounds, 2000),
            ("full rounds", tally.full_rounds, 300),
        ],
        &tally,
    );
}
