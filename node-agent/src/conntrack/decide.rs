//! The pure decisions: is one conntrack entry stale for a service model, what a triggered pass
//! looks at after a model change, and when the next periodic pass runs.

use std::collections::{BTreeSet, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use super::model::{Claim, FamilyModel, Model, Ports, canonical};
use super::netlink::family::{Family, PerFamily};
use super::netlink::msg::{Entry, IPPROTO_UDP};
use super::removed::{Key, Removed};

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
pub fn dnated(entry: &Entry) -> bool {
    canonical(entry.reply.src) != canonical(entry.orig.dst)
        || entry.reply.src_port != entry.orig.dst_port
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
pub fn stale(entry: &Entry, model: &FamilyModel, host_ips: &HashSet<IpAddr>) -> Option<Stale> {
    if entry.orig.proto != IPPROTO_UDP {
        return None;
    }
    let backend = SocketAddr::new(canonical(entry.reply.src), entry.reply.src_port);
    let dst = canonical(entry.orig.dst);
    let frontend = SocketAddr::new(dst, entry.orig.dst_port);
    let dnated = dnated(entry);
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
    let port = entry.orig.dst_port;
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

pub fn is_stale(entry: &Entry, model: &FamilyModel, host_ips: &HashSet<IpAddr>) -> bool {
    stale(entry, model, host_ips).is_some()
}

/// The verdict a pass acts on: [`stale`], except that a flow through a live frontend or nodePort
/// with serving endpoints, to a backend that is not one of them, is deleted at once only when
/// the agent saw that backend serve the key and stop (`removed`); otherwise it is
/// [`Stale::UnseenBackend`] and waits the grace. No serving endpoint at all (after the settle)
/// still judges every flow through the key at once.
pub fn verdict(
    entry: &Entry,
    model: &FamilyModel,
    host_ips: &HashSet<IpAddr>,
    removed: &Removed,
) -> Option<Stale> {
    let why = stale(entry, model, host_ips)?;
    let (key, serving) = match why {
        Stale::Frontend => {
            let f = SocketAddr::new(canonical(entry.orig.dst), entry.orig.dst_port);
            (Key::Frontend(f), model.frontends.get(&f))
        }
        Stale::NodePort => {
            let p = entry.orig.dst_port;
            (Key::NodePort(p), model.node_ports.get(&p))
        }
        _ => return Some(why),
    };
    let backend = SocketAddr::new(canonical(entry.reply.src), entry.reply.src_port);
    // An un-NATed flow reached no endpoint at all (it came before the rules): no proxy can be
    // ahead of us on it, so it goes at once as upstream deletes it.
    let seen_go =
        !dnated(entry) || serving.is_none_or(HashSet::is_empty) || removed.saw(key, backend);
    Some(if seen_go { why } else { Stale::UnseenBackend })
}

/// Reply sources a model change took away: backends that a frontend or nodePort of `old`
/// served and the same key in `new` does not (all of them when the key is no longer live), and
/// for every service of `old`, the backends it served and serves no more (also when another
/// service claiming the same frontend still serves them). A key that is settling or foreign in
/// `new` takes nothing away: its flows are not judged.
pub fn removed_backends(old: &FamilyModel, new: &FamilyModel) -> HashSet<IpAddr> {
    let mut out = HashSet::new();
    let none = HashSet::new();
    for (key, was) in &old.frontends {
        if new.settling_frontends.contains(key) || new.foreign_frontends.contains(key) {
            continue;
        }
        let now = new.frontends.get(key).unwrap_or(&none);
        out.extend(was.difference(now).map(|b| b.ip()));
    }
    for (port, was) in &old.node_ports {
        if new.settling_node_ports.contains(port) || new.foreign_node_ports.contains(port) {
            continue;
        }
        let now = new.node_ports.get(port).unwrap_or(&none);
        out.extend(was.difference(now).map(|b| b.ip()));
    }
    let nothing = Ports::default();
    for (svc, ports) in &old.services {
        let now_ports = new.services.get(svc).unwrap_or(&nothing);
        for (name, was) in ports.iter() {
            let now = now_ports.get(name).map(|c| &c.serving);
            let gone = was
                .serving
                .iter()
                .filter(|b| !now.is_some_and(|n| n.contains(b)));
            out.extend(gone.map(|b| b.ip()));
        }
    }
    out
}

/// What a triggered pass looks at in one family: entries whose original destination is one of
/// `frontends`, or whose destination port is one of `node_ports` (on any address: the NodePort
/// rule decides which addresses count), or whose reply source is one of `backends`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Scope {
    pub frontends: HashSet<SocketAddr>,
    pub node_ports: HashSet<u16>,
    pub backends: HashSet<IpAddr>,
}

impl Scope {
    pub fn is_empty(&self) -> bool {
        self.frontends.is_empty() && self.node_ports.is_empty() && self.backends.is_empty()
    }

    /// Whether `entry` is one the triggered pass judges.
    pub fn touches(&self, entry: &Entry) -> bool {
        let dst = SocketAddr::new(canonical(entry.orig.dst), entry.orig.dst_port);
        self.frontends.contains(&dst)
            || self.node_ports.contains(&entry.orig.dst_port)
            || self.backends.contains(&canonical(entry.reply.src))
    }

    /// Adds every frontend and nodePort of `m` that has no serving endpoint (settled: the
    /// zero-endpoint rule judges every flow through it). A flow through one can appear at any
    /// time (a client sending on, a proxy whose rules still lead there) and the model does not
    /// change when it does, so every triggered pass looks at them again, as kube-proxy v1.36
    /// looks at its whole table at each sync; one address is a cheap, kernel-filtered dump.
    pub fn add_unserved(&mut self, m: &FamilyModel) {
        self.frontends.extend(
            m.frontends
                .iter()
                .filter(|(_, serving)| serving.is_empty())
                .map(|(k, _)| *k),
        );
        self.node_ports.extend(
            m.node_ports
                .iter()
                .filter(|(_, serving)| serving.is_empty())
                .map(|(p, _)| *p),
        );
    }

    fn claim(&mut self, c: &Claim) {
        self.frontends.extend(&c.frontends);
        self.node_ports.extend(c.node_port);
    }

    /// What changed between `old` and `new` in one family (see [`Focus::between`]); `changed`
    /// names the services whose claims differ in either family.
    pub fn between(old: &FamilyModel, new: &FamilyModel, changed: &BTreeSet<&String>) -> Self {
        let mut scope = Scope {
            backends: removed_backends(old, new),
            ..Scope::default()
        };
        // Keys whose judgment may differ: served by another set, settling, foreign or deleted
        // in one model and not the other (a foreign service appearing, a tombstone going).
        let frontends: HashSet<&SocketAddr> = [old, new]
            .iter()
            .flat_map(|m| {
                m.frontends
                    .keys()
                    .chain(&m.settling_frontends)
                    .chain(&m.foreign_frontends)
                    .chain(&m.deleted_frontends)
            })
            .collect();
        scope.frontends.extend(
            frontends
                .into_iter()
                .filter(|k| frontend_judgment(old, k) != frontend_judgment(new, k)),
        );
        let node_ports: HashSet<&u16> = [old, new]
            .iter()
            .flat_map(|m| {
                m.node_ports
                    .keys()
                    .chain(&m.settling_node_ports)
                    .chain(&m.foreign_node_ports)
                    .chain(&m.deleted_node_ports)
            })
            .collect();
        scope.node_ports.extend(
            node_ports
                .into_iter()
                .filter(|p| node_port_judgment(old, p) != node_port_judgment(new, p)),
        );
        // Every frontend and nodePort, old and new, of a service whose claims changed in either
        // family (endpoints, ports, addresses, settling), or that is new or gone.
        for name in changed {
            let (was, now) = (old.services.get(*name), new.services.get(*name));
            for c in was.into_iter().chain(now).flat_map(|ports| ports.values()) {
                scope.claim(c);
            }
        }
        scope
    }
}

/// The services whose claims differ between `old` and `new` in either family.
fn changed_services<'a>(old: &'a Model, new: &'a Model) -> BTreeSet<&'a String> {
    let mut out = BTreeSet::new();
    for f in Family::ALL {
        let (o, n) = (&old[f].services, &new[f].services);
        out.extend(
            o.keys()
                .chain(n.keys())
                .filter(|name| o.get(*name) != n.get(*name)),
        );
    }
    out
}

/// What a frontend or nodePort is to the rules: its serving set, settling, foreign, deleted.
/// Two models judge a key alike exactly when these are equal (also read by `changes.rs`).
type Judgment<'a> = (Option<&'a HashSet<SocketAddr>>, bool, bool, bool);

pub(super) fn frontend_judgment<'a>(m: &'a FamilyModel, k: &SocketAddr) -> Judgment<'a> {
    (
        m.frontends.get(k),
        m.settling_frontends.contains(k),
        m.foreign_frontends.contains(k),
        m.deleted_frontends.contains(k),
    )
}

pub(super) fn node_port_judgment<'a>(m: &'a FamilyModel, p: &u16) -> Judgment<'a> {
    (
        m.node_ports.get(p),
        m.settling_node_ports.contains(p),
        m.foreign_node_ports.contains(p),
        m.deleted_node_ports.contains(p),
    )
}

/// Per family, what a triggered pass looks at.
pub type Focus = PerFamily<Scope>;

impl Focus {
    /// What a triggered pass after `old` -> `new` looks at; `None` when it must look at
    /// everything.
    ///
    /// The invariant, which the property tests in `focus_tests.rs` check: a triggered pass
    /// over `new` deletes at the least every entry that a full pass over `new` would delete
    /// among the entries that touch what changed, and nothing else. What changed: every
    /// frontend (ClusterIP, ExternalIP, LB VIP on the service port) and nodePort (on any
    /// address), in both families, of every service whose serving endpoints, ports, addresses
    /// or settling state differ between the two models in either family (new and deleted
    /// services included), every key whose
    /// judgment differs (served by another set, settling, foreign, deleted), and the backends
    /// taken away ([`removed_backends`]). An entry that touches none of these is judged the
    /// same by both models (its key and its nodePort are judged alike, its reply source was
    /// not taken away), except where the models differ globally: a released service IP (its
    /// IPAddress went, which unblocks deleted ClusterIP frontends whose backends the model no
    /// longer knows), another ServiceCIDR, other Node addresses. Those make the pass a full
    /// one. Orphaned service IPs are left to full passes (their grace is measured across them).
    pub fn between(old: &Model, new: &Model) -> Option<Self> {
        let global = |f: Family| {
            !old[f].allocated.is_subset(&new[f].allocated)
                || old[f].service_cidrs != new[f].service_cidrs
                || old[f].node_ips != new[f].node_ips
        };
        if Family::ALL.into_iter().any(global) {
            return None;
        }
        let changed = changed_services(old, new);
        Some(PerFamily(
            Family::ALL.map(|f| Scope::between(&old[f], &new[f], &changed)),
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
