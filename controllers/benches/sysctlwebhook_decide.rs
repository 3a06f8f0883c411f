//! How long the sysctl webhook takes to decide one binding, with figures printed: every
//! binding in the cluster (outside the exempt namespaces) reaches it, since a Binding carries no
//! pod spec its matchConditions could filter on.
//!
//! cargo bench -p groundskeeper-controllers --bench sysctlwebhook_decide

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Instant;

use groundskeeper_controllers::sysctl::{
    facts::{NodeFacts, PodFacts},
    webhook::decide::decide,
};
use groundskeeper_sysctl_rules::args::PolicyArgs;
use groundskeeper_sysctl_rules::crd::{Mode, SysctlPolicy, SysctlPolicySpec};
use k8s_openapi::api::core::v1::{Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

fn time<T>(label: &str, n: u32, mut f: impl FnMut() -> T) {
    for _ in 0..n / 10 {
        black_box(f());
    }
    let start = Instant::now();
    for _ in 0..n {
        black_box(f());
    }
    let per = start.elapsed() / n;
    println!("{label:<70} {per:>10.2?} per call ({n} calls)");
}

fn pod_facts(sysctls: &[&str]) -> PodFacts {
    PodFacts::of(&Pod {
        spec: Some(PodSpec {
            security_context: Some(testkit::sysctls(sysctls)),
            ..Default::default()
        }),
        ..Default::default()
    })
}

fn main() {
    let args = PolicyArgs {
        allowed_unsafe_sysctls: vec!["net.core.somaxconn".into()],
        sysctl_default_mode: Mode::Audit,
    };
    let node = NodeFacts {
        labels: (0..20)
            .map(|i| (format!("label-{i}"), format!("v{i}")))
            .collect::<BTreeMap<_, _>>(),
        kernel: Some("6.1.0-18-amd64".into()),
        os: Some("linux".into()),
        kubelet: Some("v1.36.2".into()),
    };
    for n in [1usize, 10, 100] {
        let policies: Vec<SysctlPolicy> = (0..n)
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
                        mode: Mode::Enforce,
                    },
                )
            })
            .collect();
        let refs: Vec<&SysctlPolicy> = policies.iter().collect();
        let none = PodFacts::default();
        time(
            &format!("no sysctls ({n} policies): the common binding"),
            1_000_000,
            || decide(&args, "ns/p", &none, "n1", Some(&node), &refs),
        );
        let allowed = pod_facts(&["kernel.sem", "net.core.somaxconn"]);
        time(
            &format!("2 sysctls, allowed ({n} policies, half select the node)"),
            20_000,
            || decide(&args, "ns/p", &allowed, "n1", Some(&node), &refs),
        );
        let denied = pod_facts(&["kernel.msgmax"]);
        time(&format!("1 sysctl, denied ({n} policies)"), 20_000, || {
            decide(&args, "ns/p", &denied, "n1", Some(&node), &refs)
        });
    }
}
