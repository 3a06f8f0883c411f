//! The four upstream passes, on hand-built snapshots.

use std::{collections::HashSet, sync::Arc};

use super::decide::*;
use crate::podgc::facts::{
    NodeFacts, Phase, PodFacts,
    example::{self, at, evicted, terminating},
};

fn pod(name: &str, phase: Phase, node: Option<&str>, created: i64) -> PodFacts {
    PodFacts {
        node_name: node.map(Arc::from),
        created: at(created).into(),
        ..example::pod("ns", name, phase)
    }
}

fn names(ds: &[Deletion]) -> Vec<&str> {
    ds.iter().map(|d| d.pod.name()).collect()
}

fn node(ready: bool, out_of_service: bool) -> NodeFacts {
    NodeFacts {
        ready,
        out_of_service,
    }
}

fn snapshot(pods: Vec<PodFacts>, nodes: &[(&str, NodeFacts)]) -> Snapshot {
    Snapshot {
        pods: pods.into_iter().map(Arc::new).collect(),
        nodes: nodes.iter().map(|(n, f)| (Arc::from(*n), *f)).collect(),
        namespaces: Default::default(),
    }
}

#[test]
fn threshold_arithmetic() {
    let table = [
        (0, 12500, 0),
        (12500, 12500, 0),
        (12501, 12500, 1),
        (20000, 12500, 7500),
        (5, 3, 2),
        (5, 0, 0),
        (5, -1, 0),
        (5, i64::MAX, 0),
    ];
    for (terminated, threshold, excess) in table {
        assert_eq!(
            over_threshold(terminated, threshold),
            excess,
            "{terminated} terminated, threshold {threshold}"
        );
    }
}

#[test]
fn sort_order_evicted_then_oldest_then_name() {
    let mut pods = [
        pod("young", Phase::Failed, None, 30),
        pod("b-same", Phase::Succeeded, None, 10),
        pod("a-same", Phase::Succeeded, None, 10),
        evicted(pod("evicted-young", Phase::Failed, None, 50)),
        pod("old", Phase::Failed, None, 0),
        evicted(pod("evicted-old", Phase::Failed, None, 40)),
    ];
    pods.sort_by(eviction_then_age);
    let order: Vec<&str> = pods.iter().map(|p| p.name()).collect();
    assert_eq!(
        order,
        [
            "evicted-old",
            "evicted-young",
            "old",
            "a-same",
            "b-same",
            "young"
        ]
    );
}

#[test]
fn terminated_deletes_the_excess_oldest_and_keeps_the_newest() {
    let pods = vec![
        pod("new", Phase::Succeeded, Some("n"), 100),
        pod("old", Phase::Succeeded, Some("n"), 1),
        pod("mid", Phase::Failed, Some("n"), 50),
        pod("running-old", Phase::Running, Some("n"), 0),
    ];
    let ds = terminated(&pods, 1);
    assert_eq!(names(&ds), ["old", "mid"]);
    assert!(ds.iter().all(|d| d.pass == Sweep::Terminated));
    assert!(ds[0].why.contains("threshold of 1"), "{}", ds[0].why);
}

#[test]
fn terminated_counts_which_phases() {
    // Terminated: Succeeded, Failed, empty. Never: Pending, Running, Unknown.
    let pods = vec![
        pod("pending", Phase::Pending, None, 0),
        pod("running", Phase::Running, None, 0),
        pod("unknown", Phase::Unknown, None, 0),
        pod("empty", Phase::Other, None, 3),
        pod("succeeded", Phase::Succeeded, None, 2),
        pod("failed", Phase::Failed, None, 1),
    ];
    assert_eq!(names(&terminated(&pods, 1)), ["failed", "succeeded"]);
    assert_eq!(
        names(&terminated(&pods, 3)),
        Vec::<&str>::new(),
        "at the threshold"
    );
}

#[test]
fn terminated_pass_disabled_or_below_threshold() {
    let pods: Vec<_> = (0..5)
        .map(|i| pod(&format!("p{i}"), Phase::Succeeded, None, i))
        .collect();
    assert!(terminated(&pods, 0).is_empty(), "0 disables");
    assert!(terminated(&pods, -5).is_empty(), "negative disables");
    assert!(terminated(&pods, 5).is_empty());
    assert!(terminated(&pods, 6).is_empty());
    assert_eq!(names(&terminated(&pods, 4)), ["p0"]);
}

#[test]
fn terminating_pods_still_count_for_the_threshold() {
    let pods = vec![
        terminating(pod("already-going", Phase::Succeeded, None, 0)),
        pod("newer", Phase::Succeeded, None, 1),
    ];
    assert_eq!(names(&terminated(&pods, 1)), ["already-going"]);
}

#[test]
fn out_of_service_needs_terminating_not_ready_and_taint() {
    let s = snapshot(
        vec![
            terminating(pod("chosen", Phase::Running, Some("oos"), 5)),
            terminating(evicted(pod(
                "chosen-evicted",
                Phase::Failed,
                Some("oos"),
                9,
            ))),
            pod("not-terminating", Phase::Running, Some("oos"), 0),
            terminating(pod("ready-tainted", Phase::Running, Some("ready-oos"), 0)),
            terminating(pod("not-ready-untainted", Phase::Running, Some("down"), 0)),
            terminating(pod("unknown-node", Phase::Running, Some("nowhere"), 0)),
            terminating(pod("unscheduled", Phase::Pending, None, 0)),
        ],
        &[
            ("oos", node(false, true)),
            ("ready-oos", node(true, true)),
            ("down", node(false, false)),
        ],
    );
    let ds = out_of_service(&s);
    assert_eq!(names(&ds), ["chosen-evicted", "chosen"]);
    assert!(ds.iter().all(|d| d.pass == Sweep::OutOfService));
    assert!(ds[0].why.contains("node oos"), "{}", ds[0].why);
}

#[test]
fn missing_nodes_are_the_unknown_bound_ones() {
    let s = snapshot(
        vec![
            pod("a", Phase::Running, Some("live"), 0),
            pod("b", Phase::Running, Some("gone"), 0),
            pod("c", Phase::Succeeded, Some("gone"), 0),
            pod("d", Phase::Pending, None, 0),
        ],
        &[("live", node(true, false))],
    );
    let missing: Vec<String> = missing_nodes(&s).iter().map(|n| n.to_string()).collect();
    assert_eq!(missing, ["gone"], "unscheduled pods are never quarantined");
}

#[test]
fn orphaned_only_on_confirmed_gone_nodes_any_phase() {
    let pods = vec![
        pod("on-live", Phase::Running, Some("live"), 0),
        pod("on-gone", Phase::Running, Some("gone"), 0),
        terminating(pod("on-gone-done", Phase::Succeeded, Some("gone"), 0)),
        pod("on-unconfirmed", Phase::Running, Some("maybe"), 0),
        pod("unscheduled", Phase::Pending, None, 0),
    ];
    let gone = HashSet::from([Arc::from("gone")]);
    let ds = orphaned(&pods, &gone);
    assert_eq!(names(&ds), ["on-gone", "on-gone-done"]);
    assert!(
        ds.iter()
            .all(|d| d.pass == Sweep::Orphaned && d.pass.sets_disruption_target())
    );
    assert!(orphaned(&pods, &HashSet::new()).is_empty());
}

#[test]
fn unscheduled_needs_terminating_and_no_node() {
    let pods = vec![
        terminating(pod("chosen", Phase::Pending, None, 0)),
        pod("pending", Phase::Pending, None, 0),
        terminating(pod("scheduled", Phase::Running, Some("n"), 0)),
    ];
    assert_eq!(names(&unscheduled(&pods)), ["chosen"]);
}

#[test]
fn labels_and_increment_order_match_upstream() {
    let labels: Vec<_> = Sweep::ALL.iter().map(|p| p.label()).collect();
    assert_eq!(
        labels,
        ["terminated", "out-of-service", "orphaned", "unscheduled"]
    );
    let before: Vec<_> = Sweep::ALL
        .iter()
        .filter(|p| p.counts_before_attempt())
        .collect();
    assert_eq!(before, [&Sweep::OutOfService]);
}
