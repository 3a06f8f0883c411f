//! The sysctl wing's one set of watches: Nodes, SysctlPolicies and the pods not yet bound,
//! watched once per process and read by the webhook (every replica) and the placement (the
//! leader) alike, as client-go's informer factory shares one informer per kind.
//!
//! Flags `sysctl/<kind>`. Pods are watched with `spec.nodeName=` (the watch carries nothing of
//! bound pods; the apiserver has no field selector for scheduling gates). One projection covers
//! both readers: every pod not yet bound as the webhook judges a binding of it ([`PodFacts`]),
//! and of those the ones carrying the gate as the placement reads them ([`GatedPod`]); each
//! SysctlPolicy as the rules read it (its name, generation and spec; not its status, which the
//! node-agents write); each Node's [`NodeFacts`].
//!
//! What changed reaches every reader that asks ([`Watched::changes`]) once the cache has
//! applied it. A Node's heartbeat changes nothing the rules read, so only a change of its facts
//! (or of a policy's spec) re-evaluates every gated pod; a gated pod is evaluated when it
//! appears or changes.

use std::future::Future;

use futures::{Stream, StreamExt};
use groundskeeper_plumbing::ObjectKey;
use groundskeeper_plumbing::{
    Readiness, ReadyFlag,
    watch::cache::{Applied, Health, Projected, Shared, Store, Update, Watches},
};
use groundskeeper_sysctl_rules::crd::SysctlPolicy;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::watcher::{self, Event};
use tokio::sync::broadcast::{self, error::RecvError};
use tokio_util::sync::CancellationToken;

use super::facts::{GatedPod, NodeFacts, PodFacts};

/// Readiness flags are `sysctl/<kind>`: the wing's, not one component's.
pub const COMPONENT: &str = "sysctl";
/// How many changes a reader may fall behind before it is told [`Change::All`] instead.
const BACKLOG: usize = 4096;

#[derive(Default)]
pub struct SysctlCache {
    pub nodes: Store<String, NodeFacts>,
    pub policies: Store<String, SysctlPolicy>,
    /// Every pod not yet bound: what the webhook judges a binding by.
    pub pending: Store<ObjectKey, PodFacts>,
    /// The pending pods that carry the gate: what the placement places.
    pub gated: Store<ObjectKey, GatedPod>,
}

/// What to evaluate after an event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    None,
    /// This gated pod appeared or changed.
    Pod(ObjectKey),
    /// What every gated pod is judged on changed.
    All,
}

/// The watches of a process, shared: each reader holds a clone.
#[derive(Clone)]
pub struct Watched {
    pub cache: Shared<SysctlCache>,
    /// The three watches' flags: what a reader acting on the cache asks.
    pub health: Health,
    flags: Vec<ReadyFlag>,
    changes: broadcast::Sender<Change>,
}

impl Watched {
    /// Registers the watches (their flags now) and returns them with the task that drives
    /// them until `token` is cancelled: each event folded into the cache, then handed to the
    /// readers. Built once per process, where a reader runs; until the task runs, nothing lists.
    pub fn new(
        readiness: &Readiness,
        client: &kube::Client,
        token: CancellationToken,
    ) -> (
        Self,
        impl Future<Output = anyhow::Result<()>> + Send + 'static,
    ) {
        let cache = Shared::<SysctlCache>::default();
        let (flags, events) = follow_all(readiness, client, &cache);
        let (changes, _) = broadcast::channel(BACKLOG);
        let watched = Self {
            cache,
            health: Health::new(flags.clone()),
            flags,
            changes: changes.clone(),
        };
        let run = async move {
            let mut events = std::pin::pin!(events);
            loop {
                tokio::select! {
                    _ = token.cancelled() => break,
                    Some(change) = events.next() => {
                        // No reader listening (the webhook alone) is no error.
                        let _ = changes.send(change);
                    }
                }
            }
            Ok(())
        };
        (watched, run)
    }

    /// The health of a reader that also acts on watches of its own: these three, then `own`.
    pub fn health_with(&self, own: impl IntoIterator<Item = ReadyFlag>) -> Health {
        Health::new(self.flags.iter().cloned().chain(own))
    }

    /// Every change from now on, each once the cache has applied it: first [`Change::All`] for
    /// what the cache holds already, and `All` again for whatever a reader fell too far behind
    /// to be told one by one.
    pub fn changes(&self) -> impl Stream<Item = Change> + Send + 'static + use<> {
        let later = futures::stream::unfold(self.changes.subscribe(), |mut rx| async move {
            match rx.recv().await {
                Ok(change) => Some((change, rx)),
                Err(RecvError::Lagged(_)) => Some((Change::All, rx)),
                Err(RecvError::Closed) => None,
            }
        });
        futures::stream::once(std::future::ready(Change::All)).chain(later)
    }
}

/// The watches feeding `cache`, with their flags and their changes in one stream.
fn follow_all(
    readiness: &Readiness,
    client: &kube::Client,
    cache: &Shared<SysctlCache>,
) -> (
    Vec<ReadyFlag>,
    impl Stream<Item = Change> + Send + 'static + use<>,
) {
    let from_watch_cache = || watcher::Config::default().any_semantic();
    let watches = Watches::new(readiness, COMPONENT, client, cache);
    let (nodes_flag, nodes) = watches.follow::<Node, _, _>(from_watch_cache(), fold_node);
    let (policies_flag, policies) =
        watches.follow::<SysctlPolicy, _, _>(from_watch_cache(), fold_policy);
    let (pods_flag, pods) =
        watches.follow::<Pod, _, _>(from_watch_cache().fields("spec.nodeName="), fold_pod);
    let changes = futures::stream::select_all([nodes.boxed(), policies.boxed(), pods.boxed()]);
    (vec![nodes_flag, policies_flag, pods_flag], changes)
}

/// `All` when the store's content changed (`same` says whether the value now at the key is
/// what it replaced), else nothing (a heartbeat, an unchanged relist).
fn changed<K, V>(applied: Applied<K, V>, same: impl FnOnce(&K, &V) -> bool) -> Change {
    match applied {
        Applied::Nothing => Change::None,
        Applied::Upserted {
            key,
            old: Some(old),
        } if same(&key, &old) => Change::None,
        Applied::Upserted { .. } | Applied::Removed { .. } | Applied::Relisted { .. } => {
            Change::All
        }
    }
}

pub fn fold_node(cache: &mut SysctlCache, ev: Event<Node>) -> Change {
    let applied = cache
        .nodes
        .apply_event(ev, |n: Node| match n.metadata.name.clone() {
            Some(name) => Projected::Yes(name, NodeFacts::of(&n)),
            None => Projected::Unusable,
        });
    let nodes = &cache.nodes;
    changed(applied, |k, old| nodes.get(k) == Some(old))
}

pub fn fold_policy(cache: &mut SysctlCache, ev: Event<SysctlPolicy>) -> Change {
    let applied = cache
        .policies
        .apply_event(ev, |p: SysctlPolicy| match p.metadata.name.clone() {
            Some(name) => {
                let mut kept = SysctlPolicy::new(&name, p.spec);
                kept.metadata.generation = p.metadata.generation;
                Projected::Yes(name, kept)
            }
            None => Projected::Unusable,
        });
    let policies = &cache.policies;
    changed(applied, |k, old| {
        policies.get(k).is_some_and(|p| p.spec == old.spec)
    })
}

/// One pod event into both stores: every pending pod's facts, and the gated pods (a pod that
/// loses the gate, or is being deleted, leaves them as on a delete).
pub fn fold_pod(cache: &mut SysctlCache, ev: Event<Pod>) -> Change {
    let update = Update::from_event(ev, |p: Pod| {
        match (p.metadata.namespace.clone(), p.metadata.name.clone()) {
            (Some(ns), Some(name)) => {
                let facts = PodFacts::of(&p);
                let gated = GatedPod::of(&p, &facts);
                Projected::Yes(ObjectKey::new(&ns, &name), (facts, gated))
            }
            _ => Projected::Unusable,
        }
    });
    let Some(update) = update else {
        return Change::None;
    };
    let (pending, gated) = split(update);
    cache.pending.apply(pending);
    match gated.map(|u| cache.gated.apply(u)) {
        Some(Applied::Upserted { key, .. }) => Change::Pod(key),
        Some(Applied::Relisted { .. }) => Change::All,
        Some(Applied::Nothing | Applied::Removed { .. }) | None => Change::None,
    }
}

/// A pod's update as each store takes it: the facts always, the gated pod only while it carries
/// the gate (none for a listed pod without it; a delete for a pod that lost it).
type Both = (PodFacts, Option<GatedPod>);

fn split(
    u: Update<ObjectKey, Both>,
) -> (
    Update<ObjectKey, PodFacts>,
    Option<Update<ObjectKey, GatedPod>>,
) {
    match u {
        Update::Init => (Update::Init, Some(Update::Init)),
        Update::InitDone => (Update::InitDone, Some(Update::InitDone)),
        Update::InitApply(k, (facts, gated)) => (
            Update::InitApply(k.clone(), facts),
            gated.map(|g| Update::InitApply(k, g)),
        ),
        Update::Apply(k, (facts, gated)) => (
            Update::Apply(k.clone(), facts),
            Some(match gated {
                Some(g) => Update::Apply(k, g),
                None => Update::Delete(k),
            }),
        ),
        Update::Delete(k) => (Update::Delete(k.clone()), Some(Update::Delete(k))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sysctl::facts::GATE;
    use serde_json::json;

    fn pod(gates: serde_json::Value, extra: serde_json::Value) -> Pod {
        let mut p = json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u", "resourceVersion": "7"},
            "spec": {"containers": [], "schedulingGates": gates,
                     "securityContext": {"sysctls": [{"name": "net.core.somaxconn", "value": "1"}]}},
        });
        for (k, v) in extra.as_object().unwrap() {
            p[k] = v.clone();
        }
        serde_json::from_value(p).unwrap()
    }

    /// A heartbeat re-evaluates nothing; a change of what the rules read re-evaluates all; a
    /// pod losing the gate leaves the cache.
    #[test]
    fn only_changes_the_rules_read_wake_every_pod() {
        let mut c = SysctlCache::default();
        let node = |kernel: &str, heartbeat: &str| -> Node {
            serde_json::from_value(json!({
                "metadata": {"name": "n1", "labels": {"pool": "db"}, "annotations": {"beat": heartbeat}},
                "status": {"nodeInfo": {"kernelVersion": kernel, "machineID": "", "systemUUID": "",
                  "bootID": "", "osImage": "", "containerRuntimeVersion": "", "kubeletVersion": "v1.36.2",
                  "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"}},
            }))
            .unwrap()
        };
        assert_eq!(fold_node(&mut c, Event::Init), Change::None);
        assert_eq!(
            fold_node(&mut c, Event::InitApply(node("6.1", "1"))),
            Change::None
        );
        assert_eq!(fold_node(&mut c, Event::InitDone), Change::All);
        assert_eq!(
            fold_node(&mut c, Event::Apply(node("6.1", "2"))),
            Change::None
        );
        assert_eq!(
            fold_node(&mut c, Event::Apply(node("6.2", "3"))),
            Change::All
        );
        assert_eq!(
            fold_node(&mut c, Event::Delete(node("6.2", "3"))),
            Change::All
        );

        fold_pod(&mut c, Event::Init);
        fold_pod(&mut c, Event::InitDone);
        let gated = pod(json!([{"name": GATE}]), json!({}));
        assert_eq!(
            fold_pod(&mut c, Event::Apply(gated)),
            Change::Pod(ObjectKey::new("ns", "p"))
        );
        assert_eq!(c.gated.len(), 1);
        assert_eq!(
            fold_pod(&mut c, Event::Apply(pod(json!([]), json!({})))),
            Change::None
        );
        assert!(c.gated.is_empty(), "ungated: no longer ours");
    }

    /// One pod watch fills both readers' stores: every pending pod's facts for the webhook, the
    /// gated ones for the placement; a pod that loses the gate stays pending, a deleted one
    /// leaves both.
    #[test]
    fn one_pod_watch_fills_the_pending_and_the_gated_pods() {
        let mut c = SysctlCache::default();
        let key = |n: &str| ObjectKey::new("ns", n);
        let named = |name: &str, gates: serde_json::Value| {
            let mut p = pod(gates, json!({}));
            p.metadata.name = Some(name.into());
            p
        };
        fold_pod(&mut c, Event::Init);
        fold_pod(
            &mut c,
            Event::InitApply(named("g", json!([{"name": GATE}]))),
        );
        fold_pod(&mut c, Event::InitApply(named("plain", json!([]))));
        assert!(c.pending.is_empty(), "a relist is swapped in whole");
        assert_eq!(fold_pod(&mut c, Event::InitDone), Change::All);
        assert_eq!(c.pending.len(), 2);
        assert_eq!(c.gated.keys().collect::<Vec<_>>(), [&key("g")]);
        assert_eq!(
            c.pending.get(&key("g")),
            Some(&c.gated.get(&key("g")).unwrap().facts)
        );

        assert_eq!(
            fold_pod(&mut c, Event::Apply(named("plain", json!([])))),
            Change::None,
            "a pending pod without the gate is not the placement's"
        );
        assert_eq!(
            fold_pod(&mut c, Event::Apply(named("g", json!([])))),
            Change::None
        );
        assert!(c.gated.is_empty(), "ungated: placed");
        assert!(c.pending.contains(&key("g")), "still pending until bound");
        fold_pod(&mut c, Event::Delete(named("g", json!([]))));
        assert!(!c.pending.contains(&key("g")));
    }

    /// A policy is kept as the rules read it: its status (the node-agents' writes) neither
    /// stays nor wakes a gated pod; a change of its spec wakes every one.
    #[test]
    fn only_a_policys_spec_wakes_the_gated_pods() {
        let mut c = SysctlCache::default();
        let policy = |mode: &str, status: serde_json::Value| -> SysctlPolicy {
            serde_json::from_value(json!({
                "apiVersion": "groundskeeper.dev/v1alpha1", "kind": "SysctlPolicy",
                "metadata": {"name": "db", "generation": 2, "resourceVersion": "9",
                             "labels": {"team": "a"}},
                "spec": {"mode": mode, "allowedUnsafeSysctls": ["net.core.somaxconn"]},
                "status": status,
            }))
            .unwrap()
        };
        fold_policy(&mut c, Event::Init);
        fold_policy(&mut c, Event::InitApply(policy("Enforce", json!(null))));
        assert_eq!(fold_policy(&mut c, Event::InitDone), Change::All);
        let kept = c.policies.get(&"db".to_string()).unwrap();
        assert_eq!(kept.metadata.generation, Some(2));
        assert_eq!(kept.metadata.labels, None);
        assert_eq!(kept.metadata.resource_version, None);
        let status = json!({"conditions": [{"type": "Valid", "status": "True", "reason": "Valid",
            "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
        assert_eq!(
            fold_policy(&mut c, Event::Apply(policy("Enforce", status))),
            Change::None
        );
        assert!(c.policies.get(&"db".to_string()).unwrap().status.is_none());
        assert_eq!(
            fold_policy(&mut c, Event::Apply(policy("Audit", json!(null)))),
            Change::All
        );
    }

    /// One set of watches, its flags named for the wing; every reader hears each change once
    /// the cache has it, first `All` for what the cache already holds, and `All` for what it
    /// fell too far behind to hear.
    #[tokio::test]
    async fn one_set_of_watches_its_readers_hear_every_change() {
        let mock = testkit::api::Mock::answering(&[]);
        let readiness = Readiness::default();
        let (watched, _run) = Watched::new(&readiness, &mock.client(), CancellationToken::new());
        assert_eq!(
            readiness.pending(),
            ["sysctl/nodes", "sysctl/sysctlpolicies", "sysctl/pods"]
        );
        let tls = readiness.register("sysctlwebhook/secrets");
        assert_eq!(
            format!("{:?}", watched.health_with([tls])),
            r#"["sysctl/nodes", "sysctl/sysctlpolicies", "sysctl/pods", "sysctlwebhook/secrets"]"#
        );
        let mut changes = Box::pin(watched.changes());
        let key = ObjectKey::new("ns", "p");
        watched.changes.send(Change::Pod(key.clone())).unwrap();
        assert_eq!(changes.next().await, Some(Change::All));
        assert_eq!(changes.next().await, Some(Change::Pod(key)));
        for _ in 0..=BACKLOG {
            watched.changes.send(Change::None).unwrap();
        }
        assert_eq!(changes.next().await, Some(Change::All), "fell behind");
        assert_eq!(changes.next().await, Some(Change::None));
        assert!(
            mock.calls().is_empty(),
            "nothing lists before the task runs"
        );
    }
}
