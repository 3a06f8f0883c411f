//! `why pod`, PodGC's part: whether PodGC collected the pod, by which pass and when, or what
//! each pass says of it now. Pure: the pod's own facts (parsed by PodGC's own code), its node
//! as the API has it, the namespace's policy and the counts in, the explanation out.
//!
//! What PodGC leaves on a pod it collects, and so all this can read back: its status patch
//! (phase `Failed`; for an orphan the condition `DisruptionTarget=True`, reason
//! `DeletionByPodGC`) and its force DELETE (grace 0: `deletionTimestamp` is the time of the
//! DELETE, `deletionGracePeriodSeconds: 0`). PodGC records no Event per pod (upstream neither),
//! so once the pod is gone from the API nothing there says which pass took it.

use std::{collections::HashSet, sync::Arc, time::Duration};

use jiff::Timestamp;
use serde::Serialize;

use crate::podgc::{
    apply::DISRUPTION_REASON,
    decide::{orphaned, out_of_service_node, over_threshold, unscheduled},
    facts::{NodeFacts, PodFacts},
    policy::{NsPolicy, Setting, expired},
};

/// The pod's node as the API has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeSeen {
    /// `spec.nodeName` is empty.
    Unbound,
    /// Bound to a node that a GET answered NotFound.
    Missing,
    Present(NodeFacts),
}

/// The pod's `DisruptionTarget` condition, when it is `True`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disruption {
    pub reason: String,
    pub since: Option<Timestamp>,
}

/// Everything the explanation reads.
#[derive(Clone, Debug)]
pub struct PodState {
    /// PodGC's own facts of the pod (`PodFacts::from_wire`), as a cycle would see it.
    pub facts: PodFacts,
    pub deletion_timestamp: Option<Timestamp>,
    pub finalizers: Vec<String>,
    pub disruption: Option<Disruption>,
    pub node: NodeSeen,
    /// Terminated pods (phase not Pending, Running or Unknown) in the cluster and in the pod's
    /// namespace; `None` when they were not counted (the pod is not terminated).
    pub terminated: Option<(usize, usize)>,
}

/// The controller's settings the plugin can not read from the API (its flags), and the
/// namespace's annotations, which it can.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// `--terminated-pod-gc-threshold`.
    pub threshold: i64,
    /// `--terminated-pod-ttl`; `None` is off.
    pub cluster_ttl: Option<Duration>,
    pub namespace: NsPolicy,
}

/// What one pass says of the pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Choice {
    /// The pass chooses it (the next cycle collects it, if it has not yet).
    Chosen,
    /// The pass leaves it.
    Left,
    /// The pass may choose it: it depends on the other pods (a threshold's order).
    Maybe,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PassNote {
    pub pass: &'static str,
    pub choice: Choice,
    pub why: String,
}

/// How the pod was collected.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Collected {
    /// The pass, or the passes it can have been (`terminated, ttl or namespace-threshold`).
    pub pass: String,
    /// `true` when the pod says so itself (PodGC's `DisruptionTarget` reason); `false` when
    /// only its state points to the pass (a force delete carries no author).
    pub certain: bool,
    /// When (RFC 3339): the condition's time for an orphan, else the force delete's.
    pub at: Option<String>,
    pub why: String,
    /// Finalizers keeping the collected pod listed.
    pub held_by: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    pub collected: Option<Collected>,
    pub passes: Vec<PassNote>,
}

fn note(pass: &'static str, choice: Choice, why: impl Into<String>) -> PassNote {
    PassNote {
        pass,
        choice,
        why: why.into(),
    }
}

fn rfc3339(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Every pass's view of the pod now, and whether (and how) it was collected.
pub fn explain(state: &PodState, settings: &Settings, now: Timestamp) -> Explanation {
    let passes = vec![
        threshold_note(state, settings),
        out_of_service_note(state),
        orphaned_note(state),
        unscheduled_note(state),
        ttl_note(state, settings, now),
        namespace_threshold_note(state, settings),
    ];
    Explanation {
        collected: collected(state, &passes),
        passes,
    }
}

fn collected(state: &PodState, passes: &[PassNote]) -> Option<Collected> {
    let held_by = state.finalizers.clone();
    if let Some(d) = state
        .disruption
        .as_ref()
        .filter(|d| d.reason == DISRUPTION_REASON)
    {
        let deleted = match state.deletion_timestamp {
            Some(t) => format!("; force-deleted at {}", rfc3339(t)),
            None => "; its DELETE has not been accepted yet (retried next cycle)".into(),
        };
        return Some(Collected {
            pass: "orphaned".into(),
            certain: true,
            at: d.since.map(rfc3339),
            why: format!(
                "condition DisruptionTarget reason {DISRUPTION_REASON}: its node {:?} no longer existed{deleted}",
                state.facts.node()
            ),
            held_by,
        });
    }
    if !state.facts.force_deleted {
        return None;
    }
    let at = state.deletion_timestamp.map(rfc3339);
    let chosen = |pass: &str| {
        passes
            .iter()
            .any(|n| n.pass == pass && n.choice != Choice::Left)
    };
    // A cycle's order; the terminated-pod rules are told apart only by the controller's log.
    let pass = if chosen("unscheduled") {
        "unscheduled"
    } else if chosen("out-of-service") {
        "out-of-service"
    } else if chosen("orphaned") {
        "orphaned"
    } else if state.facts.phase.is_terminated() {
        "terminated, ttl or namespace-threshold"
    } else {
        return Some(Collected {
            pass: String::new(),
            certain: false,
            at,
            why: "force-deleted (grace 0), but its state matches no PodGC pass: deleted by \
                  someone else"
                .into(),
            held_by,
        });
    };
    Some(Collected {
        pass: pass.into(),
        certain: false,
        at,
        why: format!(
            "force-deleted (grace 0) while its state matches PodGC's {pass} pass (a DELETE \
             does not record who sent it; the controller-manager logs `force-deleted pod` with \
             the pass)"
        ),
        held_by,
    })
}

/// `90s`, `30m`, `24h`: the flag's own units, the largest that is exact.
fn duration_text(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{}ms", d.as_millis()),
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

fn phase_of(facts: &PodFacts) -> String {
    match facts.phase.as_str() {
        "" => "phase \"\"".into(),
        p => format!("phase {p}"),
    }
}

fn threshold_note(state: &PodState, settings: &Settings) -> PassNote {
    let pass = "terminated";
    let p = &state.facts;
    if !p.phase.is_terminated() {
        return note(
            pass,
            Choice::Left,
            format!(
                "{}: only terminated pods count (phase not Pending, Running or Unknown)",
                phase_of(p)
            ),
        );
    }
    if settings.threshold <= 0 {
        return note(
            pass,
            Choice::Left,
            "the cluster-wide threshold is off (--terminated-pod-gc-threshold <= 0)",
        );
    }
    let Some((cluster, _)) = state.terminated else {
        return note(pass, Choice::Maybe, "terminated pods were not counted");
    };
    let threshold = settings.threshold;
    match over_threshold(cluster, threshold) {
        0 => note(
            pass,
            Choice::Left,
            format!(
                "{} and terminated, but the cluster holds {cluster} terminated pods, not more than the threshold of {threshold}",
                phase_of(p)
            ),
        ),
        over => note(
            pass,
            Choice::Maybe,
            format!(
                "{cluster} terminated pods exceed the threshold of {threshold}: the {over} oldest go (evicted first)"
            ),
        ),
    }
}

fn out_of_service_note(state: &PodState) -> PassNote {
    let pass = "out-of-service";
    if !state.facts.terminating {
        return note(pass, Choice::Left, "not terminating (no deletionTimestamp)");
    }
    match state.node {
        NodeSeen::Unbound => note(pass, Choice::Left, "not bound to a node"),
        NodeSeen::Missing => note(pass, Choice::Left, "its node does not exist"),
        NodeSeen::Present(n) if out_of_service_node(Some(&n)) => note(
            pass,
            Choice::Chosen,
            format!(
                "terminating on node {:?}, which is not Ready and has the out-of-service taint",
                state.facts.node()
            ),
        ),
        NodeSeen::Present(n) => note(
            pass,
            Choice::Left,
            format!(
                "terminating, but its node {:?} {}",
                state.facts.node(),
                if n.ready {
                    "is Ready"
                } else {
                    "has no out-of-service taint"
                }
            ),
        ),
    }
}

fn orphaned_note(state: &PodState) -> PassNote {
    let pass = "orphaned";
    let node = state.facts.node();
    match state.node {
        NodeSeen::Unbound => note(pass, Choice::Left, "not bound to a node"),
        NodeSeen::Present(_) => note(pass, Choice::Left, format!("its node {node:?} exists")),
        NodeSeen::Missing => {
            let gone: HashSet<Arc<str>> = state.facts.node_name.iter().cloned().collect();
            let chosen = !orphaned(std::slice::from_ref(&state.facts), &gone).is_empty();
            note(
                pass,
                if chosen { Choice::Chosen } else { Choice::Left },
                format!(
                    "its node {node:?} does not exist: collected once --orphan-quarantine has \
                     passed and a live GET of the node answers NotFound"
                ),
            )
        }
    }
}

fn unscheduled_note(state: &PodState) -> PassNote {
    let pass = "unscheduled";
    if !unscheduled(std::slice::from_ref(&state.facts)).is_empty() {
        return note(
            pass,
            Choice::Chosen,
            "terminating and never scheduled to a node",
        );
    }
    if state.facts.node_name.is_some() {
        note(pass, Choice::Left, "bound to a node")
    } else {
        note(
            pass,
            Choice::Left,
            "never scheduled, but not terminating (no deletionTimestamp)",
        )
    }
}

fn ttl_note(state: &PodState, settings: &Settings, now: Timestamp) -> PassNote {
    let pass = "ttl";
    let p = &state.facts;
    if !p.phase.is_final() {
        return note(
            pass,
            Choice::Left,
            format!("{}: only Succeeded and Failed pods have a TTL", phase_of(p)),
        );
    }
    let Some(ttl) = settings.namespace.ttl(settings.cluster_ttl) else {
        let why = match settings.namespace.ttl {
            Setting::Off => "its namespace opts out (annotation terminated-pod-ttl: 0)",
            Setting::Malformed => {
                "its namespace's terminated-pod-ttl annotation is malformed: the TTL is suspended there"
            }
            _ => "no TTL in force (--terminated-pod-ttl is off and the namespace sets none)",
        };
        return note(pass, Choice::Left, why);
    };
    let Some(end) = p.terminated_at() else {
        return note(
            pass,
            Choice::Left,
            "no termination time in its status: the TTL never applies to it",
        );
    };
    let due = jiff::SignedDuration::try_from(ttl)
        .ok()
        .and_then(|d| end.checked_add(d).ok());
    let ttl_text = duration_text(ttl);
    if expired(p, ttl, now, std::time::Instant::now()) {
        return note(
            pass,
            Choice::Chosen,
            format!(
                "terminated at {}, TTL {ttl_text}: due since {}",
                rfc3339(end),
                due.map(rfc3339).unwrap_or_default()
            ),
        );
    }
    note(
        pass,
        Choice::Left,
        format!(
            "terminated at {}, TTL {ttl_text}: due at {}",
            rfc3339(end),
            due.map(rfc3339).unwrap_or_else(|| "never".into())
        ),
    )
}

fn namespace_threshold_note(state: &PodState, settings: &Settings) -> PassNote {
    let pass = "namespace-threshold";
    let Some(threshold) = settings.namespace.threshold() else {
        let why = match settings.namespace.threshold {
            Setting::Malformed => {
                "its namespace's terminated-pod-gc-threshold annotation is malformed: no threshold there"
            }
            Setting::Off => {
                "its namespace turns it off (annotation terminated-pod-gc-threshold: 0)"
            }
            _ => "its namespace sets no threshold",
        };
        return note(pass, Choice::Left, why);
    };
    if !state.facts.phase.is_terminated() {
        return note(
            pass,
            Choice::Left,
            format!("{}: only terminated pods count", phase_of(&state.facts)),
        );
    }
    let Some((_, in_ns)) = state.terminated else {
        return note(pass, Choice::Maybe, "terminated pods were not counted");
    };
    match over_threshold(in_ns, threshold.try_into().unwrap_or(i64::MAX)) {
        0 => note(
            pass,
            Choice::Left,
            format!(
                "its namespace holds {in_ns} terminated pods, not more than its threshold of {threshold}"
            ),
        ),
        over => note(
            pass,
            Choice::Maybe,
            format!(
                "its namespace holds {in_ns} terminated pods, over its threshold of {threshold}: the {over} oldest go (evicted first)"
            ),
        ),
    }
}

/// The explanation as text, one line per pass under a headline.
pub fn render(pod: &str, e: &Explanation) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    match &e.collected {
        Some(c) if c.pass.is_empty() => {
            let _ = writeln!(out, "Pod {pod}: not collected by PodGC: {}", c.why);
        }
        Some(c) => {
            let _ = writeln!(
                out,
                "Pod {pod}: collected by PodGC, pass {}{}{}: {}",
                c.pass,
                c.at.as_deref()
                    .map(|t| format!(", at {t}"))
                    .unwrap_or_default(),
                if c.certain { "" } else { " (inferred)" },
                c.why
            );
        }
        None => {
            let soon: Vec<&str> = e
                .passes
                .iter()
                .filter(|n| n.choice == Choice::Chosen)
                .map(|n| n.pass)
                .collect();
            let _ = match soon.first() {
                Some(pass) => writeln!(
                    out,
                    "Pod {pod}: not collected yet; the {pass} pass chooses it at PodGC's next cycle"
                ),
                None => writeln!(out, "Pod {pod}: not collected by PodGC"),
            };
        }
    }
    if let Some(c) = &e.collected
        && !c.held_by.is_empty()
    {
        let _ = writeln!(
            out,
            "  still listed: finalizers {} hold it",
            c.held_by.join(", ")
        );
    }
    for n in &e.passes {
        let mark = match n.choice {
            Choice::Chosen => "chooses it",
            Choice::Left => "leaves it",
            Choice::Maybe => "may choose it",
        };
        let _ = writeln!(out, "  {:<20} {mark}: {}", n.pass, n.why);
    }
    out
}
