use std::collections::HashMap;

use clap::Parser;

use super::*;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    s: ConntrackSysctlArgs,
}

fn args(flags: &[&str]) -> ConntrackSysctlArgs {
    Cli::try_parse_from(std::iter::once("x").chain(flags.iter().copied()))
        .unwrap()
        .s
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
        let e = Cli::try_parse_from(std::iter::once("x").chain(flags.iter().copied()))
            .err()
            .unwrap_or_else(|| panic!("{flags:?} accepted"))
            .to_string();
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
