//! How long admission takes per pod and how long a policy merge takes, with figures printed.
//! `cargo bench -p groundskeeper-node-agent --bench sysctl_admit`

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Instant;

use groundskeeper_node_agent::sysctlreport::allowlist::Allowlist;
use groundskeeper_node_agent::sysctlreport::crd::{Mode, SysctlPolicy, SysctlPolicySpec};
use groundskeeper_node_agent::sysctlreport::policy::merge;
use groundskeeper_node_agent::sysctlreport::safe::safe_sysctls;
use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

fn spec(names: &[&str]) -> PodSpec {
    PodSpec {
        security_context: Some(testkit::sysctls(names)),
        ..Default::default()
    }
}

fn time<T>(label: &str, n: u32, mut f: impl FnMut() -> T) {
    for _ in 0..n / 10 {
        black_box(f());
    }
    let start = Instant::now();
    for _ in 0..n {
        black_box(f());
    }
    let per = start.elapsed() / n;
    println!("{label:<60} {per:>10.2?} per call ({n} calls)");
}

fn main() {
    let kernel = "6.1.0-18-amd64".parse().unwrap();
    let mut patterns: Vec<String> = safe_sysctls(Some(&kernel))
        .into_iter()
        .map(String::from)
        .collect();
    patterns.extend((0..50).map(|i| format!("net.ipv4.conf.eth{i}.*")));
    patterns.extend(["kernel.msg*".into(), "fs.mqueue.*".into()]);
    let list = Allowlist::new(&patterns).unwrap();

    time("Allowlist::new (12 safe + 52 patterns)", 20_000, || {
        Allowlist::new(&patterns).unwrap()
    });
    let admitted = spec(&[
        "kernel.shm_rmid_forced",
        "net.ipv4.tcp_rmem",
        "net/ipv4/conf/eth49/rp_filter",
    ]);
    time(
        "admit: 3 sysctls, exact + exact + last of 52 prefixes",
        200_000,
        || list.admit(&admitted),
    );
    let rejected = spec(&["kernel.shm_rmid_forced", "vm.swappiness"]);
    time("admit: rejected (not allowlisted)", 200_000, || {
        list.admit(&rejected)
    });
    time("admit: no sysctls", 1_000_000, || {
        list.admit(&PodSpec::default())
    });

    let labels: BTreeMap<String, String> = (0..20)
        .map(|i| (format!("label-{i}"), format!("v{i}")))
        .collect();
    let policies: Vec<SysctlPolicy> = (0..100)
        .map(|i| {
            SysctlPolicy::new(
                &format!("p{i:03}"),
                SysctlPolicySpec {
                    allowed_unsafe_sysctls: vec![
                        format!("net.ipv6.conf.eth{i}.*"),
                        "kernel.sem".into(),
                    ],
                    node_selector: Some(LabelSelector {
                        match_labels: Some(
                            [(format!("label-{}", i % 40), format!("v{}", i % 40))].into(),
                        ),
                        ..Default::default()
                    }),
                    mode: if i % 2 == 0 {
                        Mode::Enforce
                    } else {
                        Mode::Audit
                    },
                },
            )
        })
        .collect();
    let refs: Vec<&SysctlPolicy> = policies.iter().collect();
    let safe = safe_sysctls(Some(&kernel));
    time(
        "merge: 100 policies (half select the node), 20 node labels",
        2_000,
        || merge(&safe, &[], Mode::Audit, &refs, &labels),
    );
}
