//! The triggered pass's invariant, checked over generated clusters: random services (ClusterIP,
//! ExternalIPs, LB VIPs, NodePorts; IPv4, IPv6, dual-stack; some another proxy's, some sharing
//! a frontend), random EndpointSlices, a random change, and a random table (DNATed and
//! un-NATed, UDP and TCP, to frontends, to nodePorts on several node addresses and elsewhere).
//! After the triggered pass over the new model, the entries that touch the changed services
//! are exactly what a full pass over the new model leaves of them, and no other entry was
//! touched. "Touch" is computed here from the generated services, not by the code under test.
//! Against a fake table for hundreds of seeds, and against the kernel's table for a few.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{IPAddress, ServiceCIDR};
use serde_json::json;
use testkit::rng::Rng;

use super::apply::Kernel;
use super::model::focus::Focus;
use super::model::reference::{Settle, Tombstones};
use super::model::{self, LABEL_SERVICE_NAME, LABEL_SERVICE_PROXY_NAME, Model};
use super::netlink::family::Family::{self, V4};
use super::netlink::msg::{Entry, IPPROTO_TCP, IPPROTO_UDP, STATUS_ASSURED, STATUS_SEEN_REPLY};
use super::netlink::socket::Conntrack;
use super::netns::{self, NetNs};
use super::pass::{PassState, run_focused_pass, run_pass};
use super::test_support::{KernelLike, ip};

fn ips(list: &[&str]) -> Vec<IpAddr> {
    list.iter().map(|s| ip(s)).collect()
}

/// The addresses a generated cluster uses.
struct Pools {
    external: Vec<IpAddr>,
    lb: Vec<IpAddr>,
    backends: Vec<IpAddr>,
    /// In the Node object's status.
    node: Vec<IpAddr>,
    /// Owned by the table's namespace (one is also in the Node's status).
    host: Vec<IpAddr>,
    remote: Vec<IpAddr>,
}

fn pools() -> Pools {
    Pools {
        external: ips(&["192.0.2.1", "192.0.2.2", "2001:db8::1", "2001:db8::2"]),
        lb: ips(&["203.0.113.1", "203.0.113.2", "2001:db8:1::1"]),
        backends: ips(&[
            "10.244.0.1",
            "10.244.0.2",
            "10.244.0.3",
            "10.244.0.4",
            "10.244.0.5",
            "fd00:244::1",
            "fd00:244::2",
            "fd00:244::3",
            "fd00:244::4",
        ]),
        node: ips(&["192.168.0.7", "198.51.100.7", "fd00:192::7"]),
        host: ips(&["192.168.0.7", "192.168.0.9", "fd00:192::7", "fd00:192::9"]),
        remote: ips(&["203.0.113.99", "2001:db8:9::9"]),
    }
}

const SERVICE_PORTS: [u16; 2] = [53, 5353];
const TARGET_PORTS: [u16; 3] = [53, 5353, 8053];
const NODE_PORTS: [u16; 3] = [30053, 30054, 30055];

#[derive(Debug, Clone, PartialEq)]
struct Port {
    name: &'static str,
    port: u16,
    node_port: Option<u16>,
    udp: bool,
    /// The slices' port for it: its name (another name: no endpoint for this port) and number.
    slice_name: &'static str,
    target: u16,
}

/// One generated Service with its EndpointSlices (one per family).
#[derive(Debug, Clone, PartialEq)]
struct Svc {
    cluster_ips: Vec<IpAddr>,
    external_ips: Vec<IpAddr>,
    lb_ips: Vec<IpAddr>,
    ports: Vec<Port>,
    foreign: bool,
    /// (address, serving)
    endpoints: Vec<(IpAddr, bool)>,
}

impl Svc {
    fn cluster_ip(&self, fam: Family) -> Option<IpAddr> {
        self.cluster_ips.iter().copied().find(|i| fam.holds(i))
    }

    /// Its UDP frontends and nodePorts in `fam` (none without a ClusterIP of the family).
    fn claims(&self, fam: Family) -> (BTreeSet<SocketAddr>, BTreeSet<u16>) {
        let (mut frontends, mut node_ports) = (BTreeSet::new(), BTreeSet::new());
        if self.cluster_ip(fam).is_none() {
            return (frontends, node_ports);
        }
        let addrs: Vec<IpAddr> = self
            .cluster_ips
            .iter()
            .chain(&self.external_ips)
            .chain(&self.lb_ips)
            .copied()
            .filter(|i| fam.holds(i))
            .collect();
        for p in self.ports.iter().filter(|p| p.udp) {
            frontends.extend(addrs.iter().map(|a| SocketAddr::new(*a, p.port)));
            node_ports.extend(p.node_port);
        }
        (frontends, node_ports)
    }

    /// What the UDP cleanup sees of it in `fam`: a change elsewhere (a TCP port) is none.
    #[allow(clippy::type_complexity)]
    fn view(
        &self,
        fam: Family,
    ) -> (
        bool,
        (BTreeSet<SocketAddr>, BTreeSet<u16>),
        Vec<(&'static str, u16, Option<u16>, BTreeSet<SocketAddr>)>,
    ) {
        let serving = self
            .serving(fam)
            .into_iter()
            .map(|(p, set)| (p.name, p.port, p.node_port, set))
            .collect();
        (self.foreign, self.claims(fam), serving)
    }

    /// The serving backends of each UDP port in `fam`, as kube-proxy's (not another proxy's).
    fn serving(&self, fam: Family) -> Vec<(Port, BTreeSet<SocketAddr>)> {
        if self.foreign || self.cluster_ip(fam).is_none() {
            return vec![];
        }
        self.ports
            .iter()
            .filter(|p| p.udp)
            .map(|p| {
                let set = if p.slice_name == p.name {
                    self.endpoints
                        .iter()
                        .filter(|(a, serving)| *serving && fam.holds(a))
                        .map(|(a, _)| SocketAddr::new(*a, p.target))
                        .collect()
                } else {
                    BTreeSet::new()
                };
                (p.clone(), set)
            })
            .collect()
    }

    fn objects(&self, name: &str) -> (Service, Vec<EndpointSlice>) {
        let ports: Vec<_> = self
            .ports
            .iter()
            .map(|p| {
                json!({"name": p.name, "port": p.port, "protocol": if p.udp { "UDP" } else { "TCP" },
                       "nodePort": p.node_port})
            })
            .collect();
        let labels = if self.foreign {
            json!({LABEL_SERVICE_PROXY_NAME: "other"})
        } else {
            json!({})
        };
        let svc = serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": name, "labels": labels},
            "spec": {"type": "LoadBalancer", "clusterIP": self.cluster_ips[0].to_string(),
                     "clusterIPs": self.cluster_ips.iter().map(|i| i.to_string()).collect::<Vec<_>>(),
                     "externalIPs": self.external_ips.iter().map(|i| i.to_string()).collect::<Vec<_>>(),
                     "ports": ports},
            "status": {"loadBalancer": {"ingress": self.lb_ips.iter().map(|i| json!({"ip": i.to_string()})).collect::<Vec<_>>()}},
        }))
        .unwrap();
        let slices = Family::ALL
            .into_iter()
            .map(|fam| {
                let ports: Vec<_> = self
                    .ports
                    .iter()
                    .map(|p| json!({"name": p.slice_name, "port": p.target, "protocol": if p.udp { "UDP" } else { "TCP" }}))
                    .collect();
                let eps: Vec<_> = self
                    .endpoints
                    .iter()
                    .filter(|(a, _)| fam.holds(a))
                    .map(|(a, serving)| json!({"addresses": [a.to_string()], "conditions": {"serving": serving}}))
                    .collect();
                serde_json::from_value(json!({
                    "metadata": {"namespace": "ns", "name": format!("{name}-{}", fam.label()),
                                 "labels": {LABEL_SERVICE_NAME: name}},
                    "addressType": fam.label(), "ports": ports, "endpoints": eps,
                }))
                .unwrap()
            })
            .collect();
        (svc, slices)
    }
}

/// A generated cluster: services by name.
type Cluster = BTreeMap<String, Svc>;

struct Gen<'a> {
    rng: &'a mut Rng,
    pools: &'a Pools,
    /// ClusterIPs handed out so far (each once, like the allocator).
    next_ip: u8,
}

impl Gen<'_> {
    fn cluster_ips(&mut self) -> Vec<IpAddr> {
        self.next_ip += 1;
        let n = self.next_ip;
        let v4 = ip(&format!("10.96.0.{n}"));
        let v6 = ip(&format!("fd00:10:96::{n:x}"));
        match self.rng.below(3) {
            0 => vec![v4],
            1 => vec![v6],
            _ => vec![v4, v6],
        }
    }

    fn endpoints(&mut self) -> Vec<(IpAddr, bool)> {
        let pick = self.rng.some(&self.pools.backends, 40);
        pick.into_iter()
            .map(|a| (a, !self.rng.chance(15)))
            .collect()
    }

    fn port(&mut self, name: &'static str) -> Port {
        Port {
            name,
            port: self.rng.pick(&SERVICE_PORTS),
            node_port: self.rng.chance(50).then(|| self.rng.pick(&NODE_PORTS)),
            udp: !self.rng.chance(15),
            slice_name: if self.rng.chance(10) { "other" } else { name },
            target: self.rng.pick(&TARGET_PORTS),
        }
    }

    /// A service; its ExternalIPs may include another's ClusterIP (`taken`).
    fn service(&mut self, taken: &[IpAddr]) -> Svc {
        let mut external_ips = self.rng.some(&self.pools.external, 20);
        if !taken.is_empty() && self.rng.chance(20) {
            external_ips.push(self.rng.pick(taken));
        }
        let mut ports = vec![self.port("a")];
        if self.rng.chance(40) {
            ports.push(self.port("b"));
            if ports[1].port == ports[0].port && ports[1].udp == ports[0].udp {
                ports.pop();
            }
        }
        Svc {
            cluster_ips: self.cluster_ips(),
            external_ips,
            lb_ips: self.rng.some(&self.pools.lb, 20),
            ports,
            foreign: self.rng.chance(10),
            endpoints: self.endpoints(),
        }
    }

    fn cluster(&mut self, n: usize) -> Cluster {
        let mut c = Cluster::new();
        for i in 0..n {
            let taken: Vec<IpAddr> = c.values().flat_map(|s| s.cluster_ips.clone()).collect();
            c.insert(format!("s{i}"), self.service(&taken));
        }
        c
    }

    /// One to three changes; returns the new cluster.
    fn change(&mut self, old: &Cluster, fresh: &mut usize) -> Cluster {
        let mut c = old.clone();
        for _ in 0..1 + self.rng.below(3) {
            let names: Vec<String> = c.keys().cloned().collect();
            let taken: Vec<IpAddr> = c.values().flat_map(|s| s.cluster_ips.clone()).collect();
            if names.is_empty() || self.rng.chance(10) {
                *fresh += 1;
                c.insert(format!("new{fresh}"), self.service(&taken));
                continue;
            }
            let name = names[self.rng.below(names.len())].clone();
            let s = c.get_mut(&name).unwrap();
            match self.rng.below(9) {
                0 => {
                    c.remove(&name);
                }
                1 | 2 => s.endpoints = self.endpoints(),
                3 => {
                    if let Some(e) = s.endpoints.first_mut() {
                        e.1 = !e.1;
                    }
                }
                4 => {
                    let p = self.rng.below(s.ports.len());
                    s.ports[p].slice_name = if s.ports[p].slice_name == "other" {
                        s.ports[p].name
                    } else {
                        "other"
                    };
                }
                5 => {
                    s.external_ips = self.rng.some(&self.pools.external, 30);
                    if self.rng.chance(30) && !taken.is_empty() {
                        s.external_ips.push(self.rng.pick(&taken));
                    }
                }
                6 => s.lb_ips = self.rng.some(&self.pools.lb, 30),
                7 => {
                    let p = self.rng.below(s.ports.len());
                    s.ports[p].node_port = self.rng.chance(70).then(|| self.rng.pick(&NODE_PORTS));
                    s.ports[p].target = self.rng.pick(&TARGET_PORTS);
                }
                _ => s.foreign = !s.foreign,
            }
        }
        c
    }
}

/// The model the agent builds from `c` at `now`.
fn model_of(
    c: &Cluster,
    allocated: &BTreeSet<IpAddr>,
    settle: &mut Settle,
    tombstones: &mut Tombstones,
    now: Instant,
) -> Model {
    let objects: Vec<(Service, Vec<EndpointSlice>)> =
        c.iter().map(|(name, s)| s.objects(name)).collect();
    let cidrs: Vec<ServiceCIDR> = vec![testkit::networking::service_cidr(
        "kubernetes",
        ["10.96.0.0/16", "fd00:10:96::/112"],
    )];
    let addresses: Vec<IPAddress> = allocated
        .iter()
        .map(|a| serde_json::from_value(json!({"metadata": {"name": a.to_string()}})).unwrap())
        .collect();
    let node = serde_json::from_value(json!({"metadata": {"name": "n"}, "status": {"addresses":
        pools().node.iter().map(|a| json!({"type": "InternalIP", "address": a.to_string()})).collect::<Vec<_>>()}}))
    .unwrap();
    let m = model::reference::build(
        objects.iter().map(|(s, _)| s),
        objects.iter().flat_map(|(_, sl)| sl),
    )
    .with_service_ips(&cidrs, &addresses)
    .with_node(Some(&node));
    tombstones.apply(settle.apply(m, now), now)
}

/// What the change touched, from the generated services: every frontend and nodePort, old
/// and new, of each service that differs (added, deleted, handed to another proxy or back
/// included), and the backends taken away: each service port's serving backends that the same
/// port no longer serves, and each frontend's or nodePort's (the union of the services
/// claiming it) that it no longer serves.
#[derive(Debug, Default)]
struct Touched {
    frontends: BTreeSet<SocketAddr>,
    node_ports: BTreeSet<u16>,
    backends: BTreeSet<IpAddr>,
}

impl Touched {
    fn between(old: &Cluster, new: &Cluster, fam: Family) -> Self {
        let mut t = Touched::default();
        let names: BTreeSet<&String> = old.keys().chain(new.keys()).collect();
        for name in names {
            let (was, now) = (old.get(name), new.get(name));
            // Changed in either family, as the UDP cleanup sees it.
            let changed = Family::ALL.into_iter().any(|f| {
                let nothing = |s: Option<&Svc>| s.is_none_or(|s| s.claims(f).0.is_empty());
                was.map(|s| s.view(f)) != now.map(|s| s.view(f)) && !(nothing(was) && nothing(now))
            });
            if !changed {
                continue;
            }
            for s in was.into_iter().chain(now) {
                let (f, n) = s.claims(fam);
                t.frontends.extend(f);
                t.node_ports.extend(n);
            }
            let serving = |s: Option<&Svc>| -> BTreeMap<&'static str, BTreeSet<SocketAddr>> {
                s.map(|s| {
                    s.serving(fam)
                        .into_iter()
                        .map(|(p, set)| (p.name, set))
                        .collect()
                })
                .unwrap_or_default()
            };
            let (before, after) = (serving(was), serving(now));
            for (port, set) in &before {
                let kept = after.get(port).cloned().unwrap_or_default();
                t.backends.extend(set.difference(&kept).map(|b| b.ip()));
            }
        }
        let (before, after) = (unions(old, fam), unions(new, fam));
        for (key, set) in &before {
            let kept = after.get(key).cloned().unwrap_or_default();
            t.backends.extend(set.difference(&kept).map(|b| b.ip()));
        }
        t
    }

    fn touches(&self, e: &Entry) -> bool {
        self.frontends
            .contains(&SocketAddr::new(e.orig.dst, e.orig.dst_port))
            || self.node_ports.contains(&e.orig.dst_port)
            || self.backends.contains(&e.reply.src)
    }
}

/// A frontend or a nodePort.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    Frontend(SocketAddr),
    NodePort(u16),
}

/// Each key's serving backends: the union over kube-proxy's services claiming it.
fn unions(c: &Cluster, fam: Family) -> BTreeMap<Key, BTreeSet<SocketAddr>> {
    let mut out: BTreeMap<Key, BTreeSet<SocketAddr>> = BTreeMap::new();
    for s in c.values() {
        let addrs: Vec<IpAddr> = s
            .cluster_ips
            .iter()
            .chain(&s.external_ips)
            .chain(&s.lb_ips)
            .copied()
            .filter(|i| fam.holds(i))
            .collect();
        for (p, set) in s.serving(fam) {
            for a in &addrs {
                out.entry(Key::Frontend(SocketAddr::new(*a, p.port)))
                    .or_default()
                    .extend(&set);
            }
            if let Some(np) = p.node_port {
                out.entry(Key::NodePort(np)).or_default().extend(&set);
            }
        }
    }
    out
}

/// One generated case: the change, both models, and a table (also stream_tests' cases).
pub(super) struct Case {
    old: Cluster,
    new: Cluster,
    pub(super) m0: Model,
    pub(super) m1: Model,
    pub(super) table: Vec<Entry>,
}

pub(super) fn case(seed: u64, entries: usize) -> Case {
    let mut rng = Rng(seed);
    let p = pools();
    let mut g = Gen {
        rng: &mut rng,
        pools: &p,
        next_ip: 0,
    };
    let mut fresh = 0;
    let n = 1 + g.rng.below(6);
    let before = g.cluster(n);
    // Services deleted earlier: remembered frontends in both models, not part of the change.
    let old = g.change(&before, &mut fresh);
    let new = g.change(&old, &mut fresh);
    let settle_after = if g.rng.chance(50) {
        Duration::ZERO
    } else {
        Duration::from_secs(3600)
    };
    let all: Vec<&Svc> = before
        .values()
        .chain(old.values())
        .chain(new.values())
        .collect();
    // ClusterIPs keep their IPAddress for a while after their Service went; sometimes one is
    // released (the triggered pass is then a full one).
    let mut allocated: BTreeSet<IpAddr> = all.iter().flat_map(|s| s.cluster_ips.clone()).collect();
    let mut allocated1 = allocated.clone();
    if g.rng.chance(10)
        && let Some(gone) = before
            .values()
            .flat_map(|s| s.cluster_ips.clone())
            .find(|i| !new.values().any(|s| s.cluster_ips.contains(i)))
    {
        allocated1.remove(&gone);
    }
    let t0 = Instant::now();
    let mut settle = Settle::new(settle_after);
    let mut tombstones = Tombstones::new(Duration::from_secs(600));
    model_of(&before, &allocated, &mut settle, &mut tombstones, t0);
    let m0 = model_of(&old, &allocated, &mut settle, &mut tombstones, t0);
    let m1 = model_of(&new, &allocated1, &mut settle, &mut tombstones, t0);
    allocated.clear();

    // Destinations: every frontend address any service ever had on every port, node and host
    // addresses and a remote host on every nodePort, an orphaned service IP.
    let mut dsts: Vec<SocketAddr> = Vec::new();
    for s in &all {
        for a in s.cluster_ips.iter().chain(&s.external_ips).chain(&s.lb_ips) {
            for port in SERVICE_PORTS.into_iter().chain([8053]) {
                dsts.push(SocketAddr::new(*a, port));
            }
        }
    }
    for a in p.node.iter().chain(&p.host).chain(&p.remote) {
        for port in NODE_PORTS.into_iter().chain([30099]) {
            dsts.push(SocketAddr::new(*a, port));
        }
    }
    dsts.extend([
        SocketAddr::new(ip("10.96.0.200"), 53),
        SocketAddr::new(ip("fd00:10:96::c8"), 53),
    ]);
    let mut table = Vec::new();
    for i in 0..entries {
        let dst = g.rng.pick(&dsts);
        let fam = Family::of(dst.ip());
        let backends: Vec<IpAddr> = p
            .backends
            .iter()
            .copied()
            .filter(|b| fam.holds(b))
            .collect();
        let reply = match g.rng.below(10) {
            0..=4 => SocketAddr::new(g.rng.pick(&backends), g.rng.pick(&TARGET_PORTS)),
            5..=7 => dst,
            _ => SocketAddr::new(
                if fam == V4 {
                    ip("10.244.9.9")
                } else {
                    ip("fd00:244::99")
                },
                53,
            ),
        };
        let client = SocketAddr::new(
            if fam == V4 {
                ip("10.0.0.1")
            } else {
                ip("2001:db8:c::1")
            },
            10000 + i as u16,
        );
        let proto = if g.rng.chance(85) {
            IPPROTO_UDP
        } else {
            IPPROTO_TCP
        };
        table.push(Entry {
            id: Some(i as u32 + 1),
            ..Entry::dnat(proto, client, dst, reply)
        });
    }
    Case {
        old,
        new,
        m0,
        m1,
        table,
    }
}

pub(super) fn host() -> HashSet<IpAddr> {
    pools().host.into_iter().collect()
}

/// A state whose full passes never delete flows to orphaned service IPs (their grace is tested
/// on its own; triggered passes leave them to full passes).
fn state() -> PassState {
    PassState {
        orphan_grace: Duration::from_secs(3600),
        ..PassState::seen_all()
    }
}

/// What a full pass over `m` deletes from `table` in `fam`.
fn full_pass(table: &[Entry], m: &Model, fam: Family) -> BTreeSet<Entry> {
    let mut t = KernelLike {
        entries: table.to_vec(),
        host: host(),
        reject_select: false,
    };
    run_pass(&mut t, fam, &m[fam], &mut state(), Instant::now()).unwrap();
    let left: BTreeSet<Entry> = t.entries.into_iter().collect();
    table
        .iter()
        .filter(|e| !left.contains(e))
        .copied()
        .collect()
}

#[derive(Debug, Default)]
struct Tally {
    focused: usize,
    full: usize,
    deleted: usize,
    stale_untouched: usize,
    selected: usize,
}

#[test]
fn a_triggered_pass_deletes_what_a_full_pass_would_among_what_changed_and_nothing_else() {
    let mut tally = Tally::default();
    for seed in 0..400 {
        let c = case(seed, 150);
        let focus = Focus::between(&c.m0, &c.m1);
        match &focus {
            Some(_) => tally.focused += 1,
            None => tally.full += 1,
        }
        for fam in Family::ALL {
            let full = full_pass(&c.table, &c.m1, fam);
            let mut t = KernelLike {
                entries: c.table.clone(),
                host: host(),
                reject_select: seed % 7 == 0,
            };
            let scope = focus.as_ref().map(|f| &f[fam]);
            if let Some(s) = scope {
                tally.selected += usize::from(super::pass::selections(fam, s).is_some());
            }
            run_focused_pass(&mut t, fam, &c.m1[fam], &mut state(), scope, Instant::now()).unwrap();
            let left: BTreeSet<Entry> = t.entries.iter().copied().collect();
            let gone: BTreeSet<Entry> = c
                .table
                .iter()
                .filter(|e| !left.contains(e))
                .copied()
                .collect();
            let want: BTreeSet<Entry> = match scope {
                None => full.clone(),
                Some(_) => {
                    let touched = Touched::between(&c.old, &c.new, fam);
                    tally.stale_untouched += full.iter().filter(|e| !touched.touches(e)).count();
                    full.iter()
                        .filter(|e| touched.touches(e))
                        .copied()
                        .collect()
                }
            };
            tally.deleted += gone.len();
            if gone != want {
                let show =
                    |s: &BTreeSet<Entry>| s.iter().map(|e| e.to_string()).collect::<Vec<_>>();
                panic!(
                    "seed {seed} {fam}: deleted {:?}\nwant {:?}\nold {:#?}\nnew {:#?}\nscope {:?}",
                    show(&gone.difference(&want).copied().collect()),
                    show(&want.difference(&gone).copied().collect()),
                    c.old,
                    c.new,
                    scope
                );
            }
        }
    }
    // The generator reaches what the property is about.
    println!("{tally:?}");
    assert!(tally.focused > 300 && tally.full > 5, "{tally:?}");
    assert!(
        tally.deleted > 2000 && tally.stale_untouched > 1000 && tally.selected > 100,
        "{tally:?}"
    );
}

/// The same property against the kernel's table, both families, for a few seeds: the entries
/// are created in a namespace of the test's own, the triggered pass runs on the real socket.
#[test]
fn a_triggered_pass_on_the_kernel_table_matches_a_full_pass_among_what_changed() {
    let name = "a_triggered_pass_on_the_kernel_table_matches_a_full_pass_among_what_changed";
    if let Some(why) = netns::unavailable() {
        testkit::skipped(name, &format!("needs root and ip netns ({why})"));
        return;
    }
    let mut checked = 0;
    for seed in 1000..1040 {
        let c = case(seed, 120);
        let Some(focus) = Focus::between(&c.m0, &c.m1) else {
            continue;
        };
        let ns = NetNs::create("focus-prop").unwrap();
        ns.exec("ip", &["link", "set", "lo", "up"]).unwrap();
        for a in pools().host {
            let (cidr, extra) = if a.is_ipv4() {
                (format!("{a}/32"), None)
            } else {
                (format!("{a}/128"), Some("nodad"))
            };
            let mut args = vec!["addr", "add", cidr.as_str(), "dev", "lo"];
            args.extend(extra);
            ns.exec("ip", &args).unwrap();
        }
        ns.run(|| {
            let mut ct = Conntrack::open().unwrap();
            let created: Vec<Entry> = c.table.iter().map(|e| Entry { id: None, ..*e }).collect();
            let r = ct
                .create(&created, 300, STATUS_SEEN_REPLY | STATUS_ASSURED)
                .unwrap();
            assert_eq!(r.ok, created.len(), "seed {seed}: {r:?}");
            let mut kernel = Kernel::default();
            let mut want_left = BTreeSet::new();
            for fam in Family::ALL {
                let id_free = |s: BTreeSet<Entry>| -> BTreeSet<Entry> {
                    s.into_iter().map(|e| Entry { id: None, ..e }).collect()
                };
                let full = id_free(full_pass(&created, &c.m1, fam));
                let touched = Touched::between(&c.old, &c.new, fam);
                want_left.extend(created.iter().filter(|e| {
                    e.orig.family() == fam && !(full.contains(e) && touched.touches(e))
                }));
                run_focused_pass(
                    &mut kernel,
                    fam,
                    &c.m1[fam],
                    &mut state(),
                    Some(&focus[fam]),
                    Instant::now(),
                )
                .unwrap();
            }
            let mut left = BTreeSet::new();
            for fam in Family::ALL {
                ct.dump(fam, None, &mut |e| {
                    left.insert(Entry { id: None, ..*e });
                })
                .unwrap();
            }
            let show = |a: &BTreeSet<Entry>, b: &BTreeSet<Entry>| {
                a.difference(b).map(|e| e.to_string()).collect::<Vec<_>>()
            };
            assert!(
                left == want_left,
                "seed {seed}: the kernel's table after the pass: deleted {:?}, kept {:?}",
                show(&want_left, &left),
                show(&left, &want_left)
            );
        })
        .unwrap();
        checked += 1;
        if checked == 8 {
            break;
        }
    }
    assert_eq!(checked, 8, "enough focused cases");
}
