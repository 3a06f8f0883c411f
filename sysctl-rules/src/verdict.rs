//! The verdict for one pod on one node, and the stable hash names are derived with.
//!
//! The node-agent and the admission webhook both judge a pod with [`NodePolicy::verdict`], on a
//! policy built by [`node_policy`] from the same flags, SysctlPolicies, node labels and kernel.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodSpec;

use super::allowlist::{Admission, PodSysctls};
use super::args::PolicyArgs;
use super::crd::{Mode, SysctlPolicy};
use super::kernel::KernelVersion;
use super::kubelet::Kubelet;
use super::policy::{NodePolicy, merge_in};

/// A pod's verdict under a node's policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    /// A sysctl the node does not allow; `mode` says whether the node enforces or audits it,
    /// `message` is kubelet's (`forbidden sysctl: "kernel.msgmax" not allowlisted`).
    Forbidden {
        mode: Mode,
        message: String,
    },
}

impl NodePolicy {
    /// The verdict for a pod with `spec` on this node. A pod without a spec sets no sysctl.
    pub fn verdict(&self, spec: Option<&PodSpec>) -> Verdict {
        self.verdict_of(spec.map(|s| self.allowlist.admit(s)))
    }

    /// [`NodePolicy::verdict`] of a pod as [`PodSysctls`] keeps it: the same verdict as of the
    /// pod's spec.
    pub fn verdict_sysctls(&self, pod: &PodSysctls) -> Verdict {
        self.verdict_of(Some(self.allowlist.admit_sysctls(pod)))
    }

    fn verdict_of(&self, admission: Option<Admission>) -> Verdict {
        match admission {
            None | Some(Admission::Admit) => Verdict::Allowed,
            Some(Admission::Reject { message, .. }) => Verdict::Forbidden {
                mode: self.mode,
                message,
            },
        }
    }
}

/// The policy of a node with `labels` running `kernel` (None: not known, so only the ungated
/// safe sysctls) and a kubelet of v1.33 to v1.36, under the binary's flags and every
/// SysctlPolicy in the cluster.
pub fn node_policy(
    args: &PolicyArgs,
    kernel: Option<&KernelVersion>,
    policies: &[&SysctlPolicy],
    labels: &BTreeMap<String, String>,
) -> NodePolicy {
    node_policy_as(Kubelet::DEFAULT, args, kernel, policies, labels)
}

/// [`node_policy`] for a node whose kubelet has the rules of `kubelet` (see [`Kubelet::from_reported`]).
pub fn node_policy_as(
    kubelet: Kubelet,
    args: &PolicyArgs,
    kernel: Option<&KernelVersion>,
    policies: &[&SysctlPolicy],
    labels: &BTreeMap<String, String>,
) -> NodePolicy {
    merge_in(
        kubelet.namespaces(),
        &kubelet.safe_sysctls(kernel),
        &args.allowed_unsafe_sysctls(),
        args.sysctl_default_mode,
        policies,
        labels,
    )
}

/// Whether every Linux node admits a pod with `spec`, whatever its kubelet version (v1.33 on),
/// kernel, labels and SysctlPolicies: the pod's sysctls are all safe on every kernel or allowed
/// by the flags (which every node shares), and none meets a host namespace it may not. Such a
/// pod has nothing for Enforce to refuse: the scheduling gate lets it be.
pub fn allowed_everywhere(args: &PolicyArgs, spec: &PodSpec) -> bool {
    let weakest = node_policy_as(Kubelet::OLDEST, args, None, &[], &BTreeMap::new());
    weakest.verdict(Some(spec)) == Verdict::Allowed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cases;
    use k8s_openapi::api::core::v1::{PodSecurityContext, Sysctl};

    /// The rule, over generated pods and nodes: a pod [`allowed_everywhere`] is allowed on
    /// every node of every supported kubelet, kernel (known or not), label set and set of
    /// policies, in either mode; and every pod's [`PodSysctls`] gets the verdict its spec gets.
    #[test]
    fn allowed_everywhere_is_allowed_on_every_node() {
        let names = [
            "kernel.shm_rmid_forced",
            "net.ipv4.ip_local_port_range",
            "net.ipv4.tcp_keepalive_time",
            "net.ipv4.tcp_rmem",
            "net.ipv4.tcp_slow_start_after_idle",
            "net.core.somaxconn",
            "kernel.msgmax",
            "kernel.domainname",
            "net/ipv4/ip_local_port_range",
            "vm.swappiness",
        ];
        let kernels = [None, Some("3.10"), Some("4.5"), Some("4.15"), Some("6.1.0")];
        let mut everywhere = 0;
        for seed in 0..400u64 {
            let mut rng = testkit::rng::Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let case = &cases::cases()[rng.below(cases::cases().len())];
            let args = case.args();
            let sysctls: Vec<Sysctl> = rng
                .some(&names, 30)
                .into_iter()
                .map(|n| Sysctl {
                    name: n.into(),
                    value: "1".into(),
                })
                .collect();
            let spec = PodSpec {
                host_network: Some(rng.chance(20)),
                host_ipc: Some(rng.chance(20)),
                security_context: Some(PodSecurityContext {
                    sysctls: Some(sysctls),
                    ..Default::default()
                }),
                ..Default::default()
            };
            let kept = PodSysctls::of(&spec);
            let policies = case.policies();
            let refs: Vec<&SysctlPolicy> = policies.iter().collect();
            // What a cache keeps of the pod is judged as the pod is, everywhere.
            for kubelet in Kubelet::all() {
                for kernel in kernels {
                    let kernel = kernel.map(|k| crate::args::parse_kernel_version(k).unwrap());
                    let node =
                        node_policy_as(kubelet, &args, kernel.as_ref(), &refs, &case.labels());
                    let of_kept = kept
                        .as_ref()
                        .map_or(Verdict::Allowed, |k| node.verdict_sysctls(k));
                    assert_eq!(of_kept, node.verdict(Some(&spec)), "seed {seed}: {spec:?}");
                }
            }
            if !allowed_everywhere(&args, &spec) {
                continue;
            }
            everywhere += 1;
            for kubelet in Kubelet::all() {
                for kernel in kernels {
                    let kernel = kernel.map(|k| crate::args::parse_kernel_version(k).unwrap());
                    let node =
                        node_policy_as(kubelet, &args, kernel.as_ref(), &refs, &case.labels());
                    assert_eq!(
                        node.verdict(Some(&spec)),
                        Verdict::Allowed,
                        "seed {seed}: {spec:?} is allowed everywhere but not on kubelet {kubelet} \
                         kernel {kernel:?} in case {:?}",
                        case.name
                    );
                }
            }
        }
        assert!(
            everywhere > 20,
            "only {everywhere} generated pods were allowed everywhere"
        );
    }

    #[test]
    fn a_sysctl_some_node_may_refuse_is_not_allowed_everywhere() {
        let args = PolicyArgs {
            allowed_unsafe_sysctls: vec![],
            sysctl_default_mode: Mode::Enforce,
        };
        let spec = |name: &str, host_network: bool| PodSpec {
            host_network: Some(host_network),
            security_context: Some(PodSecurityContext {
                sysctls: Some(vec![Sysctl {
                    name: name.into(),
                    value: "1".into(),
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(allowed_everywhere(
            &args,
            &spec("kernel.shm_rmid_forced", false)
        ));
        // A kernel gate (a node with an old or unknown kernel drops it), a v1.37-only safe
        // sysctl, an unsafe one, a Net sysctl with hostNetwork.
        for (name, host) in [
            ("net.ipv4.tcp_keepalive_time", false),
            ("net.ipv4.tcp_slow_start_after_idle", false),
            ("kernel.msgmax", false),
            ("net.ipv4.ip_local_port_range", true),
        ] {
            assert!(!allowed_everywhere(&args, &spec(name, host)), "{name}");
        }
    }

    /// The shared table, judged here the way both binaries judge it.
    #[test]
    fn every_case_gets_its_verdict() {
        for case in cases::cases() {
            let policies = case.policies();
            let refs: Vec<&SysctlPolicy> = policies.iter().collect();
            let node = node_policy(&case.args(), case.kernel().as_ref(), &refs, &case.labels());
            assert_eq!(
                node.verdict(Some(&case.pod_spec())),
                case.want(),
                "case {:?}",
                case.name
            );
        }
    }
}
