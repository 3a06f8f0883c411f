//! The pure decisions: is one flow stale for a service model, and when the next periodic pass
//! runs. A flow is the fields of a conntrack entry the rules judge ([`Flow`]), not the wire
//! type: the pass reads those off each entry it dumps.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use super::model::removed::{Key, Removed};
use super::model::{FamilyModel, canonical};

/// What the rules judge of one conntrack entry: whether it is UDP, where its first packet was
/// sent (the original destination) and where its replies come from (the reply source: the
/// endpoint it was DNATed to, or the original destination when it was not translated).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flow {
    pub udp: bool,
    pub orig_dst: SocketAddr,
    pub reply_src: SocketAddr,
}

impl Flow {
    /// The original destination and the reply source, each with its address canonical
    /// (an IPv4-mapped IPv6 address as IPv4), as the model holds them.
    fn canonical(&self) -> (SocketAddr, SocketAddr) {
        let c = |a: SocketAddr| SocketAddr::new(canonical(a.ip()), a.port());
        (c(self.orig_dst), c(self.reply_src))
    }
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
    /// Through a live frontend or nodePort that has serving endpoints, to a backend not among
    /// them that the agent never saw serve that key: the proxy may already DNAT to it while our
    /// EndpointSlice watch lags. The pass deletes it only once the backend has looked unseen
    /// for the grace period, as an orphaned service IP.
    UnseenBackend,
}

/// Whether the connection was translated: the reply comes from somewhere other than where the
/// original packet was sent. Masquerade (SNAT) alone leaves the reply source alone.
pub fn dnated(flow: &Flow) -> bool {
    let (frontend, backend) = flow.canonical();
    backend != frontend
}

/// The decision for one entry. `host_ips` are the addresses the host (the namespace whose
/// table is cleaned) owns now.
///
/// Order, first match decides:
/// 1. only UDP entries are ever stale;
/// 2. another proxy's frontend (`dst IP:port`), or one whose service has had no serving
///    endpoint for less than the settle time: never; a live frontend: stale when the reply
///    source is not one of its serving endpoints (of any service claiming it; none serving:
///    every flow through it is stale, kubernetes#139629); a deleted frontend: stale when DNATed (kubernetes#141371; a
///    flow that was not translated is someone's own traffic to that address now), unless it
///    is a ClusterIP an IPAddress holds again;
/// 3. a destination inside a ServiceCIDR is a ClusterIP, never a NodePort destination:
///    stale only when DNATed and no IPAddress holds the IP (the service is gone);
/// 4. a NodePort (destination port): only for flows kube-proxy could have made through a
///    NodePort rule, which match only the node's own addresses: the destination must be an
///    address of this host or of its Node object, and a flow that was not DNATed is judged
///    only when the host owns the address (it reached a local socket before the rules were
///    in place). A pod's traffic to a remote host on the same port number is never judged.
///    Foreign and settling nodePorts are never stale, as in rule 2.
///
/// Deliberate difference from upstream: there the NodePort rule also applies after a frontend
/// matched and its backend serves; here a matching frontend decides alone.
pub fn stale(flow: &Flow, model: &FamilyModel, host_ips: &HashSet<IpAddr>) -> Option<Stale> {
    if !flow.udp {
        return None;
    }
    let (frontend, backend) = flow.canonical();
    let dst = frontend.ip();
    let dnated = dnated(flow);
    if model.foreign_frontends.contains(&frontend) || model.settling_frontends.contains(&frontend) {
        return None;
    }
    if let Some(serving) = model.frontends.get(&frontend) {
        return (!serving.contains(&backend)).then_some(Stale::Frontend);
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
    let port = frontend.port();
    let host_owned = host_ips.contains(&dst);
    if !(host_owned || dnated && model.node_ips.contains(&dst)) {
        return None;
    }
    if model.foreign_node_ports.contains(&port) || model.settling_node_ports.contains(&port) {
        return None;
    }
    if let Some(serving) = model.node_ports.get(&port) {
        return (!serving.contains(&backend)).then_some(Stale::NodePort);
    }
    (dnated && model.deleted_node_ports.contains(&port)).then_some(Stale::DeletedNodePort)
}

pub fn is_stale(flow: &Flow, model: &FamilyModel, host_ips: &HashSet<IpAddr>) -> bool {
    stale(flow, model, host_ips).is_some()
}

/// The staleness a pass acts on: [`stale`], except that a flow through a live frontend or nodePort
/// with serving endpoints, to a backend that is not one of them, is deleted at once only when
/// the agent saw that backend serve the key and stop (`removed`); otherwise it is
/// [`Stale::UnseenBackend`] and waits the grace. No serving endpoint at all (after the settle)
/// still judges every flow through the key at once.
pub fn staleness(
    flow: &Flow,
    model: &FamilyModel,
    host_ips: &HashSet<IpAddr>,
    removed: &Removed,
) -> Option<Stale> {
    let why = stale(flow, model, host_ips)?;
    let (frontend, backend) = flow.canonical();
    let (key, serving) = match why {
        Stale::Frontend => (Key::Frontend(frontend), model.frontends.get(&frontend)),
        Stale::NodePort => {
            let p = frontend.port();
            (Key::NodePort(p), model.node_ports.get(&p))
        }
        _ => return Some(why),
    };
    // An un-NATed flow reached no endpoint at all (it came before the rules): no proxy can be
    // ahead of us on it, so it goes at once as upstream deletes it.
    let seen_go = !dnated(flow)
        || serving.is_none_or(super::model::Addrs::is_empty)
        || removed.saw(key, backend);
    Some(if seen_go { why } else { Stale::UnseenBackend })
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
