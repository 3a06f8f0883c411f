//! What the worker watches: this node's pods, the SysctlPolicies and this Node's labels and
//! kubelet version.
//!
//! Each goes into a `plumbing::watch::cache::Store`; the watches yield the changes the worker
//! reacts to.
//!
//! Lists are served from the apiserver's watch cache (resourceVersion=0, `any_semantic`): with a
//! field selector, a paginated quorum list would page through every pod and node in the cluster
//! from etcd, on every node, at start and after every watch desync.

use std::collections::BTreeMap;

use futures::{Stream, StreamExt};
use groundskeeper_plumbing::ObjectKey;
use groundskeeper_plumbing::{
    Readiness, ReadyFlag,
    watch::cache::{Health, Projected, Shared, Store, Watches},
};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::runtime::watcher::{self, Event};

use super::crd::SysctlPolicy;

/// Readiness flags are `sysctl/pods`, `sysctl/sysctlpolicies`, `sysctl/nodes`.
pub const COMPONENT: &str = "sysctl";

/// Node labels.
pub type Labels = BTreeMap<String, String>;

/// All the worker reads of its Node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeFacts {
    pub labels: Labels,
    /// `status.nodeInfo.kubeletVersion`; None: not reported (judged as v1.36).
    pub kubelet: Option<String>,
}

impl NodeFacts {
    pub fn of(node: Node) -> Self {
        NodeFacts {
            kubelet: node
                .status
                .and_then(|s| s.node_info)
                .map(|i| i.kubelet_version)
                .filter(|k| !k.is_empty()),
            labels: node.metadata.labels.unwrap_or_default(),
        }
    }
}

/// The three watched kinds. The node store holds at most this agent's own Node.
#[derive(Default)]
pub struct ReportCache {
    pub pods: Store<ObjectKey, Pod>,
    pub policies: Store<String, SysctlPolicy>,
    pub nodes: Store<String, NodeFacts>,
}

/// What a watch event means to the worker, once the cache has applied it.
#[derive(Debug)]
pub enum Change {
    /// Nothing to react to (a list starting, or a Node list item).
    None,
    /// A pod was listed, added or updated: judge this version of it.
    Pod(Box<Pod>),
    /// A pod was deleted: forget what was done for this UID.
    PodGone(String),
    /// The pods were (re)listed: what disappeared while the watch was down is gone.
    PodsListed,
    /// A policy was listed, added or updated: its status may be due.
    Policy(Box<SysctlPolicy>),
    /// The policies or the Node changed (deleted, relisted, relabelled, kubelet upgraded): the
    /// node's policy must be merged again.
    Merge,
}

/// The flags of the three watches; what they say is asked through [`Health`].
#[derive(Clone)]
pub struct Flags {
    pub pods: ReadyFlag,
    pub policies: ReadyFlag,
    pub node: ReadyFlag,
}

impl Flags {
    /// All three: every watch has listed once only when the node's policy is known.
    pub fn health(&self) -> Health {
        Health::new([self.pods.clone(), self.policies.clone(), self.node.clone()])
    }

    /// The policy watch alone: its objects may be merged once it has listed.
    pub fn policies(&self) -> Health {
        Health::new([self.policies.clone()])
    }
}

/// The three watches feeding `cache`, with their flags and their changes in one stream.
pub fn follow_all(
    readiness: &Readiness,
    client: &kube::Client,
    node: &str,
    cache: &Shared<ReportCache>,
) -> (Flags, impl Stream<Item = Change> + Send + 'static) {
    let config = || watcher::Config::default().any_semantic();
    let watches = Watches::new(readiness, COMPONENT, client, cache);
    let on_node = |field: &str| config().fields(&format!("{field}={node}"));
    let (pods_flag, pods) = watches.follow::<Pod, _, _>(on_node("spec.nodeName"), fold_pod);
    let (policies_flag, policies) = watches.follow::<SysctlPolicy, _, _>(config(), fold_policy);
    let (node_flag, nodes) = watches.follow::<Node, _, _>(on_node("metadata.name"), fold_node);
    let changes = futures::stream::select(
        pods.boxed(),
        futures::stream::select(policies.boxed(), nodes.boxed()),
    );
    let flags = Flags {
        pods: pods_flag,
        policies: policies_flag,
        node: node_flag,
    };
    (flags, changes)
}

fn pod_kept(p: Pod) -> Projected<ObjectKey, Pod> {
    match p.metadata.name {
        Some(_) => Projected::Yes(ObjectKey::of(&p), p),
        None => Projected::Unusable,
    }
}

/// Kept under its name; an object without one can not be.
fn by_name<V>(name: Option<String>, v: V) -> Projected<String, V> {
    match name {
        Some(name) => Projected::Yes(name, v),
        None => Projected::Unusable,
    }
}

fn fold_pod(cache: &mut ReportCache, ev: Event<Pod>) -> Change {
    let change = match &ev {
        Event::Init => Change::None,
        Event::InitApply(p) | Event::Apply(p) => Change::Pod(Box::new(p.clone())),
        Event::Delete(p) => Change::PodGone(p.uid().unwrap_or_default()),
        Event::InitDone => Change::PodsListed,
    };
    cache.pods.apply_event(ev, pod_kept);
    change
}

fn fold_policy(cache: &mut ReportCache, ev: Event<SysctlPolicy>) -> Change {
    let change = match &ev {
        Event::Init => Change::None,
        Event::InitApply(p) | Event::Apply(p) => Change::Policy(Box::new(p.clone())),
        Event::Delete(_) | Event::InitDone => Change::Merge,
    };
    cache
        .policies
        .apply_event(ev, |p: SysctlPolicy| by_name(p.metadata.name.clone(), p));
    change
}

fn fold_node(cache: &mut ReportCache, ev: Event<Node>) -> Change {
    let change = match &ev {
        Event::Init | Event::InitApply(_) => Change::None,
        Event::Apply(_) | Event::Delete(_) | Event::InitDone => Change::Merge,
    };
    cache.nodes.apply_event(ev, |n: Node| {
        by_name(n.metadata.name.clone(), NodeFacts::of(n))
    });
    change
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The agent keeps the labels and the kubelet version of its Node, nothing else; an empty
    /// version is none reported.
    #[test]
    fn node_view_keeps_labels_and_kubelet_version() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n", "labels": {"pool": "db"}},
            "status": {"nodeInfo": {"kubeletVersion": "v1.37.0-eks-4d1a2b", "kernelVersion": "6.1",
              "machineID": "", "systemUUID": "", "bootID": "", "osImage": "",
              "containerRuntimeVersion": "", "kubeProxyVersion": "", "operatingSystem": "linux",
              "architecture": "amd64"}},
        }))
        .unwrap();
        let facts = NodeFacts::of(node.clone());
        assert_eq!(facts.labels["pool"], "db");
        assert_eq!(facts.kubelet.as_deref(), Some("v1.37.0-eks-4d1a2b"));
        let mut unreported = node;
        unreported
            .status
            .as_mut()
            .and_then(|s| s.node_info.as_mut())
            .unwrap()
            .kubelet_version = String::new();
        assert_eq!(NodeFacts::of(unreported).kubelet, None);
        assert_eq!(NodeFacts::of(Node::default()), NodeFacts::default());
    }
}
