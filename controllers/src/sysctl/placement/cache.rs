//! What the placement watches: pods not yet bound that carry the sysctl gate, Nodes (as the
//! webhook reads them) and SysctlPolicies.
//!
//! Flags `sysctlplacement/<kind>`. Pods are watched with `spec.nodeName=` (the apiserver has no
//! field selector for scheduling gates), and only the gated ones are kept. A Node's heartbeat
//! changes nothing the rules read, so only a change of its [`NodeFacts`] (or a policy's spec)
//! re-evaluates every gated pod; a pod is evaluated when it appears or changes.

use futures::{Stream, StreamExt};
use groundskeeper_plumbing::{
    Readiness,
    cache::{Applied, Health, Kept, Shared, Store, Watches},
};
use groundskeeper_sysctl_rules::crd::{SysctlPolicy, SysctlPolicySpec};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::watcher::{self, Event};

use super::CONDITION;
use super::decide::Constraints;
use crate::sysctl::webhook::decide::{NodeFacts, PodView};
use crate::sysctl::webhook::gate::GATE;

/// Readiness flags are `sysctlplacement/<kind>`.
pub const COMPONENT: &str = "sysctlplacement";

/// A pod by namespace and name.
pub type PodKey = (String, String);

/// What the placement reads of a gated pod.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct GatedPod {
    pub uid: String,
    /// The precondition of the placement's write: a pod changed since is read again.
    pub resource_version: String,
    pub view: PodView,
    /// The names of the sysctls it sets, for messages.
    pub sysctls: Vec<String>,
    /// Its nodeSelector and required node affinity.
    pub own: Constraints,
    /// Every scheduling gate, ours included, in order.
    pub gates: Vec<String>,
    /// The message of the pod's placement condition, when it has one saying it is held.
    pub held: Option<String>,
    /// When the pod was created (Unix seconds; 0 when it does not say): how long it has waited.
    pub created: i64,
}

impl GatedPod {
    /// The pod's view, or None when it does not carry the gate (or is being deleted).
    pub fn of(pod: &Pod) -> Option<Self> {
        let spec = pod.spec.as_ref()?;
        let gates: Vec<String> = spec
            .scheduling_gates
            .iter()
            .flatten()
            .map(|g| g.name.clone())
            .collect();
        if !gates.iter().any(|g| g == GATE) || pod.metadata.deletion_timestamp.is_some() {
            return None;
        }
        let held = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| {
                cs.iter()
                    .find(|c| c.type_ == CONDITION && c.status == "False")
            })
            .map(|c| c.message.clone().unwrap_or_default());
        Some(GatedPod {
            created: pod
                .metadata
                .creation_timestamp
                .as_ref()
                .map_or(0, |t| t.0.as_second()),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            resource_version: pod.metadata.resource_version.clone().unwrap_or_default(),
            view: PodView::of(pod),
            sysctls: spec
                .security_context
                .as_ref()
                .and_then(|s| s.sysctls.as_ref())
                .map(|s| s.iter().map(|s| s.name.clone()).collect())
                .unwrap_or_default(),
            own: Constraints {
                node_selector: spec.node_selector.clone().unwrap_or_default(),
                required: spec
                    .affinity
                    .as_ref()
                    .and_then(|a| a.node_affinity.as_ref())
                    .and_then(|n| {
                        n.required_during_scheduling_ignored_during_execution
                            .clone()
                    }),
            },
            gates,
            held,
        })
    }
}

#[derive(Default)]
pub struct Cache {
    pub nodes: Store<String, NodeFacts>,
    pub policies: Store<String, SysctlPolicySpec>,
    pub gated: Store<PodKey, GatedPod>,
}

/// What to evaluate after an event.
#[derive(Debug, PartialEq, Eq)]
pub enum Change {
    None,
    /// This pod appeared or changed.
    Pod(PodKey),
    /// What every gated pod is judged on changed.
    All,
}

/// The watches feeding `cache`, with their flags and their changes in one stream.
pub fn follow_all(
    readiness: &Readiness,
    client: &kube::Client,
    cache: &Shared<Cache>,
) -> (Health, impl Stream<Item = Change> + Send + 'static) {
    let from_watch_cache = || watcher::Config::default().any_semantic();
    let watches = Watches::new(readiness, COMPONENT, client, cache);
    let (nodes_flag, nodes) = watches.follow::<Node, _, _>(from_watch_cache(), fold_node);
    let (policies_flag, policies) =
        watches.follow::<SysctlPolicy, _, _>(from_watch_cache(), fold_policy);
    let (pods_flag, pods) =
        watches.follow::<Pod, _, _>(from_watch_cache().fields("spec.nodeName="), fold_pod);
    let changes = futures::stream::select_all([nodes.boxed(), policies.boxed(), pods.boxed()]);
    (
        Health::new(vec![nodes_flag, policies_flag, pods_flag]),
        changes,
    )
}

/// `All` when the store's content changed, else nothing (a heartbeat, an unchanged relist).
fn changed<K, V: PartialEq>(applied: Applied<K, V>, now: impl FnOnce(&K) -> Option<V>) -> Change {
    match applied {
        Applied::Nothing => Change::None,
        Applied::Upserted { key, old } => {
            if old.is_some() && old == now(&key) {
                Change::None
            } else {
                Change::All
            }
        }
        Applied::Removed { .. } | Applied::Relisted { .. } => Change::All,
    }
}

pub fn fold_node(cache: &mut Cache, ev: Event<Node>) -> Change {
    let applied = cache
        .nodes
        .apply_event(ev, |n: Node| match n.metadata.name.clone() {
            Some(name) => Kept::Yes(name, NodeFacts::of(&n)),
            None => Kept::Unusable,
        });
    let nodes = &cache.nodes;
    changed(applied, |k| nodes.get(k).cloned())
}

pub fn fold_policy(cache: &mut Cache, ev: Event<SysctlPolicy>) -> Change {
    let applied = cache
        .policies
        .apply_event(ev, |p: SysctlPolicy| match p.metadata.name.clone() {
            Some(name) => Kept::Yes(name, p.spec),
            None => Kept::Unusable,
        });
    let policies = &cache.policies;
    changed(applied, |k| policies.get(k).cloned())
}

pub fn fold_pod(cache: &mut Cache, ev: Event<Pod>) -> Change {
    let applied = cache.gated.apply_event(ev, |p: Pod| {
        match (p.metadata.namespace.clone(), p.metadata.name.clone()) {
            (Some(ns), Some(name)) => match GatedPod::of(&p) {
                Some(g) => Kept::Yes((ns, name), g),
                None => Kept::No((ns, name)),
            },
            _ => Kept::Unusable,
        }
    });
    match applied {
        Applied::Upserted { key, .. } => Change::Pod(key),
        Applied::Relisted { .. } => Change::All,
        Applied::Nothing | Applied::Removed { .. } => Change::None,
    }
}

/// The SysctlPolicies as the rules take them (the spec and the name).
pub fn policies(cache: &Cache) -> Vec<SysctlPolicy> {
    cache
        .policies
        .iter()
        .map(|(name, spec)| SysctlPolicy::new(name, spec.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
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

    #[test]
    fn only_pods_carrying_the_gate_are_kept() {
        let ours = pod(json!([{"name": "x/y"}, {"name": GATE}]), json!({}));
        let g = GatedPod::of(&ours).unwrap();
        assert_eq!(g.gates, ["x/y", GATE]);
        assert_eq!(g.sysctls, ["net.core.somaxconn"]);
        assert_eq!((g.uid.as_str(), g.resource_version.as_str()), ("u", "7"));
        assert_eq!(g.held, None);
        assert!(GatedPod::of(&pod(json!([{"name": "x/y"}]), json!({}))).is_none());
        assert!(GatedPod::of(&pod(json!([]), json!({}))).is_none());
        let deleting = pod(
            json!([{"name": GATE}]),
            json!({"metadata": {"name": "p", "namespace": "ns", "deletionTimestamp": "2026-01-01T00:00:00Z"}}),
        );
        assert!(
            GatedPod::of(&deleting).is_none(),
            "a pod being deleted is left alone"
        );
        let held = pod(
            json!([{"name": GATE}]),
            json!({"status": {"conditions": [{"type": CONDITION, "status": "False", "message": "m"}]}}),
        );
        assert_eq!(GatedPod::of(&held).unwrap().held.as_deref(), Some("m"));
    }

    /// A heartbeat re-evaluates nothing; a change of what the rules read re-evaluates all; a
    /// pod losing the gate leaves the cache.
    #[test]
    fn only_changes_the_rules_read_wake_every_pod() {
        let mut c = Cache::default();
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
            Change::Pod(("ns".into(), "p".into()))
        );
        assert_eq!(c.gated.len(), 1);
        assert_eq!(
            fold_pod(&mut c, Event::Apply(pod(json!([]), json!({})))),
            Change::None
        );
        assert!(c.gated.is_empty(), "ungated: no longer ours");
    }
}
