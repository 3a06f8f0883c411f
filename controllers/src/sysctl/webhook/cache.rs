//! What the webhook judges on: nodes (labels, kernel), SysctlPolicies, pods not yet bound.
//!
//! Flags `sysctlwebhook/<kind>`. A binding names only its pod, so the pods not yet bound are
//! kept (field selector `spec.nodeName=`, so the watch carries nothing of bound pods), each as
//! its [`PodView`]; a binding whose pod is not there yet is judged from a GET instead. The
//! webhook's Secret and configurations are the certificate task's (`tls/cache.rs`).

use futures::{Stream, StreamExt};
use groundskeeper_plumbing::{
    Readiness, ReadyFlag,
    cache::{Kept, Shared, Store, Watches},
};
use groundskeeper_sysctl_rules::crd::SysctlPolicy;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::watcher::{self, Event};

use super::decide::{NodeFacts, PodView};

/// Readiness flags are `sysctlwebhook/<kind>`.
pub const COMPONENT: &str = "sysctlwebhook";

/// A pod by namespace and name.
pub type PodKey = (String, String);

#[derive(Default)]
pub struct Cache {
    pub nodes: Store<String, NodeFacts>,
    pub policies: Store<String, SysctlPolicy>,
    pub pending: Store<PodKey, PodView>,
}

/// The watches feeding `cache`, with their flags; the stream must be polled for the cache to
/// fill, and says nothing else.
pub fn follow_all(
    readiness: &Readiness,
    client: &kube::Client,
    cache: &Shared<Cache>,
) -> (
    Vec<ReadyFlag>,
    impl Stream<Item = ()> + Send + 'static + use<>,
) {
    let from_watch_cache = || watcher::Config::default().any_semantic();
    let watches = Watches::new(readiness, COMPONENT, client, cache);
    let (nodes_flag, nodes) = watches.follow::<Node, _, _>(from_watch_cache(), fold_node);
    let (policies_flag, policies) =
        watches.follow::<SysctlPolicy, _, _>(from_watch_cache(), fold_policy);
    let (pods_flag, pods) =
        watches.follow::<Pod, _, _>(from_watch_cache().fields("spec.nodeName="), fold_pod);
    (
        vec![nodes_flag, policies_flag, pods_flag],
        futures::stream::select_all([nodes.boxed(), policies.boxed(), pods.boxed()]),
    )
}

fn by_name<V>(name: Option<String>, v: V) -> Kept<String, V> {
    match name {
        Some(name) => Kept::Yes(name, v),
        None => Kept::Unusable,
    }
}

fn fold_node(cache: &mut Cache, ev: Event<Node>) {
    cache.nodes.apply_event(ev, |n: Node| {
        by_name(n.metadata.name.clone(), NodeFacts::of(&n))
    });
}

fn fold_policy(cache: &mut Cache, ev: Event<SysctlPolicy>) {
    cache
        .policies
        .apply_event(ev, |p: SysctlPolicy| by_name(p.metadata.name.clone(), p));
}

fn fold_pod(cache: &mut Cache, ev: Event<Pod>) {
    cache.pending.apply_event(ev, |p: Pod| {
        match (p.metadata.namespace.clone(), p.metadata.name.clone()) {
            (Some(ns), Some(name)) => Kept::Yes((ns, name), PodView::of(&p)),
            _ => Kept::Unusable,
        }
    });
}
