//! The reference definitions of the model, for tests and benches only (never in the binary):
//! the model built from scratch from the facts (`build_facts`, `build` from whole objects
//! decoded as the watches decode them, `slim`), the deleted frontends remembered from one build
//! to the next (`Tombstones`), the settle before the zero-endpoint rule (`Settle`), and
//! `whole`, the model read straight from whole objects. Production keeps `Live`, which `live_tests.rs` checks equals `build_facts` then
//! `Settle` then `Tombstones` after every update; `project_tests.rs` checks the facts against
//! `whole`.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{IPAddress, ServiceCIDR};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::project::{self, ServiceFacts, SliceFacts};
use super::{Claim, FamilyModel, Model, ServiceIpRange, port_claims};
use crate::conntrack::netlink::family::{Family, PerFamily};
use crate::conntrack::wire::{WireIpAddress, WireService, WireSlice};

/// `whole` as the apiserver sends it, decoded as the watch decodes it: a whole Service,
/// EndpointSlice or IPAddress into its wire type (`wire.rs`).
pub fn slim<W: DeserializeOwned>(whole: &impl Serialize) -> W {
    serde_json::from_value(serde_json::to_value(whole).expect("serializes"))
        .expect("the slim type decodes what the whole one encodes")
}

/// `namespace/name`, the key of [`FamilyModel::services`].
pub fn service_key(ns: &str, name: &str) -> String {
    format!("{ns}/{name}")
}

/// Adds one service's claims to `m` (see [`build_facts`]).
fn add_service(
    m: &mut FamilyModel,
    key: &str,
    svc: &ServiceFacts,
    slices: &[&SliceFacts],
    fam: Family,
) {
    if svc.foreign {
        for (_, c) in port_claims(svc, &[], fam) {
            m.foreign_frontends.extend(&c.frontends);
            m.foreign_node_ports.extend(c.node_port);
        }
        return;
    }
    for (port, claim) in port_claims(svc, slices, fam) {
        // Several services claiming one frontend: the union, never the last one's set alone
        // (a Service declaring kube-dns's ClusterIP as an ExternalIP must not make every DNS
        // flow stale).
        for f in &claim.frontends {
            m.frontends.entry(*f).or_default().extend(&claim.serving);
        }
        if let Some(np) = claim.node_port {
            m.node_ports.entry(np).or_default().extend(&claim.serving);
        }
        // A repeated port name: the last one's claim is recorded, every one's frontends count.
        m.services
            .entry(key.to_string())
            .or_default()
            .insert(port, claim);
    }
}

/// Builds both families' models from the facts of every Service (namespace, name, facts) and
/// EndpointSlice (namespace, facts). Services claiming the same frontend or nodePort share it:
/// its serving set is the union of theirs. Services labelled with a proxy name are another
/// proxy's: their frontends are recorded as foreign (never judged). Every service port without
/// a serving endpoint is judged at once (an empty set); [`Settle`] holds them back for a while.
pub fn build_facts<'a>(
    services: impl IntoIterator<Item = (&'a str, &'a str, &'a ServiceFacts)>,
    slices: impl IntoIterator<Item = (&'a str, &'a SliceFacts)>,
) -> Model {
    let mut by_service: HashMap<(&str, &str), Vec<&SliceFacts>> = HashMap::new();
    for (ns, s) in slices {
        if let Some(svc) = &s.service {
            by_service.entry((ns, svc)).or_default().push(s);
        }
    }
    let services: Vec<_> = services.into_iter().collect();
    PerFamily(Family::ALL.map(|fam| {
        let mut m = FamilyModel::default();
        for (ns, name, svc) in &services {
            let slices = by_service.get(&(*ns, *name)).map_or(&[][..], Vec::as_slice);
            add_service(&mut m, &service_key(ns, name), svc, slices, fam);
        }
        m
    }))
}

/// [`build_facts`] from whole objects (tests, benches): each is decoded as the watch decodes it
/// ([`slim`]) and projected first.
pub fn build<'a>(
    services: impl IntoIterator<Item = &'a Service>,
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
) -> Model {
    let ns_name = |m: &'a ObjectMeta| {
        (
            m.namespace.as_deref().unwrap_or(""),
            m.name.as_deref().unwrap_or(""),
        )
    };
    let services: Vec<_> = services
        .into_iter()
        .map(|s| {
            (
                ns_name(&s.metadata),
                project::service(&slim::<WireService>(s)),
            )
        })
        .collect();
    let slices: Vec<_> = slices
        .into_iter()
        .map(|s| {
            (
                ns_name(&s.metadata).0,
                project::slice(&slim::<WireSlice>(s)),
            )
        })
        .collect();
    build_facts(
        services.iter().map(|((ns, name), v)| (*ns, *name, v)),
        slices.iter().map(|(ns, v)| (*ns, v)),
    )
}

impl Model {
    /// [`Model::with_service_ranges`] from whole objects (tests).
    pub fn with_service_ips<'a>(
        self,
        cidrs: impl IntoIterator<Item = &'a ServiceCIDR>,
        addresses: impl IntoIterator<Item = &'a IPAddress>,
    ) -> Self {
        let ranges: Vec<ServiceIpRange> = cidrs
            .into_iter()
            .flat_map(|c| project::service_cidr(c).into_vec())
            .collect();
        let allocated = addresses
            .into_iter()
            .filter_map(|a| project::ip_address(&slim::<WireIpAddress>(a)));
        self.with_service_ranges(&ranges, allocated)
    }

    /// [`Model::with_node_ips`] from the whole Node (tests).
    pub fn with_node(self, node: Option<&Node>) -> Self {
        let ips = node.map(project::node).unwrap_or_default();
        self.with_node_ips(&ips)
    }
}

/// A frontend or nodePort of one family that a live service held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Key {
    Frontend(SocketAddr),
    NodePort(Family, u16),
}

/// The keys kube-proxy's services hold (`ours`) and those another proxy's services hold.
fn live_keys(m: &Model) -> (HashSet<Key>, HashSet<Key>) {
    let (mut ours, mut foreign) = (HashSet::new(), HashSet::new());
    for (fam, fm) in m.iter() {
        ours.extend(
            fm.frontends
                .keys()
                .chain(&fm.settling_frontends)
                .map(|f| Key::Frontend(*f)),
        );
        ours.extend(
            fm.node_ports
                .keys()
                .chain(&fm.settling_node_ports)
                .map(|p| Key::NodePort(fam, *p)),
        );
        foreign.extend(fm.foreign_frontends.iter().map(|f| Key::Frontend(*f)));
        foreign.extend(fm.foreign_node_ports.iter().map(|p| Key::NodePort(fam, *p)));
    }
    (ours, foreign)
}

/// Remembers frontends and nodePorts that live services stopped holding (service deleted, UDP
/// port removed or changed, ExternalIP or LB VIP removed, nodePort changed), for `retention`
/// after they went, so the flows still DNATed through them are deleted (kubernetes#141371
/// registers the service ports deleted in a sync the same way). Only what this process saw
/// go is remembered: after a restart, the orphan rule covers ClusterIPs.
#[derive(Debug)]
pub struct Tombstones {
    retention: Duration,
    prev: Option<HashSet<Key>>,
    gone: HashMap<Key, Instant>,
}

impl Tombstones {
    pub fn new(retention: Duration) -> Self {
        Self {
            retention,
            prev: None,
            gone: HashMap::new(),
        }
    }

    /// Takes the model built from the live lists at `now`, records what went since the last
    /// call, and adds every unexpired tombstone that no live service holds again.
    pub fn apply(&mut self, mut m: Model, now: Instant) -> Model {
        // Only what kube-proxy's services held is remembered: another proxy's flows are not
        // ours to judge, and a service handed to another proxy is not a deletion.
        let (ours, foreign) = live_keys(&m);
        let live: HashSet<Key> = ours.union(&foreign).copied().collect();
        if let Some(prev) = &self.prev {
            for k in prev.difference(&live) {
                self.gone.insert(*k, now + self.retention);
            }
        }
        self.gone
            .retain(|k, until| *until > now && !live.contains(k));
        for k in self.gone.keys() {
            match *k {
                Key::Frontend(f) => {
                    m[Family::of(f.ip())].deleted_frontends.insert(f);
                }
                Key::NodePort(fam, p) => {
                    m[fam].deleted_node_ports.insert(p);
                }
            }
        }
        self.prev = Some(ours);
        m
    }
}

/// Holds back the zero-endpoint rule (kubernetes#139629) for a live service port until "no
/// serving endpoint" has held for `after`: an EndpointSlice deleted and re-created (by hand, by
/// a controller resync) leaves a live service without endpoints for a moment, and judging its
/// flows then would cut every healthy one. Until then the port's frontends and nodePort are
/// `settling` (not judged, as kube-proxy v1.36 skips such a service). A deleted service is not
/// held back: its frontends become deleted ones at once (`Tombstones`).
#[derive(Debug)]
pub struct Settle {
    after: Duration,
    /// (service, port name, family) -> first build that saw it without a serving endpoint.
    since: HashMap<(String, String, Family), Instant>,
}

impl Settle {
    pub fn new(after: Duration) -> Self {
        Self {
            after,
            since: HashMap::new(),
        }
    }

    /// Takes the model built from the live lists at `now`: a port without a serving endpoint
    /// for less than `after` becomes settling; a port served again is forgotten.
    pub fn apply(&mut self, mut m: Model, now: Instant) -> Model {
        let mut seen = HashSet::new();
        for fam in Family::ALL {
            let fm = &mut m[fam];
            let mut held: Vec<Claim> = Vec::new();
            for (svc, ports) in &mut fm.services {
                for (port, claim) in ports.iter_mut() {
                    if !claim.serving.is_empty() {
                        continue;
                    }
                    let key = (svc.clone(), port.to_string(), fam);
                    let since = *self.since.entry(key.clone()).or_insert(now);
                    seen.insert(key);
                    if now.saturating_duration_since(since) < self.after {
                        claim.settling = true;
                        held.push(claim.clone());
                    }
                }
            }
            for claim in held {
                for &f in &claim.frontends {
                    fm.frontends.remove(&f);
                    fm.settling_frontends.insert(f);
                }
                if let Some(np) = claim.node_port {
                    fm.node_ports.remove(&np);
                    fm.settling_node_ports.insert(np);
                }
            }
        }
        self.since.retain(|k, _| seen.contains(k));
        m
    }

    /// How long after `now` the next settling port settles: the model changes then by time
    /// alone, and must be rebuilt for the zero-endpoint rule to apply.
    pub fn next_change(&self, now: Instant) -> Option<Duration> {
        self.since
            .values()
            .map(|since| (*since + self.after).saturating_duration_since(now))
            .filter(|d| !d.is_zero())
            .min()
    }
}

pub mod whole {
    //! The model read straight from whole Services, EndpointSlices, ServiceCIDRs, IPAddresses
    //! and the Node, field by field as kube-proxy reads them: the reference the facts
    //! (`project.rs`) are checked against. `project_tests.rs` checks that the model built from
    //! facts equals this one over generated objects; nothing else uses it.

    use std::collections::{HashMap, HashSet};
    use std::net::{IpAddr, SocketAddr};

    use k8s_openapi::api::core::v1::{Node, Service, ServicePort};
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use k8s_openapi::api::networking::v1::{IPAddress, ServiceCIDR};

    use crate::conntrack::model::addr::parse_ip;
    use crate::conntrack::model::{
        Claim, FamilyModel, LABEL_SERVICE_NAME, Model, ServiceIpRange, not_kube_proxys,
    };
    use crate::conntrack::netlink::family::{Family, PerFamily};

    fn protocol(p: &Option<String>) -> &str {
        p.as_deref().unwrap_or("TCP")
    }

    fn port_name(p: &Option<String>) -> &str {
        p.as_deref().unwrap_or("")
    }

    fn valid_port(p: i32) -> Option<u16> {
        u16::try_from(p).ok().filter(|p| *p != 0)
    }

    /// The serving endpoints `IP:port` of one UDP service port in one family.
    fn serving_endpoints(
        slices: &[&EndpointSlice],
        port: &ServicePort,
        fam: Family,
    ) -> HashSet<SocketAddr> {
        let mut out = HashSet::new();
        for slice in slices.iter().filter(|s| s.address_type == fam.label()) {
            let ep_port = slice.ports.iter().flatten().find(|p| {
                port_name(&p.name) == port_name(&port.name) && protocol(&p.protocol) == "UDP"
            });
            let Some(ep_port) = ep_port.and_then(|p| p.port).and_then(valid_port) else {
                continue;
            };
            for ep in &slice.endpoints {
                let serving = ep
                    .conditions
                    .as_ref()
                    .and_then(|c| c.serving)
                    .unwrap_or(true);
                if !serving {
                    continue;
                }
                // Every address counts (kube-proxy uses only the first): a flow DNATed to any of
                // them may be live, and judging it stale would cut it.
                for ip in ep.addresses.iter().filter_map(|a| parse_ip(a)) {
                    if fam.holds(&ip) {
                        out.insert(SocketAddr::new(ip, ep_port));
                    }
                }
            }
        }
        out
    }

    /// The UDP frontends (`IP:port`) and nodePorts of one service in one family, each with the
    /// service port it belongs to.
    fn udp_frontends(
        svc: &Service,
        fam: Family,
    ) -> Vec<(&ServicePort, Vec<SocketAddr>, Option<u16>)> {
        let mut out = Vec::new();
        let Some(spec) = &svc.spec else { return out };
        let cluster_ips: Vec<&str> = match &spec.cluster_ips {
            Some(ips) if !ips.is_empty() => ips.iter().map(String::as_str).collect(),
            _ => spec.cluster_ip.as_deref().into_iter().collect(),
        };
        let Some(cluster_ip) = cluster_ips
            .iter()
            .filter_map(|ip| parse_ip(ip))
            .find(|ip| fam.holds(ip))
        else {
            return out; // headless ("None"), unallocated, or no IP of this family
        };
        let external_ips = spec
            .external_ips
            .iter()
            .flatten()
            .filter_map(|s| parse_ip(s));
        let lb_vips = svc
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref())
            .into_iter()
            .flatten()
            .filter(|i| i.ip_mode.as_deref().is_none_or(|m| m == "VIP"))
            .filter_map(|i| i.ip.as_deref().and_then(parse_ip));
        let frontend_ips: Vec<IpAddr> = std::iter::once(cluster_ip)
            .chain(external_ips)
            .chain(lb_vips)
            .filter(|ip| fam.holds(ip))
            .collect();
        for port in spec.ports.iter().flatten() {
            if protocol(&port.protocol) != "UDP" {
                continue;
            }
            let Some(svc_port) = valid_port(port.port) else {
                continue;
            };
            let frontends = frontend_ips
                .iter()
                .map(|ip| SocketAddr::new(*ip, svc_port))
                .collect();
            out.push((port, frontends, port.node_port.and_then(valid_port)));
        }
        out
    }

    fn build_family(
        services: &[&Service],
        foreign: &[&Service],
        slices: &HashMap<(&str, &str), Vec<&EndpointSlice>>,
        fam: Family,
    ) -> FamilyModel {
        let mut m = FamilyModel::default();
        for svc in foreign {
            for (_, frontends, node_port) in udp_frontends(svc, fam) {
                m.foreign_frontends.extend(frontends);
                m.foreign_node_ports.extend(node_port);
            }
        }
        for svc in services {
            let ns = svc.metadata.namespace.as_deref().unwrap_or("");
            let name = svc.metadata.name.as_deref().unwrap_or("");
            let svc_slices = slices.get(&(ns, name)).map(Vec::as_slice).unwrap_or(&[]);
            for (port, frontends, node_port) in udp_frontends(svc, fam) {
                // No serving endpoint (or no slice port matching this one) is an empty set: every
                // flow through the frontend is stale (kubernetes#139629), once that has held for
                // the settle time (`Settle`). Several services claiming one frontend: the union,
                // never the last one's set alone (a Service declaring kube-dns's ClusterIP as an
                // ExternalIP must not make every DNS flow stale).
                let serving = serving_endpoints(svc_slices, port, fam);
                for f in &frontends {
                    m.frontends.entry(*f).or_default().extend(&serving);
                }
                if let Some(np) = node_port {
                    m.node_ports.entry(np).or_default().extend(&serving);
                }
                m.services
                    .entry(format!("{ns}/{name}"))
                    .or_default()
                    .insert(
                        port_name(&port.name),
                        Claim {
                            frontends: frontends.into_iter().collect(),
                            node_port,
                            serving: serving.into_iter().collect(),
                            settling: false,
                        },
                    );
            }
        }
        m
    }

    /// Builds both families' models. Services claiming the same frontend or nodePort share it:
    /// its serving set is the union of theirs. Services labelled with a proxy name are another
    /// proxy's: their frontends are recorded as foreign (never judged). Every service port without
    /// a serving endpoint is judged at once (an empty set); [`Settle`] holds them back for a while.
    pub fn build<'a>(
        services: impl IntoIterator<Item = &'a Service>,
        slices: impl IntoIterator<Item = &'a EndpointSlice>,
    ) -> Model {
        let mut by_service: HashMap<(&str, &str), Vec<&EndpointSlice>> = HashMap::new();
        for s in slices {
            if not_kube_proxys(&s.metadata) {
                continue;
            }
            let Some(svc) = s
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_SERVICE_NAME))
            else {
                continue;
            };
            let ns = s.metadata.namespace.as_deref().unwrap_or("");
            by_service.entry((ns, svc.as_str())).or_default().push(s);
        }
        let (mut foreign, mut services): (Vec<&Service>, Vec<&Service>) = services
            .into_iter()
            .filter(|s| {
                s.spec
                    .as_ref()
                    .is_some_and(|sp| sp.type_.as_deref() != Some("ExternalName"))
            })
            .partition(|s| not_kube_proxys(&s.metadata));
        let by_name = |a: &&Service, b: &&Service| {
            (&a.metadata.namespace, &a.metadata.name)
                .cmp(&(&b.metadata.namespace, &b.metadata.name))
        };
        services.sort_by(by_name);
        foreign.sort_by(by_name);
        PerFamily(Family::ALL.map(|f| build_family(&services, &foreign, &by_service, f)))
    }

    /// Adds the ServiceCIDR prefixes and the IPs IPAddress objects hold.
    pub fn with_service_ips<'a>(
        mut m: Model,
        cidrs: impl IntoIterator<Item = &'a ServiceCIDR>,
        addresses: impl IntoIterator<Item = &'a IPAddress>,
    ) -> Model {
        for c in cidrs {
            for cidr in c
                .spec
                .as_ref()
                .and_then(|s| s.cidrs.as_ref())
                .into_iter()
                .flatten()
                .filter_map(|s| ServiceIpRange::parse(s))
            {
                let fm = &mut m[Family::of(cidr.addr)];
                if !fm.service_cidrs.contains(&cidr) {
                    fm.service_cidrs.push(cidr);
                }
            }
        }
        for a in addresses {
            if let Some(ip) = a.metadata.name.as_deref().and_then(parse_ip) {
                m[Family::of(ip)].allocated.insert(ip);
            }
        }
        for fm in &mut m.0 {
            fm.service_cidrs.sort();
        }
        m
    }

    /// Adds the addresses of this node's Node object.
    pub fn with_node(mut m: Model, node: Option<&Node>) -> Model {
        let addrs = node
            .and_then(|n| n.status.as_ref())
            .and_then(|s| s.addresses.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|a| parse_ip(&a.address));
        for ip in addrs {
            m[Family::of(ip)].node_ips.insert(ip);
        }
        m
    }
}
