//! PodGC's decisions: the four upstream passes, pure functions of a snapshot.
//!
//! The only input that needs I/O (which quarantined nodes a live GET confirmed gone) is
//! passed in by the cycle; the policy passes built on these live in `policy.rs`.

use std::{
    borrow::Borrow,
    cmp::Ordering,
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    sync::Arc,
};

use super::facts::{NodeFacts, NsAnnotations, PodFacts};

/// The pods and nodes of one cycle: every pass reads the same snapshot, as upstream does.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// The cache's own facts, shared: a snapshot of 150k pods is 150k pointers.
    pub pods: Vec<Arc<PodFacts>>,
    pub nodes: HashMap<Arc<str>, NodeFacts>,
    /// The namespaces that carry a policy annotation, unparsed.
    pub namespaces: BTreeMap<Arc<str>, NsAnnotations>,
}

/// Which sweep of a cycle chose a pod (upstream calls them passes: gcTerminated, gcOrphaned …;
/// "pass" in this repository is a conntrack cleanup pass); its label is the `reason` of the
/// upstream metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Sweep {
    Terminated,
    OutOfService,
    Orphaned,
    Unscheduled,
    /// groundskeeper's policy (see `policy.rs`): terminated longer ago than the TTL.
    Ttl,
    /// groundskeeper's policy: above its namespace's own threshold.
    NamespaceThreshold,
}

impl Sweep {
    /// Upstream's four passes.
    pub const ALL: [Sweep; 4] = [
        Sweep::Terminated,
        Sweep::OutOfService,
        Sweep::Orphaned,
        Sweep::Unscheduled,
    ];
    /// Every pass, in the order a cycle runs them (index of the cycle summary).
    pub const EVERY: [Sweep; 6] = [
        Sweep::Terminated,
        Sweep::OutOfService,
        Sweep::Orphaned,
        Sweep::Unscheduled,
        Sweep::Ttl,
        Sweep::NamespaceThreshold,
    ];

    /// The `reason` of the upstream-named counters. The policy passes delete terminated pods,
    /// so dashboards built on upstream's `reason="terminated"` still see every one.
    pub fn label(self) -> &'static str {
        match self {
            Sweep::Terminated | Sweep::Ttl | Sweep::NamespaceThreshold => "terminated",
            Sweep::OutOfService => "out-of-service",
            Sweep::Orphaned => "orphaned",
            Sweep::Unscheduled => "unscheduled",
        }
    }

    /// The pass's own name, in log lines.
    pub fn name(self) -> &'static str {
        match self {
            Sweep::Ttl => "ttl",
            Sweep::NamespaceThreshold => "namespace-threshold",
            p => p.label(),
        }
    }

    /// The `reason` of `groundskeeper_podgc_terminated_deleted_total`: which rule deleted a
    /// terminated pod. `None` for the passes that are not about terminated pods.
    pub fn terminated_reason(self) -> Option<&'static str> {
        match self {
            Sweep::Terminated => Some("threshold"),
            Sweep::Ttl => Some("ttl"),
            Sweep::NamespaceThreshold => Some("namespace-threshold"),
            _ => None,
        }
    }

    /// Only orphans get the DisruptionTarget condition with their status patch.
    pub fn sets_disruption_target(self) -> bool {
        self == Sweep::Orphaned
    }

    /// Upstream counts out-of-service deletions before the attempt, the others after.
    pub fn counts_before_attempt(self) -> bool {
        self == Sweep::OutOfService
    }
}

/// Which sweeps a cycle runs (`--pod-gc-mode`, the chart's `podGC.mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Upstream's four passes, then groundskeeper's TTL and namespace-threshold policy.
    All,
    /// Only groundskeeper's own policy (TTL, namespace threshold): beside a
    /// kube-controller-manager whose PodGC cannot be turned off, which runs the four passes.
    TtlOnly,
}

impl Mode {
    /// Whether a cycle in this mode runs `sweep`; a sweep that does not run chooses nothing
    /// (and reads nothing live: no node GET for an orphan pass that is off).
    pub fn runs(self, sweep: Sweep) -> bool {
        match self {
            Mode::All => true,
            Mode::TtlOnly => matches!(sweep, Sweep::Ttl | Sweep::NamespaceThreshold),
        }
    }
}

/// One pod to force-delete, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Deletion {
    pub pod: PodFacts,
    pub pass: Sweep,
    pub why: String,
}

impl Deletion {
    pub fn new(pod: &PodFacts, pass: Sweep, why: String) -> Self {
        Self {
            pod: pod.clone(),
            pass,
            why,
        }
    }
}

/// Upstream's `byEvictionAndCreationTimestamp`: evicted first, then oldest, then by name.
pub fn eviction_then_age(a: &PodFacts, b: &PodFacts) -> Ordering {
    b.evicted
        .cmp(&a.evicted)
        .then(a.created.cmp(&b.created))
        .then(a.name().cmp(b.name()))
}

/// How many terminated pods exceed the threshold; `threshold <= 0` disables the pass.
pub fn over_threshold(terminated: usize, threshold: i64) -> usize {
    if threshold <= 0 {
        return 0;
    }
    let excess = terminated as i128 - threshold as i128;
    excess.max(0) as usize
}

/// What a threshold deletes of `done` (terminated pods): the ones above `threshold`, evicted
/// first, then oldest. Upstream's cluster-wide pass and the namespace thresholds both.
pub fn excess(mut done: Vec<&PodFacts>, threshold: i64) -> Vec<&PodFacts> {
    let count = over_threshold(done.len(), threshold);
    if count == 0 {
        return Vec::new();
    }
    done.sort_by(|a, b| eviction_then_age(a, b));
    done.truncate(count);
    done
}

/// Whether making `d` would change nothing: the pod's force delete was already accepted
/// (`deletionGracePeriodSeconds: 0`; finalizers hold it) and it needs no status patch (already
/// Succeeded or Failed). Upstream sends the DELETE again every cycle, and since its passes
/// choose by phase and age, the threshold picks the same held pods every time. Such a pod
/// still counts as terminated and still takes its place in the threshold's order, so the
/// other pods chosen are upstream's; only the useless call is left out.
pub fn already_accepted(d: &Deletion) -> bool {
    d.pod.force_deleted && d.pod.phase.is_final()
}

/// How a threshold's reason names the pod's state: `phase "Failed" (evicted)`.
pub fn phase_note(p: &PodFacts) -> String {
    format!(
        "phase {:?}{}",
        p.phase.as_str(),
        if p.evicted { " (evicted)" } else { "" }
    )
}

/// Sweep 1: the oldest terminated pods above `threshold` (evicted ones first). Terminating pods
/// still count and can be chosen again, as in v1.36.
pub fn terminated<P: Borrow<PodFacts>>(pods: &[P], threshold: i64) -> Vec<Deletion> {
    if threshold <= 0 {
        return Vec::new();
    }
    let done: Vec<&PodFacts> = pods
        .iter()
        .map(Borrow::borrow)
        .filter(|p| p.phase.is_terminated())
        .collect();
    let total = done.len();
    excess(done, threshold)
        .into_iter()
        .map(|p| {
            let why = format!(
                "{}; {total} terminated pods exceed the threshold of {threshold}",
                phase_note(p)
            );
            Deletion::new(p, Sweep::Terminated, why)
        })
        .collect()
}

/// The out-of-service pass's rule for a node: known, not Ready, and tainted out-of-service. An
/// unknown node (or none) does not qualify, like upstream's failed lister Get.
pub fn out_of_service_node(node: Option<&NodeFacts>) -> bool {
    node.is_some_and(|n| !n.ready && n.out_of_service)
}

/// Sweep 2: terminating pods on a node that is not Ready and carries the out-of-service taint.
/// Pods whose node is unknown (or empty) are skipped, like upstream's failed lister Get. The
/// applier asks [`out_of_service_node`] again of the live cache right before each delete.
pub fn out_of_service(snapshot: &Snapshot) -> Vec<Deletion> {
    let mut chosen: Vec<&PodFacts> = snapshot
        .pods
        .iter()
        .map(|p| &**p)
        .filter(|p| p.terminating)
        .filter(|p| out_of_service_node(p.node_name.as_ref().and_then(|n| snapshot.nodes.get(n))))
        .collect();
    chosen.sort_by(|a, b| eviction_then_age(a, b));
    chosen
        .into_iter()
        .map(|p| {
            let why = format!(
                "terminating on node {} which is not Ready and has the out-of-service taint",
                p.node()
            );
            Deletion::new(p, Sweep::OutOfService, why)
        })
        .collect()
}

/// Node names pods are bound to that the node cache does not hold: quarantine candidates.
pub fn missing_nodes(snapshot: &Snapshot) -> BTreeSet<Arc<str>> {
    snapshot
        .pods
        .iter()
        .filter_map(|p| p.node_name.as_ref())
        .filter(|n| !snapshot.nodes.contains_key(*n))
        .cloned()
        .collect()
}

/// Sweep 3: every pod (any phase) bound to a node a live GET confirmed gone.
pub fn orphaned<P: Borrow<PodFacts>>(pods: &[P], gone: &HashSet<Arc<str>>) -> Vec<Deletion> {
    if gone.is_empty() {
        return Vec::new();
    }
    pods.iter()
        .map(Borrow::borrow)
        .filter(|p| p.node_name.as_ref().is_some_and(|n| gone.contains(n)))
        .map(|p| {
            let why = format!("node {} no longer exists", p.node());
            Deletion::new(p, Sweep::Orphaned, why)
        })
        .collect()
}

/// Sweep 4: terminating pods that were never scheduled.
pub fn unscheduled<P: Borrow<PodFacts>>(pods: &[P]) -> Vec<Deletion> {
    pods.iter()
        .map(Borrow::borrow)
        .filter(|p| p.terminating && p.node_name.is_none())
        .map(|p| {
            let why = "terminating and never scheduled to a node".into();
            Deletion::new(p, Sweep::Unscheduled, why)
        })
        .collect()
}
