//! The pure decisions: is one conntrack entry stale for a service model, what a triggered pass
//! looks at after a model change, and when the next periodic pass runs.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use super::family::{Family, PerFamily};
use super::model::{FamilyModel, Model, canonical};
use super::msg::{Entry, IPPROTO_UDP};

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
pub type Focus = PerFamily<HashSet<IpAddr>>;

impl Focus {
    /// What a triggered pass after `old` -> `new` must look at; `None` when it must look at
    /// everything: an IP was released (its IPAddress went), which unblocks deleted ClusterIP
    /// frontends whose backends the model no longer knows.
    pub fn between(old: &Model, new: &Model) -> Option<Self> {
        let released = |f: Family| !old[f].allocated.is_subset(&new[f].allocated);
        if Family::ALL.into_iter().any(released) {
            return None;
        }
        Some(PerFamily(
            Family::ALL.map(|f| removed_backends(&old[f], &new[f])),
        ))
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
