//! The placement's rules: tables of clusters, and properties of the narrowed affinity over
//! generated ones (it selects exactly the old selection minus the forbidding nodes, and it is an
//! update the apiserver accepts on a gated pod).

use std::collections::BTreeMap;

use groundskeeper_sysctl_rules::args::PolicyArgs;
use groundskeeper_sysctl_rules::crd::{Mode, SysctlPolicy, SysctlPolicySpec};
use k8s_openapi::api::core::v1::{
    NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod, PodSecurityContext, PodSpec,
    Sysctl,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use testkit::rng::Rng;

use super::decide::{Cause, NAME_FIELD, Placement, hold_reason, narrow, place, same_hold, selects};
use crate::sysctl::facts::{Constraints, NodeFacts, PodFacts};

fn args(default_mode: Mode) -> PolicyArgs {
    PolicyArgs {
        allowed_unsafe_sysctls: vec![],
        sysctl_default_mode: default_mode,
    }
}

fn pod_facts(sysctls: &[&str]) -> PodFacts {
    PodFacts::of(&Pod {
        spec: Some(PodSpec {
            security_context: Some(PodSecurityContext {
                sysctls: Some(
                    sysctls
                        .iter()
                        .map(|s| Sysctl {
                            name: s.to_string(),
                            value: "1".into(),
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    })
}

fn node(pool: &str, kernel: &str, os: &str) -> NodeFacts {
    NodeFacts {
        labels: [("pool".to_string(), pool.to_string())].into(),
        kernel: Some(kernel.into()),
        os: Some(os.into()),
        kubelet: None,
    }
}

fn policy(name: &str, pool: Option<&str>, allow: &[&str], mode: Mode) -> SysctlPolicy {
    SysctlPolicy::new(
        name,
        SysctlPolicySpec {
            allowed_unsafe_sysctls: allow.iter().map(|s| s.to_string()).collect(),
            node_selector: pool.map(|p| LabelSelector {
                match_labels: Some([("pool".to_string(), p.to_string())].into()),
                ..Default::default()
            }),
            mode,
        },
    )
}

/// What a row expects: the nodes a narrowed pod may use, or a reason.
#[derive(Debug)]
enum Want {
    Anywhere,
    Only(&'static [&'static str]),
    Hold(&'static str),
}

struct Row {
    name: &'static str,
    default_mode: Mode,
    nodes: Vec<(&'static str, NodeFacts)>,
    policies: Vec<SysctlPolicy>,
    sysctls: &'static [&'static str],
    want: Want,
}

fn rows() -> Vec<Row> {
    let db = || {
        policy(
            "enforce-db",
            Some("db"),
            &["net.core.somaxconn"],
            Mode::Enforce,
        )
    };
    let web = || policy("enforce-web", Some("web"), &[], Mode::Enforce);
    vec![
        Row {
            name: "default audit, no policy: every node admits",
            default_mode: Mode::Audit,
            nodes: vec![("a", node("web", "6.1.0", "linux"))],
            policies: vec![],
            sysctls: &["net.core.somaxconn"],
            want: Want::Anywhere,
        },
        Row {
            name: "only the db pool allows somaxconn",
            default_mode: Mode::Enforce,
            nodes: vec![
                ("a", node("web", "6.1.0", "linux")),
                ("b", node("db", "6.1.0", "linux")),
                ("c", node("web", "6.1.0", "linux")),
            ],
            policies: vec![db(), web()],
            sysctls: &["net.core.somaxconn"],
            want: Want::Only(&["b"]),
        },
        Row {
            name: "an audit policy admits (allowed with a warning)",
            default_mode: Mode::Enforce,
            nodes: vec![
                ("a", node("web", "6.1.0", "linux")),
                ("b", node("batch", "6.1.0", "linux")),
            ],
            policies: vec![
                web(),
                policy("audit-batch", Some("batch"), &[], Mode::Audit),
            ],
            sysctls: &["net.core.somaxconn"],
            want: Want::Only(&["b"]),
        },
        Row {
            name: "a safe sysctl gated by kernel: the old kernel forbids",
            default_mode: Mode::Enforce,
            nodes: vec![
                ("old", node("web", "4.4.0", "linux")),
                ("new", node("web", "6.1.0", "linux")),
            ],
            policies: vec![],
            sysctls: &["net.ipv4.tcp_keepalive_time"],
            want: Want::Only(&["new"]),
        },
        Row {
            name: "no node admits: the reason counts each cause, largest first",
            default_mode: Mode::Enforce,
            nodes: vec![
                ("w1", node("web", "6.1.0", "linux")),
                ("w2", node("web", "6.1.0", "linux")),
                ("w3", node("web", "6.1.0", "linux")),
                ("x1", node("other", "6.1.0", "linux")),
                ("x2", node("other", "6.1.0", "linux")),
            ],
            policies: vec![web()],
            sysctls: &["net.core.somaxconn"],
            want: Want::Hold(
                "no node admits net.core.somaxconn: 3 nodes forbid it by SysctlPolicy enforce-web, 2 by the default mode Enforce (no SysctlPolicy selects them)",
            ),
        },
        Row {
            name: "kernel and operating system are causes of their own",
            default_mode: Mode::Enforce,
            nodes: vec![
                ("k1", node("web", "4.4.0", "linux")),
                ("k2", node("web", "4.4.0", "linux")),
                ("win", node("web", "10.0", "windows")),
            ],
            policies: vec![],
            sysctls: &["net.ipv4.tcp_keepalive_time"],
            want: Want::Hold(
                "no node admits net.ipv4.tcp_keepalive_time: 2 nodes forbid it by kernel version, 1 by operating system",
            ),
        },
        Row {
            name: "no node known: held, and said so",
            default_mode: Mode::Audit,
            nodes: vec![],
            policies: vec![],
            sysctls: &["net.core.somaxconn"],
            want: Want::Hold(
                "no node admits net.core.somaxconn: no node that the pod's own node selector and affinity allow is known",
            ),
        },
    ]
}

/// The names a required selector made only of single-name terms lets through.
fn named_terms(s: &NodeSelector) -> Vec<String> {
    s.node_selector_terms
        .iter()
        .map(|t| {
            assert!(t.match_expressions.is_none(), "{t:?}");
            let f = t.match_fields.as_ref().unwrap();
            assert_eq!(f.len(), 1);
            assert_eq!(
                (f[0].key.as_str(), f[0].operator.as_str()),
                (NAME_FIELD, "In")
            );
            f[0].values.as_ref().unwrap()[0].clone()
        })
        .collect()
}

#[test]
fn each_row_gets_its_placement() {
    for row in rows() {
        let nodes: Vec<(&str, &NodeFacts)> = row.nodes.iter().map(|(n, f)| (*n, f)).collect();
        let policies: Vec<&SysctlPolicy> = row.policies.iter().collect();
        let sysctls: Vec<String> = row.sysctls.iter().map(|s| s.to_string()).collect();
        let got = place(
            &args(row.default_mode),
            "ns/p",
            &pod_facts(row.sysctls),
            &sysctls,
            &Constraints::default(),
            &nodes,
            &policies,
        );
        match (&row.want, &got) {
            (Want::Anywhere, Placement::Anywhere) => {}
            (Want::Only(names), Placement::Narrow { required, .. }) => {
                assert_eq!(named_terms(required), *names, "{}", row.name)
            }
            (Want::Hold(reason), Placement::Hold { reason: r, .. }) => {
                assert_eq!(r, reason, "{}", row.name)
            }
            (want, got) => panic!("{}: want {want:?}, got {got:?}", row.name),
        }
    }
}

/// A pod setting no sysctl (a gate put there by hand) is never held.
#[test]
fn a_pod_without_sysctls_goes_anywhere() {
    for row in rows() {
        let nodes: Vec<(&str, &NodeFacts)> = row.nodes.iter().map(|(n, f)| (*n, f)).collect();
        if nodes.is_empty() {
            continue;
        }
        let policies: Vec<&SysctlPolicy> = row.policies.iter().collect();
        let got = place(
            &args(row.default_mode),
            "ns/p",
            &PodFacts::default(),
            &[],
            &Constraints::default(),
            &nodes,
            &policies,
        );
        assert_eq!(got, Placement::Anywhere, "{}", row.name);
    }
}

// The update rule the apiserver applies to a gated pod.

/// `ValidatePodUpdate` on a gated pod: with old required terms, the same number of terms, and
/// each new term's matchExpressions and matchFields start with the old term's.
fn only_additions(old: Option<&NodeSelector>, new: &NodeSelector) -> Result<(), String> {
    let Some(old) = old else { return Ok(()) };
    if old.node_selector_terms.len() != new.node_selector_terms.len() {
        return Err("no additions/deletions to non-empty NodeSelectorTerms list".into());
    }
    for (o, n) in old.node_selector_terms.iter().zip(&new.node_selector_terms) {
        for (ol, nl) in [
            (&o.match_expressions, &n.match_expressions),
            (&o.match_fields, &n.match_fields),
        ] {
            let (ol, nl) = (
                ol.clone().unwrap_or_default(),
                nl.clone().unwrap_or_default(),
            );
            if nl.len() < ol.len() || nl[..ol.len()] != ol[..] {
                return Err(format!("only additions are allowed: {o:?} -> {n:?}"));
            }
        }
    }
    Ok(())
}

/// Every field requirement names one node, as validation demands of `matchFields`.
fn fields_are_single_valued(s: &NodeSelector) -> bool {
    s.node_selector_terms.iter().all(|t| {
        t.match_fields
            .iter()
            .flatten()
            .all(|r| r.values.as_ref().is_some_and(|v| v.len() == 1))
    })
}

fn random_requirement(rng: &mut Rng, names: &[&str]) -> (bool, NodeSelectorRequirement) {
    if rng.chance(30) {
        let op = rng.pick(&["In", "NotIn"]);
        return (
            true,
            NodeSelectorRequirement {
                key: NAME_FIELD.into(),
                operator: op.into(),
                values: Some(vec![rng.pick(names).to_string()]),
            },
        );
    }
    let op = rng.pick(&["In", "NotIn", "Exists", "DoesNotExist"]);
    let values = match op {
        "In" | "NotIn" => Some(
            rng.some(&["a", "b", "c"], 50)
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>(),
        )
        .filter(|v: &Vec<String>| !v.is_empty())
        .or_else(|| Some(vec!["a".into()])),
        _ => None,
    };
    (
        false,
        NodeSelectorRequirement {
            key: rng.pick(&["zone", "pool"]).into(),
            operator: op.into(),
            values,
        },
    )
}

/// Over generated clusters and pods' own required affinities: the narrowed selector selects
/// exactly the nodes the old one selected (all, without one) that admit the pod, it is an
/// update the apiserver accepts on a gated pod, and each field requirement names one node.
#[test]
fn narrowing_selects_the_old_selection_among_admitting_nodes_and_only_adds() {
    let names = ["n0", "n1", "n2", "n3", "n4", "n5", "n6", "n7"];
    for seed in 0..3000u64 {
        let mut rng = Rng(seed);
        let nodes: Vec<(&str, BTreeMap<String, String>)> = names
            .iter()
            .map(|n| {
                let mut labels = BTreeMap::new();
                for key in ["zone", "pool"] {
                    if rng.chance(70) {
                        labels.insert(key.to_string(), rng.pick(&["a", "b", "c"]).to_string());
                    }
                }
                (*n, labels)
            })
            .collect();
        let admit: Vec<&str> = rng.some(&names, 50);
        if admit.is_empty() || admit.len() == names.len() {
            continue; // Held or Anywhere: no selector is made.
        }
        let forbid: Vec<&str> = names
            .iter()
            .copied()
            .filter(|n| !admit.contains(n))
            .collect();
        let old = rng.chance(60).then(|| NodeSelector {
            node_selector_terms: (0..1 + rng.below(3))
                .map(|_| {
                    let mut t = NodeSelectorTerm::default();
                    for _ in 0..1 + rng.below(3) {
                        let (field, r) = random_requirement(&mut rng, &names);
                        if field {
                            t.match_fields.get_or_insert_with(Vec::new).push(r);
                        } else {
                            t.match_expressions.get_or_insert_with(Vec::new).push(r);
                        }
                    }
                    t
                })
                .collect(),
        });
        let new = narrow(old.as_ref(), &admit, &forbid);
        for (name, labels) in &nodes {
            let before = old.as_ref().is_none_or(|o| selects(o, name, labels));
            assert_eq!(
                selects(&new, name, labels),
                before && admit.contains(name),
                "seed {seed}: node {name} {labels:?}, old {old:?}, new {new:?}"
            );
        }
        only_additions(old.as_ref(), &new).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert!(fields_are_single_valued(&new), "seed {seed}: {new:?}");
    }
}

/// The update rule the property relies on, checked on its own: it refuses a new term and a
/// changed requirement, as the apiserver does.
#[test]
fn the_update_rule_refuses_what_the_apiserver_refuses() {
    let term = |key: &str| NodeSelectorTerm {
        match_expressions: Some(vec![NodeSelectorRequirement {
            key: key.into(),
            operator: "Exists".into(),
            values: None,
        }]),
        ..Default::default()
    };
    let old = NodeSelector {
        node_selector_terms: vec![term("zone")],
    };
    let more_terms = NodeSelector {
        node_selector_terms: vec![term("zone"), term("pool")],
    };
    let changed = NodeSelector {
        node_selector_terms: vec![term("pool")],
    };
    assert!(only_additions(Some(&old), &more_terms).is_err());
    assert!(only_additions(Some(&old), &changed).is_err());
    assert!(only_additions(Some(&old), &old).is_ok());
    assert!(only_additions(None, &more_terms).is_ok());
}

/// Only the nodes the pod's own nodeSelector and required affinity allow are judged: a pod
/// confined to the web pool is held when the web pool forbids it, whatever the db pool says,
/// and a pod allowed on db nodes outside its selector is not narrowed to them.
#[test]
fn only_the_nodes_the_pod_may_use_are_judged() {
    let nodes = [
        ("w", node("web", "6.1.0", "linux")),
        ("d1", node("db", "6.1.0", "linux")),
        ("d2", node("db", "6.1.0", "linux")),
    ];
    let nodes: Vec<(&str, &NodeFacts)> = nodes.iter().map(|(n, f)| (*n, f)).collect();
    let db = policy(
        "enforce-db",
        Some("db"),
        &["net.core.somaxconn"],
        Mode::Enforce,
    );
    let web = policy("enforce-web", Some("web"), &[], Mode::Enforce);
    let policies = [&db, &web];
    let sysctls = ["net.core.somaxconn".to_string()];
    let run = |own: &Constraints| {
        place(
            &args(Mode::Enforce),
            "ns/p",
            &pod_facts(&["net.core.somaxconn"]),
            &sysctls,
            own,
            &nodes,
            &policies,
        )
    };
    let web_only = Constraints {
        node_selector: [("pool".to_string(), "web".to_string())].into(),
        required: None,
    };
    let Placement::Hold { reason, .. } = run(&web_only) else {
        panic!("not held")
    };
    assert_eq!(
        reason,
        "no node admits net.core.somaxconn: 1 node forbids it by SysctlPolicy enforce-web"
    );
    let d1_or_w: NodeSelector = serde_json::from_value(serde_json::json!({"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["d1"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["w"]}]}]}))
    .unwrap();
    let own = Constraints {
        node_selector: Vec::new(),
        required: Some(d1_or_w),
    };
    let Placement::Narrow {
        required,
        admitting,
        forbidding,
    } = run(&own)
    else {
        panic!("not narrowed")
    };
    assert_eq!(
        (admitting, forbidding),
        (1, 1),
        "d2 is not the pod's to use"
    );
    let labels = |n: &str| {
        nodes
            .iter()
            .find(|(m, _)| *m == n)
            .unwrap()
            .1
            .labels
            .clone()
    };
    let selected: Vec<&str> = ["w", "d1", "d2"]
        .into_iter()
        .filter(|n| selects(&required, n, &labels(n)))
        .collect();
    assert_eq!(selected, ["d1"]);
}

/// A generated set of causes: policies whose names are prefixes of each other's (`a`, `a-b`,
/// `a, b` as one cause), the default mode, kernel and OS; each with a count.
fn causes(rng: &mut Rng) -> BTreeMap<Cause, usize> {
    let pool = ["a", "a-b", "b", "a1", "1"];
    let mut out = BTreeMap::new();
    for _ in 0..rng.below(5) {
        let cause = match rng.below(5) {
            0 => Cause::DefaultMode,
            1 => Cause::Kernel,
            2 => Cause::OperatingSystem,
            _ => {
                let mut names: Vec<String> = (0..1 + rng.below(2))
                    .map(|_| pool[rng.below(pool.len())].to_string())
                    .collect();
                names.sort();
                names.dedup();
                Cause::Policy(names)
            }
        };
        out.insert(cause, 1 + rng.below(3));
    }
    out
}

/// A held pod's message is written again exactly when its sysctls or its set of causes
/// change: new numbers of nodes for the same causes (a node joining or leaving) are the same
/// hold, over generated causes with names that are prefixes of one another.
#[test]
fn a_hold_is_the_same_while_only_the_numbers_of_nodes_move() {
    let mut rng = Rng(0x5eed_4010);
    let sysctls = vec!["net.core.somaxconn".to_string()];
    for _ in 0..3000 {
        let was = causes(&mut rng);
        let old = hold_reason(&sysctls, &was);
        // The same causes, other numbers.
        let renumbered: BTreeMap<Cause, usize> =
            was.keys().map(|c| (c.clone(), 1 + rng.below(40))).collect();
        assert!(
            same_hold(&old, &sysctls, &renumbered),
            "{old:?} against {renumbered:?}"
        );
        // Other causes: a different set is a different hold.
        let now = causes(&mut rng);
        let same_set = was.keys().eq(now.keys());
        assert_eq!(
            same_hold(&old, &sysctls, &now),
            same_set,
            "{old:?} against {now:?}"
        );
        // Other sysctls, or a message not ours: never the same.
        assert!(!same_hold(&old, &["kernel.msgmax".to_string()], &was));
        assert!(!same_hold(
            &format!("{old}, 2 by kernel version"),
            &sysctls,
            &was
        ));
    }
}
