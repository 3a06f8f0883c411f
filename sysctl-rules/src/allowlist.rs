//! kubelet's sysctl allowlist (`pkg/kubelet/sysctl/allowlist.go`).
//!
//! Built from patterns, it admits or rejects a pod by the sysctls in its security context.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::PodSpec;

use super::names::{
    Namespace, NamespaceTable, PATTERN_REGEX, classify_in, go_quote, is_valid_pattern, normalize,
};

/// The rejection reason kubelet uses (`ForbiddenReason`).
pub const FORBIDDEN_REASON: &str = "SysctlForbidden";

/// Why a pattern can not go into an allowlist; texts are kubelet's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("sysctl {} must have at most 253 characters and match regex {PATTERN_REGEX}", go_quote(.0))]
    Invalid(String),
    /// Carries the normalized, `*`-stripped string, as upstream prints it.
    #[error("the sysctls {} are not known to be namespaced", go_quote(.0))]
    UnknownNamespace(String),
}

/// One accepted pattern: what it matches and the namespace recorded for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub sysctl_or_prefix: String,
    pub namespace: Namespace,
    pub prefixed: bool,
}

/// Checks one pattern the way `NewAllowlist` of kubelet v1.33 to v1.36 does.
pub fn check_pattern(pattern: &str) -> Result<Entry, PatternError> {
    check_pattern_in(NamespaceTable::IpcNet, pattern)
}

/// Checks one pattern the way `NewAllowlist` does with namespace table `table`.
pub fn check_pattern_in(table: NamespaceTable, pattern: &str) -> Result<Entry, PatternError> {
    if !is_valid_pattern(pattern) {
        return Err(PatternError::Invalid(pattern.to_string()));
    }
    let c = classify_in(table, pattern);
    if c.namespace == Namespace::Unknown {
        return Err(PatternError::UnknownNamespace(c.sysctl_or_prefix));
    }
    Ok(Entry {
        sysctl_or_prefix: c.sysctl_or_prefix,
        namespace: c.namespace,
        prefixed: c.prefixed,
    })
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Allowlist {
    sysctls: HashMap<String, Namespace>,
    /// In insertion order; which of several matching prefixes wins can not change the outcome,
    /// since a prefix's namespace follows from the prefix itself.
    prefixes: Vec<(String, Namespace)>,
}

/// The admission outcome for one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    Admit,
    Reject {
        reason: &'static str,
        message: String,
    },
}

impl Allowlist {
    /// `NewAllowlist` of kubelet v1.33 to v1.36: the first bad pattern is the error.
    pub fn new<S: AsRef<str>>(patterns: &[S]) -> Result<Self, PatternError> {
        Self::new_in(NamespaceTable::IpcNet, patterns)
    }

    /// `NewAllowlist` with namespace table `table`.
    pub fn new_in<S: AsRef<str>>(
        table: NamespaceTable,
        patterns: &[S],
    ) -> Result<Self, PatternError> {
        let mut list = Allowlist::default();
        for p in patterns {
            list.insert(check_pattern_in(table, p.as_ref())?);
        }
        Ok(list)
    }

    pub fn insert(&mut self, entry: Entry) {
        if entry.prefixed {
            if !self
                .prefixes
                .iter()
                .any(|(p, _)| *p == entry.sysctl_or_prefix)
            {
                self.prefixes
                    .push((entry.sysctl_or_prefix, entry.namespace));
            }
        } else {
            self.sysctls.insert(entry.sysctl_or_prefix, entry.namespace);
        }
    }

    /// `validateSysctl`: exact entry first, then the first prefix (raw, no added dot); the host
    /// check uses the namespace recorded for the entry that matched. Only IPC (hostIPC) and Net
    /// (hostNetwork) are checked, as upstream's `validateSysctl` does: a UTS or User entry is
    /// allowed whatever the pod's host namespaces (see docs/sysctl.md, "Kubelet versions").
    pub fn validate(&self, name: &str, host_net: bool, host_ipc: bool) -> Result<(), String> {
        let name = normalize(name);
        let ns = self.sysctls.get(&name).copied().or_else(|| {
            self.prefixes
                .iter()
                .find(|(p, _)| name.starts_with(p.as_str()))
                .map(|(_, ns)| *ns)
        });
        match ns {
            Some(Namespace::Ipc) if host_ipc => Err(format!(
                "{} not allowed with host {} enabled",
                go_quote(&name),
                Namespace::Ipc
            )),
            Some(Namespace::Net) if host_net => Err(format!(
                "{} not allowed with host {} enabled",
                go_quote(&name),
                Namespace::Net
            )),
            Some(_) => Ok(()),
            None => Err(format!("{} not allowlisted", go_quote(&name))),
        }
    }

    /// `Admit`: the first forbidden sysctl, in pod order, is the rejection.
    pub fn admit(&self, spec: &PodSpec) -> Admission {
        let Some(sysctls) = spec
            .security_context
            .as_ref()
            .and_then(|s| s.sysctls.as_ref())
        else {
            return Admission::Admit;
        };
        self.admit_names(
            sysctls.iter().map(|s| s.name.as_str()),
            spec.host_network.unwrap_or(false),
            spec.host_ipc.unwrap_or(false),
        )
    }

    /// [`Allowlist::admit`] of a pod as [`PodSysctls`] keeps it.
    pub fn admit_sysctls(&self, pod: &PodSysctls) -> Admission {
        self.admit_names(
            pod.names.iter().map(String::as_str),
            pod.host_network,
            pod.host_ipc,
        )
    }

    fn admit_names<'a>(
        &self,
        names: impl IntoIterator<Item = &'a str>,
        host_net: bool,
        host_ipc: bool,
    ) -> Admission {
        for name in names {
            if let Err(e) = self.validate(name, host_net, host_ipc) {
                return Admission::Reject {
                    reason: FORBIDDEN_REASON,
                    message: format!("forbidden sysctl: {e}"),
                };
            }
        }
        Admission::Admit
    }
}

/// What the rules read of a pod, and nothing else: the names of the sysctls it sets, in pod
/// order, and whether it shares the host's network and IPC namespaces. What a cache keeps per
/// pod instead of a `PodSpec` (whose empty fields alone take over a kilobyte).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodSysctls {
    pub names: Vec<String>,
    pub host_network: bool,
    pub host_ipc: bool,
}

impl PodSysctls {
    /// None when `spec` sets no sysctl.
    pub fn of(spec: &PodSpec) -> Option<Self> {
        let sysctls = spec.security_context.as_ref()?.sysctls.as_ref()?;
        (!sysctls.is_empty()).then(|| PodSysctls {
            names: sysctls.iter().map(|s| s.name.clone()).collect(),
            host_network: spec.host_network.unwrap_or(false),
            host_ipc: spec.host_ipc.unwrap_or(false),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSecurityContext;

    fn spec(names: &[&str], host_net: bool, host_ipc: bool) -> PodSpec {
        PodSpec {
            host_network: Some(host_net),
            host_ipc: Some(host_ipc),
            security_context: Some(testkit::sysctls(names)),
            ..Default::default()
        }
    }

    fn reject(message: &str) -> Admission {
        Admission::Reject {
            reason: FORBIDDEN_REASON,
            message: message.into(),
        }
    }

    #[test]
    fn construction_errors_have_kubelet_texts() {
        assert_eq!(
            Allowlist::new(&["kernel.msg*", "foo*bar"])
                .unwrap_err()
                .to_string(),
            r#"sysctl "foo*bar" must have at most 253 characters and match regex ([a-z0-9]([-_a-z0-9]*[a-z0-9])?[\./])*([a-z0-9][-_a-z0-9]*)?[a-z0-9*]"#
        );
        assert_eq!(
            Allowlist::new(&["kernel/foo*"]).unwrap_err().to_string(),
            r#"the sysctls "kernel.foo" are not known to be namespaced"#
        );
        assert_eq!(
            Allowlist::new(&["*"]).unwrap_err(),
            PatternError::UnknownNamespace(String::new())
        );
        assert_eq!(
            Allowlist::new(&["net*"]).unwrap_err(),
            PatternError::UnknownNamespace("net".into())
        );
        assert_eq!(
            Allowlist::new(&["vm.swappiness"]).unwrap_err(),
            PatternError::UnknownNamespace("vm.swappiness".into())
        );
        let long = format!("net.{}", "a".repeat(250));
        assert_eq!(
            Allowlist::new(&[&long]).unwrap_err(),
            PatternError::Invalid(long)
        );
        assert!(Allowlist::new(&["net.*", "fs.mqueue.*", "kernel/msg*", "kernel.sem"]).is_ok());
        assert!(Allowlist::new::<&str>(&[]).is_ok());
    }

    /// kubelet v1.37's table makes `kernel.domainname` and `user.*` patterns acceptable; older
    /// kubelets refuse them as not namespaced. Neither is checked against host namespaces.
    #[test]
    fn uts_and_user_patterns_need_the_newer_table() {
        for p in ["kernel.domainname", "user.*", "user/max_user_namespaces"] {
            assert!(
                matches!(check_pattern(p), Err(PatternError::UnknownNamespace(_))),
                "{p}"
            );
            assert!(check_pattern_in(NamespaceTable::NEWEST, p).is_ok(), "{p}");
        }
        let list =
            Allowlist::new_in(NamespaceTable::NEWEST, &["kernel.domainname", "user.*"]).unwrap();
        for (host_net, host_ipc) in [(false, false), (true, true)] {
            assert_eq!(
                list.validate("kernel.domainname", host_net, host_ipc),
                Ok(())
            );
            assert_eq!(
                list.validate("user.max_user_namespaces", host_net, host_ipc),
                Ok(())
            );
        }
        assert_eq!(
            list.validate("kernel.hostname", false, false),
            Err(r#""kernel.hostname" not allowlisted"#.into())
        );
    }

    #[test]
    fn exact_then_prefix_matching() {
        let list = Allowlist::new(&[
            "kernel.msg*",
            "net.b.*",
            "kernel.shm_rmid_forced",
            "fs.mqueue.*",
        ])
        .unwrap();
        for ok in [
            "kernel.msgmax",
            "kernel.msgfoo",
            "kernel/msgmnb",
            "net.b.c",
            "net/b/c",
            "kernel.shm_rmid_forced",
            "fs.mqueue.msg_max",
        ] {
            assert_eq!(list.validate(ok, false, false), Ok(()), "{ok}");
        }
        for (bad, msg) in [
            ("net.b", r#""net.b" not allowlisted"#),
            ("kernel.sem", r#""kernel.sem" not allowlisted"#),
            (
                "kernel.shm_rmid_forced2",
                r#""kernel.shm_rmid_forced2" not allowlisted"#,
            ),
            ("foo", r#""foo" not allowlisted"#),
            (
                "net/ipv4/conf/eno2.100/rp_filter",
                r#""net.ipv4.conf.eno2/100.rp_filter" not allowlisted"#,
            ),
        ] {
            assert_eq!(list.validate(bad, false, false), Err(msg.into()), "{bad}");
        }
    }

    #[test]
    fn host_namespaces_forbid_their_sysctls() {
        let list = Allowlist::new(&[
            "kernel.shm_rmid_forced",
            "net.ipv4.ip_local_port_range",
            "kernel.msg*",
            "net.*",
        ])
        .unwrap();
        assert_eq!(
            list.validate("kernel.shm_rmid_forced", false, true),
            Err(r#""kernel.shm_rmid_forced" not allowed with host IPC enabled"#.into())
        );
        assert_eq!(list.validate("kernel.shm_rmid_forced", true, false), Ok(()));
        assert_eq!(
            list.validate("net.ipv4.ip_local_port_range", true, false),
            Err(r#""net.ipv4.ip_local_port_range" not allowed with host Net enabled"#.into())
        );
        assert_eq!(
            list.validate("net.ipv4.ip_local_port_range", false, true),
            Ok(())
        );
        assert_eq!(
            list.validate("kernel.msgfoo", false, true),
            Err(r#""kernel.msgfoo" not allowed with host IPC enabled"#.into()),
            "prefix entries carry the pattern's namespace"
        );
        assert_eq!(
            list.validate("net/core/somaxconn", true, true),
            Err(r#""net.core.somaxconn" not allowed with host Net enabled"#.into())
        );
    }

    #[test]
    fn admit_reports_the_first_forbidden_sysctl() {
        let list = Allowlist::new(&["kernel.shm_rmid_forced", "net.ipv4.tcp_syncookies"]).unwrap();
        assert_eq!(list.admit(&PodSpec::default()), Admission::Admit);
        assert_eq!(
            list.admit(&PodSpec {
                security_context: Some(PodSecurityContext::default()),
                ..Default::default()
            }),
            Admission::Admit
        );
        assert_eq!(list.admit(&spec(&[], true, true)), Admission::Admit);
        assert_eq!(
            list.admit(&spec(
                &["kernel.shm_rmid_forced", "net/ipv4/tcp_syncookies"],
                false,
                false
            )),
            Admission::Admit
        );
        assert_eq!(
            list.admit(&spec(
                &["kernel.shm_rmid_forced", "kernel.msgmax", "foo"],
                false,
                false
            )),
            reject(r#"forbidden sysctl: "kernel.msgmax" not allowlisted"#)
        );
        assert_eq!(
            list.admit(&spec(
                &["net.ipv4.tcp_syncookies", "kernel.msgmax"],
                true,
                false
            )),
            reject(
                r#"forbidden sysctl: "net.ipv4.tcp_syncookies" not allowed with host Net enabled"#
            )
        );
    }
}
