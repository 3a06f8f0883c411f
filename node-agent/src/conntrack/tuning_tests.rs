//! Tests of the conntrack sysctls: the plan, the writes under temp roots, dry-run, the hints.

use std::collections::HashMap;

use super::tuning::*;

#[test]
fn a_failed_write_says_what_was_tried_and_why() {
    let all = Some(u64::MAX);
    let no_net_admin = Some(!(1u64 << CAP_NET_ADMIN));
    let ro = write_hint(Some(libc::EROFS), Some(0o100644), all);
    assert!(ro.contains("mounted read-only"), "{ro}");
    // Privileged, but the kernel's file is 0444: not a privilege problem.
    let kernel = write_hint(Some(libc::EACCES), Some(0o100444), all);
    assert!(kernel.contains("read-only here, mode 444"), "{kernel}");
    assert!(!kernel.contains("lacks"), "{kernel}");
    let caps = write_hint(Some(libc::EPERM), Some(0o100644), no_net_admin);
    assert!(caps.contains("lacks CAP_NET_ADMIN"), "{caps}");
    let other = write_hint(Some(libc::EPERM), Some(0o100644), all);
    assert!(other.contains("security module"), "{other}");
    assert_eq!(write_hint(Some(libc::ENOENT), None, all), "");
}

fn args(flags: &[&str]) -> ConntrackSysctlArgs {
    testkit::cli::args(flags).unwrap()
}

#[test]
fn max_is_per_core_times_cores_floored_at_min() {
    assert_eq!(conntrack_max(32768, 131072, 2), 131072);
    assert_eq!(conntrack_max(32768, 131072, 8), 262144);
    assert_eq!(conntrack_max(32768, 0, 1), 32768);
}

#[test]
fn nothing_is_written_without_flags() {
    assert!(plan(&args(&[]), 4, |_, _| None).is_empty());
    // --conntrack-min alone does nothing either (as kube-proxy: max only with per-core).
    assert!(plan(&args(&["--conntrack-min", "5"]), 4, |_, _| None).is_empty());
}

#[test]
fn plan_writes_only_what_differs_and_grows_the_hash() {
    let a = args(&[
        "--conntrack-max-per-core",
        "65536",
        "--conntrack-tcp-timeout-established",
        "24h",
        "--conntrack-tcp-timeout-close-wait",
        "1h",
        "--conntrack-tcp-be-liberal",
        "--conntrack-udp-timeout",
        "30s",
        "--conntrack-udp-timeout-stream",
        "2m",
    ]);
    let current: HashMap<&str, u64> = [
        ("net/netfilter/nf_conntrack_tcp_timeout_close_wait", 3600),
        (HASHSIZE, 1024),
    ]
    .into();
    let w = plan(&a, 4, |p, _| current.get(p).copied());
    let got: Vec<(&str, u64, bool)> = w.iter().map(|w| (w.path, w.value, w.sysfs)).collect();
    assert_eq!(
        got,
        vec![
            (NF_CONNTRACK_MAX, 262144, false),
            (
                "net/netfilter/nf_conntrack_tcp_timeout_established",
                86400,
                false
            ),
            ("net/netfilter/nf_conntrack_udp_timeout", 30, false),
            ("net/netfilter/nf_conntrack_udp_timeout_stream", 120, false),
            ("net/netfilter/nf_conntrack_tcp_be_liberal", 1, false),
            (HASHSIZE, 65536, true),
        ]
    );
    // A hash table already big enough is left alone.
    let w = plan(&a, 4, |p, _| (p == HASHSIZE).then_some(65536));
    assert!(w.iter().all(|w| w.path != HASHSIZE));
}

#[test]
fn a_higher_max_is_left_alone_unless_lowering_is_allowed() {
    let flags = ["--conntrack-max-per-core", "32768"];
    // 4 cores: computed 131072 (the floor); the node runs with 1048576.
    let current = |p: &str, _| match p {
        NF_CONNTRACK_MAX => Some(1_048_576),
        HASHSIZE => Some(262_144),
        _ => None,
    };
    let w = plan(&args(&flags), 4, current);
    assert!(w.is_empty(), "nothing lowered: {w:?}");
    let lower = args(&[flags[0], flags[1], "--conntrack-max-allow-lower"]);
    let w = plan(&lower, 4, current);
    assert_eq!(
        w,
        vec![Write {
            path: NF_CONNTRACK_MAX,
            value: 131072,
            sysfs: false
        }]
    );
    // A lower current value is raised either way; an unreadable one is written.
    for a in [args(&flags), lower] {
        let w = plan(&a, 8, |p, _| (p == NF_CONNTRACK_MAX).then_some(65536));
        assert_eq!(w[0].value, 262144);
        let w = plan(&a, 8, |_, _| None);
        assert_eq!(w[0].value, 262144);
    }
}

#[test]
fn cpu_lists_are_counted_like_the_kernel_writes_them() {
    let cases = [
        ("0", Some(1)),
        ("0-1\n", Some(2)),
        ("0-3,8,10-11", Some(7)),
        ("", None),
        ("3-1", None),
        ("a-b", None),
    ];
    for (list, want) in cases {
        assert_eq!(count_cpu_list(list), want, "{list:?}");
    }
    assert!(online_cpus() >= 1);
}

/// A CPU limit on the agent (here its affinity, as a cpuset or a CPU manager gives it; a
/// CFS quota acts on `available_parallelism` the same way) must not shrink the node's
/// table: nf_conntrack_max counts the machine's online CPUs, as kube-proxy does.
#[test]
fn a_cpu_limit_on_the_agent_does_not_shrink_the_table() {
    let online = online_cpus();
    if online < 2 {
        testkit::skipped(
            "a_cpu_limit_on_the_agent_does_not_shrink_the_table",
            "needs 2 online CPUs",
        );
        return;
    }
    let (dir, roots, _) = fixture("gk-sysctl-cpus", "sys");
    let a = args(&["--conntrack-max-per-core", "100000", "--conntrack-min", "1"]);
    let written = std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: a zeroed cpu_set_t with CPU 0 set, for this thread only.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(0, &mut set);
                assert_eq!(
                    libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set),
                    0
                );
            }
            assert_eq!(
                std::thread::available_parallelism().unwrap().get(),
                1,
                "the limit is in place"
            );
            apply_and_log(&a, &roots, false);
            roots.read(NF_CONNTRACK_MAX, false)
        })
        .join()
        .unwrap()
    });
    assert_eq!(written, Some(100000 * online as u64));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn be_liberal_takes_an_optional_value() {
    assert!(args(&["--conntrack-tcp-be-liberal"]).conntrack_tcp_be_liberal);
    assert!(args(&["--conntrack-tcp-be-liberal=true"]).conntrack_tcp_be_liberal);
    assert!(!args(&["--conntrack-tcp-be-liberal=false"]).conntrack_tcp_be_liberal);
    assert!(plan(&args(&["--conntrack-tcp-be-liberal=false"]), 1, |_, _| None).is_empty());
}

#[test]
fn invalid_values_are_rejected_naming_them() {
    let cases: [&[&str]; 4] = [
        &["--conntrack-max-per-core", "0"],
        &["--conntrack-udp-timeout", "0s"],
        &["--conntrack-udp-timeout", "1500ms"],
        &["--conntrack-tcp-timeout-established", "soon"],
    ];
    for flags in cases {
        let e = testkit::cli::args::<ConntrackSysctlArgs>(flags)
            .err()
            .unwrap_or_else(|| panic!("{flags:?} accepted"));
        assert!(e.contains(flags[1]), "{flags:?}: {e}");
    }
}

/// A /proc/sys under a temp dir holding nf_conntrack_max 65536 and a 30 s UDP timeout, roots
/// with /sys at `sys` (not created), and flags that change both.
fn fixture(name: &str, sys: &str) -> (std::path::PathBuf, Roots, ConntrackSysctlArgs) {
    let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let nf = dir.join("proc/net/netfilter");
    std::fs::create_dir_all(&nf).unwrap();
    std::fs::write(nf.join("nf_conntrack_max"), "65536\n").unwrap();
    std::fs::write(nf.join("nf_conntrack_udp_timeout"), "30\n").unwrap();
    let roots = Roots {
        proc_sys: dir.join("proc"),
        sys: dir.join(sys),
    };
    let a = args(&[
        "--conntrack-max-per-core",
        "100000",
        "--conntrack-udp-timeout",
        "60s",
    ]);
    (dir, roots, a)
}

#[test]
fn apply_writes_under_the_roots_and_reports_read_only_paths() {
    // No such /sys directory: the hashsize write fails and is reported with its path.
    let (dir, roots, a) = fixture("gk-sysctl", "missing-sys");
    let (done, errors) = apply(&a, 2, &roots);
    assert_eq!(done.len(), 2);
    assert_eq!(roots.read(NF_CONNTRACK_MAX, false), Some(200000));
    assert_eq!(
        roots.read("net/netfilter/nf_conntrack_udp_timeout", false),
        Some(60)
    );
    assert_eq!(errors.len(), 1);
    let msg = errors[0].to_string();
    assert!(
        msg.contains("missing-sys/module/nf_conntrack/parameters/hashsize"),
        "{msg}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn dry_run_plans_but_writes_nothing() {
    let (dir, roots, a) = fixture("gk-sysctl-dry", "sys");
    let planned = apply_and_log(&a, &roots, true);
    assert!(
        planned.iter().any(|w| w.path == NF_CONNTRACK_MAX),
        "{planned:?}"
    );
    assert_eq!(roots.read(NF_CONNTRACK_MAX, false), Some(65536));
    assert_eq!(
        roots.read("net/netfilter/nf_conntrack_udp_timeout", false),
        Some(30)
    );
    assert!(!dir.join("sys").exists(), "nothing created under /sys");
    let _ = std::fs::remove_dir_all(&dir);
}
