//! The compact facts' tests: what a pod and a node are reduced to, keys, times, UIDs and
//! the interner.

use std::sync::Arc;

use groundskeeper_plumbing::ObjectKey;
use jiff::Timestamp;

use super::{facts::*, wire::WirePodStatus};
use serde_json::json;

fn pod(v: serde_json::Value) -> Result<PodFacts, Incomplete> {
    PodFacts::from_wire(serde_json::from_value(v).unwrap(), &mut Interner::default())
}

#[test]
fn phases() {
    let table = [
        (None, Phase::Other, true, false),
        (Some(""), Phase::Other, true, false),
        (Some("Pending"), Phase::Pending, false, false),
        (Some("Running"), Phase::Running, false, false),
        (Some("Unknown"), Phase::Unknown, false, false),
        (Some("Succeeded"), Phase::Succeeded, true, true),
        (Some("Failed"), Phase::Failed, true, true),
        (Some("Weird"), Phase::Other, true, false),
    ];
    for (s, phase, terminated, fin) in table {
        let p = Phase::parse(s);
        assert_eq!(p, phase, "{s:?}");
        assert_eq!(p.is_terminated(), terminated, "{s:?}");
        assert_eq!(p.is_final(), fin, "{s:?}");
    }
}

#[test]
fn pod_facts() {
    let p = pod(json!({
        "metadata": {"name": "a", "namespace": "ns", "uid": "u", "generation": 2,
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "deletionTimestamp": "2026-01-01T00:01:00Z"},
        "spec": {"nodeName": "n1"},
        "status": {"phase": "Failed", "reason": "Evicted", "conditions": [
            {"type": "Ready", "status": "False"},
            {"type": "DisruptionTarget", "status": "True",
             "lastTransitionTime": "2026-01-01T00:00:30Z"}]}
    }))
    .unwrap();
    assert_eq!((p.namespace(), p.name()), ("ns", "a"));
    assert_eq!(p.node_name.as_deref(), Some("n1"));
    assert!(p.evicted && p.terminating);
    assert_eq!(p.generation.get(), Some(2));
    assert_eq!(
        p.disruption_target_true(),
        Some(Some("2026-01-01T00:00:30Z".parse().unwrap()))
    );
}

#[test]
fn empty_node_name_is_unscheduled_and_not_evicted_unless_failed() {
    let p = pod(json!({
        "metadata": {"name": "a", "namespace": "ns", "uid": "u"},
        "spec": {"nodeName": ""},
        "status": {"phase": "Succeeded", "reason": "Evicted",
            "conditions": [{"type": "DisruptionTarget", "status": "False"}]}
    }))
    .unwrap();
    assert_eq!(p.node_name, None);
    assert!(!p.evicted && !p.terminating);
    assert_eq!(p.created, Created::MISSING);
    assert_eq!(p.disruption_target_true(), None);
}

#[test]
fn terminated_at_prefers_the_last_finished_container() {
    let t = |s: &str| Some(s.parse::<Timestamp>().unwrap());
    let fin = |at: &str| json!({"state": {"terminated": {"finishedAt": at}}});
    let table = [
        (
            "latest finishedAt over containers and init containers",
            json!({"containerStatuses": [fin("2026-01-01T00:00:10Z"), fin("2026-01-01T00:00:30Z")],
                   "initContainerStatuses": [fin("2026-01-01T00:00:05Z")],
                   "conditions": [{"type": "Ready", "status": "False",
                                   "lastTransitionTime": "2026-01-01T00:09:00Z"}]}),
            t("2026-01-01T00:00:30Z"),
        ),
        (
            "a sidecar init container can be the last to finish",
            json!({"initContainerStatuses": [fin("2026-01-01T00:01:00Z")],
                   "containerStatuses": [fin("2026-01-01T00:00:50Z")]}),
            t("2026-01-01T00:01:00Z"),
        ),
        (
            // Aged by the wrong end: failed in init, long after the first init container
            // ended; its main containers never ran. Aged from that, it lost its TTL early.
            "main containers never terminated: not an init container's end",
            json!({"initContainerStatuses": [fin("2026-01-01T00:01:00Z")],
                   "containerStatuses": [{"state": {"waiting": {}}}],
                   "conditions": [{"type": "Ready", "status": "False",
                                   "lastTransitionTime": "2026-01-01T05:00:00Z"}]}),
            t("2026-01-01T05:00:00Z"),
        ),
        (
            "main containers never terminated, no condition either: no end",
            json!({"initContainerStatuses": [fin("2026-01-01T00:01:00Z")],
                   "containerStatuses": [{"state": {"waiting": {}}}]}),
            None,
        ),
        (
            "no finishedAt: Ready/ContainersReady False transition, the latest",
            json!({"containerStatuses": [{"state": {"terminated": {}}}],
                   "conditions": [
                    {"type": "Ready", "status": "False", "lastTransitionTime": "2026-01-01T00:02:00Z"},
                    {"type": "ContainersReady", "status": "False", "lastTransitionTime": "2026-01-01T00:03:00Z"},
                    {"type": "PodScheduled", "status": "False", "lastTransitionTime": "2026-01-01T00:04:00Z"}]}),
            t("2026-01-01T00:03:00Z"),
        ),
        (
            "Ready True says nothing about the end",
            json!({"conditions": [{"type": "Ready", "status": "True",
                                   "lastTransitionTime": "2026-01-01T00:02:00Z"}]}),
            None,
        ),
        (
            "Ready False without a time",
            json!({"conditions": [{"type": "Ready", "status": "False"}]}),
            None,
        ),
        ("no status at all", json!({}), None),
    ];
    for (what, status, want) in table {
        let s: WirePodStatus = serde_json::from_value(status).unwrap();
        assert_eq!(terminated_at(&s), want, "{what}");
    }
}

#[test]
fn incomplete_pods_are_named() {
    let e = pod(json!({"metadata": {"name": "a", "namespace": "ns"}})).unwrap_err();
    assert_eq!(e.to_string(), "Pod without metadata.uid");
    // Its key could not be split back: not kept (no apiserver serves such a namespace).
    let e = pod(json!({"metadata": {"name": "a", "namespace": "n/s", "uid": "u"}}));
    assert!(e.is_err());
}

/// The key splits back into exactly the namespace and name it was made of, and two pods
/// share a key only when both parts are equal (a `/` in the name included).
#[test]
fn pod_keys_split_back_and_never_collide() {
    let parts = ["", "a", "ns", "kube-system", "b/c", "a/b", "c"];
    for ns in parts.iter().filter(|p| !p.contains('/')) {
        for name in parts {
            let k = ObjectKey::new(ns, name);
            assert_eq!((k.namespace(), k.name()), (*ns, name));
            for ns2 in parts.iter().filter(|p| !p.contains('/')) {
                for name2 in parts {
                    let same = (ns, name) == (ns2, name2);
                    assert_eq!(
                        k == ObjectKey::new(ns2, name2),
                        same,
                        "{ns}/{name} {ns2}/{name2}"
                    );
                }
            }
        }
    }
}

#[test]
fn node_facts() {
    let node = |v| NodeFacts::from_wire(&serde_json::from_value(v).unwrap());
    let table = [
        (json!({"metadata": {"name": "n"}}), false, false),
        (
            json!({"metadata": {"name": "n"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
            true,
            false,
        ),
        (
            json!({"metadata": {"name": "n"}, "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]},
                "spec": {"taints": [{"key": "other", "effect": "NoSchedule"},
                    {"key": OUT_OF_SERVICE_TAINT, "value": "x", "effect": "NoExecute"}]}}),
            false,
            true,
        ),
    ];
    for (v, ready, oos) in table {
        let f = node(v.clone());
        assert_eq!((f.ready, f.out_of_service), (ready, oos), "{v}");
    }
}

/// Creation times keep their order in 8 bytes, exactly in the years pods live in and
/// saturating beyond; a missing one sorts before every other; generations come back.
#[test]
fn creation_times_keep_their_order_and_generations_come_back() {
    let times = [
        Timestamp::MIN,
        "1600-01-01T00:00:00Z".parse().unwrap(),
        "1970-01-01T00:00:00Z".parse().unwrap(),
        "2026-11-28T00:00:00Z".parse().unwrap(),
        "2026-11-28T00:00:00.000000001Z".parse().unwrap(),
        "2026-11-28T00:00:01Z".parse().unwrap(),
        "2300-01-01T00:00:00Z".parse().unwrap(),
        Timestamp::MAX,
    ];
    for a in times {
        assert!(Created::MISSING <= Created::from(a), "{a}");
        for b in times {
            assert!(
                a >= b || Created::from(a) <= Created::from(b),
                "{a} before {b} lost its order"
            );
            let pods_years = |t: Timestamp| {
                (1678..2262).contains(&t.strftime("%Y").to_string().parse::<i32>().unwrap_or(0))
            };
            if pods_years(a) && pods_years(b) {
                assert_eq!(
                    a.cmp(&b),
                    Created::from(a).cmp(&Created::from(b)),
                    "{a} {b}"
                );
            }
        }
    }
    for g in [None, Some(0), Some(1), Some(i64::MAX)] {
        assert_eq!(Generation::from(g).get(), g);
    }
}

#[test]
fn uids_print_back_exactly_as_they_came() {
    let table = [
        ("7d0c1a4e-91b2-4c3d-8e5f-0a1b2c3d4e5f", true),
        ("00000000-0000-0000-0000-000000000000", true),
        ("7D0C1A4E-91B2-4C3D-8E5F-0A1B2C3D4E5F", false),
        ("7d0c1a4e91b24c3d8e5f0a1b2c3d4e5f", false),
        ("7d0c1a4e-91b2-4c3d-8e5f-0a1b2c3d4e5g", false),
        ("7d0c1a4e-91b2-4c3d-8e5f+0a1b2c3d4e5f", false),
        ("uid-a", false),
        ("", false),
    ];
    for (s, compact) in table {
        let u = Uid::from(s);
        assert_eq!(u.to_string(), s);
        assert_eq!(matches!(u, Uid::Uuid(_)), compact, "{s}");
        assert_eq!(u, Uid::from(s.to_string()));
    }
    assert_ne!(
        Uid::from("7d0c1a4e-91b2-4c3d-8e5f-0a1b2c3d4e5f"),
        Uid::from("7d0c1a4e-91b2-4c3d-8e5f-0a1b2c3d4e50")
    );
}

#[test]
fn interner_shares_and_prunes() {
    let mut names = Interner::default();
    let a = names.intern("node-a");
    let b = names.intern("node-a");
    assert!(Arc::ptr_eq(&a, &b));
    for i in 0..2000 {
        names.intern(&format!("gone-{i}"));
    }
    assert!(
        names.len() < 2000,
        "unreferenced names pruned: {}",
        names.len()
    );
    assert!(
        Arc::ptr_eq(&a, &names.intern("node-a")),
        "held names survive"
    );
}
