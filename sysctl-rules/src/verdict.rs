//! The verdict for one pod on one node, and the stable hash names are derived with.
//!
//! The node-agent and the admission webhook both judge a pod with [`NodePolicy::judge`], on a
//! policy built by [`node_policy`] from the same flags, SysctlPolicies, node labels and kernel.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodSpec;

use super::allowlist::Admission;
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
    pub fn judge(&self, spec: Option<&PodSpec>) -> Verdict {
        match spec.map(|s| self.allowlist.admit(s)) {
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

/// [`node_policy`] for a node whose kubelet has the rules of `kubelet` (see [`Kubelet::judge`]).
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cases;

    /// The shared table, judged here the way both binaries judge it.
    #[test]
    fn every_case_gets_its_verdict() {
        for case in cases::cases() {
            let policies = case.policies();
            let refs: Vec<&SysctlPolicy> = policies.iter().collect();
            let node = node_policy(&case.args(), case.kernel().as_ref(), &refs, &case.labels());
            assert_eq!(
                node.judge(Some(&case.pod_spec())),
                case.want(),
                "case {:?}",
                case.name
            );
        }
    }
}
