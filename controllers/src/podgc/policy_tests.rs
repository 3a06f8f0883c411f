//! The policy passes and annotation parsing, table by table.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::{Duration, Instant},
};

use super::policy::*;
use crate::podgc::{
    decide::{Deletion, Sweep, terminated},
    facts::{
        NsAnnotations, Phase, PodFacts, Uid,
        example::{self, at, evicted},
    },
};

const H: Duration = Duration::from_secs(3600);

/// When the pods of these tables were first seen terminated by this process (its own clock).
fn seen() -> Instant {
    static SEEN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *SEEN.get_or_init(Instant::now)
}

/// Long after [`seen`]: the rows that are not about this process's own clock.
fn much_later() -> Instant {
    seen() + 1000 * H
}

/// A pod in `ns`, created at `created`, terminated at `ended` (seconds from [`at`]'s epoch),
/// seen terminated here at [`seen`].
fn pod(ns: &str, name: &str, phase: Phase, created: i64, ended: Option<i64>) -> PodFacts {
    let mut p = PodFacts {
        uid: format!("uid-{ns}-{name}").into(),
        node_name: Some("n".into()),
        created: at(created).into(),
        ..example::pod(ns, name, phase)
    };
    p.set_terminated_at(ended.map(at));
    p.set_seen_final(Some(seen()));
    p
}

fn names(ds: &[Deletion]) -> Vec<String> {
    ds.iter().map(|d| d.pod.key.to_string()).collect()
}

fn annotations(ttl: Option<&str>, threshold: Option<&str>) -> NsAnnotations {
    NsAnnotations {
        ttl: ttl.map(Into::into),
        threshold: threshold.map(Into::into),
    }
}

#[test]
fn ttl_annotation_values() {
    let table = [
        (None, Setting::Inherit),
        (Some("90s"), Setting::Value(Duration::from_secs(90))),
        (Some("2h"), Setting::Value(2 * H)),
        (Some("1.5h"), Setting::Value(H * 3 / 2)),
        (Some(" 10m "), Setting::Value(Duration::from_secs(600))),
        (Some("0"), Setting::Off),
        (Some("0s"), Setting::Off),
        (Some(""), Setting::Malformed),
        (Some("1 week"), Setting::Malformed),
        (Some("7d"), Setting::Malformed),
        (Some("-1h"), Setting::Malformed),
        (Some("abc"), Setting::Malformed),
        (Some("9999h"), Setting::Malformed),
    ];
    for (raw, want) in table {
        assert_eq!(parse_ttl(raw), want, "ttl annotation {raw:?}");
    }
}

#[test]
fn threshold_annotation_values() {
    let table = [
        (None, Setting::Inherit),
        (Some("10"), Setting::Value(10)),
        (Some(" 3 "), Setting::Value(3)),
        (Some("0"), Setting::Off),
        (Some("-5"), Setting::Malformed),
        (Some("+5"), Setting::Malformed),
        (Some("1.5"), Setting::Malformed),
        (Some("1e3"), Setting::Malformed),
        (Some("ten"), Setting::Malformed),
        (Some(""), Setting::Malformed),
        (Some("99999999999999999999999"), Setting::Malformed),
    ];
    for (raw, want) in table {
        assert_eq!(parse_threshold(raw), want, "threshold annotation {raw:?}");
    }
}

#[test]
fn ttl_in_force_per_namespace() {
    let cluster = Some(H);
    let table = [
        (
            "no annotation inherits the cluster TTL",
            None,
            cluster,
            Some(H),
        ),
        ("no annotation, no cluster TTL", None, None, None),
        (
            "annotation overrides",
            Some("5m"),
            cluster,
            Some(Duration::from_secs(300)),
        ),
        (
            "annotation without cluster TTL",
            Some("5m"),
            None,
            Some(Duration::from_secs(300)),
        ),
        ("0 opts the namespace out", Some("0"), cluster, None),
        (
            "malformed suspends the TTL here, not the default",
            Some("soon"),
            cluster,
            None,
        ),
    ];
    for (what, raw, cluster, want) in table {
        let p = NsPolicy::parse(&annotations(raw, None));
        assert_eq!(p.ttl(cluster), want, "{what}");
    }
}

#[test]
fn expiry() {
    let now = at(10_000);
    let table = [
        (
            "terminated 2h ago, TTL 1h",
            Phase::Succeeded,
            Some(10_000 - 7200),
            true,
        ),
        (
            "exactly the TTL ago",
            Phase::Failed,
            Some(10_000 - 3600),
            true,
        ),
        (
            "a second younger than the TTL",
            Phase::Failed,
            Some(10_000 - 3599),
            false,
        ),
        ("no end known: never old", Phase::Succeeded, None, false),
        (
            "end in the future (skew)",
            Phase::Succeeded,
            Some(20_000),
            false,
        ),
        (
            "Running, even with an old finishedAt",
            Phase::Running,
            Some(0),
            false,
        ),
        ("Pending", Phase::Pending, Some(0), false),
        ("Unknown", Phase::Unknown, Some(0), false),
        (
            "empty phase is not Succeeded/Failed",
            Phase::Other,
            Some(0),
            false,
        ),
    ];
    for (what, phase, ended, want) in table {
        let p = pod("ns", "p", phase, 0, ended);
        assert_eq!(expired(&p, H, now, much_later()), want, "{what}");
    }
}

/// A skewed node clock: the end is the node's clock. A node an hour behind writes finishedAt
/// an hour early, and the pod looked expired as soon as this controller saw it terminate. The
/// TTL must also have passed since this process saw the pod become final, when it did.
#[test]
fn expiry_needs_the_ttl_on_this_processs_own_clock_too() {
    let now = at(10_000);
    let node_says_2h_ago = Some(10_000 - 7200);
    let minute = Duration::from_secs(60);
    for (what, seen_final, local_now, want) in [
        (
            "seen terminated 30 min ago (the node's clock says 2 h)",
            Some(seen()),
            seen() + 30 * minute,
            false,
        ),
        (
            "seen terminated a second short of the TTL",
            Some(seen()),
            seen() + H - Duration::from_secs(1),
            false,
        ),
        (
            "seen terminated the TTL ago",
            Some(seen()),
            seen() + H,
            true,
        ),
        (
            "already terminated when first listed: by the pod's own times",
            None,
            seen(),
            true,
        ),
    ] {
        let mut p = pod("ns", "p", Phase::Failed, 0, node_says_2h_ago);
        p.set_seen_final(seen_final);
        assert_eq!(expired(&p, H, now, local_now), want, "{what}");
    }
}

/// The cycle's order on one snapshot: upstream threshold on the full set first, then the TTL,
/// then namespace thresholds; one row per scenario, each naming what it checks.
#[test]
fn order_of_evaluation() {
    let now = at(100_000);
    let old = Some(100_000 - 7200); // terminated 2h ago
    let young = Some(100_000 - 60); // a minute ago
    struct Row {
        what: &'static str,
        pods: Vec<PodFacts>,
        cluster_threshold: i64,
        cluster_ttl: Option<Duration>,
        ns: Vec<(&'static str, NsAnnotations)>,
        threshold: Vec<&'static str>,
        ttl: Vec<&'static str>,
        ns_threshold: Vec<&'static str>,
    }
    let rows = [
        Row {
            what: "nothing opted in: only upstream's threshold acts",
            pods: vec![
                pod("a", "p1", Phase::Succeeded, 1, old),
                pod("a", "p2", Phase::Succeeded, 2, old),
                pod("b", "p3", Phase::Failed, 3, old),
            ],
            cluster_threshold: 2,
            cluster_ttl: None,
            ns: vec![],
            threshold: vec!["a/p1"],
            ttl: vec![],
            ns_threshold: vec![],
        },
        Row {
            what: "the global threshold counts every terminated pod, policies or not, and \
                   its choices are not chosen again",
            pods: vec![
                pod("a", "p1", Phase::Succeeded, 1, old),
                pod("a", "p2", Phase::Succeeded, 2, old),
                pod("b", "p3", Phase::Failed, 3, young),
            ],
            cluster_threshold: 2,
            cluster_ttl: Some(H),
            ns: vec![],
            threshold: vec!["a/p1"],
            ttl: vec!["a/p2"],
            ns_threshold: vec![],
        },
        Row {
            what: "TTL: old Succeeded/Failed go; young, running and timestamp-less stay",
            pods: vec![
                pod("a", "old-ok", Phase::Succeeded, 1, old),
                pod("a", "old-failed", Phase::Failed, 2, old),
                pod("a", "young", Phase::Succeeded, 3, young),
                pod("a", "running", Phase::Running, 4, old),
                pod("a", "no-end", Phase::Failed, 5, None),
            ],
            cluster_threshold: 12500,
            cluster_ttl: Some(H),
            ns: vec![],
            threshold: vec![],
            ttl: vec!["a/old-ok", "a/old-failed"],
            ns_threshold: vec![],
        },
        Row {
            what: "namespace TTL overrides the cluster's, both ways; 0 opts out",
            pods: vec![
                pod("short", "p1", Phase::Succeeded, 1, young),
                pod("long", "p2", Phase::Succeeded, 2, old),
                pod("out", "p3", Phase::Succeeded, 3, old),
                pod("plain", "p4", Phase::Succeeded, 4, old),
            ],
            cluster_threshold: 12500,
            cluster_ttl: Some(H),
            ns: vec![
                ("short", annotations(Some("30s"), None)),
                ("long", annotations(Some("24h"), None)),
                ("out", annotations(Some("0"), None)),
            ],
            threshold: vec![],
            ttl: vec!["short/p1", "plain/p4"],
            ns_threshold: vec![],
        },
        Row {
            what: "namespace threshold: evicted first, then oldest, within the namespace only",
            pods: vec![
                pod("ci", "old", Phase::Succeeded, 1, None),
                pod("ci", "mid", Phase::Failed, 2, None),
                evicted(pod("ci", "evicted-new", Phase::Failed, 9, None)),
                pod("ci", "new", Phase::Succeeded, 10, None),
                pod("ci", "running", Phase::Running, 0, None),
                pod("other", "oldest", Phase::Succeeded, 0, None),
            ],
            cluster_threshold: 12500,
            cluster_ttl: None,
            ns: vec![("ci", annotations(None, Some("2")))],
            threshold: vec![],
            ttl: vec![],
            ns_threshold: vec!["ci/evicted-new", "ci/old"],
        },
        Row {
            what: "namespace threshold counts what the TTL left",
            pods: vec![
                pod("ci", "expired", Phase::Succeeded, 1, old),
                pod("ci", "a", Phase::Succeeded, 2, young),
                pod("ci", "b", Phase::Succeeded, 3, young),
                pod("ci", "c", Phase::Succeeded, 4, young),
            ],
            cluster_threshold: 12500,
            cluster_ttl: None,
            ns: vec![("ci", annotations(Some("1h"), Some("2")))],
            threshold: vec![],
            ttl: vec!["ci/expired"],
            ns_threshold: vec!["ci/a"],
        },
        Row {
            what: "malformed annotations suspend their rule in that namespace only",
            pods: vec![
                pod("bad", "p1", Phase::Succeeded, 1, old),
                pod("bad", "p2", Phase::Succeeded, 2, old),
                pod("bad", "p3", Phase::Succeeded, 3, old),
                pod("good", "p4", Phase::Succeeded, 4, old),
            ],
            cluster_threshold: 12500,
            cluster_ttl: Some(H),
            ns: vec![("bad", annotations(Some("1 week"), Some("-1")))],
            threshold: vec![],
            ttl: vec!["good/p4"],
            ns_threshold: vec![],
        },
        Row {
            what: "threshold annotation 0 is off; no cluster TTL and no annotation: nothing",
            pods: vec![
                pod("zero", "p1", Phase::Succeeded, 1, old),
                pod("none", "p2", Phase::Failed, 2, old),
            ],
            cluster_threshold: 0,
            cluster_ttl: None,
            ns: vec![("zero", annotations(None, Some("0")))],
            threshold: vec![],
            ttl: vec![],
            ns_threshold: vec![],
        },
    ];
    for r in rows {
        let namespaces: HashMap<Arc<str>, NsPolicy> =
            r.ns.iter()
                .map(|(n, a)| (Arc::from(*n), NsPolicy::parse(a)))
                .collect();
        let step1 = terminated(&r.pods, r.cluster_threshold);
        let taken: HashSet<&Uid> = step1.iter().map(|d| &d.pod.uid).collect();
        let policy = Policy {
            cluster_ttl: r.cluster_ttl,
            namespaces: &namespaces,
            now,
            local_now: much_later(),
        };
        let (ttl, ns_threshold) = policy_passes(&r.pods, &taken, &policy);
        assert_eq!(names(&step1), r.threshold, "{}: threshold", r.what);
        assert_eq!(names(&ttl), r.ttl, "{}: ttl", r.what);
        assert_eq!(
            names(&ns_threshold),
            r.ns_threshold,
            "{}: namespace threshold",
            r.what
        );
        assert!(ttl.iter().all(|d| d.pass == Sweep::Ttl), "{}", r.what);
        assert!(
            ns_threshold
                .iter()
                .all(|d| d.pass == Sweep::NamespaceThreshold),
            "{}",
            r.what
        );
        let mut all: Vec<_> = step1.iter().chain(&ttl).chain(&ns_threshold).collect();
        let n = all.len();
        all.sort_by(|a, b| a.pod.uid.cmp(&b.pod.uid));
        all.dedup_by(|a, b| a.pod.uid == b.pod.uid);
        assert_eq!(all.len(), n, "{}: no pod chosen twice", r.what);
    }
}

#[test]
fn malformed_values_are_named() {
    let table = [
        (annotations(None, None), vec![]),
        (annotations(Some("1h"), Some("3")), vec![]),
        (annotations(Some("0"), Some("0")), vec![]),
        (
            annotations(Some("1 week"), None),
            vec![(TTL_ANNOTATION, "1 week")],
        ),
        (
            annotations(Some("2h"), Some("lots")),
            vec![(THRESHOLD_ANNOTATION, "lots")],
        ),
    ];
    for (a, want) in table {
        assert_eq!(malformed(&a), want, "{a:?}");
    }
}

/// A pod already terminated when this process first lists it (after every failover and
/// rollout) is judged by its own times: the kubelet's `finishedAt` on the node's clock, and the
/// apiserver's record of its last status write on the cluster's. Over generated node clocks (up
/// to two hours behind or ahead), run and end times, and status writes up to a minute after the
/// end: the TTL never chooses it before the TTL has passed since its end by the cluster's
/// clock, and chooses it once the TTL has passed since the apiserver's last record of it.
#[test]
fn a_node_clock_behind_never_makes_a_first_listed_pod_expire_early() {
    use crate::podgc::{facts::Interner, wire::WirePod};
    use serde_json::json;
    let stamp = |t: jiff::Timestamp| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let mut early = 0;
    for seed in 0..2000u64 {
        let mut rng = testkit::rng::Rng(seed);
        let secs = |n: u64| jiff::SignedDuration::from_secs(n as i64);
        // The cluster's clock: the pod ran, ended, the kubelet wrote its status.
        let created = at(0);
        let end = created + secs(1 + rng.below_u64(4 * 3600));
        let written = end + secs(rng.below_u64(60));
        // The node's clock, up to two hours off either way.
        let skew = jiff::SignedDuration::from_secs(rng.below_u64(4 * 3600) as i64 - 2 * 3600);
        let finished_on_node = end + skew;
        let pod: WirePod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u",
                "creationTimestamp": stamp(created),
                "managedFields": [
                    {"manager": "kubectl", "operation": "Update", "time": stamp(created),
                     "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}},
                    {"manager": "kubelet", "operation": "Update", "subresource": "status",
                     "time": stamp(written), "fieldsType": "FieldsV1",
                     "fieldsV1": {"f:status": {"f:phase": {}}}}]},
            "spec": {"nodeName": "n"},
            "status": {"phase": "Succeeded", "containerStatuses": [
                {"state": {"terminated": {"finishedAt": stamp(finished_on_node)}}}]}
        }))
        .unwrap();
        let p = PodFacts::from_wire(pod, &mut Interner::default()).unwrap();
        assert!(p.seen_final().is_none(), "first listed");
        let ttl = Duration::from_secs(60 + rng.below_u64(2 * 3600));
        let ttl_signed = jiff::SignedDuration::try_from(ttl).unwrap();
        // Any moment from the end to well past the TTL, on the cluster's clock.
        let now = end + secs(rng.below_u64(ttl.as_secs() + 3 * 3600));
        let chosen = expired(&p, ttl, now, seen());
        let whole_seconds =
            |t: jiff::Timestamp| jiff::Timestamp::from_second(t.as_second()).unwrap();
        assert!(
            !chosen || now >= whole_seconds(end) + ttl_signed,
            "seed {seed}: node {skew:?} off, ended {end}, TTL {ttl:?}, chosen at {now}"
        );
        if now >= whole_seconds(written).max(whole_seconds(finished_on_node)) + ttl_signed {
            assert!(chosen, "seed {seed}: due at {now}, not chosen");
        }
        early += usize::from(skew.is_negative() && now < end + ttl_signed);
    }
    assert!(
        early > 150,
        "cases where a node behind would look expired early: {early}"
    );
}
