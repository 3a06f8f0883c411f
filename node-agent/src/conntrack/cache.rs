//! What the cleanup watches (Services, EndpointSlices, ServiceCIDRs, IPAddresses, its own
//! Node), each through `plumbing::watch::cache::follow`, folding every event into the model's facts
//! (`model::source::ServiceCache`, each object projected by `model::project` as it arrives) and
//! marking what it changed; the model source reads them (`model/source.rs`). Services,
//! EndpointSlices and IPAddresses are decoded slim (`wire.rs`): only the fields read.

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use groundskeeper_plumbing::watch::cache::{Applied, Health, Projected, Shared, Watches};
use groundskeeper_plumbing::{ObjectKey, ReadyFlag};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::Resource;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;

use super::model::project;
use super::model::source::{ModelSource, ServiceCache};
use super::model::{LABEL_HEADLESS, LABEL_SERVICE_PROXY_NAME};
use super::wire::{WireIpAddress, WireService, WireSlice};
use crate::context::Context;

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

pub(super) fn fold_services(c: &mut ServiceCache, ev: Event<WireService>) -> bool {
    let rebuild = wants_rebuild(&ev);
    match c.services.apply_event(ev, |o| keep(o, project::service)) {
        // Most updates (status, annotations, resourceVersion) leave the facts as they were: the
        // model cannot see them, so they wake nothing.
        Applied::Upserted { key, old } if old.as_ref() == c.services.get(&key) => return false,
        Applied::Upserted { key, .. } | Applied::Removed { key, .. } => {
            c.dirty.services.insert(key);
        }
        Applied::Relisted { .. } => c.dirty.all = true,
        Applied::Nothing => {}
    }
    rebuild
}

pub(super) fn fold_slices(c: &mut ServiceCache, ev: Event<WireSlice>) -> bool {
    let rebuild = wants_rebuild(&ev);
    let (key, old) = match c.slices.apply_event(ev, |o| keep(o, project::slice)) {
        // The facts as they were (a TCP-only slice's endpoints, a zone or hint): wakes nothing.
        Applied::Upserted { key, old } if old.as_ref() == c.slices.get(&key) => return false,
        Applied::Upserted { key, old } => (key, old),
        Applied::Removed { key, old } => (key, Some(old)),
        Applied::Relisted { .. } => {
            c.slices_of.clear();
            for (key, s) in c.slices.iter() {
                if let Some(svc) = &s.service {
                    let owner = ObjectKey::new(key.namespace(), svc);
                    c.slices_of.entry(owner).or_default().push(key.clone());
                }
            }
            c.dirty.all = true;
            return rebuild;
        }
        Applied::Nothing => return rebuild,
    };
    // The service it belonged to and the one it belongs to now (a label can change).
    let ns = key.namespace();
    if let Some(svc) = old.and_then(|o| o.service) {
        let owner = ObjectKey::new(ns, &svc);
        if let Some(slices) = c.slices_of.get_mut(&owner) {
            slices.retain(|s| *s != key);
            if slices.is_empty() {
                c.slices_of.remove(&owner);
            }
        }
        c.dirty.services.insert(owner);
    }
    if let Some(svc) = c.slices.get(&key).and_then(|s| s.service.as_deref()) {
        let owner = ObjectKey::new(ns, svc);
        c.slices_of
            .entry(owner.clone())
            .or_default()
            .push(key.clone());
        c.dirty.services.insert(owner);
    }
    rebuild
}

pub(super) fn fold_cidrs(c: &mut ServiceCache, ev: Event<ServiceCIDR>) -> bool {
    c.dirty.service_ips = true;
    let rebuild = wants_rebuild(&ev);
    c.cidrs.apply_event(ev, |o| keep(o, project::service_cidr));
    rebuild
}

pub(super) fn fold_addresses(c: &mut ServiceCache, ev: Event<WireIpAddress>) -> bool {
    c.dirty.service_ips = true;
    let rebuild = wants_rebuild(&ev);
    c.addresses
        .apply_event(ev, |o| keep(o, project::ip_address));
    rebuild
}

pub(super) fn fold_nodes(c: &mut ServiceCache, ev: Event<Node>) -> bool {
    c.dirty.node = true;
    let rebuild = wants_rebuild(&ev);
    c.nodes.apply_event(ev, |o| keep(o, project::node));
    rebuild
}

/// Watches every `K` selected by `config` into the cache through `fold`.
fn kind<K>(
    watches: &Watches<ServiceCache>,
    config: watcher::Config,
    fold: fn(&mut ServiceCache, Event<K>) -> bool,
) -> (ReadyFlag, BoxStream<'static, bool>)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (flag, events) = watches.follow(config, fold);
    (flag, events.boxed())
}

/// Starts the five watches; the future runs them (it never ends) and wakes `changed` after
/// each event that may change the model. The model source reads what they fold in.
pub fn start(
    ctx: &Context,
    retention: Duration,
    settle: Duration,
    changed: Arc<Notify>,
) -> (ModelSource, impl Future<Output = ()> + Send + use<>) {
    let cache = Shared::<ServiceCache>::default();
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
                LABEL_SERVICE_PROXY_NAME, LABEL_HEADLESS
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
    let watched = ModelSource::new(cache, Health::new(ready), settle, retention);
    (watched, run)
}

#[cfg(test)]
mod tests {
    use groundskeeper_plumbing::watch::cache::{Seen, Stale};

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
        assert_eq!(
            crate::conntrack::model::source::Skip::StaleModel.label(),
            "stale-model"
        );
    }
}
