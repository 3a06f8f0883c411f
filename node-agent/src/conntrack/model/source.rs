//! Where the model comes from: the facts of every watched object (`ServiceCache`, which folds in
//! the events the watches of `cache.rs` hand it, projecting each object and marking what
//! changed), and `ModelSource`, which brings the live model up to date from them when the
//! scheduler asks (`Models::model`), only while every watch is healthy.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use groundskeeper_plumbing::ObjectKey;
use groundskeeper_plumbing::watch::cache::{Applied, Health, Projected, Seen, Shared, Store};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::Resource;
use kube::runtime::watcher::Event;

use super::Model;
use super::ServiceIpRange;
use super::changes::Changes;
use super::live::{Facts, Live};
use super::project::{self, ServiceFacts, SliceFacts};
use crate::conntrack::wire::{WireIpAddress, WireService, WireSlice};

/// The watched objects of one kind as the model reads them (`project.rs`), by key.
pub type FactsOf<V> = Store<ObjectKey, V>;

/// Every object of the five kinds the model is built from, as facts, and what changed since
/// the live model was last updated. The watches (`cache.rs`) hand it their events
/// (`fold_services` …); only its own methods change its fields.
#[derive(Default)]
pub struct ServiceCache {
    services: FactsOf<ServiceFacts>,
    slices: FactsOf<SliceFacts>,
    /// The keys of each service's slices, by the service's key.
    slices_of: HashMap<ObjectKey, Vec<ObjectKey>>,
    cidrs: FactsOf<Box<[ServiceIpRange]>>,
    addresses: FactsOf<Option<IpAddr>>,
    nodes: FactsOf<Box<[IpAddr]>>,
    dirty: Dirty,
}

/// What the live model has not taken in yet.
#[derive(Default)]
struct Dirty {
    /// A list was swapped in: every service is redone.
    all: bool,
    services: HashSet<ObjectKey>,
    service_ips: bool,
    node: bool,
}

impl ServiceCache {
    /// Folds a Service event in: its facts (`project::service`) under its key, the service
    /// marked changed. True when the model must be rebuilt.
    pub fn fold_services(&mut self, ev: Event<WireService>) -> bool {
        let rebuild = wants_rebuild(&ev);
        match self.services.apply_event(ev, |o| keep(o, project::service)) {
            // Most updates (status, annotations, resourceVersion) leave the facts as they were: the
            // model cannot see them, so they wake nothing.
            Applied::Upserted { key, old } if old.as_ref() == self.services.get(&key) => {
                return false;
            }
            Applied::Upserted { key, .. } | Applied::Removed { key, .. } => {
                self.dirty.services.insert(key);
            }
            Applied::Relisted { .. } => self.dirty.all = true,
            Applied::Nothing => {}
        }
        rebuild
    }

    /// Folds an EndpointSlice event in: its facts under its key, and the slice filed under the
    /// service it belongs to (`slices_of`), both that one and the one it left marked changed.
    pub fn fold_slices(&mut self, ev: Event<WireSlice>) -> bool {
        let rebuild = wants_rebuild(&ev);
        let (key, old) = match self.slices.apply_event(ev, |o| keep(o, project::slice)) {
            // The facts as they were (a TCP-only slice's endpoints, a zone or hint): wakes nothing.
            Applied::Upserted { key, old } if old.as_ref() == self.slices.get(&key) => {
                return false;
            }
            Applied::Upserted { key, old } => (key, old),
            Applied::Removed { key, old } => (key, Some(old)),
            Applied::Relisted { .. } => {
                self.slices_of.clear();
                for (key, s) in self.slices.iter() {
                    if let Some(svc) = &s.service {
                        let owner = ObjectKey::new(key.namespace(), svc);
                        self.slices_of.entry(owner).or_default().push(key.clone());
                    }
                }
                self.dirty.all = true;
                return rebuild;
            }
            Applied::Nothing => return rebuild,
        };
        // The service it belonged to and the one it belongs to now (a label can change).
        let ns = key.namespace();
        if let Some(svc) = old.and_then(|o| o.service) {
            let owner = ObjectKey::new(ns, &svc);
            if let Some(slices) = self.slices_of.get_mut(&owner) {
                slices.retain(|s| *s != key);
                if slices.is_empty() {
                    self.slices_of.remove(&owner);
                }
            }
            self.dirty.services.insert(owner);
        }
        if let Some(svc) = self.slices.get(&key).and_then(|s| s.service.as_deref()) {
            let owner = ObjectKey::new(ns, svc);
            self.slices_of
                .entry(owner.clone())
                .or_default()
                .push(key.clone());
            self.dirty.services.insert(owner);
        }
        rebuild
    }

    /// Folds a ServiceCIDR event in: the service IP ranges change.
    pub fn fold_cidrs(&mut self, ev: Event<ServiceCIDR>) -> bool {
        self.dirty.service_ips = true;
        let rebuild = wants_rebuild(&ev);
        self.cidrs
            .apply_event(ev, |o| keep(o, project::service_cidr));
        rebuild
    }

    /// Folds an IPAddress event in: the allocated service IPs change.
    pub fn fold_addresses(&mut self, ev: Event<WireIpAddress>) -> bool {
        self.dirty.service_ips = true;
        let rebuild = wants_rebuild(&ev);
        self.addresses
            .apply_event(ev, |o| keep(o, project::ip_address));
        rebuild
    }

    /// Folds an event of this node's Node in: the node's IPs change.
    pub fn fold_nodes(&mut self, ev: Event<Node>) -> bool {
        self.dirty.node = true;
        let rebuild = wants_rebuild(&ev);
        self.nodes.apply_event(ev, |o| keep(o, project::node));
        rebuild
    }
}

/// `o` as the model reads it (`project`), under its key.
fn keep<K: Resource, V>(o: K, project: fn(&K) -> V) -> Projected<ObjectKey, V> {
    let meta = o.meta();
    match &meta.name {
        Some(name) => Projected::Yes(
            ObjectKey::new(meta.namespace.as_deref().unwrap_or_default(), name),
            project(&o),
        ),
        None => Projected::Unusable,
    }
}

/// True when the model must be rebuilt after `ev` (a change, or a list is in).
fn wants_rebuild<K>(ev: &Event<K>) -> bool {
    matches!(ev, Event::Apply(_) | Event::Delete(_) | Event::InitDone)
}

impl Facts for ServiceCache {
    fn service(&self, ns: &str, name: &str) -> Option<(&ServiceFacts, Vec<&SliceFacts>)> {
        // One allocation for the service; its slices are looked up by the keys kept for them.
        let key = ObjectKey::new(ns, name);
        let service = self.services.get(&key)?;
        let slices = self
            .slices_of
            .get(&key)
            .into_iter()
            .flatten()
            .filter_map(|s| self.slices.get(s))
            .collect();
        Some((service, slices))
    }
}

impl ServiceCache {
    /// The model built from scratch from all the facts (the live model's reference).
    #[cfg(test)]
    pub(crate) fn built_whole(&self) -> Model {
        let ranges: Vec<ServiceIpRange> = self
            .cidrs
            .values()
            .flat_map(|r| r.iter().copied())
            .collect();
        super::reference::build_facts(
            self.services
                .iter()
                .map(|(k, v)| (k.namespace(), k.name(), v)),
            self.slices.iter().map(|(k, v)| (k.namespace(), v)),
        )
        .with_service_ranges(&ranges, self.addresses.values().flatten().copied())
        .with_node_ips(self.nodes.values().next().map_or(&[][..], |n| n))
    }

    /// Brings `live` up to date with what changed since the last call, at `now`.
    pub fn update(&mut self, live: &mut Live, now: Instant) {
        let dirty = std::mem::take(&mut self.dirty);
        if dirty.all || dirty.service_ips {
            let ranges: Vec<ServiceIpRange> = self
                .cidrs
                .values()
                .flat_map(|r| r.iter().copied())
                .collect();
            let allocated: Vec<IpAddr> = self.addresses.values().flatten().copied().collect();
            live.set_service_ips(&ranges, &allocated);
        }
        if dirty.all || dirty.node {
            live.set_node_ips(self.nodes.values().next().map_or(&[][..], |n| n));
        }
        let services: Vec<ObjectKey> = if dirty.all {
            let held = live.services().map(|(ns, n)| ObjectKey::new(ns, n));
            let mut all: Vec<ObjectKey> = held.chain(self.services.keys().cloned()).collect();
            all.sort_unstable();
            all.dedup();
            all
        } else {
            dirty.services.into_iter().collect()
        };
        live.update(
            services.iter().map(|k| (k.namespace(), k.name())),
            &*self,
            now,
        );
    }
}

/// Why a pass did not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// A watch failed, is relisting, or changed health since the model was built: the model
    /// may say an endpoint is gone that came back meanwhile, and deleting its flows would cut
    /// live traffic. Better to leave a stale entry a little longer.
    StaleModel,
}

impl Skip {
    pub fn label(self) -> &'static str {
        match self {
            Skip::StaleModel => "stale-model",
        }
    }
}

/// Where models come from: the watches, or a test's fake.
pub trait Models {
    /// The current model with what changed since the last model handed out and the watch
    /// health it was built at; `None` while a watch is not healthy (what changed meanwhile is
    /// handed out with the next model).
    fn model(&self) -> Option<(Arc<Model>, Changes, Seen)>;
    /// The watches' health now.
    fn health(&self) -> Seen;
    /// The unhealthy watches, named, for the skip warning.
    fn unhealthy(&self) -> Vec<String>;
    /// How long until the last model built changes by time alone (a service port without
    /// endpoints settles): the model is rebuilt then.
    fn changes_in(&self) -> Option<Duration> {
        None
    }
}

/// Where the agent's models come from ([`Models`]): the watched cache with the watches'
/// health, and the deleted frontends remembered across builds.
pub struct ModelSource {
    cache: Shared<ServiceCache>,
    /// Every watch the model is built from: a half-listed or failing IPAddress cache would
    /// make allocated IPs look orphaned just as a stale EndpointSlice cache would make serving
    /// endpoints look removed, so passes need all of them healthy.
    health: Health,
    /// The model kept up to date service by service, with the deleted frontends remembered
    /// and the settle times of ports without endpoints.
    live: Mutex<Live>,
}

impl ModelSource {
    /// The model source over `cache`, which the watches behind `health` fill: deleted
    /// frontends remembered for `retention`, ports without endpoints settling for `settle`.
    pub fn new(
        cache: Shared<ServiceCache>,
        health: Health,
        settle: Duration,
        retention: Duration,
    ) -> Self {
        Self {
            cache,
            health,
            live: Mutex::new(Live::new(settle, retention)),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Models for ModelSource {
    fn health(&self) -> Seen {
        self.health.seen()
    }

    /// The model with the health it was built at; `None` while a watch is not healthy (a
    /// half-listed or failing cache would make serving endpoints look removed).
    fn model(&self) -> Option<(Arc<Model>, Changes, Seen)> {
        let before = self.health.seen();
        if !before.is_current() {
            return None;
        }
        // Only what changed since the last call is redone, under the cache's lock.
        let mut c = self.cache.lock();
        let mut live = lock(&self.live);
        c.update(&mut live, std::time::Instant::now());
        // Health changed while the cache was read: the model may mix old and new. Its changes
        // stay in `live`, handed out with the next model.
        if self.health.may_act(&before).is_err() {
            return None;
        }
        Some((live.model().clone(), live.take_changes(), before))
    }

    fn changes_in(&self) -> Option<Duration> {
        lock(&self.live).next_change(std::time::Instant::now())
    }

    /// The watches that are not healthy, with how long, for the skip warning.
    fn unhealthy(&self) -> Vec<String> {
        self.health.unhealthy()
    }
}
