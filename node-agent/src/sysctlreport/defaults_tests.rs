//! The node's default pod sysctls in the worker: judged once the Node's kubelet version is
//! known, each one the node can not apply flagged on the Node once per change of its judgement,
//! its Event retried when refused, nothing written under dry-run.

use groundskeeper_plumbing::watch::cache::Update;
use groundskeeper_sysctl_rules::defaults::{Effect, parse};
use groundskeeper_sysctl_rules::names::Namespace;

use super::apply::DEFAULT_UNAVAILABLE_REASON;
use super::cache::{Change, NodeFacts};
use super::crd::Mode;
use super::decide::{default_event_name, default_note};
use super::worker::Settings;
use super::worker_tests::{Rig, Write};

const NODE: &str = "node-a";
const DEFAULTS: &str =
    "net.core.somaxconn=1024,net.ipv4.tcp_rmem=4096 87380 6291456,vm.swappiness=10";
const RMEM_WHY: &str = "not in the pod's Net namespace on kernel 4.14.0 (from 4.15 on): kubelet \
                        fails the sandbox of every pod it applies to (pods without hostNetwork)";

/// A worker on a 4.14 kernel with [`DEFAULTS`], its watches listed, its Node not read yet.
fn rig(dry_run: bool) -> Rig {
    let settings = Settings {
        node_name: NODE.into(),
        kernel: "4.14.0".parse().ok(),
        flag: vec![],
        default_mode: Mode::Audit,
        defaults: parse(DEFAULTS).unwrap(),
    };
    let rig = Rig::unlisted_with(settings, dry_run);
    rig.set_healthy(true);
    rig
}

/// The Node watch delivers the Node with this kubelet version.
async fn kubelet(r: &mut Rig, version: &str) {
    let facts = NodeFacts {
        kubelet: Some(version.into()),
        ..Default::default()
    };
    r.cache
        .lock()
        .nodes
        .apply(Update::Apply(NODE.into(), facts));
    r.worker.on_change(Change::Merge).await;
}

/// The Warning Event on the Node for `sysctl`, unavailable because `why`.
fn flagged(sysctl: &str, why: &str) -> Write {
    Write::Event {
        pod: NODE.into(),
        reason: DEFAULT_UNAVAILABLE_REASON.into(),
        action: "Check".into(),
        note: format!(
            "default pod sysctl \"{sysctl}\" (kubelet defaultPodSysctls) can not be applied on \
             this node: {why}"
        ),
    }
}

fn not_namespaced(minor: u64) -> String {
    format!(
        "not a namespaced sysctl for kubelet v1.{minor}: that kubelet refuses a configuration \
         setting it as a default (it does not start), and no pod sandbox can take it"
    )
}

fn gauge(r: &Rig, sysctl: &str, state: &str) -> i64 {
    r.metrics
        .default_pod_sysctls
        .with_label_values(&[sysctl, state])
        .get()
}

#[tokio::test]
async fn a_default_the_node_can_not_apply_is_flagged_once_per_judgement() {
    let mut r = rig(false);
    kubelet(&mut r, "v1.37.0").await;
    assert_eq!(
        r.fake.take(),
        [
            flagged("net.ipv4.tcp_rmem", RMEM_WHY),
            flagged("vm.swappiness", &not_namespaced(37)),
        ]
    );
    assert_eq!(gauge(&r, "net.core.somaxconn", "applied"), 1);
    assert_eq!(gauge(&r, "net.core.somaxconn", "unavailable"), 0);
    assert_eq!(gauge(&r, "net.ipv4.tcp_rmem", "unavailable"), 1);
    assert_eq!(gauge(&r, "net.ipv4.tcp_rmem", "applied"), 0);

    // The same judgement again (a relabel, a relist, ticks): nothing more.
    kubelet(&mut r, "v1.37.2").await;
    r.worker.on_change(Change::PodsListed).await;
    r.worker.on_tick().await;
    r.worker.on_tick().await;
    assert_eq!(r.fake.take(), []);

    // v1.38: only the judgement naming the kubelet changed.
    kubelet(&mut r, "v1.38.0").await;
    assert_eq!(
        r.fake.take(),
        [flagged("vm.swappiness", &not_namespaced(38))]
    );

    // A kubelet without defaultPodSysctls applies none: nothing to flag, each one ignored.
    kubelet(&mut r, "v1.36.2").await;
    assert_eq!(r.fake.take(), []);
    for sysctl in ["net.core.somaxconn", "net.ipv4.tcp_rmem", "vm.swappiness"] {
        assert_eq!(gauge(&r, sysctl, "ignored"), 1, "{sysctl}");
        assert_eq!(gauge(&r, sysctl, "unavailable"), 0, "{sysctl}");
    }
    // Upgraded again: a changed judgement, flagged again.
    kubelet(&mut r, "v1.37.0").await;
    assert_eq!(r.fake.take().len(), 2);
    assert_eq!(r.metrics.checked.get(), 0, "no pod was judged");
}

#[tokio::test]
async fn a_refused_flag_is_retried_on_the_tick() {
    let mut r = rig(false);
    r.fake.fail_next(500);
    kubelet(&mut r, "v1.37.0").await;
    assert_eq!(
        r.fake.take(),
        [flagged("vm.swappiness", &not_namespaced(37))],
        "the first Event was refused"
    );
    assert_eq!(
        r.metrics
            .write_errors
            .with_label_values(&["server_error"])
            .get(),
        1
    );
    r.worker.on_tick().await;
    assert_eq!(r.fake.take(), [flagged("net.ipv4.tcp_rmem", RMEM_WHY)]);
    r.worker.on_tick().await;
    assert_eq!(r.fake.take(), [], "done: no more retries");
}

#[tokio::test]
async fn dry_run_flags_nothing_but_counts() {
    let mut r = rig(true);
    kubelet(&mut r, "v1.37.0").await;
    r.worker.on_tick().await;
    assert_eq!(r.fake.take(), []);
    assert_eq!(gauge(&r, "vm.swappiness", "unavailable"), 1);
}

/// Before the Node is read nothing is judged: the kubelet's version decides.
#[tokio::test]
async fn nothing_is_judged_before_the_node_is_read() {
    let mut r = rig(false);
    r.cache.lock().nodes.apply(Update::Delete(NODE.into()));
    r.worker.on_change(Change::Merge).await;
    assert_eq!(r.fake.take(), []);
    assert_eq!(gauge(&r, "vm.swappiness", "unavailable"), 0);
}

#[test]
fn default_event_names_are_stable_distinct_and_valid() {
    let note = default_note("vm.swappiness", &Effect::Applied(Namespace::Net));
    let a = default_event_name(NODE, "vm.swappiness", &note);
    assert_eq!(a, default_event_name(NODE, "vm.swappiness", &note));
    assert!(a.starts_with("node-a.default-sysctl-"), "{a}");
    assert_ne!(a, default_event_name(NODE, "kernel.sem", &note));
    assert_ne!(a, default_event_name(NODE, "vm.swappiness", "another note"));
    assert_ne!(a, default_event_name("node-b", "vm.swappiness", &note));
    let long = format!("{}-{}", "a".repeat(220), "b".repeat(30));
    let n = default_event_name(&long, "vm.swappiness", &note);
    assert!(n.len() <= 253 && !n.contains("-.default"), "{n}");
    assert!(default_event_name("", "x", "y").starts_with("node.default-sysctl-"));
    // The longest name and reason still make a note the apiserver takes (1024 bytes).
    let name = format!("net.{}", "a".repeat(249));
    let why = groundskeeper_sysctl_rules::defaults::effect_of(
        &name,
        groundskeeper_sysctl_rules::kubelet::Kubelet::NEWEST,
        None,
    );
    assert!(default_note(&name, &why).len() <= 1024);
}
