//! What the cleanup watches (Services, EndpointSlices, ServiceCIDRs, IPAddresses, its own
//! Node), each through `plumbing::watch::cache::follow` with its selector, every event folded
//! into the model's facts by their owner (`model::source::ServiceCache::fold_services` …, each
//! object projected by `model::project` as it arrives, what it changed marked); the model source
//! reads them (`model/source.rs`). Services, EndpointSlices and IPAddresses are decoded slim
//! (`wire.rs`): only the fields read.

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use groundskeeper_plumbing::ReadyFlag;
use groundskeeper_plumbing::watch::cache::{Health, Shared, Watches};
use kube::Resource;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;

use super::model::source::{ModelSource, ServiceCache};
use super::model::{LABEL_HEADLESS, LABEL_SERVICE_PROXY_NAME};
use crate::context::Context;

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
        kind(&watch, any(), ServiceCache::fold_services),
        kind(
            &watch,
            any().labels(&format!(
                "!{},!{}",
                LABEL_SERVICE_PROXY_NAME, LABEL_HEADLESS
            )),
            ServiceCache::fold_slices,
        ),
        kind(&watch, any(), ServiceCache::fold_cidrs),
        kind(&watch, any(), ServiceCache::fold_addresses),
        kind(
            &watch,
            any().fields(&format!("metadata.name={}", ctx.node_name)),
            ServiceCache::fold_nodes,
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
