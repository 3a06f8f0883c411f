//! `why pod`'s PodGC explanation on plain values: a table of named cases, and the rules over
//! generated pods (it agrees with PodGC's own passes; it never calls a pod collected that
//! PodGC's writes did not mark).

use std::{collections::HashMap, sync::Arc, time::Duration};

use super::collected::{
    Choice, Disruption, Explanation, NodeSeen, PodState, Settings, explain, render,
};
use crate::podgc::{
    decide::{Snapshot, orphaned, out_of_service, unscheduled},
    facts::{
        NodeFacts, Phase, PodFacts,
        example::{at, force_deleted, pod, terminating},
    },
    policy::{NsPolicy, Setting},
};

const NOW: i64 = 10_000;

fn settings() -> Settings {
    Settings {
        threshold: 12500,
        cluster_ttl: None,
        namespace: NsPolicy::default(),
    }
}

fn on(node: &str, mut p: PodFacts) -> PodFacts {
    p.node_name = Some(node.into());
    p
}

fn state(facts: PodFacts, node: NodeSeen) -> PodState {
    PodState {
        deletion_timestamp: facts.terminating.then(|| at(500)),
        finalizers: Vec::new(),
        disruption: None,
        node,
        terminated: facts.phase.is_terminated().then_some((1, 1)),
        facts,
    }
}

const READY: NodeSeen = NodeSeen::Present(NodeFacts {
    ready: true,
    out_of_service: false,
});
const OUT_OF_SERVICE: NodeSeen = NodeSeen::Present(NodeFacts {
    ready: false,
    out_of_service: true,
});

fn chosen(e: &Explanation) -> Vec<&'static str> {
    e.passes
        .iter()
        .filter(|n| n.choice == Choice::Chosen)
        .map(|n| n.pass)
        .collect()
}

struct Row {
    name: &'static str,
    state: PodState,
    settings: Settings,
    /// The pass it was collected by (`Some("")`: force-deleted by someone else), and whether
    /// the pod says so itself.
    collected: Option<(&'static str, bool)>,
    chosen: &'static [&'static str],
    /// A pass and its choice, with a word its reason must hold.
    says: Option<(&'static str, Choice, &'static str)>,
}

fn rows() -> Vec<Row> {
    let held_orphan = {
        let mut s = state(
            force_deleted(on("gone", pod("ns", "o", Phase::Failed))),
            NodeSeen::Missing,
        );
        s.disruption = Some(Disruption {
            reason: "DeletionByPodGC".into(),
            since: Some(at(400)),
        });
        s.finalizers = vec!["example.com/hold".into()];
        s
    };
    let other_disruption = {
        let mut s = state(on("n1", pod("ns", "e", Phase::Running)), READY);
        s.disruption = Some(Disruption {
            reason: "EvictionByEvictionAPI".into(),
            since: Some(at(1)),
        });
        s
    };
    let ended = |secs| {
        let mut p = on("n1", pod("ns", "done", Phase::Succeeded));
        p.set_terminated_at(Some(at(secs)));
        state(p, READY)
    };
    let ttl = |namespace_ttl| Settings {
        cluster_ttl: Some(Duration::from_secs(3600)),
        namespace: NsPolicy {
            ttl: namespace_ttl,
            threshold: Setting::Inherit,
        },
        ..settings()
    };
    let counted = |cluster, ns| {
        let mut s = state(on("n1", pod("ns", "f", Phase::Failed)), READY);
        s.terminated = Some((cluster, ns));
        s
    };
    vec![
        Row {
            name: "a running pod on a Ready node: left by every pass",
            state: state(on("n1", pod("ns", "r", Phase::Running)), READY),
            settings: settings(),
            collected: None,
            chosen: &[],
            says: Some(("terminated", Choice::Left, "phase Running")),
        },
        Row {
            name: "an orphan PodGC marked and force-deleted, held by a finalizer",
            state: held_orphan,
            settings: settings(),
            collected: Some(("orphaned", true)),
            chosen: &["orphaned"],
            says: None,
        },
        Row {
            name: "a DisruptionTarget of another reason is not PodGC's",
            state: other_disruption,
            settings: settings(),
            collected: None,
            chosen: &[],
            says: None,
        },
        Row {
            name: "a Succeeded pod force-deleted: one of the terminated-pod rules, inferred",
            state: state(
                force_deleted(on("n1", pod("ns", "s", Phase::Succeeded))),
                READY,
            ),
            settings: settings(),
            collected: Some(("terminated, ttl or namespace-threshold", false)),
            chosen: &[],
            says: None,
        },
        Row {
            name: "terminating and never scheduled: the unscheduled pass chooses it",
            state: state(
                terminating(pod("ns", "u", Phase::Pending)),
                NodeSeen::Unbound,
            ),
            settings: settings(),
            collected: None,
            chosen: &["unscheduled"],
            says: Some(("orphaned", Choice::Left, "not bound")),
        },
        Row {
            name: "force-deleted and never scheduled: collected by unscheduled",
            state: state(
                force_deleted(pod("ns", "u", Phase::Failed)),
                NodeSeen::Unbound,
            ),
            settings: settings(),
            collected: Some(("unscheduled", false)),
            chosen: &["unscheduled"],
            says: None,
        },
        Row {
            name: "terminating on a node out of service",
            state: state(
                terminating(on("n1", pod("ns", "t", Phase::Running))),
                OUT_OF_SERVICE,
            ),
            settings: settings(),
            collected: None,
            chosen: &["out-of-service"],
            says: None,
        },
        Row {
            name: "terminating on a Ready node: out-of-service leaves it",
            state: state(terminating(on("n1", pod("ns", "t", Phase::Running))), READY),
            settings: settings(),
            collected: None,
            chosen: &[],
            says: Some(("out-of-service", Choice::Left, "is Ready")),
        },
        Row {
            name: "a running pod force-deleted on a Ready node: someone else's delete",
            state: state(
                force_deleted(on("n1", pod("ns", "x", Phase::Running))),
                READY,
            ),
            settings: settings(),
            collected: Some(("", false)),
            chosen: &[],
            says: None,
        },
        Row {
            name: "bound to a node that is gone: orphaned chooses it",
            state: state(
                on("gone", pod("ns", "o", Phase::Running)),
                NodeSeen::Missing,
            ),
            settings: settings(),
            collected: None,
            chosen: &["orphaned"],
            says: Some(("orphaned", Choice::Chosen, "does not exist")),
        },
        Row {
            name: "ended two hours ago under a TTL of one hour: due",
            state: ended(NOW - 7200),
            settings: ttl(Setting::Inherit),
            collected: None,
            chosen: &["ttl"],
            says: Some(("ttl", Choice::Chosen, "TTL 1h")),
        },
        Row {
            name: "ended ten minutes ago under a TTL of one hour: not yet",
            state: ended(NOW - 600),
            settings: ttl(Setting::Inherit),
            collected: None,
            chosen: &[],
            says: Some(("ttl", Choice::Left, "due at")),
        },
        Row {
            name: "the namespace opts out of the cluster's TTL",
            state: ended(NOW - 7200),
            settings: ttl(Setting::Off),
            collected: None,
            chosen: &[],
            says: Some(("ttl", Choice::Left, "opts out")),
        },
        Row {
            name: "a malformed namespace TTL suspends the TTL there",
            state: ended(NOW - 7200),
            settings: ttl(Setting::Malformed),
            collected: None,
            chosen: &[],
            says: Some(("ttl", Choice::Left, "malformed")),
        },
        Row {
            name: "no termination time: the TTL never applies",
            state: state(on("n1", pod("ns", "f", Phase::Failed)), READY),
            settings: ttl(Setting::Inherit),
            collected: None,
            chosen: &[],
            says: Some(("ttl", Choice::Left, "no termination time")),
        },
        Row {
            name: "over the cluster threshold: may be chosen",
            state: counted(10, 3),
            settings: Settings {
                threshold: 5,
                ..settings()
            },
            collected: None,
            chosen: &[],
            says: Some(("terminated", Choice::Maybe, "the 5 oldest")),
        },
        Row {
            name: "under the cluster threshold: left",
            state: counted(3, 3),
            settings: Settings {
                threshold: 5,
                ..settings()
            },
            collected: None,
            chosen: &[],
            says: Some(("terminated", Choice::Left, "not more than")),
        },
        Row {
            name: "the threshold off",
            state: counted(30, 3),
            settings: Settings {
                threshold: 0,
                ..settings()
            },
            collected: None,
            chosen: &[],
            says: Some(("terminated", Choice::Left, "off")),
        },
        Row {
            name: "over the namespace's own threshold: may be chosen",
            state: counted(3, 3),
            settings: Settings {
                namespace: NsPolicy {
                    ttl: Setting::Inherit,
                    threshold: Setting::Value(2),
                },
                ..settings()
            },
            collected: None,
            chosen: &[],
            says: Some(("namespace-threshold", Choice::Maybe, "the 1 oldest")),
        },
    ]
}

#[test]
fn each_case_is_explained_as_its_row_says() {
    for row in rows() {
        let e = explain(&row.state, &row.settings, at(NOW));
        let got = e.collected.as_ref().map(|c| (c.pass.as_str(), c.certain));
        assert_eq!(got, row.collected, "{}: {e:#?}", row.name);
        assert_eq!(chosen(&e), row.chosen, "{}: {e:#?}", row.name);
        if let Some((pass, want, word)) = row.says {
            let n = e.passes.iter().find(|n| n.pass == pass).unwrap();
            assert_eq!(n.choice, want, "{}: {n:?}", row.name);
            assert!(
                n.why.contains(word),
                "{}: {:?} lacks {word:?}",
                row.name,
                n.why
            );
        }
        // Every pass is always explained, in a cycle's order.
        let passes: Vec<&str> = e.passes.iter().map(|n| n.pass).collect();
        assert_eq!(
            passes,
            [
                "terminated",
                "out-of-service",
                "orphaned",
                "unscheduled",
                "ttl",
                "namespace-threshold"
            ],
            "{}",
            row.name
        );
        let text = render("ns/p", &e);
        assert!(text.starts_with("Pod ns/p: "), "{}: {text}", row.name);
    }
}

#[test]
fn the_text_says_when_and_what_holds_a_collected_pod() {
    let row = rows().into_iter().nth(1).unwrap();
    let e = explain(&row.state, &row.settings, at(NOW));
    let text = render("ns/o", &e);
    assert!(
        text.contains("collected by PodGC, pass orphaned, at 2023-11-14T22:20:00Z"),
        "{text}"
    );
    assert!(
        text.contains("finalizers example.com/hold hold it"),
        "{text}"
    );
}

/// Every combination of the pod facts the passes read, over every node state.
fn generated() -> Vec<PodState> {
    let phases = [
        Phase::Pending,
        Phase::Running,
        Phase::Succeeded,
        Phase::Failed,
        Phase::Unknown,
        Phase::Other,
    ];
    let nodes = [
        NodeSeen::Unbound,
        NodeSeen::Missing,
        READY,
        OUT_OF_SERVICE,
        NodeSeen::Present(NodeFacts {
            ready: false,
            out_of_service: false,
        }),
        NodeSeen::Present(NodeFacts {
            ready: true,
            out_of_service: true,
        }),
    ];
    let reasons = [None, Some("DeletionByPodGC"), Some("TerminationByKubelet")];
    let mut out = Vec::new();
    for phase in phases {
        for node in nodes {
            for deletion in 0..3 {
                for reason in reasons {
                    let mut p = pod("ns", "g", phase);
                    if node != NodeSeen::Unbound {
                        p.node_name = Some("n1".into());
                    }
                    p.terminating = deletion > 0;
                    p.force_deleted = deletion == 2;
                    p.set_terminated_at(Some(at(0)));
                    let mut s = state(p, node);
                    s.disruption = reason.map(|r| Disruption {
                        reason: r.into(),
                        since: Some(at(1)),
                    });
                    out.push(s);
                }
            }
        }
    }
    out
}

/// What PodGC's own passes choose of a snapshot holding this one pod (the orphan pass with the
/// node confirmed gone, as after its quarantine and live GET).
fn podgc_chooses(s: &PodState) -> Vec<&'static str> {
    let pods = vec![Arc::new(s.facts.clone())];
    let mut nodes = HashMap::new();
    if let NodeSeen::Present(n) = s.node {
        nodes.insert(Arc::<str>::from("n1"), n);
    }
    let snapshot = Snapshot {
        pods: pods.clone(),
        nodes,
        ..Snapshot::default()
    };
    let gone = match s.node {
        NodeSeen::Missing => [Arc::<str>::from("n1")].into_iter().collect(),
        _ => Default::default(),
    };
    let mut out = Vec::new();
    if !out_of_service(&snapshot).is_empty() {
        out.push("out-of-service");
    }
    if !orphaned(&pods, &gone).is_empty() {
        out.push("orphaned");
    }
    if !unscheduled(&pods).is_empty() {
        out.push("unscheduled");
    }
    out
}

#[test]
fn the_passes_choose_exactly_what_podgcs_own_passes_choose() {
    for s in generated() {
        let e = explain(&s, &settings(), at(NOW));
        let said: Vec<&str> = chosen(&e)
            .into_iter()
            .filter(|p| ["out-of-service", "orphaned", "unscheduled"].contains(p))
            .collect();
        assert_eq!(said, podgc_chooses(&s), "{s:#?}");
    }
}

#[test]
fn collected_only_when_podgcs_writes_marked_the_pod() {
    for s in generated() {
        let e = explain(&s, &settings(), at(NOW));
        let marked = s
            .disruption
            .as_ref()
            .is_some_and(|d| d.reason == "DeletionByPodGC");
        match &e.collected {
            None => assert!(!marked && !s.facts.force_deleted, "{s:#?}"),
            Some(c) => {
                assert!(marked || s.facts.force_deleted, "{s:#?}: {c:?}");
                // Only PodGC's own condition makes it certain.
                assert_eq!(c.certain, marked, "{s:#?}: {c:?}");
                assert!(c.at.is_some(), "{s:#?}: {c:?}");
            }
        }
    }
}
