//! The compact facts PodGC keeps per Pod and Node.
//!
//! Exactly what the passes and the status patch read. Namespace and node names are interned,
//! so 50k pods on 5k nodes share a few thousand strings.

use std::{collections::HashSet, sync::Arc};

use groundskeeper_plumbing::ObjectKey;
use jiff::Timestamp;

use super::wire::{WireNode, WirePod, WirePodStatus};

/// `status.phase`. Anything unrecognised (including `""`) counts as terminated, as upstream's
/// "not Pending, Running or Unknown" does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    Pending,
    Running,
    Succeeded,
    Failed,
    Unknown,
    /// Empty or unrecognised.
    Other,
}

impl Phase {
    pub fn parse(s: Option<&str>) -> Self {
        match s.unwrap_or("") {
            "Pending" => Self::Pending,
            "Running" => Self::Running,
            "Succeeded" => Self::Succeeded,
            "Failed" => Self::Failed,
            "Unknown" => Self::Unknown,
            _ => Self::Other,
        }
    }

    /// Threshold GC counts these: phase not Pending, Running or Unknown.
    pub fn is_terminated(self) -> bool {
        !matches!(self, Self::Pending | Self::Running | Self::Unknown)
    }

    /// Pods in these phases are deleted without the status patch to Failed.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Running => "Running",
            Self::Succeeded => "Succeeded",
            Self::Failed => "Failed",
            Self::Unknown => "Unknown",
            Self::Other => "",
        }
    }
}

/// `metadata.creationTimestamp` in 8 bytes: nanoseconds since the epoch, exact from 1678 to
/// 2262 and saturating beyond (the order is kept; equal ones sort by name). A missing one is
/// the least, as Go's zero time sorts first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Created(i64);

impl Created {
    pub const MISSING: Self = Self(i64::MIN);
}

impl From<Timestamp> for Created {
    fn from(t: Timestamp) -> Self {
        let nanos = t.as_nanosecond();
        Self(i64::try_from(nanos).unwrap_or(if nanos < 0 { i64::MIN } else { i64::MAX }))
    }
}

/// `metadata.generation` in 8 bytes: `i64::MIN`, which no apiserver writes (generations
/// count up from 1), stands for a pod without one.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Generation(i64);

impl Generation {
    pub fn get(self) -> Option<i64> {
        Some(self.0).filter(|g| *g != i64::MIN)
    }
}

impl From<Option<i64>> for Generation {
    fn from(g: Option<i64>) -> Self {
        Self(g.unwrap_or(i64::MIN))
    }
}

impl std::fmt::Debug for Generation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.get())
    }
}

/// What PodGC knows about one pod.
#[derive(Clone, Debug, PartialEq)]
pub struct PodFacts {
    /// `namespace/name`; read through [`PodFacts::namespace`] and [`PodFacts::name`].
    pub key: ObjectKey,
    pub uid: Uid,
    /// `spec.nodeName`; `None` when empty.
    pub node_name: Option<Arc<str>>,
    pub phase: Phase,
    /// Failed with reason Evicted: sorted first by the threshold GC.
    pub evicted: bool,
    /// `metadata.deletionTimestamp` is set.
    pub terminating: bool,
    /// A force delete was already accepted: `deletionTimestamp` set with
    /// `deletionGracePeriodSeconds: 0`. Still listed, so finalizers hold it; another DELETE
    /// changes nothing (the apiserver answers 200 and writes nothing), only their removal does.
    pub force_deleted: bool,
    /// `metadata.creationTimestamp`; a missing one sorts first, like Go's zero time.
    pub created: Created,
    pub generation: Generation,
    /// `status.conditions` types in their order: the status patch sends them as
    /// `$setElementOrder/conditions`, as upstream's two-way merge patch does, so an added
    /// DisruptionTarget goes after the existing conditions instead of first. The whole list is
    /// interned: the pods of a cluster carry a handful of distinct lists between them.
    pub condition_types: Arc<[Arc<str>]>,
    /// What most pods do not have (a DisruptionTarget, an end): one pointer, `None` for them.
    pub(super) rare: Option<Box<Rare>>,
}

/// The facts of [`PodFacts`] that only some pods have (finished pods, disrupted ones): kept
/// apart so that a running pod does not pay for them. Read and set through `PodFacts`.
#[derive(Clone, Debug, PartialEq, Default)]
pub(super) struct Rare {
    /// When the pod already has `DisruptionTarget=True`: its lastTransitionTime, which the
    /// orphan patch keeps (upstream's UpdatePodCondition keeps it when the status is unchanged).
    disruption_target_true: Option<Option<Timestamp>>,
    /// When the pod terminated, for the TTL: [`terminated_at`] (the node's clock), but never
    /// before [`recorded_at`] (the apiserver's). `None` means the TTL never applies to it.
    terminated_at: Option<Timestamp>,
    /// When this process first saw the pod Succeeded or Failed, on its own monotonic clock
    /// (set by the cache, kept across updates and relists): the TTL also needs this much
    /// time to have passed here.
    seen_final: Option<std::time::Instant>,
}

/// `metadata.uid`. The apiserver's are UUIDs (lowercase, hyphenated): kept as their 16 bytes,
/// which at 150k pods saves the 36-byte string and its allocation per pod. Any other string is
/// kept as it is; either way it prints back exactly as it came.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Uid {
    Uuid([u8; 16]),
    Other(Box<str>),
}

impl Uid {
    fn uuid(s: &str) -> Option<[u8; 16]> {
        let b = s.as_bytes();
        if b.len() != 36 || [8, 13, 18, 23].iter().any(|&i| b[i] != b'-') {
            return None;
        }
        let nibble = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        let mut hex = b.iter().copied().filter(|&c| c != b'-');
        let mut out = [0u8; 16];
        for byte in &mut out {
            *byte = nibble(hex.next()?)? << 4 | nibble(hex.next()?)?;
        }
        Some(out)
    }
}

impl From<&str> for Uid {
    fn from(s: &str) -> Self {
        match Self::uuid(s) {
            Some(b) => Self::Uuid(b),
            None => Self::Other(s.into()),
        }
    }
}

impl From<String> for Uid {
    fn from(s: String) -> Self {
        Self::from(s.as_str())
    }
}

impl std::fmt::Display for Uid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Other(s) => f.write_str(s),
            Self::Uuid(b) => {
                for (i, byte) in b.iter().enumerate() {
                    if matches!(i, 4 | 6 | 8 | 10) {
                        f.write_str("-")?;
                    }
                    write!(f, "{byte:02x}")?;
                }
                Ok(())
            }
        }
    }
}

impl std::fmt::Debug for Uid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.to_string())
    }
}

/// What PodGC knows about one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct NodeFacts {
    /// The `Ready` condition is present with status `True`.
    pub ready: bool,
    /// Carries a taint with key `node.kubernetes.io/out-of-service` (any value or effect).
    pub out_of_service: bool,
}

pub const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";
pub const DISRUPTION_TARGET: &str = "DisruptionTarget";

/// Shares one allocation per distinct namespace or node name, and per distinct list of
/// condition types.
#[derive(Default)]
pub struct Interner {
    set: HashSet<Arc<str>>,
    prune_at: usize,
    lists: HashSet<Arc<[Arc<str>]>>,
    lists_prune_at: usize,
}

impl Interner {
    /// The list of `items`, each interned, shared with every pod whose list is the same.
    pub fn intern_list<'a>(&mut self, items: impl Iterator<Item = &'a str>) -> Arc<[Arc<str>]> {
        let list: Vec<Arc<str>> = items.map(|s| self.intern(s)).collect();
        if let Some(a) = self.lists.get(&list[..]) {
            return a.clone();
        }
        if self.lists.len() >= self.lists_prune_at.max(64) {
            // Lists no pod holds any more go; the threshold doubles, as for names.
            self.lists.retain(|a| Arc::strong_count(a) > 1);
            self.lists_prune_at = self.lists.len() * 2;
        }
        let a: Arc<[Arc<str>]> = list.into();
        self.lists.insert(a.clone());
        a
    }

    pub fn intern(&mut self, s: &str) -> Arc<str> {
        if let Some(a) = self.set.get(s) {
            return a.clone();
        }
        if self.set.len() >= self.prune_at.max(1024) {
            // Names nothing holds any more (deleted namespaces and nodes) go; the threshold
            // doubles so pruning stays amortised O(1).
            self.set.retain(|a| Arc::strong_count(a) > 1);
            self.prune_at = self.set.len() * 2;
        }
        let a: Arc<str> = Arc::from(s);
        self.set.insert(a.clone());
        a
    }

    pub fn len(&self) -> usize {
        self.set.len()
    }

    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }
}

/// Why a watched object could not be kept.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("{kind} without metadata.{field}")]
pub struct Incomplete {
    pub kind: &'static str,
    pub field: &'static str,
}

impl PodFacts {
    pub fn from_wire(pod: WirePod, names: &mut Interner) -> Result<Self, Incomplete> {
        let missing = |field| Incomplete { kind: "Pod", field };
        let m = pod.metadata;
        let recorded = recorded_at(&m);
        let namespace = m.namespace.ok_or(missing("namespace"))?;
        if namespace.contains('/') {
            return Err(Incomplete {
                kind: "Pod",
                field: "namespace without '/'",
            });
        }
        let key = ObjectKey::new(&namespace, &m.name.ok_or(missing("name"))?);
        let uid = Uid::from(&*m.uid.ok_or(missing("uid"))?);
        let node_name = pod
            .spec
            .and_then(|s| s.node_name)
            .filter(|n| !n.is_empty())
            .map(|n| names.intern(&n));
        let status = pod.status.unwrap_or_default();
        let phase = Phase::parse(status.phase.as_deref());
        // The kubelet's end is on the node's clock; the apiserver recorded the pod's status
        // at or after it ended, on the cluster's: the later of the two is never early.
        let terminated_at = terminated_at(&status).map(|end| recorded.map_or(end, |r| end.max(r)));
        let conditions = status.conditions.unwrap_or_default();
        let condition_types = names.intern_list(conditions.iter().map(|c| &*c.type_));
        let disruption_target_true = conditions
            .into_iter()
            .find(|c| c.type_ == DISRUPTION_TARGET)
            .filter(|c| c.status == "True")
            .map(|c| c.last_transition_time.map(|t| t.0));
        let mut facts = Self {
            key,
            uid,
            node_name,
            phase,
            evicted: phase == Phase::Failed && status.reason.as_deref() == Some("Evicted"),
            terminating: m.deletion_timestamp.is_some(),
            force_deleted: m.deletion_timestamp.is_some()
                && m.deletion_grace_period_seconds == Some(0),
            created: m
                .creation_timestamp
                .map_or(Created::MISSING, |t| t.0.into()),
            generation: m.generation.into(),
            condition_types,
            rare: None,
        };
        facts.set_disruption_target_true(disruption_target_true);
        facts.set_terminated_at(terminated_at);
        Ok(facts)
    }

    /// When the pod already has `DisruptionTarget=True`: its lastTransitionTime, which the
    /// orphan patch keeps (upstream's UpdatePodCondition keeps it when the status is unchanged).
    pub fn disruption_target_true(&self) -> Option<Option<Timestamp>> {
        self.rare.as_ref().and_then(|r| r.disruption_target_true)
    }

    /// When the pod terminated, for the TTL: [`terminated_at`] (the node's clock), but never
    /// before [`recorded_at`] (the apiserver's). `None`: the TTL never applies to it.
    pub fn terminated_at(&self) -> Option<Timestamp> {
        self.rare.as_ref().and_then(|r| r.terminated_at)
    }

    /// When this process first saw the pod Succeeded or Failed, on its own monotonic clock
    /// (set by the cache, kept across updates and relists): the TTL also needs this much time
    /// to have passed here.
    pub fn seen_final(&self) -> Option<std::time::Instant> {
        self.rare.as_ref().and_then(|r| r.seen_final)
    }

    pub fn set_disruption_target_true(&mut self, t: Option<Option<Timestamp>>) {
        self.rare_mut(|r| r.disruption_target_true = t);
    }

    pub fn set_terminated_at(&mut self, t: Option<Timestamp>) {
        self.rare_mut(|r| r.terminated_at = t);
    }

    pub fn set_seen_final(&mut self, t: Option<std::time::Instant>) {
        self.rare_mut(|r| r.seen_final = t);
    }

    /// Changes the rare facts; a pod left with none holds no box (so two pods with the same
    /// facts compare equal however they were built).
    fn rare_mut(&mut self, change: impl FnOnce(&mut Rare)) {
        let mut rare = self.rare.take().unwrap_or_default();
        change(&mut rare);
        if *rare != Rare::default() {
            self.rare = Some(rare);
        }
    }
}

impl PodFacts {
    pub fn namespace(&self) -> &str {
        self.key.namespace()
    }

    pub fn name(&self) -> &str {
        self.key.name()
    }

    /// The node the pod is bound to, `""` when it was never scheduled (for log lines and
    /// reasons).
    pub fn node(&self) -> &str {
        self.node_name.as_deref().unwrap_or_default()
    }
}

/// The latest time the apiserver recorded for the pod, on the cluster's clock: its last status
/// write (the `time` of its `managedFields` entries for the `status` subresource; the write that
/// made it Succeeded or Failed is at most that late), and never before its creation.
pub fn recorded_at(
    m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<Timestamp> {
    let status_written = m
        .managed_fields
        .iter()
        .flatten()
        .filter(|e| e.subresource.as_deref() == Some("status"))
        .filter_map(|e| e.time.as_ref().map(|t| t.0))
        .max();
    status_written
        .into_iter()
        .chain(m.creation_timestamp.as_ref().map(|t| t.0))
        .max()
}

/// When a pod terminated, from its own status: the latest `state.terminated.finishedAt` over
/// its containers and init containers (the last one to stop ends the pod; a sidecar init
/// container stops after the main ones), once a main container has terminated: a pod whose
/// main containers never ran to an end (an init container failed) does not age from an init
/// container's end, which can be long before the pod failed. Without any, the
/// latest `lastTransitionTime` of a `Ready` or `ContainersReady` condition that is `False`
/// (the kubelet flips them when the pod completes; for a pod that never became ready this is
/// earlier than its end, which only matters for pods that never ran a container to the end).
/// Neither: `None`, and the TTL never deletes the pod; a missing timestamp never makes a pod
/// old. Only read for Succeeded and Failed pods.
pub fn terminated_at(status: &WirePodStatus) -> Option<Timestamp> {
    let finished = |cs: &Option<Vec<_>>| {
        cs.iter()
            .flatten()
            .filter_map(|c: &super::wire::WireContainerStatus| {
                c.state.as_ref()?.terminated.as_ref()?.finished_at.as_ref()
            })
            .map(|t| t.0)
            .max()
    };
    let main = finished(&status.container_statuses);
    let finished = main.map(|m| m.max(finished(&status.init_container_statuses).unwrap_or(m)));
    finished.or_else(|| {
        status
            .conditions
            .iter()
            .flatten()
            .filter(|c| matches!(c.type_.as_str(), "Ready" | "ContainersReady"))
            .filter(|c| c.status == "False")
            .filter_map(|c| c.last_transition_time.as_ref())
            .map(|t| t.0)
            .max()
    })
}

impl NodeFacts {
    pub fn from_wire(node: &WireNode) -> Self {
        Self {
            ready: node
                .conditions()
                .iter()
                .find(|c| c.type_ == "Ready")
                .is_some_and(|c| c.status == "True"),
            out_of_service: node.taints().iter().any(|t| t.key == OUT_OF_SERVICE_TAINT),
        }
    }
}

/// The two annotations as a Namespace carries them, unparsed (the cache keeps only these).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NsAnnotations {
    pub ttl: Option<Box<str>>,
    pub threshold: Option<Box<str>>,
}

/// Pods for the tests of the passes and the applier, written once.
#[cfg(test)]
pub mod example {
    use super::*;

    /// `secs` after a fixed instant (2023-11-14T22:13:20Z).
    pub fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    /// A pod `namespace/name` (UID `uid-<name>`) in `phase`, unscheduled, created at [`at`]`(0)`,
    /// generation 1, not evicted nor terminating, without conditions or end.
    pub fn pod(namespace: &str, name: &str, phase: Phase) -> PodFacts {
        PodFacts {
            key: ObjectKey::new(namespace, name),
            uid: format!("uid-{name}").into(),
            node_name: None,
            phase,
            evicted: false,
            terminating: false,
            force_deleted: false,
            created: at(0).into(),
            generation: Some(1).into(),
            condition_types: Arc::new([]),
            rare: None,
        }
    }

    pub fn evicted(p: PodFacts) -> PodFacts {
        PodFacts { evicted: true, ..p }
    }

    pub fn terminating(p: PodFacts) -> PodFacts {
        PodFacts {
            terminating: true,
            ..p
        }
    }

    /// Force-deleted already (grace 0) and held by a finalizer.
    pub fn force_deleted(p: PodFacts) -> PodFacts {
        PodFacts {
            terminating: true,
            force_deleted: true,
            ..p
        }
    }
}
