//! groundskeeper's policy for terminated pods: a TTL and per-namespace thresholds.
//!
//! On top of upstream's cluster-wide threshold: a TTL since termination
//! (`--terminated-pod-ttl`) and per-namespace overrides through two Namespace annotations.
//! Pure: the cycle hands in the pods the upstream threshold left, the parsed namespace policies
//! and the time.
//!
//! Order of evaluation, per cycle (docs/podgc.md):
//! 1. upstream's threshold pass on every terminated pod in the cluster, whatever the policies;
//! 2. the TTL, on the Succeeded/Failed pods step 1 did not choose;
//! 3. each namespace's threshold, on that namespace's terminated pods steps 1 and 2 left.
//!
//! A pod is chosen by at most one step. Every rule is opt-in: without the flag and the
//! annotations this module chooses nothing.

use std::{
    borrow::Borrow,
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use groundskeeper_plumbing::client::parse_duration;
use jiff::Timestamp;

use super::{
    decide::{Deletion, Sweep, eviction_then_age, excess, phase_note},
    facts::{NsAnnotations, PodFacts, Uid},
};

pub const TTL_ANNOTATION: &str = "groundskeeper.dev/terminated-pod-ttl";
pub const THRESHOLD_ANNOTATION: &str = "groundskeeper.dev/terminated-pod-gc-threshold";

/// One annotation, parsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setting<T> {
    /// No annotation: the cluster default applies.
    Inherit,
    Value(T),
    /// `0`: the rule is off in this namespace (an opt-out from the cluster TTL).
    Off,
    /// Unparseable: the rule is suspended in this namespace, never replaced by a default that
    /// could delete more than the owner asked for.
    Malformed,
}

/// A namespace's policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NsPolicy {
    pub ttl: Setting<Duration>,
    pub threshold: Setting<u64>,
}

impl Default for NsPolicy {
    fn default() -> Self {
        Self {
            ttl: Setting::Inherit,
            threshold: Setting::Inherit,
        }
    }
}

/// A Go-style duration as the flags take it (`90s`, `30m`, `12h`); `0` turns the TTL off.
pub fn parse_ttl(raw: Option<&str>) -> Setting<Duration> {
    let Some(raw) = raw else {
        return Setting::Inherit;
    };
    match parse_duration(raw) {
        Ok(d) if d.is_zero() => Setting::Off,
        Ok(d) => Setting::Value(d),
        Err(_) => Setting::Malformed,
    }
}

/// A whole count of terminated pods kept in the namespace; `0` turns it off (as upstream's
/// threshold does). Signs, fractions, spaces inside and units are malformed.
pub fn parse_threshold(raw: Option<&str>) -> Setting<u64> {
    let Some(raw) = raw else {
        return Setting::Inherit;
    };
    let raw = raw.trim();
    if raw.is_empty() || !raw.bytes().all(|b| b.is_ascii_digit()) {
        return Setting::Malformed;
    }
    match raw.parse::<u64>() {
        Ok(0) => Setting::Off,
        Ok(n) => Setting::Value(n),
        Err(_) => Setting::Malformed,
    }
}

impl NsPolicy {
    pub fn parse(a: &NsAnnotations) -> Self {
        Self {
            ttl: parse_ttl(a.ttl.as_deref()),
            threshold: parse_threshold(a.threshold.as_deref()),
        }
    }

    /// The TTL in force in this namespace, given the cluster's.
    pub fn ttl(&self, cluster: Option<Duration>) -> Option<Duration> {
        match self.ttl {
            Setting::Inherit => cluster,
            Setting::Value(d) => Some(d),
            Setting::Off | Setting::Malformed => None,
        }
    }

    /// The namespace's own threshold; there is no cluster-wide default for it.
    pub fn threshold(&self) -> Option<u64> {
        match self.threshold {
            Setting::Value(n) => Some(n),
            _ => None,
        }
    }
}

/// What the policy passes read besides the pods.
pub struct Policy<'a> {
    /// `--terminated-pod-ttl`; `None` is off.
    pub cluster_ttl: Option<Duration>,
    /// Parsed policies of the namespaces that carry an annotation; others inherit.
    pub namespaces: &'a HashMap<Arc<str>, NsPolicy>,
    pub now: Timestamp,
    /// This process's monotonic now, for how long it has itself seen a pod terminated.
    pub local_now: std::time::Instant,
}

impl Policy<'_> {
    fn of(&self, ns: &str) -> NsPolicy {
        self.namespaces.get(ns).copied().unwrap_or_default()
    }
}

/// Whether `p` terminated at least `ttl` ago. Only Succeeded and Failed pods with a known end
/// qualify; an end in the future (clock skew) is not old. The end is the kubelet's `finishedAt`
/// (the node's clock) but never before the apiserver last recorded the pod's status (the
/// cluster's clock, see `facts::recorded_at`): a node an hour behind can not make the pod look
/// an hour older, also for a pod already final when this process first listed it (after every
/// failover and rollout). When this process saw the pod become final (`seen_final`, its own
/// clock), the TTL must also have passed since then.
pub fn expired(p: &PodFacts, ttl: Duration, now: Timestamp, local_now: std::time::Instant) -> bool {
    if !p.phase.is_final() {
        return false;
    }
    if p.seen_final()
        .is_some_and(|seen| local_now.saturating_duration_since(seen) < ttl)
    {
        return false;
    }
    let Some(end) = p.terminated_at() else {
        return false;
    };
    let Ok(ttl) = jiff::SignedDuration::try_from(ttl) else {
        return false;
    };
    end.checked_add(ttl).is_ok_and(|due| due <= now)
}

/// Steps 2 and 3 (TTL, then namespace thresholds) on the pods step 1 (`taken`, by UID) left.
/// Returns the TTL deletions and the namespace-threshold deletions, each in eviction-then-age
/// order.
pub fn policy_passes<P: Borrow<PodFacts>>(
    pods: &[P],
    taken: &HashSet<&Uid>,
    policy: &Policy,
) -> (Vec<Deletion>, Vec<Deletion>) {
    let left = pods
        .iter()
        .map(Borrow::borrow)
        .filter(|p: &&PodFacts| !taken.contains(&p.uid));

    let mut ttl_chosen: Vec<(&PodFacts, Duration)> = Vec::new();
    // Terminated pods not chosen by the TTL, per namespace with its own threshold.
    let mut per_ns: HashMap<&str, (u64, Vec<&PodFacts>)> = HashMap::new();
    for p in left {
        if !p.phase.is_terminated() {
            continue;
        }
        let ns = policy.of(p.namespace());
        if let Some(ttl) = ns.ttl(policy.cluster_ttl)
            && expired(p, ttl, policy.now, policy.local_now)
        {
            ttl_chosen.push((p, ttl));
            continue;
        }
        if let Some(n) = ns.threshold() {
            per_ns
                .entry(p.namespace())
                .or_insert_with(|| (n, Vec::new()))
                .1
                .push(p);
        }
    }

    ttl_chosen.sort_by(|a, b| eviction_then_age(a.0, b.0));
    let ttl = ttl_chosen
        .into_iter()
        .map(|(p, ttl)| {
            let why = format!(
                "phase {:?} and terminated at {} (TTL {}{})",
                p.phase.as_str(),
                p.terminated_at().map(|t| t.to_string()).unwrap_or_default(),
                humantime(ttl),
                if p.seen_final().is_none() {
                    "; already terminated when first listed: by the pod's own times"
                } else {
                    ""
                }
            );
            Deletion::new(p, Sweep::Ttl, why)
        })
        .collect();

    let mut namespaces: Vec<_> = per_ns.into_iter().collect();
    namespaces.sort_by(|a, b| a.0.cmp(b.0));
    let mut ns_threshold = Vec::new();
    for (ns, (n, done)) in namespaces {
        let total = done.len();
        let chosen = excess(done, i64::try_from(n).unwrap_or(i64::MAX));
        ns_threshold.extend(chosen.into_iter().map(|p| {
            let why = format!(
                "{}; {total} terminated pods in namespace {ns} exceed its threshold of {n}",
                phase_note(p)
            );
            Deletion::new(p, Sweep::NamespaceThreshold, why)
        }));
    }
    (ttl, ns_threshold)
}

fn humantime(d: Duration) -> String {
    let s = d.as_secs();
    if d.subsec_millis() != 0 {
        format!("{}ms", d.as_millis())
    } else if s.is_multiple_of(3600) && s > 0 {
        format!("{}h", s / 3600)
    } else if s.is_multiple_of(60) && s > 0 {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
}

/// The malformed annotations of a namespace, as (annotation, value) pairs to report.
pub fn malformed(a: &NsAnnotations) -> Vec<(&'static str, &str)> {
    let p = NsPolicy::parse(a);
    let mut out = Vec::new();
    if p.ttl == Setting::Malformed {
        out.push((TTL_ANNOTATION, a.ttl.as_deref().unwrap_or_default()));
    }
    if p.threshold == Setting::Malformed {
        out.push((
            THRESHOLD_ANNOTATION,
            a.threshold.as_deref().unwrap_or_default(),
        ));
    }
    out
}
