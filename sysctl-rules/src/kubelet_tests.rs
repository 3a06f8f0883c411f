//! Every known kubelet version × generated kernel versions × sysctl names × host namespaces ×
//! flags, judged by the crate and by an independent transcription of the upstream rules.
//!
//! The transcription below is written from the upstream files themselves (see docs/sysctl.md,
//! "Kubelet versions", for the files and tags), in their own terms: the Pod Security baseline
//! sets by version, the kernel-gate constants as strings, the namespace maps and kubelet's
//! `getSafeSysctlAllowlist` / `validateSysctl`. It shares no code with the crate's rules.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodSpec;

use crate::args::PolicyArgs;
use crate::crd::Mode;
use crate::kubelet::Kubelet;
use crate::verdict::{Verdict, node_policy_as};

/// `pod-security-admission/policy/check_sysctls.go`, `sysctlsAllowedV1Dot32` (v0.33 to v0.36).
/// The v1.38 alphas change neither the sets nor the namespace maps: v1.38 is transcribed as v1.37.
const ALLOWED_V1_DOT_32: [&str; 12] = [
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
];
/// `sysctlsAllowedV1Dot37 = sysctlsAllowedV1Dot32.Union(...)`.
const ADDED_V1_DOT_37: [&str; 2] = [
    "net.ipv4.tcp_slow_start_after_idle",
    "net.ipv4.tcp_notsent_lowat",
];

/// `pkg/util/kernel/constants.go`: the `...NamespacedKernelVersion` of each gated safe sysctl.
fn gate(name: &str) -> Option<&'static str> {
    Some(match name {
        "net.ipv4.ip_local_reserved_ports" => "3.16",
        "net.ipv4.tcp_keepalive_time" => "4.5",
        "net.ipv4.tcp_keepalive_intvl" => "4.5",
        "net.ipv4.tcp_keepalive_probes" => "4.5",
        "net.ipv4.tcp_fin_timeout" => "4.6",
        "net.ipv4.tcp_rmem" => "4.15",
        "net.ipv4.tcp_wmem" => "4.15",
        "net.ipv4.tcp_slow_start_after_idle" => "4.15",
        "net.ipv4.tcp_notsent_lowat" => "4.6",
        _ => return None,
    })
}

/// `component-helpers/node/util/sysctl/namespace.go`: `nameToNamespace`, `prefixToNamespace`.
fn namespace(minor: u64, s: &str) -> &'static str {
    let mut names = vec![
        ("kernel.sem", "IPC"),
        ("kernel.shmall", "IPC"),
        ("kernel.shmmax", "IPC"),
        ("kernel.shmmni", "IPC"),
        ("kernel.shm_rmid_forced", "IPC"),
        ("kernel.shm", "IPC"),
        ("kernel.msgmax", "IPC"),
        ("kernel.msgmnb", "IPC"),
        ("kernel.msgmni", "IPC"),
        ("kernel.msg", "IPC"),
    ];
    let mut prefixes = vec![("net", "Net"), ("fs.mqueue", "IPC")];
    if minor >= 37 {
        names.push(("kernel.domainname", "UTS"));
        prefixes.push(("user", "User"));
    }
    if let Some((_, ns)) = names.iter().find(|(n, _)| *n == s) {
        return ns;
    }
    prefixes
        .iter()
        .find(|(p, _)| s.starts_with(&format!("{p}.")))
        .map_or("", |(_, ns)| ns)
}

/// The leading dotted numbers of a kernel release, at least two (`version.ParseGeneric` on the
/// well-formed strings generated here); None for anything else.
fn kernel_numbers(s: &str) -> Option<Vec<u64>> {
    let head: String = s
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let parts: Vec<u64> = head
        .trim_end_matches('.')
        .split('.')
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    (parts.len() >= 2).then_some(parts)
}

fn at_least(k: &[u64], min: &[u64]) -> bool {
    let n = k.len().max(min.len());
    let pad = |v: &[u64]| {
        (0..n)
            .map(|i| v.get(i).copied().unwrap_or(0))
            .collect::<Vec<_>>()
    };
    pad(k) >= pad(min)
}

/// `getSafeSysctlAllowlist`, then `NewAllowlist(safe ++ flag)` and `validateSysctl`, for a
/// kubelet v1.`minor`. A flag pattern the version does not know as namespaced would stop that
/// kubelet; on its node such a pattern allows nothing.
fn upstream(
    minor: u64,
    kernel: Option<&str>,
    flag: &[&str],
    name: &str,
    host_net: bool,
    host_ipc: bool,
) -> Result<(), String> {
    let kv = kernel.and_then(kernel_numbers);
    let mut safe: Vec<&str> = ALLOWED_V1_DOT_32.to_vec();
    if minor >= 37 {
        safe.extend(ADDED_V1_DOT_37);
    }
    let safe = safe.into_iter().filter(|s| match gate(s) {
        None => true,
        Some(g) => kv
            .as_ref()
            .is_some_and(|k| at_least(k, &kernel_numbers(g).unwrap())),
    });
    let mut exact = BTreeMap::new();
    let mut prefixes = Vec::new();
    for p in safe.chain(flag.iter().copied()) {
        match p.strip_suffix('*') {
            Some(prefix) => {
                let ns = namespace(minor, prefix);
                if !ns.is_empty() {
                    prefixes.push((prefix.to_string(), ns));
                }
            }
            None => {
                let ns = namespace(minor, p);
                if !ns.is_empty() {
                    exact.insert(p.to_string(), ns);
                }
            }
        }
    }
    let ns = exact.get(name).copied().or_else(|| {
        prefixes
            .iter()
            .find(|(p, _)| name.starts_with(p.as_str()))
            .map(|(_, ns)| *ns)
    });
    match ns {
        Some("IPC") if host_ipc => Err(format!("{name:?} not allowed with host IPC enabled")),
        Some("Net") if host_net => Err(format!("{name:?} not allowed with host Net enabled")),
        Some(_) => Ok(()),
        None => Err(format!("{name:?} not allowlisted")),
    }
}

/// Kernel releases around every gate, distro strings, and none or garbage.
fn kernels() -> Vec<Option<String>> {
    let mut out: Vec<Option<String>> = vec![None, Some("linux".into()), Some("".into())];
    for g in ["3.16", "4.5", "4.6", "4.15"] {
        let v = kernel_numbers(g).unwrap();
        let (major, minor) = (v[0], v[1]);
        out.push(Some(format!("{major}.{}.99", minor - 1)));
        out.push(Some(format!("{major}.{minor}")));
        out.push(Some(format!("{major}.{minor}.0-1-generic")));
        out.push(Some(format!("{major}.{}", minor + 1)));
    }
    for k in [
        "3.10.0-1160.el7.x86_64",
        "4.14.300",
        "4.19.0+",
        "5.4.0-150-generic",
        "5.14.0-427.el9.x86_64",
        "6.1.0-18-amd64",
        "6.6.87.2-microsoft-standard-WSL2",
    ] {
        out.push(Some(k.into()));
    }
    out
}

fn names() -> Vec<&'static str> {
    let mut n: Vec<&str> = ALLOWED_V1_DOT_32
        .iter()
        .chain(&ADDED_V1_DOT_37)
        .copied()
        .collect();
    n.extend([
        "kernel.msgmax",
        "kernel.sem",
        "kernel.shmmax",
        "fs.mqueue.msg_max",
        "net.core.somaxconn",
        "net.ipv4.tcp_congestion_control",
        "kernel.domainname",
        "kernel.hostname",
        "user.max_user_namespaces",
        "vm.swappiness",
    ]);
    n
}

fn spec(name: &str, host_net: bool, host_ipc: bool) -> PodSpec {
    PodSpec {
        host_network: Some(host_net),
        host_ipc: Some(host_ipc),
        security_context: Some(testkit::sysctls(&[name])),
        ..Default::default()
    }
}

#[test]
fn every_version_kernel_and_name_is_judged_as_upstream() {
    let flags: [&[&str]; 3] = [
        &[],
        &["kernel.domainname", "user.*", "kernel.msg*"],
        &["net.core.*", "kernel.sem"],
    ];
    let mut checked = 0;
    for minor in 33..=38 {
        for reported in [format!("v1.{minor}.0"), format!("v1.{minor}.7-eks-4d1a2b")] {
            let judged = Kubelet::from_reported(Some(&reported));
            assert_eq!(judged.assumed, None, "{reported}");
            for kernel in kernels() {
                let parsed = kernel.as_deref().and_then(|k| k.parse().ok());
                for flag in flags {
                    let args = PolicyArgs {
                        allowed_unsafe_sysctls: flag.iter().map(|s| s.to_string()).collect(),
                        sysctl_default_mode: Mode::Enforce,
                    };
                    let node = node_policy_as(
                        judged.kubelet,
                        &args,
                        parsed.as_ref(),
                        &[],
                        &BTreeMap::new(),
                    );
                    for name in names() {
                        for (net, ipc) in
                            [(false, false), (true, false), (false, true), (true, true)]
                        {
                            let want = upstream(minor, kernel.as_deref(), flag, name, net, ipc)
                                .map_or_else(
                                    |e| Verdict::Forbidden {
                                        mode: Mode::Enforce,
                                        message: format!("forbidden sysctl: {e}"),
                                    },
                                    |()| Verdict::Allowed,
                                );
                            assert_eq!(
                                node.verdict(Some(&spec(name, net, ipc))),
                                want,
                                "kubelet {reported}, kernel {kernel:?}, flag {flag:?}, {name}, \
                                 hostNetwork {net}, hostIPC {ipc}"
                            );
                            checked += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 20_000, "{checked}");
}

/// The two v1.37 additions are where the versions part: on a kernel that namespaces them,
/// v1.33 to v1.36 forbid both and v1.37 and v1.38 allow both; every other safe sysctl is judged
/// alike.
#[test]
fn versions_differ_only_by_the_v1_37_additions() {
    for kernel in kernels() {
        for name in ALLOWED_V1_DOT_32 {
            let judged: Vec<bool> = (33..=38)
                .map(|m| upstream(m, kernel.as_deref(), &[], name, false, false).is_ok())
                .collect();
            assert!(judged.windows(2).all(|w| w[0] == w[1]), "{name} {kernel:?}");
        }
    }
    for name in ADDED_V1_DOT_37 {
        for minor in 33..=36 {
            assert!(upstream(minor, Some("6.1"), &[], name, false, false).is_err());
        }
        for minor in 37..=38 {
            assert!(upstream(minor, Some("6.1"), &[], name, false, false).is_ok());
        }
    }
}
