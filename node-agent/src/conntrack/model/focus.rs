//! What a triggered pass looks at after the model changed (`Focus`, per family a `Scope`), with
//! the invariant that makes a scoped pass delete what a full one would among what it looks at
//! (`Focus::between`): computed from two models, or from what the live model noted changing
//! (`changes.rs`, `Changes::focus`).

use std::collections::{BTreeSet, HashSet};
use std::net::{IpAddr, SocketAddr};

use super::{Addrs, Claim, FamilyModel, Model, Ports, canonical};
use crate::conntrack::netlink::family::{Family, PerFamily};

/// Reply sources a model change took away: backends that a frontend or nodePort of `old`
/// served and the same key in `new` does not (all of them when the key is no longer live), and
/// for every service of `old`, the backends it served and serves no more (also when another
/// service claiming the same frontend still serves them). A key that is settling or foreign in
/// `new` takes nothing away: its flows are not judged.
pub fn removed_backends(old: &FamilyModel, new: &FamilyModel) -> HashSet<IpAddr> {
    let mut out = HashSet::new();
    let none = Addrs::default();
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

    /// Whether a flow sent to `orig_dst` whose reply comes from `reply_src` is one the
    /// triggered pass judges.
    pub fn touches(&self, orig_dst: SocketAddr, reply_src: IpAddr) -> bool {
        let dst = SocketAddr::new(canonical(orig_dst.ip()), orig_dst.port());
        self.frontends.contains(&dst)
            || self.node_ports.contains(&orig_dst.port())
            || self.backends.contains(&canonical(reply_src))
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
        let frontends: HashSet<&SocketAddr> =
            [old, new].iter().flat_map(|m| m.frontend_keys()).collect();
        scope.frontends.extend(
            frontends
                .into_iter()
                .filter(|k| frontend_judgment(old, k) != frontend_judgment(new, k)),
        );
        let node_ports: HashSet<&u16> =
            [old, new].iter().flat_map(|m| m.node_port_keys()).collect();
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
type Judgment<'a> = (Option<&'a Addrs>, bool, bool, bool);

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
    /// not taken away), except where the models differ globally: a released service IP that a
    /// UDP frontend has (its IPAddress went, which unblocks deleted ClusterIP frontends whose
    /// backends the model no longer knows; see `releases_udp`), another ServiceCIDR, other
    /// Node addresses. Those make the pass a full one. Orphaned service IPs are left to full
    /// passes (their grace is measured across them), so an IP released that no UDP frontend
    /// has (a TCP-only Service's) changes nothing here.
    pub fn between(old: &Model, new: &Model) -> Option<Self> {
        Self::between_parts(old, new, new)
    }

    /// [`Focus::between`] where `old` and `new` may be partial models (what `Changes` noted)
    /// and `current` is the whole model `new` is part of: a released IP is looked up among
    /// the frontends of `current` too, which holds every frontend `old` lacks and had.
    pub(super) fn between_parts(old: &Model, new: &Model, current: &Model) -> Option<Self> {
        let global = |f: Family| {
            releases_udp(&old[f], &new[f], &current[f])
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

/// Whether an IP allocated in `old` and not in `new` is the address of a UDP frontend (live,
/// settling, another proxy's, or remembered deleted) in `old` or `current` (the whole model
/// `new` is part of). Only then can the release change how a flow is judged other than as an
/// orphan: a deleted ClusterIP frontend that an IPAddress held again (rule 2) is stale again.
/// An IP allocated anew makes no flow stale (it only keeps flows to it), and flows to an IP
/// no UDP frontend has are judged as orphans, by full passes.
pub(super) fn releases_udp(old: &FamilyModel, new: &FamilyModel, current: &FamilyModel) -> bool {
    let released: HashSet<&IpAddr> = old.allocated.difference(&new.allocated).collect();
    !released.is_empty()
        && [old, current]
            .into_iter()
            .any(|m| m.frontend_keys().any(|f| released.contains(&f.ip())))
}
