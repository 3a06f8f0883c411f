//! What the agent does about one pod bound to its node: plain values in, what to do out.
//!
//! The agent never fails a pod. Keeping a forbidden pod off a node is the admission webhook's
//! work, done before the binding (a Failed status written after it raced kubelet and lost: the
//! pod ran anyway). The agent waits for kubelet's own verdict and reports what it sees:
//!
//! - kubelet rejected the pod (Failed) or it is being deleted: kubelet's verdict; nothing;
//! - kubelet admitted and started it ([`started`]) while the node's verdict already forbade it:
//!   under Enforce it ran despite the policy ([`Action::ReportRan`]), under Audit it is the
//!   audit report ([`Action::ReportAudit`]);
//! - it had started before the verdict (a policy created, narrowed or moved onto the node
//!   later): reported once as started before ([`Action::ReportStarted`]), never touched.
//!
//! Its memory makes each report happen once per change of the pod's sysctls, of the verdict,
//! or of whether it has started.
//!
//! Also the Node's Event for a default pod sysctl the node can not apply: its note and its
//! derived name ([`default_event_name`]).

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use groundskeeper_sysctl_rules::defaults::Effect;
use groundskeeper_sysctl_rules::names::go_quote;
use groundskeeper_sysctl_rules::verdict::Verdict;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodStatus};

use super::crd::Mode;

/// kubelet's annotation on the mirror pod of a static pod.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// What the worker reads of a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodFacts {
    pub uid: String,
    /// Succeeded or Failed: never touched again (kubelet does not re-admit them either).
    pub terminal: bool,
    /// Being deleted: failing it would change nothing, so it is left alone.
    pub deleting: bool,
    /// A mirror pod (annotation [`MIRROR_ANNOTATION`]): the API's copy of a static pod, which
    /// kubelet alone admits and runs from its manifest. Never judged: recreated for a running
    /// static pod, it has no status for a few seconds and would look seen-pending, then "ran".
    pub mirror: bool,
    /// kubelet has admitted and begun running it (see [`started`]).
    pub started: bool,
    /// `status.startTime`: when kubelet admitted it (its first status write).
    pub started_at: Option<Timestamp>,
    /// What the verdict depends on: the sysctls in order, hostNetwork, hostIPC.
    pub fingerprint: u64,
}

impl PodFacts {
    pub fn of(pod: &Pod) -> Self {
        let spec = pod.spec.as_ref();
        let mut h = DefaultHasher::new();
        if let Some(sysctls) = spec
            .and_then(|s| s.security_context.as_ref())
            .and_then(|s| s.sysctls.as_ref())
        {
            for s in sysctls {
                s.name.hash(&mut h);
                s.value.hash(&mut h);
            }
        }
        spec.and_then(|s| s.host_network)
            .unwrap_or(false)
            .hash(&mut h);
        spec.and_then(|s| s.host_ipc).unwrap_or(false).hash(&mut h);
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        PodFacts {
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            terminal: matches!(phase, Some("Succeeded" | "Failed")),
            deleting: pod.metadata.deletion_timestamp.is_some(),
            mirror: pod
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION)),
            started: pod.status.as_ref().is_some_and(started),
            started_at: pod
                .status
                .as_ref()
                .and_then(|s| s.start_time.as_ref())
                .map(|t| t.0),
            fingerprint: h.finish(),
        }
    }
}

/// Whether kubelet has admitted the pod and begun running it, judged only from what kubelet
/// itself writes to the pod's status. kubelet's sysctl check is an admission check: it runs
/// once, before kubelet first syncs the pod, and a pod it has admitted is never rejected
/// later. The agent acts only where kubelet's admission would, so any sign that kubelet has
/// taken the pod on means "started", and a started pod is never failed:
///
/// - `status.startTime` is set: kubelet's status manager sets it the first time it writes the
///   status of a pod it admitted (the earliest signal; phase is still Pending then);
/// - `status.phase` is anything but Pending or empty (Running, Succeeded, Failed, Unknown);
/// - any container, init container or ephemeral container status shows the runtime at work:
///   state or last state running or terminated, a `containerID`, `started: true`, or restarts;
/// - a condition of a type only kubelet writes (`PodReadyToStartContainers`, `Initialized`,
///   `ContainersReady`, `Ready`), whatever its value: kubelet writes them once admitted.
///
/// Signals other actors write (`PodScheduled`, `DisruptionTarget`, readiness-gate conditions,
/// nominatedNodeName) do not count: they say nothing about kubelet. Erring towards "started" is
/// the safe side: the worst it does is leave a forbidden pod to kubelet's own admission.
pub fn started(status: &PodStatus) -> bool {
    const KUBELET_CONDITIONS: [&str; 4] = [
        "PodReadyToStartContainers",
        "Initialized",
        "ContainersReady",
        "Ready",
    ];
    let container_started = |c: &ContainerStatus| {
        let ran = |s: Option<&k8s_openapi::api::core::v1::ContainerState>| {
            s.is_some_and(|s| s.running.is_some() || s.terminated.is_some())
        };
        ran(c.state.as_ref())
            || ran(c.last_state.as_ref())
            || c.container_id.as_deref().is_some_and(|id| !id.is_empty())
            || c.started == Some(true)
            || c.restart_count > 0
    };
    let any_container = [
        status.container_statuses.as_ref(),
        status.init_container_statuses.as_ref(),
        status.ephemeral_container_statuses.as_ref(),
    ]
    .into_iter()
    .flatten()
    .flatten()
    .any(container_started);
    status.start_time.is_some()
        || status
            .phase
            .as_deref()
            .is_some_and(|p| !p.is_empty() && p != "Pending")
        || any_container
        || status
            .conditions
            .iter()
            .flatten()
            .any(|c| KUBELET_CONDITIONS.contains(&c.type_.as_str()))
}

pub use groundskeeper_sysctl_rules::hash::stable_hash;

/// The name of the one Warning event that reports a forbidden pod that started (ran despite
/// Enforce, audited, or already started), for this pod UID, policy revision and the verdict's
/// message: whichever report it is, a second one is not made. Being derived,
/// it comes out the same after an agent restart: creating it again gets 409 AlreadyExists,
/// which is how "already reported" survives restarts without any write to the pod.
/// `<pod name, cut to fit>.sysctl-<16 hex>`, a valid DNS subdomain of at most 253 characters.
pub fn report_event_name(pod_name: &str, uid: &str, policy_revision: u64, message: &str) -> String {
    let h = stable_hash(&[uid, &format!("{policy_revision:016x}"), message]);
    derived_name(pod_name, &format!(".sysctl-{h:016x}"), "pod")
}

/// The name of the one Warning Event on the Node that flags a default pod sysctl the node can
/// not apply, for this default and this note (which says why, by which kubelet and kernel): a
/// second is made only when the judgement changes, and not by a restarted agent.
/// `<node name, cut to fit>.default-sysctl-<16 hex>`.
pub fn default_event_name(node: &str, sysctl: &str, note: &str) -> String {
    let h = stable_hash(&[sysctl, note]);
    derived_name(node, &format!(".default-sysctl-{h:016x}"), "node")
}

/// The Warning Event's note for a default the node can not apply (a note is at most 1024
/// bytes: the value, up to 1024 itself, is left out).
pub fn default_note(sysctl: &str, why: &Effect) -> String {
    format!(
        "default pod sysctl {} (kubelet defaultPodSysctls) can not be applied on this node: {why}",
        go_quote(sysctl)
    )
}

/// `head` cut so that `head` and `suffix` make a DNS subdomain of at most 253 characters, still
/// ending a label with an alphanumeric; `fallback` when nothing of it is left.
fn derived_name(head: &str, suffix: &str, fallback: &str) -> String {
    let room = 253 - suffix.len();
    let mut head: String = head.chars().take(room).collect();
    while head.ends_with(['-', '.']) {
        head.pop();
    }
    if head.is_empty() {
        head.push_str(fallback);
    }
    format!("{head}{suffix}")
}

/// What the agent does for a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing to do, nothing to remember: terminal (kubelet's verdict, or done), being
    /// deleted, or unnamed.
    Skip,
    /// Already handled for these sysctls, this verdict and this stage.
    AlreadyDone,
    /// Allowed: remember, touch nothing.
    Admit,
    /// Forbidden and not started: nothing is written. Under Enforce the webhook should have
    /// kept it off this node; kubelet's own admission decides now, and if kubelet starts it,
    /// it is known to have started under this verdict.
    Await { mode: Mode, message: String },
    /// Forbidden under Enforce, and started while that verdict was in force: it ran despite
    /// the policy. Reported (Event `SysctlForbiddenRan`, metric), never stopped.
    ReportRan { message: String },
    /// Forbidden under Audit, started while that verdict was in force: the audit report.
    ReportAudit { message: String },
    /// Forbidden, but it had started before this verdict: reported once where someone chose
    /// the node's policy; never touched.
    ReportStarted { mode: Mode, message: String },
    /// As [`Action::ReportStarted`], on a node nobody chose a policy for (no SysctlPolicy
    /// selects it, default mode Audit): nothing said, nothing remembered, so a policy created
    /// later does report it. A default install must not fill the cluster with events about
    /// workloads kubelet had already admitted.
    LeaveStarted,
}

/// Whether the pod had started when it was last seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Pending,
    Started,
}

/// What was done per pod UID: for which sysctls, under which verdict, at which stage.
#[derive(Default, Debug)]
pub struct Memory {
    done: HashMap<String, (u64, Verdict, Stage)>,
}

impl Memory {
    pub fn remember(&mut self, facts: &PodFacts, verdict: Verdict) {
        let stage = if facts.started {
            Stage::Started
        } else {
            Stage::Pending
        };
        self.done
            .insert(facts.uid.clone(), (facts.fingerprint, verdict, stage));
    }

    pub fn forget(&mut self, uid: &str) {
        self.done.remove(uid);
    }

    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.done.retain(|uid, _| keep(uid));
    }

    pub fn len(&self) -> usize {
        self.done.len()
    }

    pub fn is_empty(&self) -> bool {
        self.done.is_empty()
    }

    /// This pod was seen not started, with these sysctls, under this verdict.
    fn seen_pending(&self, facts: &PodFacts, verdict: &Verdict) -> bool {
        self.done.get(&facts.uid).is_some_and(|(fp, v, stage)| {
            *fp == facts.fingerprint && v == verdict && *stage == Stage::Pending
        })
    }

    fn done(&self, facts: &PodFacts, verdict: &Verdict) -> bool {
        let stage = if facts.started {
            Stage::Started
        } else {
            Stage::Pending
        };
        self.done
            .get(&facts.uid)
            .is_some_and(|(fp, v, s)| *fp == facts.fingerprint && v == verdict && *s == stage)
    }
}

/// Decides for one pod under the node's `verdict` for it. `since` is when the node's current
/// policy came into force for this agent: a pod kubelet started after it (its startTime, on
/// the same node's clock, is later), or that this agent saw not started under the same
/// verdict, started under it. Doubt goes towards "started before", which only reports.
/// `chosen`: a SysctlPolicy selects the node, or the default mode is Enforce.
pub fn decide(
    facts: &PodFacts,
    verdict: Verdict,
    memory: &Memory,
    chosen: bool,
    since: Timestamp,
) -> Action {
    if facts.terminal || facts.deleting || facts.mirror || facts.uid.is_empty() {
        return Action::Skip;
    }
    if memory.done(facts, &verdict) {
        return Action::AlreadyDone;
    }
    let Verdict::Forbidden { mode, message } = verdict.clone() else {
        return Action::Admit;
    };
    if !facts.started {
        return Action::Await { mode, message };
    }
    let under_verdict =
        memory.seen_pending(facts, &verdict) || facts.started_at.is_some_and(|t| t > since);
    match (under_verdict, mode) {
        (true, Mode::Enforce) => Action::ReportRan { message },
        (true, Mode::Audit) => Action::ReportAudit { message },
        (false, _) if chosen => Action::ReportStarted { mode, message },
        (false, _) => Action::LeaveStarted,
    }
}
