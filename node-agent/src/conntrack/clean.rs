//! The pure decisions: is one conntrack entry stale for a service model, and when should the
//! next periodic pass run.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use super::msg::{Entry, IPPROTO_UDP};

/// One IP family's UDP services, as kube-proxy's CleanStaleEntries sees them, plus what
/// kube-proxy does not know: recently deleted frontends, the service IP ranges and which of
/// their IPs are allocated, and this node's addresses.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FamilyModel {
    /// `frontend IP:port -> serving endpoints IP:port` (ClusterIP, ExternalIPs, LB VIPs) of
    /// live services. An empty set: the service has no serving endpoint.
    pub frontends: HashMap<SocketAddr, HashSet<SocketAddr>>,
    /// `nodePort -> serving endpoints IP:port` of live services.
    pub node_ports: HashMap<u16, HashSet<SocketAddr>>,
    /// Frontends of live services that another proxy handles (`service-proxy-name`): never
    /// judged, and they stop the later rules (another proxy's DNAT is not ours to undo).
    pub foreign_frontends: HashSet<SocketAddr>,
    pub foreign_node_ports: HashSet<u16>,
    /// Frontends and nodePorts no live service holds any more, remembered for a while after
    /// they went (see `model::Tombstones`). A live or foreign frontend with the same key wins.
    pub deleted_frontends: HashSet<SocketAddr>,
    pub deleted_node_ports: HashSet<u16>,
    /// ServiceCIDR prefixes of this family. Empty: the orphan rule is off.
    pub service_cidrs: Vec<Cidr>,
    /// IPs inside a ServiceCIDR that an IPAddress object holds.
    pub allocated: HashSet<IpAddr>,
    /// This node's addresses from its Node object (`status.addresses`); the host's own
    /// addresses are read at each pass and passed to [`stale`] beside the model.
    pub node_ips: HashSet<IpAddr>,
}

impl FamilyModel {
    /// Nothing to compare entries against: a pass could not delete anything.
    pub fn is_empty(&self) -> bool {
        self.frontends.is_empty()
            && self.node_ports.is_empty()
            && self.deleted_frontends.is_empty()
            && self.deleted_node_ports.is_empty()
            && self.service_cidrs.is_empty()
    }

    fn in_service_cidr(&self, ip: IpAddr) -> bool {
        self.service_cidrs.iter().any(|c| c.contains(ip))
    }
}

/// Both families; each pass uses one.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Model {
    pub ipv4: FamilyModel,
    pub ipv6: FamilyModel,
}

/// An IP prefix (a ServiceCIDR's `spec.cidrs` item).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cidr {
    pub addr: IpAddr,
    pub len: u8,
}

impl Cidr {
    /// `10.96.0.0/16`, `fd00:10:96::/112`; `None` for anything else (never a panic).
    pub fn parse(s: &str) -> Option<Self> {
        let (a, l) = s.trim().split_once('/')?;
        let addr: IpAddr = a.parse().ok()?;
        if l.is_empty() || !l.bytes().all(|b| b.is_ascii_digit()) || l.len() > 3 {
            return None;
        }
        let len: u8 = l.parse().ok()?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        (len <= max).then_some(Self { addr, len })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let bits = |ip: IpAddr| -> (u128, u32) {
            match ip {
                IpAddr::V4(v) => (u128::from(u32::from(v)), 32),
                IpAddr::V6(v) => (u128::from(v), 128),
            }
        };
        let ip = canonical(ip);
        let ((net, w1), (x, w2)) = (bits(self.addr), bits(ip));
        if w1 != w2 {
            return false;
        }
        let host_bits = w1 - u32::from(self.len);
        if host_bits >= 128 {
            return true; // ::/0
        }
        (net >> host_bits) == (x >> host_bits)
    }
}

/// Go's `net.IP.String()` prints an IPv4-mapped IPv6 address as IPv4; comparing canonical
/// forms keeps the same equalities.
pub fn canonical(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

/// Why an entry is stale, for the log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stale {
    /// Original destination is a live service frontend whose serving endpoints (possibly
    /// none) lack the reply source.
    Frontend,
    /// DNATed through a frontend that no live service holds any more.
    DeletedFrontend,
    /// DNATed to an IP inside a ServiceCIDR that no IPAddress object holds. The pass only
    /// deletes it once the IP has looked orphaned for a grace period (watch lag).
    OrphanedServiceIp,
    /// Addressed to this node on a live NodePort whose serving endpoints lack the reply source.
    NodePort,
    /// DNATed, addressed to this node on a NodePort no live service holds any more.
    DeletedNodePort,
}

/// Whether the connection was translated: the reply comes from somewhere other than where the
/// original packet was sent. Masquerade (SNAT) alone leaves the reply source alone.
pub fn dnated(entry: &Entry) -> bool {
    canonical(entry.reply.src) != canonical(entry.orig.dst)
        || entry.reply.src_port != entry.orig.dst_port
}

/// The decision for one entry. `host_ips` are the addresses the host (the namespace whose
/// table is cleaned) owns now.
///
/// Order, first match decides:
/// 1. only UDP entries are ever stale;
/// 2. a live frontend (`dst IP:port`): stale when the reply source is not one of its serving
///    endpoints (none serving: every flow through it is stale, kubernetes#139629); another
///    proxy's frontend: never; a deleted frontend: stale when DNATed (kubernetes#141371; a
///    flow that was not translated is someone's own traffic to that address now), unless it
///    is a ClusterIP an IPAddress holds again;
/// 3. a destination inside a ServiceCIDR is a ClusterIP, never a NodePort destination:
///    stale only when DNATed and no IPAddress holds the IP (the service is gone);
/// 4. a NodePort (destination port): only for flows kube-proxy could have made through a
///    NodePort rule, which match only the node's own addresses: the destination must be an
///    address of this host or of its Node object, and a flow that was not DNATed is judged
///    only when the host owns the address (it reached a local socket before the rules were
///    in place). A pod's traffic to a remote host on the same port number is never judged.
///
/// Deliberate difference from upstream: there the NodePort rule also applies after a frontend
/// matched and its backend serves; here a matching frontend decides alone.
pub fn stale(entry: &Entry, model: &FamilyModel, host_ips: &HashSet<IpAddr>) -> Option<Stale> {
    if entry.orig.proto != IPPROTO_UDP {
        return None;
    }
    let backend = SocketAddr::new(canonical(entry.reply.src), entry.reply.src_port);
    let dst = canonical(entry.orig.dst);
    let frontend = SocketAddr::new(dst, entry.orig.dst_port);
    let dnated = dnated(entry);
    if let Some(serving) = model.frontends.get(&frontend) {
        return (!serving.contains(&backend)).then_some(Stale::Frontend);
    }
    if model.foreign_frontends.contains(&frontend) {
        return None;
    }
    if model.deleted_frontends.contains(&frontend) {
        // A ClusterIP that an IPAddress holds again was handed to a new service whose Service
        // event has not arrived here yet: kube-proxy may already DNAT through it. The deleted
        // service's own IPAddress goes only after the Service, so this merely waits for it.
        let reallocated = model.in_service_cidr(dst) && model.allocated.contains(&dst);
        return (dnated && !reallocated).then_some(Stale::DeletedFrontend);
    }
    if model.in_service_cidr(dst) {
        return (dnated && !model.allocated.contains(&dst)).then_some(Stale::OrphanedServiceIp);
    }
    let port = entry.orig.dst_port;
    let host_owned = host_ips.contains(&dst);
    if !(host_owned || dnated && model.node_ips.contains(&dst)) {
        return None;
    }
    if let Some(serving) = model.node_ports.get(&port) {
        return (!serving.contains(&backend)).then_some(Stale::NodePort);
    }
    if model.foreign_node_ports.contains(&port) {
        return None;
    }
    (dnated && model.deleted_node_ports.contains(&port)).then_some(Stale::DeletedNodePort)
}

pub fn is_stale(entry: &Entry, model: &FamilyModel, host_ips: &HashSet<IpAddr>) -> bool {
    stale(entry, model, host_ips).is_some()
}

/// The reply sources a model change may have made stale: backends that a frontend or nodePort
/// of `old` served and the same key in `new` does not (all of them when the key is no longer
/// live), and the frontend IPs whose last serving endpoint went (flows to them that were
/// never DNATed). A triggered pass looks only at entries from these; the periodic pass looks
/// at everything.
pub fn removed_backends(old: &FamilyModel, new: &FamilyModel) -> HashSet<IpAddr> {
    let mut out = HashSet::new();
    let none = HashSet::new();
    for (key, was) in &old.frontends {
        let now = new.frontends.get(key).unwrap_or(&none);
        out.extend(was.difference(now).map(|b| b.ip()));
        if now.is_empty() && !was.is_empty() && new.frontends.contains_key(key) {
            out.insert(key.ip());
        }
    }
    for (port, was) in &old.node_ports {
        let now = new.node_ports.get(port).unwrap_or(&none);
        out.extend(was.difference(now).map(|b| b.ip()));
    }
    out
}

/// Per family, the reply sources a triggered pass looks at.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Focus {
    pub ipv4: HashSet<IpAddr>,
    pub ipv6: HashSet<IpAddr>,
}

impl Focus {
    /// What a triggered pass after `old` -> `new` must look at; `None` when it must look at
    /// everything: an IP was released (its IPAddress went), which unblocks deleted ClusterIP
    /// frontends whose backends the model no longer knows.
    pub fn between(old: &Model, new: &Model) -> Option<Self> {
        let released = |o: &FamilyModel, n: &FamilyModel| !o.allocated.is_subset(&n.allocated);
        if released(&old.ipv4, &new.ipv4) || released(&old.ipv6, &new.ipv6) {
            return None;
        }
        Some(Self {
            ipv4: removed_backends(&old.ipv4, &new.ipv4),
            ipv6: removed_backends(&old.ipv6, &new.ipv6),
        })
    }
}

/// Cilium's CT GC interval rule (`calculateInterval`): a pass that deleted nothing leaves the
/// interval as it was; one that deleted more than 25% comes back sooner by that ratio (at most
/// 90% sooner); one that deleted under 5% comes back 1.5x later; rounded to whole seconds and
/// kept within `[min, max]`.
///
/// The ratio is deleted / scanned, where Cilium divides by the map's capacity. Cilium's GC
/// frees capacity (it removes expired entries, the kernel here expires its own); this pass
/// corrects live UDP flows, and what it scans (the UDP entries) is the population it judges.
/// Against `nf_conntrack_max` (262144 and up) the ratio would stay under 5% for any realistic
/// number of stale flows and the interval could only grow.
pub fn next_interval(
    prev: Duration,
    scanned: usize,
    deleted: usize,
    min: Duration,
    max: Duration,
) -> Duration {
    let max = max.max(min);
    if deleted == 0 || scanned == 0 {
        return prev.clamp(min, max);
    }
    let ratio = (deleted as f64 / scanned as f64).min(1.0);
    let next = if ratio > 0.25 {
        prev.mul_f64(1.0 - ratio.min(0.9))
    } else if ratio < 0.05 {
        prev.mul_f64(1.5)
    } else {
        prev
    };
    let rounded = Duration::from_secs(next.as_secs_f64().round() as u64);
    rounded.clamp(min, max)
}

#[cfg(test)]
#[path = "clean_tests.rs"]
mod tests;
