//! The safe sysctls (kubelet `SafeSysctlAllowlist`, v1.33 to v1.38) and their kernel gates.
//!
//! In upstream order, each with the first kernel that namespaces it. Order matters: it is the
//! order of the merged allowlist and of what the agent logs. Which kubelet version has which
//! list is `kubelet.rs`'s; where each fact comes from is in docs/sysctl.md.

use super::kernel::KernelVersion;

/// One safe sysctl and, when the kernel only namespaces it from some release on, that release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SafeSysctl {
    pub name: &'static str,
    pub min_kernel: Option<(u64, u64)>,
}

const fn always(name: &'static str) -> SafeSysctl {
    SafeSysctl {
        name,
        min_kernel: None,
    }
}

const fn from(name: &'static str, major: u64, minor: u64) -> SafeSysctl {
    SafeSysctl {
        name,
        min_kernel: Some((major, minor)),
    }
}

/// Kubelet v1.33 to v1.36's list, with the `pkg/util/kernel/constants.go` gates.
pub const SAFE_SYSCTLS: [SafeSysctl; 12] = [
    always("kernel.shm_rmid_forced"),
    always("net.ipv4.ip_local_port_range"),
    always("net.ipv4.tcp_syncookies"),
    always("net.ipv4.ping_group_range"),
    always("net.ipv4.ip_unprivileged_port_start"),
    from("net.ipv4.ip_local_reserved_ports", 3, 16),
    from("net.ipv4.tcp_keepalive_time", 4, 5),
    from("net.ipv4.tcp_fin_timeout", 4, 6),
    from("net.ipv4.tcp_keepalive_intvl", 4, 5),
    from("net.ipv4.tcp_keepalive_probes", 4, 5),
    from("net.ipv4.tcp_rmem", 4, 15),
    from("net.ipv4.tcp_wmem", 4, 15),
];

/// Kubelet v1.37's list (and v1.38's, unchanged): v1.36's and two more. The kernel gates are the code's
/// (`TCPSlowStartAfterIdleNamespacedKernelVersion = "4.15"`,
/// `TCPNotSentLowatNamespacedKernelVersion = "4.6"`), not the "4.7" of a commit message.
pub const SAFE_SYSCTLS_V1_37: [SafeSysctl; 14] = [
    always("kernel.shm_rmid_forced"),
    always("net.ipv4.ip_local_port_range"),
    always("net.ipv4.tcp_syncookies"),
    always("net.ipv4.ping_group_range"),
    always("net.ipv4.ip_unprivileged_port_start"),
    from("net.ipv4.ip_local_reserved_ports", 3, 16),
    from("net.ipv4.tcp_keepalive_time", 4, 5),
    from("net.ipv4.tcp_fin_timeout", 4, 6),
    from("net.ipv4.tcp_keepalive_intvl", 4, 5),
    from("net.ipv4.tcp_keepalive_probes", 4, 5),
    from("net.ipv4.tcp_rmem", 4, 15),
    from("net.ipv4.tcp_wmem", 4, 15),
    from("net.ipv4.tcp_slow_start_after_idle", 4, 15),
    from("net.ipv4.tcp_notsent_lowat", 4, 6),
];

/// The safe sysctls this kernel namespaces. An unknown kernel (`None`: the version could not be
/// read or parsed) keeps only the ungated ones, as kubelet does; it never fails start-up. Pure:
/// the webhook computes it per node and request; [`dropped`] says what to log once.
pub fn safe_sysctls(kernel: Option<&KernelVersion>) -> Vec<&'static str> {
    safe_sysctls_of(&SAFE_SYSCTLS, kernel)
}

/// [`safe_sysctls`] of another kubelet version's `list`.
pub fn safe_sysctls_of(list: &[SafeSysctl], kernel: Option<&KernelVersion>) -> Vec<&'static str> {
    list.iter()
        .filter(|s| gate(s, kernel).is_none())
        .map(|s| s.name)
        .collect()
}

/// The safe sysctls this kernel does not get, each with kubelet's reason ("kernel version is
/// too old" with the gate, or "kernel version is unknown"), for the start-up log.
pub fn dropped(kernel: Option<&KernelVersion>) -> Vec<(&'static str, String)> {
    dropped_of(&SAFE_SYSCTLS, kernel)
}

/// [`dropped`] of another kubelet version's `list`.
pub fn dropped_of(
    list: &[SafeSysctl],
    kernel: Option<&KernelVersion>,
) -> Vec<(&'static str, String)> {
    list.iter()
        .filter_map(|s| gate(s, kernel).map(|why| (s.name, why)))
        .collect()
}

/// Why `s` is not available on `kernel`, or None when it is.
fn gate(s: &SafeSysctl, kernel: Option<&KernelVersion>) -> Option<String> {
    match (s.min_kernel, kernel) {
        (None, _) => None,
        (Some((major, minor)), Some(k)) => (!k.at_least(&KernelVersion::new(&[major, minor])))
            .then(|| format!("kernel version {k} is too old (needs {major}.{minor})")),
        (Some(_), None) => Some("kernel version is unknown".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(kernel: &str) -> Vec<&'static str> {
        safe_sysctls(Some(&kernel.parse().unwrap()))
    }

    const UNGATED: [&str; 5] = [
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_unprivileged_port_start",
    ];

    #[test]
    fn gates_follow_the_kernel_in_upstream_order() {
        let all: Vec<&str> = SAFE_SYSCTLS.iter().map(|s| s.name).collect();
        assert_eq!(on("6.1.0-18-amd64"), all);
        assert_eq!(on("4.15"), all, "4.15 is the last gate, inclusive");
        let mut want = UNGATED.to_vec();
        want.extend([
            "net.ipv4.ip_local_reserved_ports",
            "net.ipv4.tcp_keepalive_time",
            "net.ipv4.tcp_fin_timeout",
            "net.ipv4.tcp_keepalive_intvl",
            "net.ipv4.tcp_keepalive_probes",
        ]);
        assert_eq!(on("4.14.300"), want);
        assert_eq!(on("4.6.0"), want);
        want.retain(|s| *s != "net.ipv4.tcp_fin_timeout");
        assert_eq!(on("4.5.7"), want);
        assert_eq!(
            on("3.18.0-957.27.2.el7.x86_64"),
            [&UNGATED[..], &["net.ipv4.ip_local_reserved_ports"]].concat()
        );
        assert_eq!(
            on("3.16"),
            [&UNGATED[..], &["net.ipv4.ip_local_reserved_ports"]].concat()
        );
        assert_eq!(on("3.15.9"), UNGATED.to_vec());
    }

    /// v1.37 appends two gated entries and changes nothing before them.
    #[test]
    fn v1_37_extends_the_list() {
        assert_eq!(SAFE_SYSCTLS_V1_37[..12], SAFE_SYSCTLS);
        let k = |s: &str| s.parse::<KernelVersion>().unwrap();
        let on = |s: &str| safe_sysctls_of(&SAFE_SYSCTLS_V1_37, Some(&k(s)));
        assert!(on("4.15").contains(&"net.ipv4.tcp_slow_start_after_idle"));
        assert!(!on("4.14.300").contains(&"net.ipv4.tcp_slow_start_after_idle"));
        assert!(on("4.6").contains(&"net.ipv4.tcp_notsent_lowat"));
        assert!(!on("4.5.7").contains(&"net.ipv4.tcp_notsent_lowat"));
        assert_eq!(
            safe_sysctls_of(&SAFE_SYSCTLS_V1_37, None),
            safe_sysctls(None),
            "an unknown kernel gets no gated entry of either list"
        );
    }

    #[test]
    fn unknown_kernel_keeps_only_ungated() {
        assert_eq!(safe_sysctls(None), UNGATED.to_vec());
        assert_eq!(dropped(None).len(), SAFE_SYSCTLS.len() - UNGATED.len());
    }

    #[test]
    fn dropped_names_the_gate() {
        assert!(dropped(Some(&"6.1".parse().unwrap())).is_empty());
        assert_eq!(
            dropped(Some(&"4.14.300".parse().unwrap())),
            vec![
                (
                    "net.ipv4.tcp_rmem",
                    "kernel version 4.14.300 is too old (needs 4.15)".to_string()
                ),
                (
                    "net.ipv4.tcp_wmem",
                    "kernel version 4.14.300 is too old (needs 4.15)".to_string()
                ),
            ]
        );
    }
}
