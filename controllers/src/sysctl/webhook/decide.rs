//! Whether a pod may be bound to (or created on) a node: plain values in, the decision out.
//!
//! The verdict is the shared one (`groundskeeper_sysctl_rules`, the same the node-agent reports by),
//! for the node's labels, kernel (`status.nodeInfo.kernelVersion`) and kubelet version
//! (`status.nodeInfo.kubeletVersion`: each kubelet admits by its own version's rules), the
//! SysctlPolicies and the flags. Only an Enforce verdict denies; an Audit one is allowed with a
//! warning.

use groundskeeper_sysctl_rules::args::PolicyArgs;
use groundskeeper_sysctl_rules::crd::{Mode, SysctlPolicy};
use groundskeeper_sysctl_rules::kubelet::Kubelet;
use groundskeeper_sysctl_rules::policy::merge_in;
use groundskeeper_sysctl_rules::verdict::{Verdict, node_policy_as};

use crate::sysctl::facts::{NodeFacts, PodFacts};

/// What to answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Allowed: no sysctl, all allowed, or not the webhook's to judge.
    Allow,
    /// Forbidden, but the node only audits: allowed, with this warning.
    Audit { message: String },
    /// Forbidden and the node enforces: denied with this message.
    Deny { message: String },
}

/// The decision for pod `pod` (`namespace/name`, for messages) seen as `pod_facts`, onto node
/// `node_name`, known as `node` (None: not in the cache), under `policies` and the flags.
pub fn decide(
    args: &PolicyArgs,
    pod: &str,
    pod_facts: &PodFacts,
    node_name: &str,
    node: Option<&NodeFacts>,
    policies: &[&SysctlPolicy],
) -> Decision {
    let Some(sysctls) = pod_facts.sysctls.as_deref() else {
        return Decision::Allow;
    };
    if pod_facts.mirror {
        return Decision::Allow;
    }
    let Some(node) = node else {
        // Without the node's labels its policy is unknown; a binding denied now is retried by
        // the scheduler once the node is in the cache. Where nothing in the cluster enforces,
        // no verdict could deny, so nothing is held up.
        if !anything_enforces(args, policies) {
            return Decision::Allow;
        }
        return Decision::Deny {
            message: format!(
                "pod {pod} sets sysctls and node {node_name:?} is not known to groundskeeper yet, \
                 so its SysctlPolicy can not be judged; retry once the node exists"
            ),
        };
    };
    let policy = policy_of(args, node, policies);
    // Said only when the node's own kubelet version's rules could not be used.
    let assumed = Kubelet::from_reported(node.kubelet.as_deref())
        .assumed
        .map(|a| format!("; {a}"))
        .unwrap_or_default();
    match policy.verdict_sysctls(sysctls) {
        Verdict::Allowed => Decision::Allow,
        Verdict::Forbidden {
            mode: Mode::Audit,
            message,
        } => Decision::Audit {
            message: format!(
                "{message} on node {node_name:?} (sysctl mode Audit{}{assumed}): allowed, \
                 reported only",
                by(&policy.policies)
            ),
        },
        Verdict::Forbidden {
            mode: Mode::Enforce,
            message,
        } => Decision::Deny {
            message: format!(
                "pod {pod} may not run on node {node_name:?}: {message} (sysctl mode \
                 Enforce{}{assumed}); keep such pods off such nodes with node affinity \
                 (groundskeeper docs/sysctl.md)",
                by(&policy.policies)
            ),
        },
    }
}

/// The decision for a binding whose pod was not read (not cached, and the webhook's budget of
/// pod lookups is spent: see `serve.rs`). Fail safe without the pod: where no verdict could
/// deny (the node audits; or, for a node not known, nothing in the cluster enforces) the
/// binding is allowed, as the pod's sysctls would be; where the node enforces it is denied,
/// since the pod might set a forbidden sysctl. A denied binding costs the pod a retry: the
/// scheduler binds it again with backoff, and by then the watch has usually delivered it.
pub fn decide_unread(
    args: &PolicyArgs,
    pod: &str,
    node_name: &str,
    node: Option<&NodeFacts>,
    policies: &[&SysctlPolicy],
) -> Decision {
    let enforcing = match node {
        Some(node) => policy_of(args, node, policies).mode == Mode::Enforce,
        None => anything_enforces(args, policies),
    };
    if !enforcing {
        return Decision::Allow;
    }
    Decision::Deny {
        message: format!(
            "pod {pod} could not be read (the sysctl webhook is over its budget of API lookups) \
             and node {node_name:?} enforces its sysctl policy; the binding is retried"
        ),
    }
}

/// Whether any node could enforce: the default mode, or any SysctlPolicy.
pub fn anything_enforces(args: &PolicyArgs, policies: &[&SysctlPolicy]) -> bool {
    args.sysctl_default_mode == Mode::Enforce
        || policies.iter().any(|p| p.spec.mode == Mode::Enforce)
}

/// The policy of a known node, by the rules of its own kubelet version.
pub fn policy_of(
    args: &PolicyArgs,
    node: &NodeFacts,
    policies: &[&SysctlPolicy],
) -> groundskeeper_sysctl_rules::policy::NodePolicy {
    let kubelet = Kubelet::from_reported(node.kubelet.as_deref()).kubelet;
    if node.linux() {
        let kernel = node.kernel.as_deref().and_then(|k| k.parse().ok());
        node_policy_as(kubelet, args, kernel.as_ref(), policies, &node.labels)
    } else {
        let flag = args.allowed_unsafe_sysctls();
        let mode = args.sysctl_default_mode;
        merge_in(
            kubelet.namespaces(),
            &[],
            &flag,
            mode,
            policies,
            &node.labels,
        )
    }
}

/// `, SysctlPolicy a, b` or `, no SysctlPolicy selects the node`.
fn by(policies: &[String]) -> String {
    if policies.is_empty() {
        ", no SysctlPolicy selects the node: the default mode".into()
    } else {
        format!(", SysctlPolicy {}", policies.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use groundskeeper_sysctl_rules::cases::{self, Case};
    use k8s_openapi::api::core::v1::{Pod, PodSpec};

    fn pod_facts(case: &Case) -> PodFacts {
        PodFacts::of(&Pod {
            spec: Some(case.pod_spec()),
            ..Default::default()
        })
    }

    fn node(case: &Case) -> NodeFacts {
        NodeFacts {
            labels: case.labels(),
            kernel: case.kernel.map(String::from),
            os: Some("linux".into()),
            kubelet: Some("v1.36.2".into()),
        }
    }

    fn run(case: &Case, pod_facts: &PodFacts, node: Option<&NodeFacts>) -> Decision {
        let policies = case.policies();
        let refs: Vec<&SysctlPolicy> = policies.iter().collect();
        decide(&case.args(), "ns/p", pod_facts, "n1", node, &refs)
    }

    /// The shared table: the webhook denies exactly the Enforce verdicts, audits the Audit
    /// ones, allows the rest, and quotes kubelet's message.
    #[test]
    fn every_shared_case_is_answered_by_its_verdict() {
        for case in cases::cases() {
            let got = run(&case, &pod_facts(&case), Some(&node(&case)));
            match (case.want(), &got) {
                (Verdict::Allowed, Decision::Allow) => {}
                (
                    Verdict::Forbidden {
                        mode: Mode::Audit,
                        message,
                    },
                    Decision::Audit { message: m },
                )
                | (
                    Verdict::Forbidden {
                        mode: Mode::Enforce,
                        message,
                    },
                    Decision::Deny { message: m },
                ) => assert!(m.contains(&message), "case {:?}: {m}", case.name),
                (want, got) => panic!("case {:?}: want {want:?}, got {got:?}", case.name),
            }
        }
    }

    /// Whatever the node, policies and flags: a pod setting no sysctl, or a static pod's
    /// mirror, is never denied.
    #[test]
    fn no_sysctls_or_a_mirror_is_never_denied() {
        for case in cases::cases() {
            let none = PodFacts::default();
            let mut mirror = pod_facts(&case);
            mirror.mirror = true;
            for (what, v) in [("no sysctls", &none), ("mirror", &mirror)] {
                for n in [None, Some(&node(&case))] {
                    assert_eq!(
                        run(&case, v, n),
                        Decision::Allow,
                        "case {:?}, {what}, node known: {}",
                        case.name,
                        n.is_some()
                    );
                }
            }
        }
    }

    /// Off Linux kubelet has no safe sysctls: over every shared case, a node that says it runs
    /// another system is never judged more leniently than a Linux node, a safe sysctl is
    /// refused there as kubelet refuses it, and a node that does not say is judged as Linux.
    #[test]
    fn off_linux_no_sysctl_is_safe() {
        let rank = |d: &Decision| match d {
            Decision::Allow => 0,
            Decision::Audit { .. } => 1,
            Decision::Deny { .. } => 2,
        };
        for case in cases::cases() {
            let linux = node(&case);
            let windows = NodeFacts {
                os: Some("windows".into()),
                ..linux.clone()
            };
            let unsaid = NodeFacts {
                os: None,
                ..linux.clone()
            };
            let v = pod_facts(&case);
            let (l, w) = (run(&case, &v, Some(&linux)), run(&case, &v, Some(&windows)));
            assert!(
                rank(&w) >= rank(&l),
                "case {:?}: {l:?} on Linux, {w:?} on Windows",
                case.name
            );
            assert_eq!(run(&case, &v, Some(&unsaid)), l, "case {:?}", case.name);
        }
        let cases = cases::cases();
        let safe = *cases.iter().find(|c| c.name == "safe sysctl").unwrap();
        let windows = NodeFacts {
            os: Some("windows".into()),
            ..node(&safe)
        };
        let Decision::Deny { message } = run(&safe, &pod_facts(&safe), Some(&windows)) else {
            panic!("a safe sysctl on a Windows node under Enforce was not denied")
        };
        assert!(
            message.contains(r#""kernel.shm_rmid_forced" not allowlisted"#),
            "{message}"
        );
        // The flag's patterns still allow there.
        let flag = *cases
            .iter()
            .find(|c| c.name == "flag pattern allows")
            .unwrap();
        assert_eq!(
            run(&flag, &pod_facts(&flag), Some(&windows)),
            Decision::Allow
        );
    }

    #[test]
    fn an_unknown_node_is_denied_only_where_something_enforces() {
        let cases = cases::cases();
        let find = |name: &str| *cases.iter().find(|c| c.name == name).unwrap();
        // Default Audit and no policy at all: nothing could deny.
        let audit = find("unsafe, no policy, default audit");
        assert_eq!(run(&audit, &pod_facts(&audit), None), Decision::Allow);
        // Default Enforce, or an Enforce policy anywhere: the node might enforce.
        for name in [
            "unsafe, no policy, default enforce",
            "a policy for other nodes does not apply",
        ] {
            let c = find(name);
            let Decision::Deny { message } = run(&c, &pod_facts(&c), None) else {
                panic!("{name}: not denied")
            };
            assert!(message.contains(r#"node "n1" is not known"#), "{message}");
        }
    }

    /// Over every shared case, a binding judged without its pod: never allowed where the pod,
    /// had it been read, could have been denied, and never denied where nothing on the node
    /// could deny (for a node known or not).
    #[test]
    fn unread_pods_fail_safe() {
        for case in cases::cases() {
            let policies = case.policies();
            let refs: Vec<&SysctlPolicy> = policies.iter().collect();
            let args = case.args();
            for n in [None, Some(node(&case))] {
                let unread = decide_unread(&args, "ns/p", "n1", n.as_ref(), &refs);
                let read = run(&case, &pod_facts(&case), n.as_ref());
                let what = format!("case {:?}, node known: {}", case.name, n.is_some());
                if matches!(read, Decision::Deny { .. }) {
                    assert!(
                        matches!(unread, Decision::Deny { .. }),
                        "{what}: {unread:?}"
                    );
                }
                let node_enforces = match &n {
                    Some(n) => policy_of(&args, n, &refs).mode == Mode::Enforce,
                    None => anything_enforces(&args, &refs),
                };
                assert_eq!(
                    matches!(unread, Decision::Deny { .. }),
                    node_enforces,
                    "{what}: {unread:?}"
                );
                if let Decision::Deny { message } = unread {
                    assert!(
                        message.contains("could not be read") && message.contains("\"n1\""),
                        "{what}: {message}"
                    );
                }
            }
        }
    }

    #[test]
    fn messages_name_pod_node_policies_and_the_way_out() {
        let cases = cases::cases();
        let c = *cases
            .iter()
            .find(|c| c.name == "enforce policy forbids what it does not list")
            .unwrap();
        let Decision::Deny { message } = run(&c, &pod_facts(&c), Some(&node(&c))) else {
            panic!("not denied")
        };
        assert_eq!(
            message,
            r#"pod ns/p may not run on node "n1": forbidden sysctl: "kernel.msgmax" not allowlisted (sysctl mode Enforce, SysctlPolicy db); keep such pods off such nodes with node affinity (groundskeeper docs/sysctl.md)"#
        );
    }

    /// A cluster mid-upgrade: the same pod, kernel and policies on a v1.36 and a v1.37 node.
    /// `net.ipv4.tcp_slow_start_after_idle` is safe only from v1.37 on, so only the v1.36
    /// node's kubelet would reject it, and only that binding is denied.
    #[test]
    fn mixed_kubelet_versions_judge_by_their_own_rules() {
        let args = PolicyArgs {
            allowed_unsafe_sysctls: vec![],
            sysctl_default_mode: Mode::Enforce,
        };
        let pod = PodFacts::of(&Pod {
            spec: Some(PodSpec {
                security_context: Some(testkit::sysctls(&["net.ipv4.tcp_slow_start_after_idle"])),
                ..Default::default()
            }),
            ..Default::default()
        });
        let on = |kubelet: Option<&str>, kernel: &str| NodeFacts {
            kernel: Some(kernel.into()),
            os: Some("linux".into()),
            kubelet: kubelet.map(String::from),
            ..Default::default()
        };
        let old = on(Some("v1.36.2"), "6.1.0-18-amd64");
        let new = on(Some("v1.37.0"), "6.1.0-18-amd64");
        let Decision::Deny { message } = decide(&args, "ns/p", &pod, "old", Some(&old), &[]) else {
            panic!("the v1.36 node's binding was not denied")
        };
        assert!(
            message.contains(r#""net.ipv4.tcp_slow_start_after_idle" not allowlisted"#),
            "{message}"
        );
        assert!(!message.contains("judged as"), "its own version: {message}");
        assert_eq!(
            decide(&args, "ns/p", &pod, "new", Some(&new), &[]),
            Decision::Allow
        );
        // v1.37 still gates it by the kernel (4.15).
        let new_old_kernel = on(Some("v1.37.0"), "4.14.300");
        assert!(matches!(
            decide(&args, "ns/p", &pod, "n", Some(&new_old_kernel), &[]),
            Decision::Deny { .. }
        ));
        // Newer than known: judged as v1.38 (the newest known), and the message says so. Unreadable or absent:
        // judged as v1.36, as before kubelet versions were read.
        assert_eq!(
            decide(
                &args,
                "ns/p",
                &pod,
                "n",
                Some(&on(Some("v1.40.1"), "6.1")),
                &[]
            ),
            Decision::Allow
        );
        for kubelet in [None, Some("garbage")] {
            let Decision::Deny { message } =
                decide(&args, "ns/p", &pod, "n", Some(&on(kubelet, "6.1")), &[])
            else {
                panic!("{kubelet:?}: not denied")
            };
            assert!(
                message.contains("judged as v1.36"),
                "{kubelet:?}: {message}"
            );
        }
    }
}
