//! What the model changed since a point, kept as the old values of only what changed, so a
//! triggered pass's focus costs as much as the change, not the model: the scheduler needs
//! neither a copy of the model the last round judged nor a compare of two whole models.
//!
//! The rule, checked by `changes_tests.rs` over generated sequences of changes: for the model
//! `judged` at the point and the model `current` now, [`Changes::focus`] equals
//! `Focus::between(judged, current)` and [`Changes::changed`] says whether they differ.
//! That holds because both models differ only in what was noted: the old values noted form a
//! partial model (`old`), the same entries read from `current` another (`new`), and
//! `Focus::between` over the two partial models reads exactly the entries that differ in the
//! whole ones (an entry equal in both adds nothing to a scope or to the backends taken away).
//!
//! [`Changes::trigger`] says what the change asks of the scheduler: a triggered round, one
//! over the frontends without endpoints only, or nothing (a change no UDP flow is judged by:
//! TCP-only Services, their IPAddresses).

use std::collections::HashSet;
use std::net::SocketAddr;

use super::focus::{Focus, frontend_judgment, node_port_judgment, releases_udp};
use super::{FamilyModel, Model};
use crate::conntrack::netlink::family::{Family, PerFamily};

/// What a change asks of the scheduler ([`Changes::trigger`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// Nothing a UDP flow is judged by changed in a way that can make one stale, and nothing
    /// noted is about UDP services: a TCP-only Service or its EndpointSlices, an IPAddress
    /// allocated, or released where no UDP frontend has the IP, a Node or ServiceCIDR update
    /// that left their addresses as they were. No round.
    Nothing,
    /// Nothing that can make a UDP flow stale changed, but what was noted is about UDP
    /// services (a slice of a UDP service that changes none of its claims), or the model saw
    /// nothing of the event at all: a round over the frontends and nodePorts without serving
    /// endpoints, when there are some (kube-proxy deletes flows through them at each sync).
    Unserved,
    /// What UDP flows are judged by changed: a triggered round over what changed.
    Change,
}

/// The old value of every entry an update changed since a point (the first value wins).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Changes {
    /// Per family, the model as it was at the point, restricted to the entries noted.
    old: Model,
    frontends: PerFamily<HashSet<SocketAddr>>,
    node_ports: PerFamily<HashSet<u16>>,
    /// Services (`namespace/name`), in both families.
    services: HashSet<String>,
    /// `old` holds the ServiceCIDR prefixes and allocated IPs of the point.
    service_ips: bool,
    /// `old` holds the Node addresses of the point.
    node_ips: bool,
}

impl Changes {
    /// Nothing noted.
    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
            && !self.service_ips
            && !self.node_ips
            && Family::ALL
                .into_iter()
                .all(|f| self.frontends[f].is_empty() && self.node_ports[f].is_empty())
    }

    /// Notes `f` as it is in `m` before it changes (its first note wins).
    pub fn note_frontend(&mut self, m: &Model, f: SocketAddr) {
        let fam = Family::of(f.ip());
        if self.frontends[fam].insert(f) {
            copy_frontend(&m[fam], &mut self.old[fam], f);
        }
    }

    /// Notes nodePort `p` of `fam` as it is in `m` before it changes.
    pub fn note_node_port(&mut self, m: &Model, fam: Family, p: u16) {
        if self.node_ports[fam].insert(p) {
            copy_node_port(&m[fam], &mut self.old[fam], p);
        }
    }

    /// Notes the claims of service `svc` (`namespace/name`) in both families before they
    /// change.
    pub fn note_service(&mut self, m: &Model, svc: &str) {
        if self.services.insert(svc.to_string()) {
            for fam in Family::ALL {
                copy_service(&m[fam], &mut self.old[fam], svc);
            }
        }
    }

    /// Notes the ServiceCIDR prefixes and allocated IPs before they change.
    pub fn note_service_ips(&mut self, m: &Model) {
        if !std::mem::replace(&mut self.service_ips, true) {
            for fam in Family::ALL {
                self.old[fam].service_cidrs = m[fam].service_cidrs.clone();
                self.old[fam].allocated = m[fam].allocated.clone();
            }
        }
    }

    /// Notes the Node addresses before they change.
    pub fn note_node_ips(&mut self, m: &Model) {
        if !std::mem::replace(&mut self.node_ips, true) {
            for fam in Family::ALL {
                self.old[fam].node_ips = m[fam].node_ips.clone();
            }
        }
    }

    /// Adds what changed after `self` (`later` was noted from the model `self` ends at): an
    /// entry both noted keeps the older value, `self`'s.
    pub fn merge(&mut self, later: Changes) {
        for fam in Family::ALL {
            for f in &later.frontends[fam] {
                if self.frontends[fam].insert(*f) {
                    copy_frontend(&later.old[fam], &mut self.old[fam], *f);
                }
            }
            for p in &later.node_ports[fam] {
                if self.node_ports[fam].insert(*p) {
                    copy_node_port(&later.old[fam], &mut self.old[fam], *p);
                }
            }
        }
        for svc in &later.services {
            if self.services.insert(svc.clone()) {
                for fam in Family::ALL {
                    copy_service(&later.old[fam], &mut self.old[fam], svc);
                }
            }
        }
        let mut later = later;
        if !self.service_ips && later.service_ips {
            self.service_ips = true;
            for fam in Family::ALL {
                self.old[fam].service_cidrs = std::mem::take(&mut later.old[fam].service_cidrs);
                self.old[fam].allocated = std::mem::take(&mut later.old[fam].allocated);
            }
        }
        if !self.node_ips && later.node_ips {
            self.node_ips = true;
            for fam in Family::ALL {
                self.old[fam].node_ips = std::mem::take(&mut later.old[fam].node_ips);
            }
        }
    }

    /// The entries noted, as they were at the point (a partial model).
    pub fn old(&self) -> &Model {
        &self.old
    }

    /// The entries noted, as they are in `current` (a partial model).
    pub fn now_in(&self, current: &Model) -> Model {
        let mut new = Model::default();
        for fam in Family::ALL {
            let (from, to) = (&current[fam], &mut new[fam]);
            for f in &self.frontends[fam] {
                copy_frontend(from, to, *f);
            }
            for p in &self.node_ports[fam] {
                copy_node_port(from, to, *p);
            }
            for svc in &self.services {
                copy_service(from, to, svc);
            }
            if self.service_ips {
                to.service_cidrs = from.service_cidrs.clone();
                to.allocated = from.allocated.clone();
            }
            if self.node_ips {
                to.node_ips = from.node_ips.clone();
            }
        }
        new
    }

    /// Whether `current` differs from the model at the point (read in place: after a relist
    /// every service is noted, and a copy of them here would be a second model).
    pub fn changed(&self, current: &Model) -> bool {
        self.differs(current, |old, new| old.allocated != new.allocated)
    }

    /// Whether `current` differs from the model at the point in anything noted, the allocated
    /// IPs compared by `allocated` (the noted old family model, the current one).
    fn differs(
        &self,
        current: &Model,
        allocated: impl Fn(&FamilyModel, &FamilyModel) -> bool,
    ) -> bool {
        Family::ALL.into_iter().any(|fam| {
            let (old, new) = (&self.old[fam], &current[fam]);
            self.frontends[fam]
                .iter()
                .any(|f| frontend_judgment(old, f) != frontend_judgment(new, f))
                || self.node_ports[fam]
                    .iter()
                    .any(|p| node_port_judgment(old, p) != node_port_judgment(new, p))
                || self
                    .services
                    .iter()
                    .any(|s| old.services.get(s) != new.services.get(s))
                || self.service_ips
                    && (old.service_cidrs != new.service_cidrs || allocated(old, new))
                || self.node_ips && old.node_ips != new.node_ips
        })
    }

    /// What the change since the point asks of the scheduler, `current` being the model now.
    /// A [`Trigger::Change`] exactly when [`Changes::changed`] says the models differ, except
    /// where they differ only in allocated IPs that cannot make a UDP flow stale: IPs
    /// allocated, and IPs released that no UDP frontend has (see `focus::releases_udp`).
    pub fn trigger(&self, current: &Model) -> Trigger {
        if self.differs(current, |old, new| releases_udp(old, new, new)) {
            return Trigger::Change;
        }
        // A UDP key noted, or a service with UDP claims before or now (a TCP-only service
        // claims nothing: it is in neither model).
        let udp = Family::ALL.into_iter().any(|fam| {
            !self.frontends[fam].is_empty()
                || !self.node_ports[fam].is_empty()
                || self.services.iter().any(|s| {
                    self.old[fam].services.contains_key(s) || current[fam].services.contains_key(s)
                })
        });
        if udp || self.is_empty() {
            Trigger::Unserved
        } else {
            Trigger::Nothing
        }
    }

    /// What a triggered pass looks at after the model at the point became `current`: exactly
    /// `Focus::between(model at the point, current)`.
    pub fn focus(&self, current: &Model) -> Option<Focus> {
        Focus::between_parts(&self.old, &self.now_in(current), current)
    }

    /// What a triggered round over `current` looks at, `self` being what changed since the
    /// model the last round judged: what the change touched ([`Changes::focus`]), and every
    /// frontend and nodePort without a serving endpoint ([`Scope::add_unserved`]). `None`: the
    /// change needs a full round.
    ///
    /// [`Scope::add_unserved`]: super::focus::Scope::add_unserved
    pub fn triggered_focus(&self, current: &Model) -> Option<Focus> {
        let mut focus = self.focus(current)?;
        for fam in Family::ALL {
            focus[fam].add_unserved(&current[fam]);
        }
        Some(focus)
    }

    /// Every entry that differs between `old` and `new`, noted from `old`: what an update from
    /// `old` to `new` notes, for a source that hands out whole models (tests).
    #[cfg(test)]
    pub fn between(old: &Model, new: &Model) -> Self {
        let mut c = Changes::default();
        for fam in Family::ALL {
            let (o, n) = (&old[fam], &new[fam]);
            for f in [o, n].into_iter().flat_map(|m| m.frontend_keys()) {
                if frontend_judgment(o, f) != frontend_judgment(n, f) {
                    c.note_frontend(old, *f);
                }
            }
            for p in [o, n].into_iter().flat_map(|m| m.node_port_keys()) {
                if node_port_judgment(o, p) != node_port_judgment(n, p) {
                    c.note_node_port(old, fam, *p);
                }
            }
            for svc in o.services.keys().chain(n.services.keys()) {
                if o.services.get(svc) != n.services.get(svc) {
                    c.note_service(old, svc);
                }
            }
            if o.service_cidrs != n.service_cidrs || o.allocated != n.allocated {
                c.note_service_ips(old);
            }
            if o.node_ips != n.node_ips {
                c.note_node_ips(old);
            }
        }
        c
    }
}

/// Sets `f`'s entries in `to` as they are in `from` (absent where absent).
fn copy_frontend(from: &FamilyModel, to: &mut FamilyModel, f: SocketAddr) {
    match from.frontends.get(&f) {
        Some(s) => to.frontends.insert(f, s.clone()),
        None => to.frontends.remove(&f),
    };
    copy_member(&from.settling_frontends, &mut to.settling_frontends, f);
    copy_member(&from.foreign_frontends, &mut to.foreign_frontends, f);
    copy_member(&from.deleted_frontends, &mut to.deleted_frontends, f);
}

/// Sets nodePort `p`'s entries in `to` as they are in `from`.
fn copy_node_port(from: &FamilyModel, to: &mut FamilyModel, p: u16) {
    match from.node_ports.get(&p) {
        Some(s) => to.node_ports.insert(p, s.clone()),
        None => to.node_ports.remove(&p),
    };
    copy_member(&from.settling_node_ports, &mut to.settling_node_ports, p);
    copy_member(&from.foreign_node_ports, &mut to.foreign_node_ports, p);
    copy_member(&from.deleted_node_ports, &mut to.deleted_node_ports, p);
}

/// Sets service `svc`'s claims in `to` as they are in `from`.
fn copy_service(from: &FamilyModel, to: &mut FamilyModel, svc: &str) {
    match from.services.get(svc) {
        Some(p) => {
            to.services.insert(svc.to_string(), p.clone());
        }
        None => {
            to.services.remove(svc);
        }
    }
}

fn copy_member<K: std::hash::Hash + Eq + Copy>(from: &HashSet<K>, to: &mut HashSet<K>, k: K) {
    if from.contains(&k) {
        to.insert(k);
    } else {
        to.remove(&k);
    }
}
