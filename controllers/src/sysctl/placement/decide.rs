//! Where a gated pod may run: every known node judged as the binding webhook judges it, and
//! the required node affinity that keeps the pod on the nodes that admit it.
//!
//! The affinity is an addition the apiserver accepts on a gated pod (`ValidatePodUpdate`: while
//! `schedulingGates` is not empty, required node affinity may only narrow): with no required
//! terms yet, one term per admitting node; with terms, each term gains a `NotIn` per forbidding
//! node. A field requirement (`matchFields`) takes exactly one value, so a list of names is
//! terms (ORed) or requirements (ANDed), never one `In` with many values.

use std::collections::BTreeMap;

use groundskeeper_sysctl_rules::crd::{Mode, SysctlPolicy};
use groundskeeper_sysctl_rules::policy::selects as policy_selects;
use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};

use crate::sysctl::facts::{Constraints, NodeFacts, PodFacts};
use crate::sysctl::webhook::decide::{Decision, decide};
use groundskeeper_sysctl_rules::args::PolicyArgs;

/// The field a node's name is selected by in `matchFields`.
pub const NAME_FIELD: &str = "metadata.name";
/// A kernel newer than any: a node that admits the pod with it forbids only by its kernel.
const NEWEST_KERNEL: &str = "999.0.0";

/// Why one node does not admit the pod, for the message of a pod no node admits.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Cause {
    /// Enforce SysctlPolicies that select the node (names, sorted).
    Policy(Vec<String>),
    /// No SysctlPolicy selects it; the default mode is Enforce.
    DefaultMode,
    /// Its kernel does not namespace the sysctl (a newer kernel would admit it).
    Kernel,
    /// It reports an operating system other than Linux.
    OperatingSystem,
}

impl Cause {
    fn says(&self) -> String {
        match self {
            Cause::Policy(names) => format!("SysctlPolicy {}", names.join(", ")),
            Cause::DefaultMode => "the default mode Enforce (no SysctlPolicy selects them)".into(),
            Cause::Kernel => "kernel version".into(),
            Cause::OperatingSystem => "operating system".into(),
        }
    }
}

/// What to do with a gated pod.
#[derive(Clone, Debug, PartialEq)]
pub enum Placement {
    /// Every known node admits it: take the gate off, change nothing else.
    Anywhere,
    /// Some nodes admit it: this required node selector, and the gate off.
    Narrow {
        required: NodeSelector,
        admitting: usize,
        forbidding: usize,
    },
    /// No node admits it: it stays gated (Pending), and this says why; `causes` counts the
    /// nodes that forbid it for each cause (empty when no node is a candidate).
    Hold {
        reason: String,
        causes: BTreeMap<Cause, usize>,
    },
}

impl Constraints {
    /// Whether the pod's own constraints let it onto node `name` with `labels`: only those
    /// nodes are judged, so a pod confined to some nodes is held or narrowed by those alone.
    pub fn allow(&self, name: &str, labels: &BTreeMap<String, String>) -> bool {
        self.node_selector
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self
                .required
                .as_ref()
                .filter(|s| !s.node_selector_terms.is_empty())
                .is_none_or(|s| selects(s, name, labels))
    }
}

/// Whether `s` selects node `name` with `labels`, as the scheduler's node affinity does: terms
/// ORed, requirements ANDed, a term with no requirement selecting nothing. A requirement that
/// can not be read (`Gt` on a non-number) selects nothing.
pub fn selects(s: &NodeSelector, name: &str, labels: &BTreeMap<String, String>) -> bool {
    s.node_selector_terms.iter().any(|t| {
        let exprs = t.match_expressions.as_deref().unwrap_or_default();
        let fields = t.match_fields.as_deref().unwrap_or_default();
        (!exprs.is_empty() || !fields.is_empty())
            && exprs
                .iter()
                .all(|r| matches(r, labels.get(&r.key).map(String::as_str)))
            && fields
                .iter()
                .all(|r| r.key == NAME_FIELD && matches(r, Some(name)))
    })
}

fn matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => match (
            value.and_then(number),
            values.first().and_then(|x| number(x)),
        ) {
            (Some(v), Some(bound)) => {
                (r.operator == "Gt" && v > bound) || (r.operator == "Lt" && v < bound)
            }
            _ => false,
        },
        _ => false,
    }
}

/// The placement of pod `pod` (`namespace/name`) seen as `pod_facts`, which sets `sysctls` and is
/// confined by `own`, over every known node and SysctlPolicy.
pub fn place(
    args: &PolicyArgs,
    pod: &str,
    pod_facts: &PodFacts,
    sysctls: &[String],
    own: &Constraints,
    nodes: &[(&str, &NodeFacts)],
    policies: &[&SysctlPolicy],
) -> Placement {
    let mut admitting = Vec::new();
    let mut forbidding = Vec::new();
    let mut causes: BTreeMap<Cause, usize> = BTreeMap::new();
    let candidates = nodes.iter().filter(|(n, f)| own.allow(n, &f.labels));
    for (name, facts) in candidates {
        match decide(args, pod, pod_facts, name, Some(facts), policies) {
            Decision::Allow | Decision::Audit { .. } => admitting.push(*name),
            Decision::Deny { .. } => {
                forbidding.push(*name);
                *causes
                    .entry(cause(args, pod, pod_facts, name, facts, policies))
                    .or_default() += 1;
            }
        }
    }
    admitting.sort_unstable();
    forbidding.sort_unstable();
    if admitting.is_empty() {
        return Placement::Hold {
            reason: hold_reason(sysctls, &causes),
            causes,
        };
    }
    if forbidding.is_empty() {
        return Placement::Anywhere;
    }
    Placement::Narrow {
        required: narrow(own.required.as_ref(), &admitting, &forbidding),
        admitting: admitting.len(),
        forbidding: forbidding.len(),
    }
}

/// Why `node` forbids the pod (it was denied).
fn cause(
    args: &PolicyArgs,
    pod: &str,
    pod_facts: &PodFacts,
    node: &str,
    facts: &NodeFacts,
    policies: &[&SysctlPolicy],
) -> Cause {
    if facts.os.as_deref().is_some_and(|os| os != "linux") {
        return Cause::OperatingSystem;
    }
    let newer = NodeFacts {
        kernel: Some(NEWEST_KERNEL.into()),
        ..facts.clone()
    };
    if !matches!(
        decide(args, pod, pod_facts, node, Some(&newer), policies),
        Decision::Deny { .. }
    ) {
        return Cause::Kernel;
    }
    let mut enforcing: Vec<String> = policies
        .iter()
        .filter(|p| p.spec.mode == Mode::Enforce)
        .filter(|p| policy_selects(p.spec.node_selector.as_ref(), &facts.labels))
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    enforcing.sort();
    if enforcing.is_empty() {
        Cause::DefaultMode
    } else {
        Cause::Policy(enforcing)
    }
}

/// `no node admits net.core.somaxconn: 3 nodes forbid it by SysctlPolicy enforce-db, 2 by
/// kernel version`, the largest group first.
pub fn hold_reason(sysctls: &[String], causes: &BTreeMap<Cause, usize>) -> String {
    let what = what(sysctls);
    let mut groups: Vec<(&Cause, &usize)> = causes.iter().collect();
    groups.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    if groups.is_empty() {
        return format!(
            "no node admits {what}: no node that the pod's own node selector and affinity allow is known"
        );
    }
    let parts: Vec<String> = groups
        .iter()
        .enumerate()
        .map(|(i, (cause, n))| {
            let nodes = if **n == 1 {
                "node forbids"
            } else {
                "nodes forbid"
            };
            if i == 0 {
                format!("{n} {nodes} it by {}", cause.says())
            } else {
                format!("{n} by {}", cause.says())
            }
        })
        .collect();
    format!("no node admits {what}: {}", parts.join(", "))
}

fn what(sysctls: &[String]) -> String {
    if sysctls.is_empty() {
        "its sysctls".to_string()
    } else {
        sysctls.join(", ")
    }
}

/// More causes than this and a held message is compared whole ([`same_hold`]).
const MAX_CAUSES_MATCHED: usize = 16;

/// Whether `old`, the message of a pod's hold, says what [`hold_reason`] would say of
/// `sysctls` and `causes` with any numbers of nodes: the same sysctls, and each cause once, in
/// any order. A node joining or leaving that only moves those numbers is not worth a status
/// patch and an Event for every held pod; a new cause, or one gone, is.
pub fn same_hold(old: &str, sysctls: &[String], causes: &BTreeMap<Cause, usize>) -> bool {
    if causes.is_empty() || causes.len() > MAX_CAUSES_MATCHED {
        return old == hold_reason(sysctls, causes);
    }
    let Some(rest) = old.strip_prefix(&format!("no node admits {}: ", what(sysctls))) else {
        return false;
    };
    let says: Vec<String> = causes.keys().map(Cause::says).collect();
    let mut used = vec![false; says.len()];
    groups_match(rest, &says, &mut used, true)
}

/// Whether `rest` is one group per cause of `says` not yet `used` (`first`: the group that
/// says "N nodes forbid it by"), tried in every order a prefix allows (a policy's name may
/// begin another's).
fn groups_match(rest: &str, says: &[String], used: &mut [bool], first: bool) -> bool {
    if rest.is_empty() {
        return !first && used.iter().all(|u| *u);
    }
    let rest = match first {
        true => rest,
        false => match rest.strip_prefix(", ") {
            Some(r) => r,
            None => return false,
        },
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let Ok(n) = rest[..digits].parse::<usize>() else {
        return false;
    };
    let lead = match (first, n) {
        (false, _) => " by ",
        (true, 1) => " node forbids it by ",
        (true, _) => " nodes forbid it by ",
    };
    let Some(rest) = rest[digits..].strip_prefix(lead) else {
        return false;
    };
    for i in 0..says.len() {
        if used[i] {
            continue;
        }
        if let Some(after) = rest.strip_prefix(says[i].as_str()) {
            used[i] = true;
            if groups_match(after, says, used, false) {
                return true;
            }
            used[i] = false;
        }
    }
    false
}

fn name_is(operator: &str, node: &str) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: NAME_FIELD.into(),
        operator: operator.into(),
        values: Some(vec![node.into()]),
    }
}

/// `existing` narrowed to `admitting` (both lists sorted; they partition the known nodes).
/// Without required terms: one term per admitting node. With terms: each term keeps what it
/// has and gains `metadata.name NotIn` each forbidding node, so (T1 ∨ … ∨ Tk) ∧ ¬forbidding.
pub fn narrow(
    existing: Option<&NodeSelector>,
    admitting: &[&str],
    forbidding: &[&str],
) -> NodeSelector {
    match existing.filter(|s| !s.node_selector_terms.is_empty()) {
        None => NodeSelector {
            node_selector_terms: admitting
                .iter()
                .map(|n| NodeSelectorTerm {
                    match_fields: Some(vec![name_is("In", n)]),
                    ..Default::default()
                })
                .collect(),
        },
        Some(s) => NodeSelector {
            node_selector_terms: s
                .node_selector_terms
                .iter()
                .map(|t| {
                    let mut t = t.clone();
                    t.match_fields
                        .get_or_insert_with(Vec::new)
                        .extend(forbidding.iter().map(|n| name_is("NotIn", n)));
                    t
                })
                .collect(),
        },
    }
}
