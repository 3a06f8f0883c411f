//! What the certificate task watches: the webhook's own Secret and webhook configurations
//! (validating and mutating), each by name.
//!
//! Flags `<component>/<kind>` of the component serving the certificate (`sysctlwebhook`). The
//! Secret is watched in its own namespace only; a configuration only when the
//! controller-manager keeps its caBundles ([`Own`]).

use futures::{Stream, StreamExt};
use groundskeeper_plumbing::{
    Readiness, ReadyFlag,
    watch::cache::{self, Projected, Shared, Store, Watches},
};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::runtime::watcher::{self, Event};

use super::rotation::{Annotations, Data};

/// The Secret as the certificate task reads it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SecretFacts {
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
pub struct CertCache {
    pub secret: Store<String, SecretFacts>,
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

/// The watches feeding `cache`, flags `component/<kind>`, with their changes in one stream.
pub fn follow_all(
    readiness: &Readiness,
    component: &'static str,
    client: &kube::Client,
    own: &Own,
    cache: &Shared<CertCache>,
) -> (
    Vec<ReadyFlag>,
    impl Stream<Item = Change> + Send + 'static + use<>,
) {
    let named = |name: &str| watcher::Config::default().fields(&format!("metadata.name={name}"));
    // Its own namespace only: the Role grants nothing else.
    let namespace = own.namespace.clone();
    let (secret_flag, secret) = cache::follow_in(
        readiness,
        component,
        client.clone(),
        move |c| Api::<Secret>::namespaced(c, &namespace),
        named(&own.secret),
        cache.clone(),
        fold_secret,
    );
    let watches = Watches::new(readiness, component, client, cache);
    let mut flags = vec![secret_flag];
    let mut changes = futures::stream::select_all([secret.boxed()]);
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
    (flags, changes)
}

fn by_name<V>(name: Option<String>, v: V) -> Projected<String, V> {
    match name {
        Some(name) => Projected::Yes(name, v),
        None => Projected::Unusable,
    }
}

fn fold_secret(cache: &mut CertCache, ev: Event<Secret>) -> Change {
    cache.secret.apply_event(ev, |s: Secret| {
        let facts = SecretFacts {
            data: s
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect(),
            annotations: s.metadata.annotations.unwrap_or_default(),
            resource_version: s.metadata.resource_version.unwrap_or_default(),
        };
        by_name(s.metadata.name, facts)
    });
    Change::Certificates
}

fn fold_webhooks(cache: &mut CertCache, ev: Event<ValidatingWebhookConfiguration>) -> Change {
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

fn fold_mutating(cache: &mut CertCache, ev: Event<MutatingWebhookConfiguration>) -> Change {
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
) -> Projected<String, WebhookBundles> {
    let bundles = WebhookBundles {
        resource_version: meta.resource_version.unwrap_or_default(),
        webhooks: hooks
            .map(|(name, ca)| (name, ca.map(|b| b.0).unwrap_or_default()))
            .collect(),
    };
    by_name(meta.name, bundles)
}
