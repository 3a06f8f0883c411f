//! The sysctl verdicts the plugin explains: one pod on one node (`sysctl check`), and a
//! Pending pod on every node its own constraints allow (`why pod`). Pure: the webhook's own
//! decision (`sysctl::webhook::decide`) and the placement's (`sysctl::placement::decide::place`) on
//! plain values. The one file of the plugin that names the `groundskeeper_sysctl_rules` crate.

use std::fmt::Write as _;

use groundskeeper_sysctl_rules::{args::PolicyArgs, kubelet::Kubelet};

pub use groundskeeper_sysctl_rules::crd::SysctlPolicy;
use k8s_openapi::api::core::v1::{Pod, PodSpec};
use serde::Serialize;

use crate::sysctl::facts::{Constraints, NodeFacts, PodFacts};
use crate::sysctl::placement::decide::{Placement, place};
use crate::sysctl::webhook::decide::{Decision, decide, policy_of};

/// The flags the controller-manager judges sysctls with (`--allowed-unsafe-sysctls`,
/// `--sysctl-default-mode`): they are not in the API, so the plugin takes the same ones.
pub type PolicyFlags = PolicyArgs;

/// A pod's verdict on one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeVerdict {
    pub node: String,
    /// `allowed`, `audited` (forbidden, but the node only audits: allowed with a warning) or
    /// `refused`.
    pub verdict: &'static str,
    /// The webhook's own message, for `audited` and `refused`.
    pub message: Option<String>,
}

impl NodeVerdict {
    fn of(node: &str, d: Decision) -> Self {
        let (verdict, message) = match d {
            Decision::Allow => ("allowed", None),
            Decision::Audit { message } => ("audited", Some(message)),
            Decision::Deny { message } => ("refused", Some(message)),
        };
        NodeVerdict {
            node: node.into(),
            verdict,
            message,
        }
    }

    pub fn refused(&self) -> bool {
        self.verdict == "refused"
    }
}

/// `sysctl check`: the node, what it is judged by, and the verdict.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Check {
    pub pod: String,
    pub sysctls: Vec<String>,
    pub kernel: Option<String>,
    pub kubelet: Option<String>,
    /// Said when the node's own kubelet version's rules could not be used.
    pub kubelet_note: Option<String>,
    pub os: Option<String>,
    /// `Enforce` or `Audit`.
    pub mode: String,
    /// The SysctlPolicies that select the node, sorted.
    pub policies: Vec<String>,
    #[serde(flatten)]
    pub verdict: NodeVerdict,
}

/// The sysctl names `pod` sets, in order.
pub fn sysctl_names(spec: Option<&PodSpec>) -> Vec<String> {
    spec.and_then(|s| s.security_context.as_ref())
        .and_then(|s| s.sysctls.as_ref())
        .map(|s| s.iter().map(|s| s.name.clone()).collect())
        .unwrap_or_default()
}

/// The verdict for `pod` (`label`, for messages) on node `node_name` known as `node`.
pub fn check(
    flags: &PolicyFlags,
    label: &str,
    pod: &Pod,
    node_name: &str,
    node: &NodeFacts,
    policies: &[SysctlPolicy],
) -> Check {
    let refs: Vec<&SysctlPolicy> = policies.iter().collect();
    let pod_facts = PodFacts::of(pod);
    let policy = policy_of(flags, node, &refs);
    let decision = decide(flags, label, &pod_facts, node_name, Some(node), &refs);
    Check {
        pod: label.into(),
        sysctls: sysctl_names(pod.spec.as_ref()),
        kernel: node.kernel.clone(),
        kubelet: node.kubelet.clone(),
        kubelet_note: Kubelet::from_reported(node.kubelet.as_deref()).assumed,
        os: node.os.clone(),
        mode: format!("{:?}", policy.mode),
        policies: policy.policies.clone(),
        verdict: NodeVerdict::of(node_name, decision),
    }
}

pub fn render_check(c: &Check) -> String {
    let mut out = String::new();
    let v = &c.verdict;
    let _ = writeln!(
        out,
        "{} on node {}: {}",
        c.pod,
        v.node,
        match v.verdict {
            "allowed" => "allowed".to_string(),
            "audited" => "allowed (Audit: forbidden, reported only)".to_string(),
            other => other.to_string(),
        }
    );
    if c.sysctls.is_empty() {
        let _ = writeln!(out, "  it sets no sysctl");
    } else {
        let _ = writeln!(out, "  sysctls: {}", c.sysctls.join(", "));
    }
    let said = |v: &Option<String>| v.clone().unwrap_or_else(|| "(not reported)".into());
    let _ = writeln!(
        out,
        "  node: kernel {}, kubelet {}, os {}",
        said(&c.kernel),
        said(&c.kubelet),
        said(&c.os)
    );
    if let Some(note) = &c.kubelet_note {
        let _ = writeln!(out, "  {note}");
    }
    let by = if c.policies.is_empty() {
        "no SysctlPolicy selects it: the default mode".to_string()
    } else {
        format!("SysctlPolicy {}", c.policies.join(", "))
    };
    let _ = writeln!(out, "  mode {} ({by})", c.mode);
    if let Some(m) = &v.message {
        let _ = writeln!(out, "  why: {m}");
    }
    out
}

/// Where a Pending pod may go, by its sysctls.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Pending {
    pub sysctls: Vec<String>,
    /// It carries the placement's scheduling gate.
    pub gated: bool,
    /// The placement's condition message on the pod, when it says the pod is held.
    pub held: Option<String>,
    /// Every node its own nodeSelector and required affinity allow, judged.
    pub nodes: Vec<NodeVerdict>,
    /// Nodes its own constraints keep it off (not judged).
    pub excluded: usize,
    /// The placement's reason when no node admits it.
    pub none_admits: Option<String>,
}

/// Each node `pod` (`label`) could go to, judged as the webhook and the placement judge it.
pub fn pending(
    flags: &PolicyFlags,
    label: &str,
    pod: &Pod,
    gated: bool,
    held: Option<String>,
    nodes: &[(String, NodeFacts)],
    policies: &[SysctlPolicy],
) -> Pending {
    let refs: Vec<&SysctlPolicy> = policies.iter().collect();
    let pod_facts = PodFacts::of(pod);
    let spec = pod.spec.as_ref();
    let own = spec.map(Constraints::of).unwrap_or_default();
    let sysctls = sysctl_names(spec);
    let mut judged = Vec::new();
    let mut excluded = 0;
    for (name, facts) in nodes {
        if own.allow(name, &facts.labels) {
            let d = decide(flags, label, &pod_facts, name, Some(facts), &refs);
            judged.push(NodeVerdict::of(name, d));
        } else {
            excluded += 1;
        }
    }
    let named: Vec<(&str, &NodeFacts)> = nodes.iter().map(|(n, f)| (n.as_str(), f)).collect();
    let none_admits = match place(flags, label, &pod_facts, &sysctls, &own, &named, &refs) {
        Placement::Hold { reason, .. } if pod_facts.sysctls.is_some() => Some(reason),
        _ => None,
    };
    Pending {
        sysctls,
        gated,
        held,
        nodes: judged,
        excluded,
        none_admits,
    }
}

pub fn render_pending(p: &Pending) -> String {
    let mut out = String::new();
    if p.sysctls.is_empty() {
        let _ = writeln!(
            out,
            "Sysctls: it sets none; no sysctl verdict keeps it off a node"
        );
        return out;
    }
    let refused = p.nodes.iter().filter(|n| n.refused()).count();
    let _ = writeln!(
        out,
        "Sysctls {}: {refused} of {} node(s) its own constraints allow refuse it{}",
        p.sysctls.join(", "),
        p.nodes.len(),
        if p.excluded > 0 {
            format!(
                " ({} more excluded by its own nodeSelector or affinity)",
                p.excluded
            )
        } else {
            String::new()
        }
    );
    if p.gated {
        let _ = writeln!(
            out,
            "  it carries the scheduling gate groundskeeper.dev/sysctl: no scheduler binds it until the placement removes it"
        );
    }
    if let Some(h) = &p.held {
        let _ = writeln!(out, "  placement condition: {h}");
    }
    if let Some(r) = &p.none_admits {
        let _ = writeln!(out, "  {r}");
    }
    for n in &p.nodes {
        let _ = writeln!(
            out,
            "  {:<24} {}{}",
            n.node,
            n.verdict,
            n.message
                .as_deref()
                .map(|m| format!(": {m}"))
                .unwrap_or_default()
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use groundskeeper_sysctl_rules::{
        cases::{self, Case},
        crd::Mode,
        verdict::Verdict,
    };

    fn node(case: &Case) -> NodeFacts {
        NodeFacts {
            labels: case.labels(),
            kernel: case.kernel.map(String::from),
            os: Some("linux".into()),
            kubelet: Some("v1.36.2".into()),
        }
    }

    fn pod(case: &Case) -> Pod {
        Pod {
            spec: Some(case.pod_spec()),
            ..Default::default()
        }
    }

    /// `sysctl check` says, on every row of the table both binaries are tested on, what the
    /// row's verdict is, and quotes kubelet's message.
    #[test]
    fn check_says_every_shared_rows_verdict() {
        for case in cases::cases() {
            let c = check(
                &case.args(),
                "Pod/p",
                &pod(&case),
                "n1",
                &node(&case),
                &case.policies(),
            );
            let want = match case.want() {
                Verdict::Allowed => "allowed",
                Verdict::Forbidden {
                    mode: Mode::Audit, ..
                } => "audited",
                Verdict::Forbidden { .. } => "refused",
            };
            assert_eq!(c.verdict.verdict, want, "case {:?}: {c:?}", case.name);
            if let Verdict::Forbidden { message, .. } = case.want() {
                let m = c.verdict.message.as_deref().unwrap_or_default();
                assert!(m.contains(&message), "case {:?}: {m}", case.name);
            }
            let text = render_check(&c);
            assert!(text.starts_with("Pod/p on node n1: "), "{text}");
        }
    }

    /// Each node is judged by its own kubelet: the same pod refused on a v1.36 node under an
    /// Enforce default, allowed on a v1.37 one, and the kernel and versions are said.
    #[test]
    fn the_nodes_kubelet_version_decides_and_is_said() {
        let flags = PolicyFlags {
            allowed_unsafe_sysctls: Vec::new(),
            sysctl_default_mode: Mode::Enforce,
        };
        let pod = Pod {
            spec: Some(PodSpec {
                security_context: Some(k8s_openapi::api::core::v1::PodSecurityContext {
                    sysctls: Some(vec![k8s_openapi::api::core::v1::Sysctl {
                        name: "net.ipv4.tcp_slow_start_after_idle".into(),
                        value: "0".into(),
                    }]),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let at = |kubelet: &str| NodeFacts {
            kernel: Some("6.1.0-18-amd64".into()),
            kubelet: Some(kubelet.into()),
            ..NodeFacts::default()
        };
        let old = check(&flags, "Pod/p", &pod, "a", &at("v1.36.2"), &[]);
        assert_eq!(old.verdict.verdict, "refused", "{old:?}");
        assert_eq!(old.mode, "Enforce");
        let text = render_check(&old);
        assert!(
            text.contains("kernel 6.1.0-18-amd64, kubelet v1.36.2"),
            "{text}"
        );
        assert!(text.contains("no SysctlPolicy selects it"), "{text}");
        let new = check(&flags, "Pod/p", &pod, "b", &at("v1.37.0"), &[]);
        assert_eq!(new.verdict.verdict, "allowed", "{new:?}");

        // A Pending pod: both judged, one refuses; a node its own selector excludes is not.
        let mut confined = pod.clone();
        confined.spec.as_mut().unwrap().node_selector =
            Some([("pool".to_string(), "x".to_string())].into());
        let mut a = at("v1.36.2");
        a.labels.insert("pool".into(), "x".into());
        let mut b = at("v1.37.0");
        b.labels.insert("pool".into(), "x".into());
        let nodes = vec![
            ("a".to_string(), a.clone()),
            ("b".to_string(), b),
            ("c".to_string(), at("v1.36.2")),
        ];
        let p = pending(&flags, "ns/p", &confined, true, None, &nodes, &[]);
        let said: Vec<(&str, &str)> = p.nodes.iter().map(|n| (&*n.node, n.verdict)).collect();
        assert_eq!(said, [("a", "refused"), ("b", "allowed")]);
        assert_eq!(p.excluded, 1);
        assert_eq!(p.none_admits, None);
        // Only the refusing node left: no node admits it, and the placement's reason says why.
        let p = pending(&flags, "ns/p", &confined, true, None, &nodes[..1], &[]);
        let why = p.none_admits.as_deref().unwrap_or_default();
        assert!(
            why.starts_with("no node admits net.ipv4.tcp_slow_start_after_idle"),
            "{why}"
        );
        let text = render_pending(&p);
        assert!(text.contains("1 of 1 node(s)"), "{text}");
        assert!(text.contains("scheduling gate"), "{text}");
    }
}
