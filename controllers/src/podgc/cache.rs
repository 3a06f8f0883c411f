//! The Pod and Node caches: watcher streams folded into compact maps. A relist is buffered and
//! swapped in at `InitDone`, so objects deleted while the watch was down disappear and a cycle
//! never reads half a list (the informer's Replace semantics). Namespaces are watched as
//! metadata only, for the two policy annotations.

use std::{
    collections::HashMap,
    hash::Hash,
    sync::{Arc, Mutex},
};

use futures::TryStreamExt;
use groundskeeper_plumbing::ReadyFlag;
use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, Resource, core::PartialObjectMeta, runtime::watcher};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{
    facts::{Interner, NodeFacts, PodFacts},
    passes::Snapshot,
    policy::{NsAnnotations, THRESHOLD_ANNOTATION, TTL_ANNOTATION},
    wire::{WireNode, WirePod},
};

/// One watched kind's map, with the relist buffer.
pub struct Store<K, V> {
    live: HashMap<K, V>,
    relist: Option<HashMap<K, V>>,
    listed: bool,
}

impl<K: Eq + Hash, V> Default for Store<K, V> {
    fn default() -> Self {
        Self {
            live: HashMap::new(),
            relist: None,
            listed: false,
        }
    }
}

/// A watcher event reduced to a key and the facts kept.
pub enum Update<K, V> {
    Init,
    InitApply(K, V),
    InitDone,
    Apply(K, V),
    Delete(K),
}

impl<K: Eq + Hash, V> Store<K, V> {
    /// Folds one event in; returns true when a full list has just completed.
    pub fn update(&mut self, u: Update<K, V>) -> bool {
        match u {
            Update::Init => self.relist = Some(HashMap::new()),
            Update::InitApply(k, v) => {
                self.relist.get_or_insert_with(HashMap::new).insert(k, v);
            }
            Update::InitDone => {
                self.live = self.relist.take().unwrap_or_default();
                self.live.shrink_to_fit();
                self.listed = true;
                return true;
            }
            Update::Apply(k, v) => {
                self.live.insert(k, v);
            }
            Update::Delete(k) => {
                self.live.remove(&k);
            }
        }
        false
    }

    pub fn listed(&self) -> bool {
        self.listed
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.live.values()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.live.iter()
    }

    pub fn len(&self) -> usize {
        self.live.len()
    }

    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }
}

pub type PodKey = (Arc<str>, Arc<str>);

/// Both caches, and the names they share.
#[derive(Default)]
pub struct Caches {
    pub pods: Store<PodKey, PodFacts>,
    pub nodes: Store<Arc<str>, NodeFacts>,
    /// Only namespaces that carry a policy annotation.
    pub namespaces: Store<Arc<str>, NsAnnotations>,
    names: Interner,
}

impl Caches {
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            pods: self.pods.values().cloned().collect(),
            nodes: self.nodes.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            namespaces: self
                .namespaces
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        }
    }

    /// A namespace without either annotation is folded in as a delete, so the store holds only
    /// the few namespaces with a policy.
    pub fn namespace_update(
        &mut self,
        ev: watcher::Event<PartialObjectMeta<Namespace>>,
    ) -> Option<Update<Arc<str>, NsAnnotations>> {
        let mut facts = |ns: PartialObjectMeta<Namespace>| {
            let Some(name) = ns.metadata.name.as_deref() else {
                tracing::warn!("ignoring namespace without metadata.name");
                return None;
            };
            let key = self.names.intern(name);
            let mut a = ns.metadata.annotations.unwrap_or_default();
            let policy = NsAnnotations {
                ttl: a.remove(TTL_ANNOTATION).map(String::into_boxed_str),
                threshold: a.remove(THRESHOLD_ANNOTATION).map(String::into_boxed_str),
            };
            let any = policy != NsAnnotations::default();
            Some((key, any.then_some(policy)))
        };
        Some(match ev {
            watcher::Event::Init => Update::Init,
            watcher::Event::InitDone => Update::InitDone,
            watcher::Event::InitApply(n) => match facts(n)? {
                (k, Some(v)) => Update::InitApply(k, v),
                // Not inserting is enough: the relist replaces the whole map.
                (_, None) => return None,
            },
            watcher::Event::Apply(n) => match facts(n)? {
                (k, Some(v)) => Update::Apply(k, v),
                (k, None) => Update::Delete(k),
            },
            watcher::Event::Delete(n) => Update::Delete(facts(n)?.0),
        })
    }

    pub fn pod_update(&mut self, ev: watcher::Event<WirePod>) -> Option<Update<PodKey, PodFacts>> {
        let facts = |p: WirePod, names: &mut Interner| match PodFacts::from_wire(p, names) {
            Ok(f) => Some(((f.namespace.clone(), f.name.clone()), f)),
            Err(e) => {
                tracing::warn!(error = %e, "ignoring pod");
                None
            }
        };
        Some(match ev {
            watcher::Event::Init => Update::Init,
            watcher::Event::InitDone => Update::InitDone,
            watcher::Event::InitApply(p) => {
                let (k, v) = facts(p, &mut self.names)?;
                Update::InitApply(k, v)
            }
            watcher::Event::Apply(p) => {
                let (k, v) = facts(p, &mut self.names)?;
                Update::Apply(k, v)
            }
            watcher::Event::Delete(p) => {
                let (k, _) = facts(p, &mut self.names)?;
                Update::Delete(k)
            }
        })
    }

    pub fn node_update(
        &mut self,
        ev: watcher::Event<WireNode>,
    ) -> Option<Update<Arc<str>, NodeFacts>> {
        let mut key = |n: &WireNode| match n.metadata.name.as_deref() {
            Some(name) => Some(self.names.intern(name)),
            None => {
                tracing::warn!("ignoring node without metadata.name");
                None
            }
        };
        Some(match ev {
            watcher::Event::Init => Update::Init,
            watcher::Event::InitDone => Update::InitDone,
            watcher::Event::InitApply(n) => Update::InitApply(key(&n)?, NodeFacts::from_wire(&n)),
            watcher::Event::Apply(n) => Update::Apply(key(&n)?, NodeFacts::from_wire(&n)),
            watcher::Event::Delete(n) => Update::Delete(key(&n)?),
        })
    }
}

/// Whether each cache has completed its first full list.
#[derive(Clone)]
pub struct Synced {
    pub pods: watch::Receiver<bool>,
    pub nodes: watch::Receiver<bool>,
    /// A namespace's opt-out (`0`) must be known before its pods meet the cluster TTL.
    pub namespaces: watch::Receiver<bool>,
}

impl Synced {
    /// Resolves once every cache listed (never, if a watch task ended first).
    pub async fn wait(&mut self) {
        for rx in [&mut self.pods, &mut self.nodes, &mut self.namespaces] {
            if rx.wait_for(|s| *s).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

/// Watches pods and nodes into `caches` until `token` is cancelled.
pub fn start(
    client: kube::Client,
    caches: Arc<Mutex<Caches>>,
    config: watcher::Config,
    ready: (ReadyFlag, ReadyFlag, ReadyFlag),
    token: CancellationToken,
) -> (Synced, tokio::task::JoinHandle<()>) {
    let (pods_tx, pods_rx) = watch::channel(false);
    let (nodes_tx, nodes_rx) = watch::channel(false);
    let (ns_tx, ns_rx) = watch::channel(false);
    let pods = drive(
        "pods",
        Api::<WirePod>::all(client.clone()),
        config.clone(),
        caches.clone(),
        |c: &mut Caches, ev| match c.pod_update(ev) {
            Some(u) => c.pods.update(u),
            None => false,
        },
        ready.0,
        pods_tx,
        token.clone(),
    );
    let namespaces = drive(
        "namespaces",
        Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
        config.clone(),
        caches.clone(),
        |c: &mut Caches, ev| match c.namespace_update(ev) {
            Some(u) => c.namespaces.update(u),
            None => false,
        },
        ready.2,
        ns_tx,
        token.clone(),
    );
    let nodes = drive(
        "nodes",
        Api::<WireNode>::all(client),
        config,
        caches,
        |c: &mut Caches, ev| match c.node_update(ev) {
            Some(u) => c.nodes.update(u),
            None => false,
        },
        ready.1,
        nodes_tx,
        token,
    );
    let task = tokio::spawn(async move {
        tokio::join!(pods, nodes, namespaces);
    });
    (
        Synced {
            pods: pods_rx,
            nodes: nodes_rx,
            namespaces: ns_rx,
        },
        task,
    )
}

#[allow(clippy::too_many_arguments)]
async fn drive<W>(
    what: &'static str,
    api: Api<W>,
    config: watcher::Config,
    caches: Arc<Mutex<Caches>>,
    fold: impl Fn(&mut Caches, watcher::Event<W>) -> bool,
    ready: ReadyFlag,
    synced: watch::Sender<bool>,
    token: CancellationToken,
) where
    W: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    W::DynamicType: Default,
{
    let stream = groundskeeper_plumbing::watch::watch(api, config, ready.clone());
    let mut stream = std::pin::pin!(stream);
    loop {
        let ev = tokio::select! {
            _ = token.cancelled() => return,
            ev = stream.try_next() => ev,
        };
        match ev {
            Ok(Some(ev)) => {
                let listed = {
                    let mut c = caches.lock().expect("podgc cache lock");
                    fold(&mut c, ev)
                };
                if listed {
                    // Applied: the cache is current again (also after a relist).
                    ready.mark_ready();
                    if !*synced.borrow() {
                        synced.send_replace(true);
                        tracing::info!(watch = what, "podgc cache listed");
                    }
                }
            }
            Ok(None) => return,
            // plumbing::watch logs, counts and retries errors; it never yields one.
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relist_replaces_and_drops_what_is_gone() {
        let mut s: Store<&str, u32> = Store::default();
        assert!(!s.listed());
        s.update(Update::Init);
        s.update(Update::InitApply("a", 1));
        s.update(Update::InitApply("b", 1));
        assert!(s.is_empty(), "nothing visible before the list completes");
        assert!(s.update(Update::InitDone));
        assert!(s.listed());
        s.update(Update::Apply("c", 1));
        s.update(Update::Delete("a"));
        // The watch breaks; the relist no longer has b.
        s.update(Update::Init);
        s.update(Update::InitApply("c", 2));
        let mut mid: Vec<_> = s.iter().map(|(k, v)| (*k, *v)).collect();
        mid.sort();
        assert_eq!(
            mid,
            [("b", 1), ("c", 1)],
            "the old list stays until InitDone"
        );
        s.update(Update::InitDone);
        let after: Vec<_> = s.iter().map(|(k, v)| (*k, *v)).collect();
        assert_eq!(after, [("c", 2)]);
    }

    #[tokio::test]
    async fn cycles_wait_for_both_first_lists() {
        use futures::FutureExt;
        let (pods_tx, pods) = watch::channel(false);
        let (nodes_tx, nodes) = watch::channel(false);
        let (ns_tx, namespaces) = watch::channel(false);
        let mut synced = Synced {
            pods,
            nodes,
            namespaces,
        };
        pods_tx.send_replace(true);
        assert!(
            synced.wait().now_or_never().is_none(),
            "pods listed, nodes not yet: orphan detection must not start"
        );
        nodes_tx.send_replace(true);
        assert!(
            synced.wait().now_or_never().is_none(),
            "namespaces not listed: an opt-out could be missed"
        );
        ns_tx.send_replace(true);
        assert!(synced.wait().now_or_never().is_some());
    }

    #[test]
    fn pods_fold_into_facts_keyed_by_namespace_and_name() {
        let mut c = Caches::default();
        let pod: WirePod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"nodeName": "n1"}
        }))
        .unwrap();
        let bad: WirePod =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "x"}})).unwrap();
        assert!(c.pod_update(watcher::Event::Apply(bad)).is_none());
        let u = c.pod_update(watcher::Event::Apply(pod.clone())).unwrap();
        c.pods.update(u);
        assert_eq!(c.pods.len(), 1);
        let snap = c.snapshot();
        assert_eq!(snap.pods[0].node_name.as_deref(), Some("n1"));
        let u = c.pod_update(watcher::Event::Delete(pod)).unwrap();
        c.pods.update(u);
        assert!(c.pods.is_empty());
    }

    #[test]
    fn only_namespaces_with_a_policy_are_kept() {
        let mut c = Caches::default();
        let ns = |name: &str, annotations: serde_json::Value| {
            serde_json::from_value::<PartialObjectMeta<Namespace>>(serde_json::json!({
                "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                "metadata": {"name": name, "annotations": annotations}
            }))
            .unwrap()
        };
        let fold = |c: &mut Caches, ev| {
            if let Some(u) = c.namespace_update(ev) {
                c.namespaces.update(u);
            }
        };
        fold(&mut c, watcher::Event::Init);
        fold(
            &mut c,
            watcher::Event::InitApply(ns("plain", serde_json::json!({"x": "y"}))),
        );
        fold(
            &mut c,
            watcher::Event::InitApply(ns(
                "ci",
                serde_json::json!({TTL_ANNOTATION: "1h", "x": "y"}),
            )),
        );
        fold(&mut c, watcher::Event::InitDone);
        let snap = c.snapshot();
        assert_eq!(snap.namespaces.len(), 1, "{:?}", snap.namespaces);
        assert_eq!(snap.namespaces["ci"].ttl.as_deref(), Some("1h"));
        assert_eq!(snap.namespaces["ci"].threshold, None);
        // The annotation is removed: the namespace leaves the store.
        fold(
            &mut c,
            watcher::Event::Apply(ns("ci", serde_json::json!({}))),
        );
        assert!(c.snapshot().namespaces.is_empty());
        fold(
            &mut c,
            watcher::Event::Apply(ns("plain", serde_json::json!({THRESHOLD_ANNOTATION: "5"}))),
        );
        assert_eq!(
            c.snapshot().namespaces["plain"].threshold.as_deref(),
            Some("5")
        );
        fold(
            &mut c,
            watcher::Event::Delete(ns("plain", serde_json::json!({}))),
        );
        assert!(c.snapshot().namespaces.is_empty());
    }
}
