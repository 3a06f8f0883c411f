//! What the webhook watches: nodes (labels, kernel), SysctlPolicies, pods not yet bound, and
//! its own Secret and webhook configurations (validating and mutating).
//!
//! Flags `sysctlwebhook/<kind>`. A binding names only its pod, so the pods not yet bound are
//! kept (field selector `spec.nodeName=`, so the watch carries nothing of bound pods), each as
//! its [`PodView`]; a binding whose pod is not there yet is judged from a GET instead.

use futures::{Stream, StreamExt};
use groundskeeper_plumbing::{
    Readiness,
    cache::{self, Health, Kept, Shared, Store, Watches},
};
use groundskeeper_sysctl_rules::crd::SysctlPolicy;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::Api;
use kube::runtime::watcher::{self, Event};

use super::decide::{NodeFacts, PodView};
use super::rotation::{Annotations, Data};

/// Readiness flags are `sysctlwebhook/<kind>`.
pub const COMPONENT: &str = "sysctlwebhook";

/// A pod by namespace and name.
pub type PodKey = (String, String);

/// The Secret as the webhook reads it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SecretView {
    pub data: Data,
    pub annotations: Annotations,
    pub resource_version: String,
}

/// Each webhook of the configuration, in order: its name and caBundle; and the
/// configuration's resourceVersion they were read at (the precondition of the caBundle patch).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WebhookBundles {
    pub resource_version: String,
    pub webhooks: Vec<(String, Vec<u8>)>,
}

#[derive(Default)]
pub struct Cache {
    pub nodes: Store<String, NodeFacts>,
    pub policies: Store<String, SysctlPolicy>,
    pub pending: Store<PodKey, PodView>,
    pub secret: Store<String, SecretView>,
    pub webhooks: Store<String, WebhookBundles>,
    /// The mutating configuration's (the gate's), by name.
    pub mutating: Store<String, WebhookBundles>,
}

/// What the certificate task reacts to, once the cache has applied it.
#[derive(Debug, PartialEq, Eq)]
pub enum Change {
    None,
    /// The Secret or the webhook configuration changed (or was listed).
    Certificates,
}

/// Where the webhook's own objects are.
#[derive(Clone, Debug)]
pub struct Own {
    pub namespace: String,
    pub secret: String,
    /// Watched (and its caBundles patched) only when the controller-manager issues the
    /// certificates; cert-manager's cainjector patches it otherwise.
    pub configuration: Option<String>,
    /// The MutatingWebhookConfiguration of the gate, on the same terms.
    pub mutating: Option<String>,
}

/// The watches feeding `cache`, with their flags and their changes in one stream.
pub fn follow_all(
    readiness: &Readiness,
    client: &kube::Client,
    own: &Own,
    cache: &Shared<Cache>,
) -> (Health, impl Stream<Item = Change> + Send + 'static) {
    let from_watch_cache = || watcher::Config::default().any_semantic();
    let named = |name: &str| watcher::Config::default().fields(&format!("metadata.name={name}"));
    let watches = Watches::new(readiness, COMPONENT, client, cache);
    let (nodes_flag, nodes) = watches.follow::<Node, _, _>(from_watch_cache(), fold_node);
    let (policies_flag, policies) =
        watches.follow::<SysctlPolicy, _, _>(from_watch_cache(), fold_policy);
    let (pods_flag, pods) =
        watches.follow::<Pod, _, _>(from_watch_cache().fields("spec.nodeName="), fold_pod);
    // Its own namespace only: the Role grants nothing else.
    let namespace = own.namespace.clone();
    let (secret_flag, secret) = cache::follow_in(
        readiness,
        COMPONENT,
        client.clone(),
        move |c| Api::<Secret>::namespaced(c, &namespace),
        named(&own.secret),
        cache.clone(),
        fold_secret,
    );
    let mut flags = vec![nodes_flag, policies_flag, pods_flag, secret_flag];
    let mut changes = futures::stream::select_all([
        nodes.boxed(),
        policies.boxed(),
        pods.boxed(),
        secret.boxed(),
    ]);
    if let Some(name) = &own.configuration {
        let (flag, webhooks) =
            watches.follow::<ValidatingWebhookConfiguration, _, _>(named(name), fold_webhooks);
        flags.push(flag);
        changes.push(webhooks.boxed());
    }
    if let Some(name) = &own.mutating {
        let (flag, webhooks) =
            watches.follow::<MutatingWebhookConfiguration, _, _>(named(name), fold_mutating);
        flags.push(flag);
        changes.push(webhooks.boxed());
    }
    (Health::new(flags), changes)
}

fn by_name<V>(name: Option<String>, v: V) -> Kept<String, V> {
    match name {
        Some(name) => Kept::Yes(name, v),
        None => Kept::Unusable,
    }
}

fn fold_node(cache: &mut Cache, ev: Event<Node>) -> Change {
    cache.nodes.apply_event(ev, |n: Node| {
        by_name(n.metadata.name.clone(), NodeFacts::of(&n))
    });
    Change::None
}

fn fold_policy(cache: &mut Cache, ev: Event<SysctlPolicy>) -> Change {
    cache
        .policies
        .apply_event(ev, |p: SysctlPolicy| by_name(p.metadata.name.clone(), p));
    Change::None
}

fn fold_pod(cache: &mut Cache, ev: Event<Pod>) -> Change {
    cache.pending.apply_event(ev, |p: Pod| {
        match (p.metadata.namespace.clone(), p.metadata.name.clone()) {
            (Some(ns), Some(name)) => Kept::Yes((ns, name), PodView::of(&p)),
            _ => Kept::Unusable,
        }
    });
    Change::None
}

fn fold_secret(cache: &mut Cache, ev: Event<Secret>) -> Change {
    cache.secret.apply_event(ev, |s: Secret| {
        let view = SecretView {
            data: s
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect(),
            annotations: s.metadata.annotations.unwrap_or_default(),
            resource_version: s.metadata.resource_version.unwrap_or_default(),
        };
        by_name(s.metadata.name, view)
    });
    Change::Certificates
}

fn fold_webhooks(cache: &mut Cache, ev: Event<ValidatingWebhookConfiguration>) -> Change {
    cache
        .webhooks
        .apply_event(ev, |c: ValidatingWebhookConfiguration| {
            let hooks = c.webhooks.unwrap_or_default().into_iter();
            kept_bundles(
                c.metadata,
                hooks.map(|w| (w.name, w.client_config.ca_bundle)),
            )
        });
    Change::Certificates
}

fn fold_mutating(cache: &mut Cache, ev: Event<MutatingWebhookConfiguration>) -> Change {
    cache
        .mutating
        .apply_event(ev, |c: MutatingWebhookConfiguration| {
            let hooks = c.webhooks.unwrap_or_default().into_iter();
            kept_bundles(
                c.metadata,
                hooks.map(|w| (w.name, w.client_config.ca_bundle)),
            )
        });
    Change::Certificates
}

/// What either kind of webhook configuration keeps: each webhook's caBundle, and the
/// resourceVersion they were read at (the precondition of a caBundle patch).
fn kept_bundles(
    meta: kube::api::ObjectMeta,
    hooks: impl Iterator<Item = (String, Option<k8s_openapi::ByteString>)>,
) -> Kept<String, WebhookBundles> {
    let bundles = WebhookBundles {
        resource_version: meta.resource_version.unwrap_or_default(),
        webhooks: hooks
            .map(|(name, ca)| (name, ca.map(|b| b.0).unwrap_or_default()))
            .collect(),
    };
    by_name(meta.name, bundles)
}
