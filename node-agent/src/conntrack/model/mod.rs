//! The service model a pass judges entries against (its types), and how it is built from
//! Services and EndpointSlices, the way kube-proxy's service and endpoint trackers feed
//! CleanStaleEntries (spec 3.2, last part), plus ServiceCIDRs, IPAddresses, the Node and the
//! remembered deleted frontends.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{IPAddress, ServiceCIDR};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::netlink::family::{Family, PerFamily};
use super::project::{self, ServiceView, SliceView};

pub use super::addr::{ServiceIpRange, canonical};
pub use super::project::{
    LABEL_HEADLESS, LABEL_SERVICE_NAME, LABEL_SERVICE_PROXY_NAME, not_kube_proxys,
};

/// One IP family's UDP services, as kube-proxy's CleanStaleEntries sees them, plus what
/// kube-proxy does not know: recently deleted frontends, the service IP ranges and which of
/// their IPs are allocated, and this node's addresses.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FamilyModel {
    /// `frontend IP:port -> serving endpoints IP:port` (ClusterIP, ExternalIPs, LB VIPs) of
    /// live services. Several services claiming one frontend: the union of their serving
    /// endpoints (a flow is kept when any of them would keep it). An empty set: no claimant has
    /// a serving endpoint.
    pub frontends: HashMap<SocketAddr, HashSet<SocketAddr>>,
    /// `nodePort -> serving endpoints IP:port` of live services (a union, as above).
    pub node_ports: HashMap<u16, HashSet<SocketAddr>>,
    /// Frontends and nodePorts of a live service port that has had no serving endpoint for
    /// less than the settle time (see [`Settle`]): never judged, as kube-proxy v1.36 skips a
    /// service without endpoints. Disjoint from `frontends` and `node_ports`.
    pub settling_frontends: HashSet<SocketAddr>,
    pub settling_node_ports: HashSet<u16>,
    /// Frontends of live services that another proxy handles (`service-proxy-name`): never
    /// judged, and they stop the later rules (another proxy's DNAT is not ours to undo). One
    /// of them claiming a frontend keeps every flow through it, whoever else claims it.
    pub foreign_frontends: HashSet<SocketAddr>,
    pub foreign_node_ports: HashSet<u16>,
    /// What each live service of ours claims, by `namespace/name` then service port name: a
    /// triggered pass looks at every frontend of a service whose claims changed.
    pub services: BTreeMap<String, Ports>,
    /// Frontends and nodePorts no live service holds any more, remembered for a while after
    /// they went (see `model::Tombstones`). A live or foreign frontend with the same key wins.
    pub deleted_frontends: HashSet<SocketAddr>,
    pub deleted_node_ports: HashSet<u16>,
    /// ServiceCIDR prefixes of this family. Empty: the orphan rule is off.
    pub service_cidrs: Vec<ServiceIpRange>,
    /// IPs inside a ServiceCIDR that an IPAddress object holds.
    pub allocated: HashSet<IpAddr>,
    /// This node's addresses from its Node object (`status.addresses`); the host's own
    /// addresses are read at each pass and passed to `decide::stale` beside the model.
    pub node_ips: HashSet<IpAddr>,
}

pub use super::claim::{Addrs, Claim, Ports};

impl FamilyModel {
    /// Whether a frontend or nodePort has no serving endpoint (and has settled).
    pub fn has_unserved(&self) -> bool {
        self.frontends.values().any(HashSet::is_empty)
            || self.node_ports.values().any(HashSet::is_empty)
    }

    /// Nothing to compare entries against: a pass could not delete anything.
    pub fn is_empty(&self) -> bool {
        self.frontends.is_empty()
            && self.node_ports.is_empty()
            && self.deleted_frontends.is_empty()
            && self.deleted_node_ports.is_empty()
            && self.service_cidrs.is_empty()
    }

    pub fn in_service_cidr(&self, ip: IpAddr) -> bool {
        self.service_cidrs.iter().any(|c| c.contains(ip))
    }
}

/// Both families' halves, indexed by [`Family`]; each pass uses one.
pub type Model = PerFamily<FamilyModel>;

/// What each UDP port of `svc` claims in `fam`, in spec order, given the views of its slices.
/// No serving endpoint (or no slice port matching the service port) is an empty set: every
/// flow through the frontends is stale (kubernetes#139629), once that has held for the settle
/// time ([`Settle`]).
pub fn port_claims<'a>(
    svc: &'a ServiceView,
    slices: &[&SliceView],
    fam: Family,
) -> Vec<(&'a str, Claim)> {
    let ips = &svc.ips[fam];
    if ips.is_empty() {
        return Vec::new(); // headless ("None"), unallocated, or no IP of this family
    }
    svc.ports
        .iter()
        .map(|p| {
            let mut serving = Vec::new();
            for s in slices {
                // The first slice port of the name decides, even an invalid one.
                if let Some((_, Some(ep_port))) = s.ports.iter().find(|(n, _)| *n == p.name) {
                    serving.extend(
                        s.serving
                            .iter()
                            .filter(|ip| fam.holds(ip))
                            .map(|ip| SocketAddr::new(*ip, *ep_port)),
                    );
                }
            }
            let claim = Claim {
                frontends: ips.iter().map(|ip| SocketAddr::new(*ip, p.port)).collect(),
                node_port: p.node_port,
                serving: serving.into_iter().collect(),
                settling: false,
            };
            (&*p.name, claim)
        })
        .collect()
}

/// `namespace/name`, the key of [`FamilyModel::services`].
pub fn service_key(ns: &str, name: &str) -> String {
    format!("{ns}/{name}")
}

/// Adds one service's claims to `m` (see [`build_views`]).
pub(super) fn add_service(
    m: &mut FamilyModel,
    key: &str,
    svc: &ServiceView,
    slices: &[&SliceView],
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

/// Builds both families' models from the views of every Service (namespace, name, view) and
/// EndpointSlice (namespace, view). Services claiming the same frontend or nodePort share it:
/// its serving set is the union of theirs. Services labelled with a proxy name are another
/// proxy's: their frontends are recorded as foreign (never judged). Every service port without
/// a serving endpoint is judged at once (an empty set); [`Settle`] holds them back for a while.
pub fn build_views<'a>(
    services: impl IntoIterator<Item = (&'a str, &'a str, &'a ServiceView)>,
    slices: impl IntoIterator<Item = (&'a str, &'a SliceView)>,
) -> Model {
    let mut by_service: HashMap<(&str, &str), Vec<&SliceView>> = HashMap::new();
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

/// [`build_views`] from whole objects (tests, benches): each is projected first.
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
        .map(|s| (ns_name(&s.metadata), project::service(s)))
        .collect();
    let slices: Vec<_> = slices
        .into_iter()
        .map(|s| (ns_name(&s.metadata).0, project::slice(s)))
        .collect();
    build_views(
        services.iter().map(|((ns, name), v)| (*ns, *name, v)),
        slices.iter().map(|(ns, v)| (*ns, v)),
    )
}

impl Model {
    /// Adds the ServiceCIDR prefixes and the IPs IPAddress objects hold (the orphan rule). A
    /// ServiceCIDR being deleted still counts: its IPs can still be allocated.
    pub fn with_service_ranges<'a>(
        mut self,
        cidrs: impl IntoIterator<Item = &'a ServiceIpRange>,
        allocated: impl IntoIterator<Item = IpAddr>,
    ) -> Self {
        for cidr in cidrs {
            let fm = &mut self[Family::of(cidr.addr)];
            if !fm.service_cidrs.contains(cidr) {
                fm.service_cidrs.push(*cidr);
            }
        }
        for ip in allocated {
            self[Family::of(ip)].allocated.insert(ip);
        }
        for fm in &mut self.0 {
            fm.service_cidrs.sort();
        }
        self
    }

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
        let allocated = addresses.into_iter().filter_map(project::ip_address);
        self.with_service_ranges(&ranges, allocated)
    }

    /// Adds this node's addresses (its Node's `status.addresses` that are IPs).
    pub fn with_node_ips(mut self, ips: &[IpAddr]) -> Self {
        for ip in ips {
            self[Family::of(*ip)].node_ips.insert(*ip);
        }
        self
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
