//! What the cleanup watches (Services, EndpointSlices, ServiceCIDRs, IPAddresses, its own
//! Node), each through `plumbing::cache::follow` into one shared cache, and the model built
//! from it only while every watch is healthy.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use std::fmt::Debug;

use futures::StreamExt;
use futures::stream::BoxStream;
use groundskeeper_plumbing::ReadyFlag;
use groundskeeper_plumbing::cache::{Applied, Health, Kept, Seen, Shared, Store, Watches};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{IPAddress, ServiceCIDR};
use kube::Resource;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;

use super::changes::Changes;
use super::live::{self, Live};
use super::model::{self, Model, ServiceIpRange};
use super::project::{self, ServiceView, SliceView};
use crate::context::Context;

/// Namespace ("" for cluster-scoped kinds) and name.
type Key = (String, String);

/// The watched objects of one kind as the model reads them ([`project`]).
type Views<V> = Store<Key, V>;

/// Every object of the five kinds the model is built from, as views, and what changed since
/// the live model was last updated.
#[derive(Default)]
pub struct Cache {
    services: Views<ServiceView>,
    slices: Views<SliceView>,
    /// The names of each service's slices, by the service's namespace and name.
    slices_of: HashMap<Key, Vec<String>>,
    cidrs: Views<Box<[ServiceIpRange]>>,
    addresses: Views<Option<IpAddr>>,
    nodes: Views<Box<[IpAddr]>>,
    dirty: Dirty,
}

/// What the live model has not taken in yet.
#[derive(Default)]
struct Dirty {
    /// A list was swapped in: every service is redone.
    all: bool,
    services: HashSet<Key>,
    service_ips: bool,
    node: bool,
}

/// `o` as the model reads it (`project`), under its namespace and name.
fn keep<K: Resource, V>(o: K, project: fn(&K) -> V) -> Kept<Key, V> {
    let meta = o.meta();
    match &meta.name {
        Some(name) => Kept::Yes(
            (meta.namespace.clone().unwrap_or_default(), name.clone()),
            project(&o),
        ),
        None => Kept::Unusable,
    }
}

/// True when the model must be rebuilt after `ev` (a change, or a list is in).
fn wants_rebuild<K>(ev: &Event<K>) -> bool {
    matches!(ev, Event::Apply(_) | Event::Delete(_) | Event::InitDone)
}

pub(super) fn fold_services(c: &mut Cache, ev: Event<Service>) -> bool {
    let rebuild = wants_rebuild(&ev);
    match c.services.apply_event(ev, |o| keep(o, project::service)) {
        // Most updates (status, annotations, resourceVersion) leave the view as it was.
        Applied::Upserted { key, old } if old.as_ref() == c.services.get(&key) => {}
        Applied::Upserted { key, .. } | Applied::Removed { key, .. } => {
            c.dirty.services.insert(key);
        }
        Applied::Relisted { .. } => c.dirty.all = true,
        Applied::Nothing => {}
    }
    rebuild
}

pub(super) fn fold_slices(c: &mut Cache, ev: Event<EndpointSlice>) -> bool {
    let rebuild = wants_rebuild(&ev);
    let (key, old) = match c.slices.apply_event(ev, |o| keep(o, project::slice)) {
        Applied::Upserted { key, old } if old.as_ref() == c.slices.get(&key) => return rebuild,
        Applied::Upserted { key, old } => (key, old),
        Applied::Removed { key, old } => (key, Some(old)),
        Applied::Relisted { .. } => {
            c.slices_of.clear();
            for ((ns, name), s) in c.slices.iter() {
                if let Some(svc) = &s.service {
                    let owner = (ns.clone(), svc.to_string());
                    c.slices_of.entry(owner).or_default().push(name.clone());
                }
            }
            c.dirty.all = true;
            return rebuild;
        }
        Applied::Nothing => return rebuild,
    };
    // The service it belonged to and the one it belongs to now (a label can change).
    let (ns, name) = &key;
    if let Some(svc) = old.and_then(|o| o.service) {
        let owner = (ns.clone(), svc.to_string());
        if let Some(names) = c.slices_of.get_mut(&owner) {
            names.retain(|n| n != name);
            if names.is_empty() {
                c.slices_of.remove(&owner);
            }
        }
        c.dirty.services.insert(owner);
    }
    if let Some(svc) = c.slices.get(&key).and_then(|s| s.service.as_deref()) {
        let owner = (ns.clone(), svc.to_string());
        c.slices_of
            .entry(owner.clone())
            .or_default()
            .push(name.clone());
        c.dirty.services.insert(owner);
    }
    rebuild
}

fn fold_cidrs(c: &mut Cache, ev: Event<ServiceCIDR>) -> bool {
    c.dirty.service_ips = true;
    let rebuild = wants_rebuild(&ev);
    c.cidrs.apply_event(ev, |o| keep(o, project::service_cidr));
    rebuild
}

fn fold_addresses(c: &mut Cache, ev: Event<IPAddress>) -> bool {
    c.dirty.service_ips = true;
    let rebuild = wants_rebuild(&ev);
    c.addresses
        .apply_event(ev, |o| keep(o, project::ip_address));
    rebuild
}

fn fold_nodes(c: &mut Cache, ev: Event<Node>) -> bool {
    c.dirty.node = true;
    let rebuild = wants_rebuild(&ev);
    c.nodes.apply_event(ev, |o| keep(o, project::node));
    rebuild
}

impl live::Views for Cache {
    fn service(&self, ns: &str, name: &str) -> Option<(&ServiceView, Vec<&SliceView>)> {
        let key = (ns.to_string(), name.to_string());
        let view = self.services.get(&key)?;
        let slices = self
            .slices_of
            .get(&key)
            .into_iter()
            .flatten()
            .filter_map(|s| self.slices.get(&(ns.to_string(), s.clone())))
            .collect();
        Some((view, slices))
    }
}

impl Cache {
    /// The model built from scratch from every view (the live model's reference).
    #[cfg(test)]
    pub(super) fn built_whole(&self) -> Model {
        let ranges: Vec<ServiceIpRange> = self
            .cidrs
            .values()
            .flat_map(|r| r.iter().copied())
            .collect();
        model::build_views(
            self.services
                .iter()
                .map(|((ns, n), v)| (ns.as_str(), n.as_str(), v)),
            self.slices.iter().map(|((ns, _), v)| (ns.as_str(), v)),
        )
        .with_service_ranges(&ranges, self.addresses.values().flatten().copied())
        .with_node_ips(self.nodes.values().next().map_or(&[][..], |n| n))
    }

    /// Brings `live` up to date with what changed since the last call, at `now`.
    pub(super) fn update(&mut self, live: &mut Live, now: Instant) {
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
        let services: Vec<Key> = if dirty.all {
            let held = live
                .services()
                .map(|(ns, n)| (ns.to_string(), n.to_string()));
            let mut all: Vec<Key> = held.chain(self.services.keys().cloned()).collect();
            all.sort_unstable();
            all.dedup();
            all
        } else {
            dirty.services.into_iter().collect()
        };
        live.update(
            services.iter().map(|(ns, n)| (ns.as_str(), n.as_str())),
            &*self,
            now,
        );
    }
}

/// Watches every `K` selected by `config` into the cache through `fold`.
fn kind<K>(
    watches: &Watches<Cache>,
    config: watcher::Config,
    fold: fn(&mut Cache, Event<K>) -> bool,
) -> (ReadyFlag, BoxStream<'static, bool>)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (flag, events) = watches.follow(config, fold);
    (flag, events.boxed())
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
    cache: Shared<Cache>,
    /// Every watch the model is built from: a half-listed or failing IPAddress cache would
    /// make allocated IPs look orphaned just as a stale EndpointSlice cache would make serving
    /// endpoints look removed, so passes need all of them healthy.
    health: Health,
    /// The model kept up to date service by service, with the deleted frontends remembered
    /// and the settle times of ports without endpoints.
    live: Mutex<Live>,
}

impl ModelSource {
    /// Starts the five watches; the future runs them (it never ends) and wakes `changed`
    /// after each event that may change the model.
    pub fn start(
        ctx: &Context,
        retention: Duration,
        settle: Duration,
        changed: Arc<Notify>,
    ) -> (Self, impl Future<Output = ()> + Send + use<>) {
        let cache = Shared::<Cache>::default();
        let any = watcher::Config::default;
        let watch = Watches::new(&ctx.base.readiness, "conntrack", &ctx.base.client, &cache);
        let watches = [
            // All services, also those another proxy handles (service-proxy-name): their
            // frontends are recorded as foreign, so a label change is not mistaken for a
            // deletion.
            kind(&watch, any(), fold_services),
            kind(
                &watch,
                any().labels(&format!(
                    "!{},!{}",
                    model::LABEL_SERVICE_PROXY_NAME,
                    model::LABEL_HEADLESS
                )),
                fold_slices,
            ),
            kind(&watch, any(), fold_cidrs),
            kind(&watch, any(), fold_addresses),
            kind(
                &watch,
                any().fields(&format!("metadata.name={}", ctx.node_name)),
                fold_nodes,
            ),
        ];
        let (ready, events): (Vec<_>, Vec<_>) = watches.into_iter().unzip();
        let run = futures::stream::select_all(events).for_each(move |rebuild| {
            if rebuild {
                changed.notify_one();
            }
            std::future::ready(())
        });
        let watched = Self {
            cache,
            health: Health::new(ready),
            live: Mutex::new(Live::new(settle, retention)),
        };
        (watched, run)
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

#[cfg(test)]
mod tests {
    use groundskeeper_plumbing::cache::{Seen, Stale};

    fn at(e: [Option<u64>; 5]) -> Seen {
        Seen::from_epochs(e)
    }

    /// The cases that matter here, asked the way a pass asks (`Scheduler::on_wake`).
    #[test]
    fn passes_act_only_on_a_model_built_from_healthy_unchanged_watches() {
        let built = at([Some(3), Some(7), Some(1), Some(1), Some(1)]);
        let cases = [
            (
                "built while all were healthy, nothing happened since: clean",
                built.clone(),
                at([Some(3), Some(7), Some(1), Some(1), Some(1)]),
                Ok(()),
            ),
            (
                "the EndpointSlice watch is failing (apiserver down): skip",
                built.clone(),
                at([Some(3), None, Some(1), Some(1), Some(1)]),
                Err(Stale::NotHealthy),
            ),
            (
                "relisting after the outage: still skip until the list is in",
                built.clone(),
                at([None, Some(7), Some(1), Some(1), Some(1)]),
                Err(Stale::NotHealthy),
            ),
            (
                "back and healthy, but the model predates the outage: skip until rebuilt",
                built.clone(),
                at([Some(3), Some(10), Some(1), Some(1), Some(1)]),
                Err(Stale::ChangedSince),
            ),
            (
                "a model built while a watch was not healthy is never acted on",
                at([Some(3), None, Some(1), Some(1), Some(1)]),
                at([Some(3), None, Some(1), Some(1), Some(1)]),
                Err(Stale::NotHealthy),
            ),
            (
                "the IPAddress watch is failing: allocated IPs could look orphaned",
                built.clone(),
                at([Some(3), Some(7), Some(1), None, Some(1)]),
                Err(Stale::NotHealthy),
            ),
        ];
        for (what, built, now, want) in cases {
            assert_eq!(built.may_act(&now), want, "{what}");
        }
        assert_eq!(super::Skip::StaleModel.label(), "stale-model");
    }
}
