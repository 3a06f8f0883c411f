//! The admission decision for one pod bound to this node: plain values in, what to do out.
//!
//! Its memory makes it happen once per change of the pod's sysctls or of the outcome.
//!
//! kubelet admits a pod once, before it starts it; a pod it has started is never re-admitted.
//! The agent keeps to the same rule: only a pod that has not started can be failed
//! ([`started`]). A started pod the policy forbids is only reported, once per pod and policy
//! revision ([`report_event_name`]).

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodStatus};

use super::allowlist::{Admission, Allowlist};
use super::crd::Mode;

/// What admission reads of a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodFacts {
    pub uid: String,
    /// Succeeded or Failed: never touched again (kubelet does not re-admit them either).
    pub terminal: bool,
    /// Being deleted: failing it would change nothing, so it is left alone.
    pub deleting: bool,
    /// kubelet has admitted and begun running it (see [`started`]): never failed.
    pub started: bool,
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
            started: pod.status.as_ref().is_some_and(started),
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

pub use groundskeeper_sysctl::verdict::stable_hash;

/// The name of the one Warning event that reports a forbidden pod the agent does not fail
/// (Audit, or already started), for this pod UID, policy revision and verdict. Being derived,
/// it comes out the same after an agent restart: creating it again gets 409 AlreadyExists,
/// which is how "already reported" survives restarts without any write to the pod.
/// `<pod name, cut to fit>.sysctl-<16 hex>`, a valid DNS subdomain of at most 253 characters.
pub fn report_event_name(pod_name: &str, uid: &str, policy_revision: u64, message: &str) -> String {
    let h = stable_hash(&[uid, &format!("{policy_revision:016x}"), message]);
    let suffix = format!(".sysctl-{h:016x}");
    let room = 253 - suffix.len();
    let mut head: String = pod_name.chars().take(room).collect();
    // A cut name must still end a DNS label with an alphanumeric.
    while head.ends_with(['-', '.']) {
        head.pop();
    }
    if head.is_empty() {
        head.push_str("pod");
    }
    format!("{head}{suffix}")
}

/// A pod's verdict under the node's policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Admit,
    Reject { mode: Mode, message: String },
}

/// What admission does for a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing to do, nothing to remember.
    Skip,
    /// Already handled with this outcome for these sysctls.
    AlreadyDone,
    /// Allowed: remember, touch nothing.
    Admit,
    /// Forbidden, not started: in Enforce fail the pod and warn; in Audit only warn.
    Reject { mode: Mode, message: String },
    /// Forbidden but already started: kubelet admitted it, so it is never failed; report it
    /// (event once per pod and policy revision, metric) and touch nothing.
    ReportStarted { mode: Mode, message: String },
    /// Forbidden, started, and nobody chose a policy for this node (no SysctlPolicy selects
    /// it, default mode Audit): touch nothing, say nothing, remember nothing, so that a policy
    /// created later does report it. A default install must not fill the cluster with events
    /// about workloads kubelet already admitted.
    LeaveStarted,
}

/// What was done per pod UID: the fingerprint it was done for and the outcome.
#[derive(Default, Debug)]
pub struct Memory {
    done: HashMap<String, (u64, Outcome)>,
}

impl Memory {
    pub fn remember(&mut self, facts: &PodFacts, outcome: Outcome) {
        self.done
            .insert(facts.uid.clone(), (facts.fingerprint, outcome));
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

    fn get(&self, uid: &str) -> Option<&(u64, Outcome)> {
        self.done.get(uid)
    }
}

/// The outcome for a pod spec under this allowlist and mode.
pub fn outcome(allowlist: &Allowlist, mode: Mode, pod: &Pod) -> Outcome {
    match pod.spec.as_ref().map(|s| allowlist.admit(s)) {
        None | Some(Admission::Admit) => Outcome::Admit,
        Some(Admission::Reject { message, .. }) => Outcome::Reject { mode, message },
    }
}

/// Decides for one pod. A pod is acted on when its outcome differs from what was last done
/// for the same sysctls: so a pod is warned about once, failed once, and a policy change that
/// turns Audit into Enforce does fail a pod that was only warned about, if it has not started.
/// A started pod is never failed, whatever the policy says now; it is reported only when the
/// node's policy was chosen (`chosen`: a SysctlPolicy selects the node, or the default mode
/// was set to Enforce).
pub fn decide(facts: &PodFacts, outcome: Outcome, memory: &Memory, chosen: bool) -> Action {
    if facts.terminal || facts.deleting || facts.uid.is_empty() {
        return Action::Skip;
    }
    if let Some((fp, done)) = memory.get(&facts.uid)
        && *fp == facts.fingerprint
        && *done == outcome
    {
        return Action::AlreadyDone;
    }
    match outcome {
        Outcome::Admit => Action::Admit,
        Outcome::Reject { .. } if facts.started && !chosen => Action::LeaveStarted,
        Outcome::Reject { mode, message } if facts.started => {
            Action::ReportStarted { mode, message }
        }
        Outcome::Reject { mode, message } => Action::Reject { mode, message },
    }
}
