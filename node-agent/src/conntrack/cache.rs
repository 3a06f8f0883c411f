//! What the cleanup watches (Services, EndpointSlices, ServiceCIDRs, IPAddresses, its own
//! Node), each through `plumbing::cache::follow` into one shared cache, and the model built
//! from it only while every watch is healthy.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use std::fmt::Debug;

use futures::StreamExt;
use futures::stream::BoxStream;
use groundskeeper_plumbing::ReadyFlag;
use groundskeeper_plumbing::cache::{Health, Kept, Seen, Shared, Store, Watches};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{IPAddress, ServiceCIDR};
use kube::Resource;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;

use super::model::{self, Model, Settle, Tombstones};
use super::project;
use crate::context::Context;

/// Namespace ("" for cluster-scoped kinds) and name.
type Key = (String, String);

/// The watched objects as the model reads them ([`project`]), shared: a model build clones pointers out under
/// the lock and reads the objects after releasing it.
type Objects<K> = Store<Key, Arc<K>>;

/// Every object of the five kinds the model is built from.
#[derive(Default)]
pub struct Cache {
    services: Objects<Service>,
    slices: Objects<EndpointSlice>,
    cidrs: Objects<ServiceCIDR>,
    addresses: Objects<IPAddress>,
    nodes: Objects<Node>,
}

/// `o` as the model reads it (`project`), under its namespace and name.
fn keep<K: Resource>(o: K, project: fn(K) -> K) -> Kept<Key, Arc<K>> {
    match o.meta().name.clone() {
        Some(name) => Kept::Yes(
            (o.meta().namespace.clone().unwrap_or_default(), name),
            Arc::new(project(o)),
        ),
        None => Kept::Unusable,
    }
}

/// Applies `ev` to `store`; true when the model must be rebuilt (a change, or a list is in).
fn fold<K: Resource>(store: &mut Objects<K>, ev: Event<K>, project: fn(K) -> K) -> bool {
    let rebuild = matches!(ev, Event::Apply(_) | Event::Delete(_) | Event::InitDone);
    store.apply_event(ev, |o| keep(o, project));
    rebuild
}

/// The objects of one kind, cloned out of the cache (pointers only).
fn all<K>(store: &Objects<K>) -> Vec<Arc<K>> {
    store.values().cloned().collect()
}

/// Watches every `K` selected by `config` into the part of the cache `store` picks, each
/// object cut down by `project` to what the model reads.
fn kind<K>(
    watches: &Watches<Cache>,
    config: watcher::Config,
    store: fn(&mut Cache) -> &mut Objects<K>,
    project: fn(K) -> K,
) -> (ReadyFlag, BoxStream<'static, bool>)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (flag, events) =
        watches.follow(config, move |c: &mut Cache, ev| fold(store(c), ev, project));
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
    /// The current model with the watch health it was built at; `None` while a watch is not
    /// healthy.
    fn model(&self) -> Option<(Model, Seen)>;
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
    tombstones: Mutex<Tombstones>,
    settle: Mutex<Settle>,
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
            kind::<Service>(&watch, any(), |c| &mut c.services, project::service),
            kind::<EndpointSlice>(
                &watch,
                any().labels(&format!(
                    "!{},!{}",
                    model::LABEL_SERVICE_PROXY_NAME,
                    model::LABEL_HEADLESS
                )),
                |c| &mut c.slices,
                project::slice,
            ),
            kind::<ServiceCIDR>(&watch, any(), |c| &mut c.cidrs, project::service_cidr),
            kind::<IPAddress>(&watch, any(), |c| &mut c.addresses, project::ip_address),
            kind::<Node>(
                &watch,
                any().fields(&format!("metadata.name={}", ctx.node_name)),
                |c| &mut c.nodes,
                project::node,
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
            tombstones: Mutex::new(Tombstones::new(retention)),
            settle: Mutex::new(Settle::new(settle)),
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
    fn model(&self) -> Option<(Model, Seen)> {
        let before = self.health.seen();
        if !before.is_current() {
            return None;
        }
        let (services, slices, cidrs, addresses, node) = {
            let c = self.cache.lock();
            (
                all(&c.services),
                all(&c.slices),
                all(&c.cidrs),
                all(&c.addresses),
                c.nodes.values().next().cloned(),
            )
        };
        let m = model::build(services.iter().map(|s| &**s), slices.iter().map(|s| &**s))
            .with_service_ips(cidrs.iter().map(|c| &**c), addresses.iter().map(|a| &**a))
            .with_node(node.as_deref());
        // Health changed while the cache was read: the model may mix old and new.
        if self.health.may_act(&before).is_err() {
            return None;
        }
        let now = std::time::Instant::now();
        let m = lock(&self.settle).apply(m, now);
        Some((lock(&self.tombstones).apply(m, now), before))
    }

    fn changes_in(&self) -> Option<Duration> {
        lock(&self.settle).next_change(std::time::Instant::now())
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
