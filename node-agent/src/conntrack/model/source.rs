//! Where the model comes from: the facts of every watched object (`ServiceCache`, which the watches
//! of `cache.rs` fold their events into), and `ModelSource`, which brings the live model up to
//! date from them when the scheduler asks (`Models::model`), only while every watch is healthy.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use groundskeeper_plumbing::ObjectKey;
use groundskeeper_plumbing::watch::cache::{Health, Seen, Shared, Store};

use super::Model;
use super::ServiceIpRange;
use super::changes::Changes;
use super::live::{Facts, Live};
use super::project::{ServiceFacts, SliceFacts};

/// The watched objects of one kind as the model reads them (`project.rs`), by key.
pub type FactsOf<V> = Store<ObjectKey, V>;

/// Every object of the five kinds the model is built from, as facts, and what changed since
/// the live model was last updated. The watches (`cache.rs`) fold their events in.
#[derive(Default)]
pub struct ServiceCache {
    pub services: FactsOf<ServiceFacts>,
    pub slices: FactsOf<SliceFacts>,
    /// The keys of each service's slices, by the service's key.
    pub slices_of: HashMap<ObjectKey, Vec<ObjectKey>>,
    pub cidrs: FactsOf<Box<[ServiceIpRange]>>,
    pub addresses: FactsOf<Option<IpAddr>>,
    pub nodes: FactsOf<Box<[IpAddr]>>,
    pub dirty: Dirty,
}

/// What the live model has not taken in yet.
#[derive(Default)]
pub struct Dirty {
    /// A list was swapped in: every service is redone.
    pub all: bool,
    pub services: HashSet<ObjectKey>,
    pub service_ips: bool,
    pub node: bool,
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
