//! What PodGC watches: pods, nodes and namespaces, kept as compact facts in one cache.
//!
//! Each kind goes through `plumbing::watch::cache::follow` (flags `podgc/pods`, `podgc/nodes`,
//! `podgc/namespaces`) into one [`Caches`]; [`Synced`] says when all three have listed once.

use std::{fmt::Debug, sync::Arc, time::Instant};

use futures::{Stream, StreamExt, stream};
use groundskeeper_plumbing::ObjectKey;
use groundskeeper_plumbing::{
    ReadyFlag,
    process::Base,
    watch::cache::{Applied, Projected, Shared, Store, Update, Watches},
};
use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Resource,
    core::PartialObjectMeta,
    runtime::watcher::{self, Event},
};
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use super::{
    decide::Snapshot,
    facts::{Interner, NodeFacts, NsAnnotations, PodFacts, Uid},
    pending::{self, Pending},
    policy::{THRESHOLD_ANNOTATION, TTL_ANNOTATION},
    wire::{WireNode, WirePod},
};

/// The readiness component: the flags are `podgc/pods`, `podgc/nodes`, `podgc/namespaces`.
const COMPONENT: &str = "podgc";

/// Objects per list page. A page is what a list holds at once, and kube's client holds it two
/// or three times over as JSON (the body's chunks, one contiguous copy, the text decoded):
/// 500 pods of 9 KiB, client-go's page, is 4.5 MB of JSON, held so at the peak of every list
/// and relist, more than the cache of 50k pods. 100 holds a fifth of that, for five times the
/// requests (1,500 at 150k pods, each a few milliseconds of the apiserver's); the peaks with
/// either size: docs/benchmarks.md#the-lists-page-size.
const LIST_PAGE_SIZE: u32 = 100;

/// The three caches, and the names they share.
pub struct Caches {
    /// Shared with each cycle's snapshot, which then costs a pointer per pod, not a copy.
    /// Relisted in place: a relist of 150k pods never holds a second map of them. Every pass
    /// acts through `Health`, which says `NotHealthy` from the relist's start to its end, and a
    /// pass that read before it sees its epoch changed before each write.
    pub pods: Store<ObjectKey, Arc<PodFacts>>,
    pub nodes: Store<Arc<str>, NodeFacts>,
    /// Only namespaces that carry a policy annotation.
    pub namespaces: Store<Arc<str>, NsAnnotations>,
    names: Interner,
    /// Our pod writes the pod store has not folded yet: those pods are left out of snapshots.
    pub pending: Pending,
}

impl Default for Caches {
    fn default() -> Self {
        Self {
            pods: Store::relisting_in_place(),
            nodes: Store::default(),
            namespaces: Store::default(),
            names: Interner::default(),
            pending: Pending::default(),
        }
    }
}

impl Caches {
    /// What a cycle judges. A pod with a write of ours the cache has not folded yet is left
    /// out: not chosen, not counted toward a threshold (`pending.rs`).
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            pods: self
                .pods
                .values()
                .filter(|p| !self.pending.holds(p))
                .cloned()
                .collect(),
            nodes: self.nodes.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            namespaces: self
                .namespaces
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        }
    }

    /// Every store has applied a full list once: orphan detection must never run on a node
    /// cache that has not, and a namespace's opt-out (`0`) must be known before its pods meet
    /// the cluster TTL.
    pub fn listed(&self) -> bool {
        self.pods.listed() && self.nodes.listed() && self.namespaces.listed()
    }

    /// Our write to `pod` was answered at `version` (`pending.rs`).
    pub fn wrote(&mut self, pod: &PodFacts, version: Option<u64>) {
        let cached = self.pods.get(&pod.key).is_some_and(|p| p.uid == pod.uid);
        self.pending.record(pod, version, cached);
    }

    pub fn fold_pod(&mut self, ev: Event<WirePod>) -> Applied<ObjectKey, Arc<PodFacts>> {
        let caught_up = CaughtUp::of(&ev, !self.pending.is_empty());
        let applied = self.fold_pod_facts(ev);
        self.catch_up(caught_up);
        applied
    }

    /// What a folded pod event settles of our pending writes.
    fn catch_up(&mut self, c: CaughtUp) {
        let pending = &mut self.pending;
        match c {
            CaughtUp::Watched { pod, version } => {
                if let Some((key, uid)) = pod {
                    pending.folded(&key, &uid, version);
                }
                if let Some(v) = version {
                    pending.advance(v);
                }
            }
            CaughtUp::Deleted { key, version } => {
                if let Some(key) = key {
                    pending.gone(&key);
                }
                if let Some(v) = version {
                    pending.advance(v);
                }
            }
            CaughtUp::Listed { pod, version } => {
                if let Some((key, uid)) = pod {
                    pending.folded(&key, &uid, version);
                }
            }
            CaughtUp::Relisted => {
                let pods = &self.pods;
                pending.retain_cached(|k, u| pods.get(k).is_some_and(|p| p.uid == *u));
            }
            CaughtUp::Nothing => {}
        }
    }

    fn fold_pod_facts(&mut self, ev: Event<WirePod>) -> Applied<ObjectKey, Arc<PodFacts>> {
        let watched = matches!(ev, Event::Apply(_));
        let (names, pods) = (&mut self.names, &self.pods);
        let update = Update::from_event(ev, |p| match PodFacts::from_wire(p, names) {
            Ok(mut f) => {
                let key = f.key.clone();
                if f.phase.is_final() {
                    let old = pods.get(&key).filter(|old| old.uid == f.uid);
                    f.set_seen_final(seen_final(old.map(|o| &**o), watched));
                }
                Projected::Yes(key, Arc::new(f))
            }
            Err(e) => {
                tracing::warn!(error = %e, "ignoring pod");
                Projected::Unusable
            }
        });
        match update {
            Some(update) => self.pods.apply(update),
            None => Applied::Nothing,
        }
    }

    pub fn fold_node(&mut self, ev: Event<WireNode>) -> Applied<Arc<str>, NodeFacts> {
        let names = &mut self.names;
        self.nodes
            .apply_event(ev, |n| match n.metadata.name.as_deref() {
                Some(name) => Projected::Yes(names.intern(name), NodeFacts::from_wire(&n)),
                None => {
                    tracing::warn!("ignoring node without metadata.name");
                    Projected::Unusable
                }
            })
    }

    /// A namespace without either annotation is not kept (an update that removes them removes
    /// it), so the store holds only the few namespaces with a policy.
    pub fn fold_namespace(
        &mut self,
        ev: Event<PartialObjectMeta<Namespace>>,
    ) -> Applied<Arc<str>, NsAnnotations> {
        let names = &mut self.names;
        self.namespaces.apply_event(ev, |ns| {
            let Some(name) = ns.metadata.name.as_deref() else {
                tracing::warn!("ignoring namespace without metadata.name");
                return Projected::Unusable;
            };
            let key = names.intern(name);
            let mut a = ns.metadata.annotations.unwrap_or_default();
            let policy = NsAnnotations {
                ttl: a.remove(TTL_ANNOTATION).map(String::into_boxed_str),
                threshold: a.remove(THRESHOLD_ANNOTATION).map(String::into_boxed_str),
            };
            if policy == NsAnnotations::default() {
                Projected::No(key)
            } else {
                Projected::Yes(key, policy)
            }
        })
    }
}

/// What a pod event says of our pending writes, read before it is folded: the pod (only while
/// writes are pending) and the version it carries.
enum CaughtUp {
    /// A watch event: in version order, so its version settles every write at or below.
    Watched {
        pod: Option<(ObjectKey, Uid)>,
        version: Option<u64>,
    },
    Deleted {
        key: Option<ObjectKey>,
        version: Option<u64>,
    },
    /// An object of a relist: settles only a write to that pod.
    Listed {
        pod: Option<(ObjectKey, Uid)>,
        version: Option<u64>,
    },
    /// A relist ended: what it did not list has left.
    Relisted,
    Nothing,
}

impl CaughtUp {
    fn of(ev: &Event<WirePod>, pending: bool) -> Self {
        let version = |p: &WirePod| pending::version(p.metadata.resource_version.as_deref());
        let pod = |p: &WirePod| {
            let m = &p.metadata;
            let key = ObjectKey::new(m.namespace.as_deref()?, m.name.as_deref()?);
            Some((key, Uid::from(m.uid.as_deref()?)))
        };
        let pod = |p: &WirePod| if pending { pod(p) } else { None };
        match ev {
            Event::Apply(p) => CaughtUp::Watched {
                pod: pod(p),
                version: version(p),
            },
            Event::Delete(p) => CaughtUp::Deleted {
                key: pod(p).map(|(k, _)| k),
                version: version(p),
            },
            Event::InitApply(p) => CaughtUp::Listed {
                pod: pod(p),
                version: version(p),
            },
            Event::InitDone => CaughtUp::Relisted,
            Event::Init => CaughtUp::Nothing,
        }
    }
}

/// When this process saw a pod that is now final become final. Kept from the live map across
/// updates and relists (a relist is buffered while the live map still holds the pod). Seen
/// turning final, or appearing final through the watch: now. Already final in a list with no
/// earlier state (the first list after start, or created and ended while the watch was down):
/// unknown, `None`, and the TTL goes by the pod's own times (`policy::expired`; counted in
/// `groundskeeper_podgc_ttl_first_listed_total`).
pub fn seen_final(old: Option<&PodFacts>, watched: bool) -> Option<Instant> {
    match old {
        Some(old) if old.phase.is_final() => old.seen_final(),
        Some(_) => Some(Instant::now()),
        None if watched => Some(Instant::now()),
        None => None,
    }
}

/// Whether every cache has completed its first full list.
#[derive(Clone)]
pub struct Synced(watch::Receiver<bool>);

impl Synced {
    /// Resolves once every cache listed (never, if the watches ended first).
    pub async fn wait(&mut self) {
        if self.0.wait_for(|s| *s).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// PodGC's watches, running.
pub struct Watched {
    pub caches: Shared<Caches>,
    /// Pods, nodes, namespaces: a cycle deletes on what they say, so it runs only while all
    /// are healthy.
    pub flags: [ReadyFlag; 3],
    pub synced: Synced,
    /// The watches, to be spawned: they end when `base.token` is cancelled.
    pub task: futures::future::BoxFuture<'static, ()>,
}

/// Watches pods, nodes and namespaces into one [`Caches`] until `base.token` is cancelled.
pub fn start(base: &Base) -> Watched {
    let caches = Shared::<Caches>::default();
    let watches = Watches::new(&base.readiness, COMPONENT, &base.client, &caches);
    let (pods, pod_events) = follow_into(&watches, Caches::fold_pod);
    let (nodes, node_events) = follow_into(&watches, Caches::fold_node);
    let (namespaces, ns_events) = follow_into(&watches, Caches::fold_namespace);
    let (tx, rx) = watch::channel(false);
    let events = stream::select(pod_events, stream::select(node_events, ns_events));
    let token = base.token.clone();
    let task = Box::pin(async move {
        tokio::select! {
            _ = token.cancelled() => {}
            _ = signal_listed(events, tx) => {}
        }
    });
    Watched {
        caches,
        flags: [pods, nodes, namespaces],
        synced: Synced(rx),
        task,
    }
}

/// Follows every `W` into `caches` with `fold`; each item of the stream says whether every
/// cache has listed by now.
fn follow_into<W, A>(
    watches: &Watches<Caches>,
    fold: fn(&mut Caches, Event<W>) -> A,
) -> (ReadyFlag, impl Stream<Item = bool> + Send + 'static)
where
    W: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    A: 'static,
{
    watches.follow(watch_config(), move |c, ev| {
        fold(c, ev);
        c.listed()
    })
}

/// How every PodGC watch lists: in pages of [`LIST_PAGE_SIZE`], and consistent (no
/// `resourceVersion`: the apiserver answers with the current state, from its watch cache where
/// etcd lets it prove that cache current, else from etcd). Never `resourceVersion=0`
/// (`ListSemantic::Any`): that list may be older than what this process, or the leader before
/// it, already saw, and the threshold, out-of-service and namespace-policy passes decide on the
/// cache as a whole (a count of terminated pods, a node's taint, a namespace's opt-out), which
/// no precondition on the deleted pod re-checks (docs/podgc.md, "Listing").
fn watch_config() -> watcher::Config {
    watcher::Config::default().page_size(LIST_PAGE_SIZE)
}

/// Drives the watch streams (each item: every cache has listed by now) and turns `synced`
/// true at the first that says so.
async fn signal_listed(events: impl Stream<Item = bool>, synced: watch::Sender<bool>) {
    let mut events = std::pin::pin!(events);
    while let Some(all_listed) = events.next().await {
        if all_listed && !*synced.borrow() {
            synced.send_replace(true);
            tracing::info!("podgc caches listed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str) -> WirePod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns", "uid": "u"},
            "spec": {"nodeName": "n1"}
        }))
        .unwrap()
    }

    fn ns(name: &str, annotations: serde_json::Value) -> PartialObjectMeta<Namespace> {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": {"name": name, "annotations": annotations}
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn cycles_wait_for_all_first_lists() {
        use futures::FutureExt;
        let mut c = Caches::default();
        let (events, rx) = futures::channel::mpsc::unbounded();
        let (tx, synced) = watch::channel(false);
        let mut synced = Synced(synced);
        let driven = tokio::spawn(signal_listed(rx, tx));
        let step = |listed: bool| {
            events.unbounded_send(listed).unwrap();
            async {
                for _ in 0..10 {
                    tokio::task::yield_now().await;
                }
            }
        };
        type List = fn(&mut Caches);
        let lists: [(&str, List, bool); 3] = [
            (
                "pods listed, nodes not yet: orphan detection must not start",
                |c| {
                    c.fold_pod(Event::Init);
                    c.fold_pod(Event::InitDone);
                },
                false,
            ),
            (
                "namespaces not listed: an opt-out could be missed",
                |c| {
                    c.fold_node(Event::Init);
                    c.fold_node(Event::InitDone);
                },
                false,
            ),
            (
                "all three listed",
                |c| {
                    c.fold_namespace(Event::Init);
                    c.fold_namespace(Event::InitDone);
                },
                true,
            ),
        ];
        for (what, list, synced_now) in lists {
            list(&mut c);
            step(c.listed()).await;
            assert_eq!(synced.wait().now_or_never().is_some(), synced_now, "{what}");
        }
        driven.abort();
    }

    /// The passes decide on counts, taints and annotations no precondition re-checks: every
    /// list must be consistent, never one the apiserver may answer from an older cache.
    #[test]
    fn lists_are_consistent_and_paged() {
        let c = watch_config();
        assert_eq!(c.list_semantic, watcher::ListSemantic::MostRecent);
        assert_eq!(c.page_size, Some(LIST_PAGE_SIZE));
        assert_eq!(
            c.initial_list_strategy,
            watcher::InitialListStrategy::ListWatch
        );
    }

    #[test]
    fn pods_fold_into_facts_keyed_by_namespace_and_name() {
        let mut c = Caches::default();
        let bad: WirePod =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "x"}})).unwrap();
        assert_eq!(
            c.fold_pod(Event::Apply(bad)),
            Applied::Nothing,
            "a pod without namespace or uid is not kept"
        );
        c.fold_pod(Event::Apply(pod("p")));
        assert_eq!(c.pods.len(), 1);
        let snap = c.snapshot();
        assert_eq!(snap.pods[0].node_name.as_deref(), Some("n1"));
        c.fold_pod(Event::Delete(pod("p")));
        assert!(c.pods.is_empty());
    }

    /// A node's clock cannot age a pod alone: when this process saw each pod become final, kept across updates
    /// and relists; unknown for a pod already final when first listed.
    #[test]
    fn the_time_a_pod_was_seen_final_is_kept() {
        let with_phase = |name: &str, uid: &str, phase: &str| -> WirePod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": "ns", "uid": uid},
                "spec": {"nodeName": "n1"}, "status": {"phase": phase}
            }))
            .unwrap()
        };
        let seen = |c: &Caches, name: &str| {
            c.pods
                .get(&ObjectKey::new("ns", name))
                .unwrap()
                .seen_final()
        };
        let mut c = Caches::default();
        c.fold_pod(Event::Init);
        c.fold_pod(Event::InitApply(with_phase("listed-final", "u1", "Failed")));
        c.fold_pod(Event::InitApply(with_phase("runs", "u2", "Running")));
        c.fold_pod(Event::InitDone);
        assert_eq!(seen(&c, "listed-final"), None, "final before we looked");
        assert_eq!(seen(&c, "runs"), None, "not final");

        c.fold_pod(Event::Apply(with_phase("runs", "u2", "Succeeded")));
        let t = seen(&c, "runs").expect("seen turning final");
        std::thread::sleep(std::time::Duration::from_millis(5));
        c.fold_pod(Event::Apply(with_phase("runs", "u2", "Succeeded")));
        assert_eq!(seen(&c, "runs"), Some(t), "an update keeps it");
        c.fold_pod(Event::Init);
        c.fold_pod(Event::InitApply(with_phase("runs", "u2", "Succeeded")));
        c.fold_pod(Event::InitApply(with_phase("listed-final", "u1", "Failed")));
        c.fold_pod(Event::InitDone);
        assert_eq!(seen(&c, "runs"), Some(t), "a relist keeps it");
        assert_eq!(seen(&c, "listed-final"), None, "still unknown");

        c.fold_pod(Event::Apply(with_phase("runs", "u3", "Succeeded")));
        assert!(
            seen(&c, "runs").is_some_and(|t3| t3 > t),
            "a new pod under the same name starts again"
        );
        c.fold_pod(Event::Apply(with_phase("born-final", "u4", "Failed")));
        assert!(
            seen(&c, "born-final").is_some(),
            "appeared final while watched"
        );
    }

    #[test]
    fn only_namespaces_with_a_policy_are_kept() {
        let mut c = Caches::default();
        c.fold_namespace(Event::Init);
        c.fold_namespace(Event::InitApply(ns("plain", serde_json::json!({"x": "y"}))));
        c.fold_namespace(Event::InitApply(ns(
            "ci",
            serde_json::json!({TTL_ANNOTATION: "1h", "x": "y"}),
        )));
        c.fold_namespace(Event::InitDone);
        let snap = c.snapshot();
        assert_eq!(snap.namespaces.len(), 1, "{:?}", snap.namespaces);
        assert_eq!(snap.namespaces["ci"].ttl.as_deref(), Some("1h"));
        assert_eq!(snap.namespaces["ci"].threshold, None);
        // The annotation is removed: the namespace leaves the store.
        c.fold_namespace(Event::Apply(ns("ci", serde_json::json!({}))));
        assert!(c.snapshot().namespaces.is_empty());
        c.fold_namespace(Event::Apply(ns(
            "plain",
            serde_json::json!({THRESHOLD_ANNOTATION: "5"}),
        )));
        assert_eq!(
            c.snapshot().namespaces["plain"].threshold.as_deref(),
            Some("5")
        );
        c.fold_namespace(Event::Delete(ns("plain", serde_json::json!({}))));
        assert!(c.snapshot().namespaces.is_empty());
    }
}
