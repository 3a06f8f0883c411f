//! What the sysctl wing keeps of the objects it watches and judges by: a node's facts, a pod's
//! facts, a gated pod as the placement reads it; and the names both sides of the gate share
//! (the scheduling gate, the placement's pod condition).
//!
//! Plain values and the projections that make them, below both the decisions that judge them
//! (`webhook/decide.rs`, `placement/decide.rs`) and the cache that keeps them (`cache.rs`).

use std::collections::BTreeMap;
use std::sync::Arc;

use groundskeeper_sysctl_rules::allowlist::PodSysctls;
use k8s_openapi::api::core::v1::{Node, NodeSelector, Pod};

/// The scheduling gate the webhook adds and the placement removes
/// (`spec.schedulingGates[].name`).
pub const GATE: &str = "groundskeeper.dev/sysctl";
/// The pod condition the placement sets (`False`: no node admits the pod's sysctls).
pub const CONDITION: &str = "groundskeeper.dev/SysctlPlacement";

/// The annotation kubelet puts on the API copy of a static pod.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// Set by kubelet from its GOOS, as `status.nodeInfo.operatingSystem`.
const OS_LABEL: &str = "kubernetes.io/os";

/// What the webhook reads of a pod (every pod not yet bound).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct PodFacts {
    pub uid: String,
    /// The names of its sysctls and its host namespaces, what the rules read (the rest of the
    /// spec is dropped); None when the pod sets no sysctl. Shared: a gated pod's facts are the
    /// same allocation in both of the cache's stores.
    pub sysctls: Option<Arc<PodSysctls>>,
    /// A static pod's mirror: kubelet runs the static pod from its manifest whatever the API
    /// says, so refusing the mirror would only hide a running pod.
    pub mirror: bool,
}

impl PodFacts {
    pub fn of(pod: &Pod) -> Self {
        PodFacts {
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            sysctls: pod.spec.as_ref().and_then(PodSysctls::of).map(Arc::new),
            mirror: pod
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION)),
        }
    }
}

/// What the webhook and the placement read of a node.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct NodeFacts {
    pub labels: BTreeMap<String, String>,
    /// `status.nodeInfo.kernelVersion`, as kubelet reports it (`uname -r`).
    pub kernel: Option<String>,
    /// `status.nodeInfo.operatingSystem`, else the `kubernetes.io/os` label; None: neither.
    pub os: Option<String>,
    /// `status.nodeInfo.kubeletVersion` (`v1.37.0`, `v1.36.2-eks-…`); None: not reported, and
    /// the node is judged as a v1.36 kubelet.
    pub kubelet: Option<String>,
}

impl NodeFacts {
    /// Linux, or not said: kubelet's safe list is Linux's alone (`SafeSysctlAllowlist` is nil
    /// on other systems), so a node that says it runs another allows no sysctl as safe.
    pub fn linux(&self) -> bool {
        self.os.as_deref().is_none_or(|os| os == "linux")
    }

    pub fn of(node: &Node) -> Self {
        let info = node.status.as_ref().and_then(|s| s.node_info.as_ref());
        let labels = node.metadata.labels.clone().unwrap_or_default();
        let os = info
            .map(|i| i.operating_system.clone())
            .filter(|os| !os.is_empty())
            .or_else(|| labels.get(OS_LABEL).cloned());
        NodeFacts {
            labels,
            kernel: info
                .map(|i| i.kernel_version.clone())
                .filter(|k| !k.is_empty()),
            os,
            kubelet: info
                .map(|i| i.kubelet_version.clone())
                .filter(|k| !k.is_empty()),
        }
    }
}

/// What the placement reads of a gated pod's own node constraints.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Constraints {
    /// `spec.nodeSelector`, as pairs (a pod's few; a map's node would be half a kilobyte).
    pub node_selector: Vec<(String, String)>,
    /// `spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution`.
    pub required: Option<NodeSelector>,
}

impl Constraints {
    /// What `spec` confines its pod to.
    pub fn of(spec: &k8s_openapi::api::core::v1::PodSpec) -> Self {
        Constraints {
            node_selector: spec
                .node_selector
                .iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            required: spec
                .affinity
                .as_ref()
                .and_then(|a| a.node_affinity.as_ref())
                .and_then(|n| {
                    n.required_during_scheduling_ignored_during_execution
                        .clone()
                }),
        }
    }
}

/// What the placement reads of a gated pod.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct GatedPod {
    pub uid: String,
    /// The precondition of the placement's write: a pod changed since is read again.
    pub resource_version: String,
    pub facts: PodFacts,
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
    /// The names of the sysctls it sets, in pod order, for messages.
    pub fn sysctl_names(&self) -> &[String] {
        self.facts.sysctls.as_deref().map_or(&[], |s| &s.names)
    }

    /// The gated pod's facts, or None when it does not carry the gate (or is being deleted);
    /// `facts` are `PodFacts::of(pod)`, shared with the pending store.
    pub fn of(pod: &Pod, facts: &PodFacts) -> Option<Self> {
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
            facts: facts.clone(),
            own: Constraints::of(spec),
            gates,
            held,
        })
    }
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

    fn gated(pod: &Pod) -> Option<GatedPod> {
        GatedPod::of(pod, &PodFacts::of(pod))
    }

    #[test]
    fn only_pods_carrying_the_gate_are_kept() {
        let ours = pod(json!([{"name": "x/y"}, {"name": GATE}]), json!({}));
        let g = gated(&ours).unwrap();
        assert_eq!(g.gates, ["x/y", GATE]);
        assert_eq!(g.sysctl_names(), ["net.core.somaxconn"]);
        assert_eq!((g.uid.as_str(), g.resource_version.as_str()), ("u", "7"));
        assert_eq!(g.held, None);
        assert!(gated(&pod(json!([{"name": "x/y"}]), json!({}))).is_none());
        assert!(gated(&pod(json!([]), json!({}))).is_none());
        let deleting = pod(
            json!([{"name": GATE}]),
            json!({"metadata": {"name": "p", "namespace": "ns", "deletionTimestamp": "2026-01-01T00:00:00Z"}}),
        );
        assert!(
            gated(&deleting).is_none(),
            "a pod being deleted is left alone"
        );
        let held = pod(
            json!([{"name": GATE}]),
            json!({"status": {"conditions": [{"type": CONDITION, "status": "False", "message": "m"}]}}),
        );
        assert_eq!(gated(&held).unwrap().held.as_deref(), Some("m"));
    }

    #[test]
    fn views_keep_only_what_the_rules_read() {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"uid": "u", "annotations": {MIRROR_ANNOTATION: "x"}},
            "spec": {"hostNetwork": true, "containers": [{"name": "c", "image": "i"}],
                     "securityContext": {"runAsUser": 1, "sysctls": [{"name": "a.b", "value": "1"}]}},
        }))
        .unwrap();
        let v = PodFacts::of(&pod);
        assert!(v.mirror);
        assert_eq!(v.uid, "u");
        let kept = v.sysctls.unwrap();
        assert_eq!(kept.names, ["a.b"]);
        assert!(kept.host_network && !kept.host_ipc);
        pod.spec.as_mut().unwrap().security_context = None;
        assert_eq!(PodFacts::of(&pod).sysctls, None);

        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n", "labels": {"pool": "db"}},
            "status": {"nodeInfo": {"kernelVersion": "6.1.0-18-amd64", "machineID": "", "systemUUID": "",
              "bootID": "", "osImage": "", "containerRuntimeVersion": "", "kubeletVersion": "v1.37.0-eks-4d1a2b",
              "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"}},
        }))
        .unwrap();
        let facts = NodeFacts::of(&node);
        assert_eq!(facts.kernel.as_deref(), Some("6.1.0-18-amd64"));
        assert_eq!(facts.labels["pool"], "db");
        assert_eq!(facts.os.as_deref(), Some("linux"));
        assert_eq!(facts.kubelet.as_deref(), Some("v1.37.0-eks-4d1a2b"));
        assert_eq!(NodeFacts::of(&Node::default()), NodeFacts::default());
        let labelled: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "w", "labels": {OS_LABEL: "windows"}},
        }))
        .unwrap();
        assert_eq!(NodeFacts::of(&labelled).os.as_deref(), Some("windows"));
    }
}
