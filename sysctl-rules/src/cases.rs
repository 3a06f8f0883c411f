//! The decision table both binaries are tested against: a node (labels, kernel), the
//! SysctlPolicies, the default mode, a pod's sysctls, and the verdict kubelet's rules give.
//!
//! `verdict.rs` checks every row on the pure core; the admission webhook's decision table and
//! its cluster test, and the node-agent's, reuse the same rows, so the two binaries can not
//! drift apart on what a node allows.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PodSecurityContext, PodSpec, Sysctl};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::args::PolicyArgs;
use super::crd::{Mode, SysctlPolicy, SysctlPolicySpec};
use super::kernel::KernelVersion;
use super::verdict::Verdict;

/// `--allowed-unsafe-sysctls` in every case.
pub const FLAG: &[&str] = &["net.core.somaxconn"];

/// One SysctlPolicy of a case; `select: None` selects every node.
#[derive(Clone, Copy, Debug)]
pub struct PolicyRow {
    pub name: &'static str,
    pub patterns: &'static [&'static str],
    pub select: Option<&'static [(&'static str, &'static str)]>,
    pub mode: Mode,
}

#[derive(Clone, Copy, Debug)]
pub enum Want {
    Allowed,
    /// Forbidden in this mode, with kubelet's message after `forbidden sysctl: `.
    Forbidden(Mode, &'static str),
}

#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub name: &'static str,
    pub default_mode: Mode,
    /// The node's kernel release as it reports it (`status.nodeInfo.kernelVersion`, or
    /// `/proc/sys/kernel/osrelease`); None: not reported.
    pub kernel: Option<&'static str>,
    pub labels: &'static [(&'static str, &'static str)],
    pub policies: &'static [PolicyRow],
    pub sysctls: &'static [&'static str],
    pub host_network: bool,
    pub host_ipc: bool,
    pub want: Want,
}

const DB: &[(&str, &str)] = &[("pool", "db")];
const WEB: &[(&str, &str)] = &[("pool", "web")];
const KERNEL: Option<&str> = Some("6.1.0-18-amd64");

const fn case(name: &'static str, default_mode: Mode, sysctls: &'static [&'static str]) -> Case {
    Case {
        name,
        default_mode,
        kernel: KERNEL,
        labels: DB,
        policies: &[],
        sysctls,
        host_network: false,
        host_ipc: false,
        want: Want::Allowed,
    }
}

const fn policy(
    name: &'static str,
    patterns: &'static [&'static str],
    select: Option<&'static [(&'static str, &'static str)]>,
    mode: Mode,
) -> PolicyRow {
    PolicyRow {
        name,
        patterns,
        select,
        mode,
    }
}

use Mode::{Audit, Enforce};

/// Every row; names are unique.
pub fn cases() -> Vec<Case> {
    let msgmax = r#""kernel.msgmax" not allowlisted"#;
    vec![
        case("no sysctls", Enforce, &[]),
        case("safe sysctl", Enforce, &["kernel.shm_rmid_forced"]),
        case("flag pattern allows", Enforce, &["net.core.somaxconn"]),
        Case {
            want: Want::Forbidden(Audit, msgmax),
            ..case(
                "unsafe, no policy, default audit",
                Audit,
                &["kernel.msgmax"],
            )
        },
        Case {
            want: Want::Forbidden(Enforce, msgmax),
            ..case(
                "unsafe, no policy, default enforce",
                Enforce,
                &["kernel.msgmax"],
            )
        },
        Case {
            policies: const { &[policy("db", &["kernel.msg*"], Some(DB), Enforce)] },
            ..case(
                "enforce policy allows by prefix, slash form too",
                Audit,
                &["kernel.msgmax", "kernel/msgmnb"],
            )
        },
        Case {
            policies: const { &[policy("db", &["kernel.sem"], Some(DB), Enforce)] },
            want: Want::Forbidden(Enforce, msgmax),
            ..case(
                "enforce policy forbids what it does not list",
                Audit,
                &["kernel.sem", "kernel.msgmax"],
            )
        },
        Case {
            labels: WEB,
            policies: const { &[policy("db", &["kernel.msg*"], Some(DB), Enforce)] },
            want: Want::Forbidden(Audit, msgmax),
            ..case(
                "a policy for other nodes does not apply",
                Audit,
                &["kernel.msgmax"],
            )
        },
        Case {
            policies: const { &[policy("db", &["kernel.sem"], Some(DB), Audit)] },
            want: Want::Forbidden(Audit, msgmax),
            ..case("an audit policy only audits", Enforce, &["kernel.msgmax"])
        },
        Case {
            policies: const {
                &[
                    policy("a-audit", &["kernel.msg*"], Some(DB), Audit),
                    policy("b-all", &[], None, Enforce),
                ]
            },
            want: Want::Forbidden(Enforce, r#""kernel.sem" not allowlisted"#),
            ..case(
                "enforce wins, patterns are a union",
                Audit,
                &["kernel.msgmax", "kernel.sem"],
            )
        },
        Case {
            policies: const { &[policy("all", &[], None, Audit)] },
            want: Want::Forbidden(Audit, msgmax),
            ..case(
                "a selecting policy decides, not the default",
                Enforce,
                &["kernel.msgmax"],
            )
        },
        Case {
            policies: const { &[policy("db", &["vm.swappiness"], Some(DB), Enforce)] },
            want: Want::Forbidden(Enforce, r#""vm.swappiness" not allowlisted"#),
            ..case(
                "an unnamespaced pattern allows nothing",
                Audit,
                &["vm.swappiness"],
            )
        },
        Case {
            kernel: Some("5.15.0-75-generic"),
            ..case(
                "gated safe sysctl on a new kernel",
                Enforce,
                &["net.ipv4.tcp_rmem"],
            )
        },
        Case {
            kernel: Some("4.14.300"),
            want: Want::Forbidden(Enforce, r#""net.ipv4.tcp_rmem" not allowlisted"#),
            ..case(
                "gated safe sysctl on an old kernel",
                Enforce,
                &["net.ipv4.tcp_rmem"],
            )
        },
        Case {
            kernel: None,
            want: Want::Forbidden(Enforce, r#""net.ipv4.tcp_keepalive_time" not allowlisted"#),
            ..case(
                "kernel not reported: ungated only",
                Enforce,
                &["net.ipv4.tcp_keepalive_time"],
            )
        },
        Case {
            kernel: Some("linux"),
            want: Want::Forbidden(Enforce, r#""net.ipv4.tcp_fin_timeout" not allowlisted"#),
            ..case(
                "kernel unparseable: ungated only",
                Enforce,
                &["net.ipv4.tcp_fin_timeout"],
            )
        },
        Case {
            host_network: true,
            want: Want::Forbidden(
                Enforce,
                r#""net.core.somaxconn" not allowed with host Net enabled"#,
            ),
            ..case(
                "host network forbids Net sysctls",
                Enforce,
                &["net.core.somaxconn"],
            )
        },
        Case {
            host_ipc: true,
            want: Want::Forbidden(
                Enforce,
                r#""kernel.shm_rmid_forced" not allowed with host IPC enabled"#,
            ),
            ..case(
                "host IPC forbids IPC sysctls",
                Enforce,
                &["kernel.shm_rmid_forced"],
            )
        },
        Case {
            want: Want::Forbidden(Enforce, r#""kernel.sem" not allowlisted"#),
            ..case(
                "the first forbidden sysctl in pod order",
                Enforce,
                &["kernel.shm_rmid_forced", "kernel.sem", "kernel.msgmax"],
            )
        },
        Case {
            policies: const { &[policy("all", &["net.ipv4.conf.*"], None, Enforce)] },
            ..case(
                "slash names are normalised as kubelet does",
                Audit,
                &["net/ipv4/conf/eno2.100/rp_filter"],
            )
        },
    ]
}

impl Case {
    /// The binary's flags in this case.
    pub fn args(&self) -> PolicyArgs {
        PolicyArgs {
            allowed_unsafe_sysctls: FLAG.iter().map(|s| s.to_string()).collect(),
            sysctl_default_mode: self.default_mode,
        }
    }

    pub fn kernel(&self) -> Option<KernelVersion> {
        self.kernel.and_then(|k| k.parse().ok())
    }

    pub fn labels(&self) -> BTreeMap<String, String> {
        pairs(self.labels)
    }

    /// The case's policies, generation 1.
    pub fn policies(&self) -> Vec<SysctlPolicy> {
        self.policies
            .iter()
            .map(|p| {
                let mut policy = SysctlPolicy::new(
                    p.name,
                    SysctlPolicySpec {
                        allowed_unsafe_sysctls: p.patterns.iter().map(|s| s.to_string()).collect(),
                        node_selector: p.select.map(|s| LabelSelector {
                            match_labels: Some(pairs(s)),
                            ..Default::default()
                        }),
                        mode: p.mode,
                    },
                );
                policy.metadata.generation = Some(1);
                policy
            })
            .collect()
    }

    /// The part of the pod spec the rules read.
    pub fn pod_spec(&self) -> PodSpec {
        PodSpec {
            host_network: Some(self.host_network),
            host_ipc: Some(self.host_ipc),
            security_context: Some(PodSecurityContext {
                sysctls: Some(
                    self.sysctls
                        .iter()
                        .map(|n| Sysctl {
                            name: n.to_string(),
                            value: "1".into(),
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    pub fn want(&self) -> Verdict {
        match self.want {
            Want::Allowed => Verdict::Allowed,
            Want::Forbidden(mode, m) => Verdict::Forbidden {
                mode,
                message: format!("forbidden sysctl: {m}"),
            },
        }
    }

    /// The apiserver refuses to create such a pod (a Net sysctl with hostNetwork, an IPC one
    /// with hostIPC), so cluster tests skip it; the rules still cover it, as kubelet's do.
    pub fn apiserver_refuses(&self) -> bool {
        self.host_network || self.host_ipc
    }
}

fn pairs(p: &[(&str, &str)]) -> BTreeMap<String, String> {
    p.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_are_unique() {
        let mut names: Vec<&str> = super::cases().iter().map(|c| c.name).collect();
        let n = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), n);
    }
}
