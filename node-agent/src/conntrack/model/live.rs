//! The model kept up to date service by service. A change to one Service or to its
//! EndpointSlices redoes that service's claims and the frontends and nodePorts it claimed or
//! claims now, nothing else: at 10k Services a whole rebuild costs far more CPU per change
//! (`model_update` in docs/benchmarks.md).
//!
//! The rule, checked by `live_tests.rs` over generated sequences of changes and settle-time
//! passages: after every update the model equals the one built from scratch on the same inputs
//! and times (`reference::build_facts`, then `reference::Settle` and `reference::Tombstones`),
//! which stay the definition of what the model is.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::changes::Changes;
use super::project::{ServiceFacts, SliceFacts};
use crate::conntrack::model::{
    Addrs, Claim, FamilyModel, Model, Ports, ServiceIpRange, port_claims,
};
use crate::conntrack::netlink::family::Family;

/// A frontend or nodePort of one family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Key {
    Frontend(SocketAddr),
    NodePort(Family, u16),
}

impl Key {
    fn family(self) -> Family {
        match self {
            Key::Frontend(f) => Family::of(f.ip()),
            Key::NodePort(fam, _) => fam,
        }
    }

    /// Whether `c` claims this key (in the key's family).
    /// Notes this key in `changes` as it is in `m`, before it changes.
    fn note(self, changes: &mut Changes, m: &Model) {
        match self {
            Key::Frontend(f) => changes.note_frontend(m, f),
            Key::NodePort(fam, p) => changes.note_node_port(m, fam, p),
        }
    }

    fn claimed_by(self, c: &Claim) -> bool {
        match self {
            Key::Frontend(f) => c.frontends.contains(&f),
            Key::NodePort(_, p) => c.node_port == Some(p),
        }
    }
}

/// Every key of one family that `c` claims.
fn keys_of(c: &Claim, fam: Family) -> impl Iterator<Item = Key> + '_ {
    let node_port = c.node_port.map(|p| Key::NodePort(fam, p));
    c.frontends
        .iter()
        .map(|f| Key::Frontend(*f))
        .chain(node_port)
}

/// A service port without a serving endpoint: its name, family, and the first update that
/// saw it so.
type SettleStart = (Box<str>, Family, Instant);

/// Who claims one key: services of ours (by `namespace/name`) and how many of another proxy.
#[derive(Debug, Default)]
struct Claimants {
    ours: Vec<Arc<str>>,
    foreign: u32,
}

/// A service's facts, by namespace and name: the Service and its EndpointSlices; `None` when
/// there is no such Service.
pub trait Facts {
    fn service(&self, ns: &str, name: &str) -> Option<(&ServiceFacts, Vec<&SliceFacts>)>;
}

/// The live model: [`FamilyModel`]s kept as `build_facts` + `Settle` + `Tombstones` would
/// make them, updated one service at a time.
#[derive(Debug)]
pub struct Live {
    /// Shared with the round that judges it; between rounds only this holds it (the scheduler
    /// keeps a `Weak`), so an update changes it in place instead of copying it whole.
    model: Arc<Model>,
    /// What the updates changed since the last [`Live::take_changes`].
    changes: Changes,
    /// The keys each service claimed at the last update, and whether it is another proxy's.
    held: HashMap<Arc<str>, (bool, Vec<Key>)>,
    claimants: HashMap<Key, Claimants>,
    settle_after: Duration,
    /// Per service, (port name, family) -> first update that saw it without a serving endpoint.
    since: HashMap<Arc<str>, Vec<SettleStart>>,
    /// When settling ports settle: (instant, service, port, family).
    settles: BTreeSet<(Instant, Arc<str>, Box<str>, Family)>,
    retention: Duration,
    /// Keys no live service holds any more, until when they are remembered.
    gone: HashMap<Key, Instant>,
    expiry: BTreeSet<(Instant, Key)>,
}

impl Live {
    pub fn new(settle_after: Duration, retention: Duration) -> Self {
        Self {
            model: Arc::default(),
            changes: Changes::default(),
            held: HashMap::new(),
            claimants: HashMap::new(),
            settle_after,
            since: HashMap::new(),
            settles: BTreeSet::new(),
            retention,
            gone: HashMap::new(),
            expiry: BTreeSet::new(),
        }
    }

    /// The model as of the last update.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// What the updates changed since the last call (the scheduler adds it up between the
    /// rounds, for the focus of a triggered one).
    pub fn take_changes(&mut self) -> Changes {
        std::mem::take(&mut self.changes)
    }

    /// Every service the model holds something of, by namespace and name (a relist redoes
    /// these and every listed one).
    pub fn services(&self) -> impl Iterator<Item = (&str, &str)> {
        self.held.keys().map(|k| split(k))
    }

    /// How long after `now` the next settling port settles (see `Settle::next_change`).
    pub fn next_change(&self, now: Instant) -> Option<Duration> {
        self.settles
            .iter()
            .map(|(at, ..)| at.saturating_duration_since(now))
            .find(|d| !d.is_zero())
    }

    /// Sets the ServiceCIDR prefixes and allocated IPs (see `Model::with_service_ranges`).
    pub fn set_service_ips(&mut self, ranges: &[ServiceIpRange], allocated: &[IpAddr]) {
        self.changes.note_service_ips(&self.model);
        let m = Arc::make_mut(&mut self.model);
        let fresh = Model::default().with_service_ranges(ranges, allocated.iter().copied());
        for (fm, new) in m.0.iter_mut().zip(fresh.0) {
            fm.service_cidrs = new.service_cidrs;
            fm.allocated = new.allocated;
        }
    }

    /// Sets this node's addresses.
    pub fn set_node_ips(&mut self, ips: &[IpAddr]) {
        self.changes.note_node_ips(&self.model);
        let m = Arc::make_mut(&mut self.model);
        let fresh = Model::default().with_node_ips(ips);
        for (fm, new) in m.0.iter_mut().zip(fresh.0) {
            fm.node_ips = new.node_ips;
        }
    }

    /// Redoes the services named in `changed` (namespace, name) from `facts` at `now`, with
    /// the ports whose settle time has passed and the tombstones that expire.
    pub fn update<'a>(
        &mut self,
        changed: impl IntoIterator<Item = (&'a str, &'a str)>,
        facts: &impl Facts,
        now: Instant,
    ) {
        let mut dirty: BTreeSet<Arc<str>> = changed
            .into_iter()
            .map(|(ns, name)| Arc::from(format!("{ns}/{name}")))
            .collect();
        while let Some(first) = self.settles.first().filter(|(at, ..)| *at <= now) {
            dirty.insert(first.1.clone());
            self.settles.pop_first();
        }
        let expired = self.expiry.first().is_some_and(|(at, _)| *at <= now);
        if dirty.is_empty() && !expired {
            return;
        }
        let mut shared = std::mem::take(&mut self.model);
        let model = Arc::make_mut(&mut shared);
        // Whether each key touched was ours before this update (for the tombstones).
        let mut was_ours: HashMap<Key, bool> = HashMap::new();
        for svc in &dirty {
            self.changes.note_service(model, svc);
            let since = self.forget(model, svc, &mut was_ours);
            let (ns, name) = split(svc);
            if let Some((service, slices)) = facts.service(ns, name) {
                self.claim(model, svc, (service, &slices), &since, now, &mut was_ours);
            }
        }
        for (key, was) in was_ours {
            key.note(&mut self.changes, model);
            self.refresh(model, key, facts);
            let c = self.claimants.get(&key);
            let ours = c.is_some_and(|c| !c.ours.is_empty());
            let live = ours || c.is_some_and(|c| c.foreign > 0);
            if c.is_some_and(|c| c.ours.is_empty() && c.foreign == 0) {
                self.claimants.remove(&key);
            }
            if was && !live {
                let until = now + self.retention;
                self.gone.insert(key, until);
                self.expiry.insert((until, key));
                set_deleted(model, key, true);
            } else if live && self.gone.remove(&key).is_some() {
                set_deleted(model, key, false);
            }
        }
        while let Some(&(at, key)) = self.expiry.first().filter(|(at, _)| *at <= now) {
            self.expiry.pop_first();
            if self.gone.get(&key) == Some(&at) {
                key.note(&mut self.changes, model);
                self.gone.remove(&key);
                set_deleted(model, key, false);
            }
        }
        self.model = shared;
    }

    /// Takes back what `svc` claimed: its keys, its claims, its settle times (returned: a port
    /// still without a serving endpoint keeps its own).
    fn forget(
        &mut self,
        m: &mut Model,
        svc: &Arc<str>,
        was_ours: &mut HashMap<Key, bool>,
    ) -> Vec<SettleStart> {
        if let Some((foreign, keys)) = self.held.remove(svc) {
            for key in keys {
                let c = self.claimants.entry(key).or_default();
                was_ours.entry(key).or_insert(!c.ours.is_empty());
                if foreign {
                    c.foreign -= 1;
                } else if let Some(i) = c.ours.iter().position(|s| s == svc) {
                    c.ours.swap_remove(i);
                }
            }
        }
        for fam in Family::ALL {
            m[fam].services.remove(&**svc);
        }
        let since = self.since.remove(svc).unwrap_or_default();
        for (port, fam, first) in &since {
            let at = *first + self.settle_after;
            self.settles.remove(&(at, svc.clone(), port.clone(), *fam));
        }
        since
    }

    /// Records what `svc` claims now; the keys are refreshed afterwards.
    fn claim(
        &mut self,
        m: &mut Model,
        svc: &Arc<str>,
        (service, slices): (&ServiceFacts, &[&SliceFacts]),
        old_since: &[SettleStart],
        now: Instant,
        was_ours: &mut HashMap<Key, bool>,
    ) {
        let mut keys = Vec::new();
        let mut since = Vec::new();
        for fam in Family::ALL {
            let claims = port_claims(service, slices, fam);
            for (_, c) in &claims {
                keys.extend(keys_of(c, fam));
            }
            if service.foreign {
                continue;
            }
            // A repeated port name: the last one's claim is recorded (`model::add_service`).
            let mut recorded = Ports::default();
            for (p, c) in claims {
                recorded.insert(p, c);
            }
            for (port, c) in recorded.iter_mut().filter(|(_, c)| c.serving.is_empty()) {
                let first = old_since
                    .iter()
                    .find(|(p, f, _)| **p == *port && *f == fam)
                    .map_or(now, |(_, _, t)| *t);
                since.push((Box::<str>::from(port), fam, first));
                if now.saturating_duration_since(first) < self.settle_after {
                    c.settling = true;
                    self.settles
                        .insert((first + self.settle_after, svc.clone(), port.into(), fam));
                }
            }
            if !recorded.is_empty() {
                m[fam].services.insert(svc.to_string(), recorded);
            }
        }
        keys.sort_unstable();
        keys.dedup();
        for key in &keys {
            let c = self.claimants.entry(*key).or_default();
            was_ours.entry(*key).or_insert(!c.ours.is_empty());
            if service.foreign {
                c.foreign += 1;
            } else {
                c.ours.push(svc.clone());
            }
        }
        if !since.is_empty() {
            self.since.insert(svc.clone(), since);
        }
        if !keys.is_empty() {
            self.held.insert(svc.clone(), (service.foreign, keys));
        }
    }

    /// Sets `key`'s entries from who claims it now: settling when a claim of ours holding it
    /// settles, else the union of every claim of ours holding it; foreign when another proxy's
    /// service claims it.
    fn refresh(&self, m: &mut Model, key: Key, facts: &impl Facts) {
        let fam = key.family();
        let fm = &mut m[fam];
        let (ours, foreign): (&[Arc<str>], bool) = match self.claimants.get(&key) {
            Some(c) => (&c.ours, c.foreign > 0),
            None => (&[], false),
        };
        let settling = ours.iter().any(|s| {
            fm.services
                .get(&**s)
                .is_some_and(|ports| ports.values().any(|c| c.settling && key.claimed_by(c)))
        });
        let served = (!ours.is_empty() && !settling).then(|| {
            let mut serving: Vec<(&str, Addrs)> = Vec::new();
            for s in ours {
                let (ns, name) = split(s);
                if let Some((service, slices)) = facts.service(ns, name) {
                    for (_, c) in port_claims(service, &slices, fam) {
                        if key.claimed_by(&c) {
                            serving.push((s, c.serving));
                        }
                    }
                }
            }
            match serving.as_slice() {
                // One claim alone: the list its recorded claim holds, not a copy of it.
                [(s, only)] => fm
                    .services
                    .get(*s)
                    .and_then(|ports| {
                        ports
                            .values()
                            .find(|c| c.serving == *only && key.claimed_by(c))
                    })
                    .map_or_else(|| only.clone(), |c| c.serving.clone()),
                _ => serving
                    .iter()
                    .flat_map(|(_, a)| a.iter().copied())
                    .collect(),
            }
        });
        set_key(fm, key, served, settling, foreign);
    }
}

/// `namespace/name` split back (a namespace holds no `/`).
fn split(svc: &str) -> (&str, &str) {
    svc.split_once('/').unwrap_or(("", svc))
}

fn set_key(fm: &mut FamilyModel, key: Key, served: Option<Addrs>, settling: bool, foreign: bool) {
    fn put<K: std::hash::Hash + Eq + Copy>(
        live: &mut HashMap<K, Addrs>,
        held: &mut HashSet<K>,
        foreigns: &mut HashSet<K>,
        k: K,
        served: Option<Addrs>,
        settling: bool,
        foreign: bool,
    ) {
        match served {
            Some(s) => {
                live.insert(k, s);
            }
            None => {
                live.remove(&k);
            }
        }
        if settling {
            held.insert(k);
        } else {
            held.remove(&k);
        }
        if foreign {
            foreigns.insert(k);
        } else {
            foreigns.remove(&k);
        }
    }
    match key {
        Key::Frontend(f) => put(
            &mut fm.frontends,
            &mut fm.settling_frontends,
            &mut fm.foreign_frontends,
            f,
            served,
            settling,
            foreign,
        ),
        Key::NodePort(_, p) => put(
            &mut fm.node_ports,
            &mut fm.settling_node_ports,
            &mut fm.foreign_node_ports,
            p,
            served,
            settling,
            foreign,
        ),
    }
}

fn set_deleted(m: &mut Model, key: Key, deleted: bool) {
    let fm = &mut m[key.family()];
    match (key, deleted) {
        (Key::Frontend(f), true) => {
            fm.deleted_frontends.insert(f);
        }
        (Key::Frontend(f), false) => {
            fm.deleted_frontends.remove(&f);
        }
        (Key::NodePort(_, p), true) => {
            fm.deleted_node_ports.insert(p);
        }
        (Key::NodePort(_, p), false) => {
            fm.deleted_node_ports.remove(&p);
        }
    }
}
