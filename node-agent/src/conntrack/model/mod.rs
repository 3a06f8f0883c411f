//! The service model a pass judges entries against: its types (`FamilyModel`, `Model`) and
//! what one service port claims in it (`port_claims`), the way kube-proxy's service and
//! endpoint trackers feed CleanStaleEntries (docs/upstream.md, step 2), plus ServiceCIDRs,
//! IPAddresses, the Node and the remembered deleted frontends. The files beside this one keep
//! it: the facts of the watched objects (`project`, `source`), the live model (`live`), what
//! changed in it (`changes`) and what a triggered pass looks at after a change (`focus`), and
//! the backends seen to stop serving (`removed`).

pub mod addr;
pub mod changes;
pub mod claim;
pub mod focus;
pub mod live;
pub mod project;
#[cfg(any(test, feature = "testing"))]
pub mod reference;
pub mod removed;
pub mod source;

#[cfg(test)]
mod changes_tests;
#[cfg(test)]
mod focus_tests;
#[cfg(test)]
mod live_tests;
#[cfg(test)]
mod model_tests;
#[cfg(test)]
pub(super) mod project_tests;
#[cfg(test)]
mod removed_tests;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};

use super::netlink::family::{Family, PerFamily};
use project::{ServiceFacts, SliceFacts};

pub use addr::{ServiceIpRange, canonical};
pub use claim::{Addrs, Claim, Ports};
pub use project::{LABEL_HEADLESS, LABEL_SERVICE_NAME, LABEL_SERVICE_PROXY_NAME, not_kube_proxys};

/// One IP family's UDP services, as kube-proxy's CleanStaleEntries sees them, plus what
/// kube-proxy does not know: recently deleted frontends, the service IP ranges and which of
/// their IPs are allocated, and this node's addresses.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FamilyModel {
    /// `frontend IP:port -> serving endpoints IP:port` (ClusterIP, ExternalIPs, LB VIPs) of
    /// live services. Several services claiming one frontend: the union of their serving
    /// endpoints (a flow is kept when any of them would keep it). An empty set: no claimant has
    /// a serving endpoint.
    pub frontends: HashMap<SocketAddr, Addrs>,
    /// `nodePort -> serving endpoints IP:port` of live services (a union, as above).
    pub node_ports: HashMap<u16, Addrs>,
    /// Frontends and nodePorts of a live service port that has had no serving endpoint for
    /// less than the settle time (see `reference::Settle`): never judged, as kube-proxy v1.36 skips a
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
    /// they went (see `reference::Tombstones`). A live or foreign frontend with the same key wins.
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

impl FamilyModel {
    /// Whether a frontend or nodePort has no serving endpoint (and has settled).
    pub fn has_unserved(&self) -> bool {
        self.frontends.values().any(Addrs::is_empty)
            || self.node_ports.values().any(Addrs::is_empty)
    }

    /// Nothing to compare entries against: a pass could not delete anything.
    pub fn is_empty(&self) -> bool {
        self.frontends.is_empty()
            && self.node_ports.is_empty()
            && self.deleted_frontends.is_empty()
            && self.deleted_node_ports.is_empty()
            && self.service_cidrs.is_empty()
    }

    /// Every frontend the model says something of: live, settling, another proxy's, deleted
    /// (a key may be in more than one).
    pub fn frontend_keys(&self) -> impl Iterator<Item = &SocketAddr> {
        self.frontends
            .keys()
            .chain(&self.settling_frontends)
            .chain(&self.foreign_frontends)
            .chain(&self.deleted_frontends)
    }

    /// Every nodePort the model says something of, as [`FamilyModel::frontend_keys`].
    pub fn node_port_keys(&self) -> impl Iterator<Item = &u16> {
        self.node_ports
            .keys()
            .chain(&self.settling_node_ports)
            .chain(&self.foreign_node_ports)
            .chain(&self.deleted_node_ports)
    }

    pub fn in_service_cidr(&self, ip: IpAddr) -> bool {
        self.service_cidrs.iter().any(|c| c.contains(ip))
    }
}

/// Both families' halves, indexed by [`Family`]; each pass uses one.
pub type Model = PerFamily<FamilyModel>;

/// What each UDP port of `svc` claims in `fam`, in spec order, given the facts of its slices.
/// No serving endpoint (or no slice port matching the service port) is an empty set: every
/// flow through the frontends is stale (kubernetes#139629), once that has held for the settle
/// time (`reference::Settle` defines it, `Live` keeps it).
pub fn port_claims<'a>(
    svc: &'a ServiceFacts,
    slices: &[&SliceFacts],
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

    /// Adds this node's addresses (its Node's `status.addresses` that are IPs).
    pub fn with_node_ips(mut self, ips: &[IpAddr]) -> Self {
        for ip in ips {
            self[Family::of(*ip)].node_ips.insert(*ip);
        }
        self
    }
}
