//! The admission decision for one pod bound to this node: plain values in, what to do out,
//! and the memory that makes it happen once per change of the pod's sysctls or of the outcome.
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

/// FNV-1a, 64 bits: a hash that is the same in every build and process, for names that must
/// come out the same after a restart (std's `DefaultHasher` promises no such thing).
pub fn stable_hash(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        // A separator byte that can not occur in the parts keeps ["ab","c"] apart from ["a","bc"].
        for b in part.bytes().chain(std::iter::once(0xff)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

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

/// What the thin layer does for a pod.
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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStateWaiting, PodCondition,
        PodSecurityContext, PodSpec, Sysctl,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn pod(uid: &str, sysctls: &[&str], phase: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.uid = Some(uid.into());
        p.spec = Some(PodSpec {
            security_context: Some(PodSecurityContext {
                sysctls: Some(
                    sysctls
                        .iter()
                        .map(|n| Sysctl {
                            name: n.to_string(),
                            value: "1".into(),
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        });
        p.status = Some(PodStatus {
            phase: Some(phase.into()),
            ..Default::default()
        });
        p
    }

    fn list() -> Allowlist {
        Allowlist::new(&["kernel.shm_rmid_forced"]).unwrap()
    }

    fn run(p: &Pod, mode: Mode, memory: &mut Memory) -> Action {
        run_chosen(p, mode, memory, true)
    }

    /// As the thin layer does it: remember what was acted on.
    fn run_chosen(p: &Pod, mode: Mode, memory: &mut Memory, chosen: bool) -> Action {
        let facts = PodFacts::of(p);
        let out = outcome(&list(), mode, p);
        let action = decide(&facts, out.clone(), memory, chosen);
        if !matches!(
            action,
            Action::Skip | Action::AlreadyDone | Action::LeaveStarted
        ) {
            memory.remember(&facts, out);
        }
        action
    }

    const MSG: &str = r#"forbidden sysctl: "kernel.msgmax" not allowlisted"#;

    #[test]
    fn forbidden_pod_is_rejected_once() {
        let mut m = Memory::default();
        let p = pod("u1", &["kernel.msgmax"], "Pending");
        let want = Action::Reject {
            mode: Mode::Enforce,
            message: MSG.into(),
        };
        assert_eq!(run(&p, Mode::Enforce, &mut m), want);
        assert_eq!(run(&p, Mode::Enforce, &mut m), Action::AlreadyDone);
    }

    #[test]
    fn allowed_pod_is_never_rejected() {
        let mut m = Memory::default();
        let p = pod("u1", &["kernel.shm_rmid_forced"], "Pending");
        assert_eq!(run(&p, Mode::Enforce, &mut m), Action::Admit);
        assert_eq!(run(&p, Mode::Enforce, &mut m), Action::AlreadyDone);
        assert_eq!(
            run(&pod("u2", &[], "Running"), Mode::Enforce, &mut m),
            Action::Admit
        );
    }

    #[test]
    fn terminal_and_deleting_pods_are_never_touched() {
        let mut m = Memory::default();
        for phase in ["Succeeded", "Failed"] {
            assert_eq!(
                run(&pod("u1", &["kernel.msgmax"], phase), Mode::Enforce, &mut m),
                Action::Skip
            );
        }
        let mut p = pod("u2", &["kernel.msgmax"], "Running");
        p.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        assert_eq!(run(&p, Mode::Enforce, &mut m), Action::Skip);
        assert!(m.is_empty());
    }

    #[test]
    fn audit_then_enforce_acts_again_but_same_audit_does_not() {
        let mut m = Memory::default();
        let p = pod("u1", &["kernel.msgmax"], "Pending");
        assert!(matches!(
            run(&p, Mode::Audit, &mut m),
            Action::Reject {
                mode: Mode::Audit,
                ..
            }
        ));
        assert_eq!(run(&p, Mode::Audit, &mut m), Action::AlreadyDone);
        assert!(matches!(
            run(&p, Mode::Enforce, &mut m),
            Action::Reject {
                mode: Mode::Enforce,
                ..
            }
        ));
    }

    fn container(f: impl FnOnce(&mut ContainerStatus)) -> Vec<ContainerStatus> {
        let mut c = ContainerStatus {
            name: "c".into(),
            ..Default::default()
        };
        f(&mut c);
        vec![c]
    }

    fn state(running: bool, terminated: bool) -> ContainerState {
        ContainerState {
            running: running.then(Default::default),
            terminated: terminated.then(|| ContainerStateTerminated {
                exit_code: 0,
                ..Default::default()
            }),
            waiting: (!running && !terminated).then(|| ContainerStateWaiting {
                reason: Some("ContainerCreating".into()),
                ..Default::default()
            }),
        }
    }

    fn condition(type_: &str, status: &str) -> Option<Vec<PodCondition>> {
        Some(vec![PodCondition {
            type_: type_.into(),
            status: status.into(),
            ..Default::default()
        }])
    }

    #[test]
    fn started_is_read_from_what_kubelet_writes() {
        let t = || Some(Time(jiff::Timestamp::UNIX_EPOCH));
        let table: Vec<(&str, PodStatus, bool)> = vec![
            ("no status at all", PodStatus::default(), false),
            (
                "Pending, nothing else",
                PodStatus {
                    phase: Some("Pending".into()),
                    ..Default::default()
                },
                false,
            ),
            (
                "empty phase",
                PodStatus {
                    phase: Some(String::new()),
                    ..Default::default()
                },
                false,
            ),
            (
                "scheduler's PodScheduled only",
                PodStatus {
                    phase: Some("Pending".into()),
                    conditions: condition("PodScheduled", "True"),
                    ..Default::default()
                },
                false,
            ),
            (
                "a controller's DisruptionTarget only",
                PodStatus {
                    conditions: condition("DisruptionTarget", "True"),
                    ..Default::default()
                },
                false,
            ),
            (
                "nominatedNodeName and a waiting-free empty container list",
                PodStatus {
                    nominated_node_name: Some("n".into()),
                    container_statuses: Some(vec![]),
                    ..Default::default()
                },
                false,
            ),
            (
                "container waiting, no id yet",
                PodStatus {
                    container_statuses: Some(container(|c| c.state = Some(state(false, false)))),
                    ..Default::default()
                },
                false,
            ),
            (
                "startTime set, still Pending",
                PodStatus {
                    phase: Some("Pending".into()),
                    start_time: t(),
                    ..Default::default()
                },
                true,
            ),
            (
                "phase Running",
                PodStatus {
                    phase: Some("Running".into()),
                    ..Default::default()
                },
                true,
            ),
            (
                "phase Unknown",
                PodStatus {
                    phase: Some("Unknown".into()),
                    ..Default::default()
                },
                true,
            ),
            (
                "phase Succeeded",
                PodStatus {
                    phase: Some("Succeeded".into()),
                    ..Default::default()
                },
                true,
            ),
            (
                "container running",
                PodStatus {
                    container_statuses: Some(container(|c| c.state = Some(state(true, false)))),
                    ..Default::default()
                },
                true,
            ),
            (
                "container terminated",
                PodStatus {
                    container_statuses: Some(container(|c| c.state = Some(state(false, true)))),
                    ..Default::default()
                },
                true,
            ),
            (
                "container waiting after a run (last state terminated)",
                PodStatus {
                    container_statuses: Some(container(|c| {
                        c.state = Some(state(false, false));
                        c.last_state = Some(state(false, true));
                    })),
                    ..Default::default()
                },
                true,
            ),
            (
                "container created (containerID)",
                PodStatus {
                    container_statuses: Some(container(|c| {
                        c.container_id = Some("containerd://abc".into())
                    })),
                    ..Default::default()
                },
                true,
            ),
            (
                "container started flag",
                PodStatus {
                    container_statuses: Some(container(|c| c.started = Some(true))),
                    ..Default::default()
                },
                true,
            ),
            (
                "container restarted",
                PodStatus {
                    container_statuses: Some(container(|c| c.restart_count = 1)),
                    ..Default::default()
                },
                true,
            ),
            (
                "init container running",
                PodStatus {
                    init_container_statuses: Some(container(|c| {
                        c.state = Some(state(true, false))
                    })),
                    ..Default::default()
                },
                true,
            ),
            (
                "ephemeral container terminated",
                PodStatus {
                    ephemeral_container_statuses: Some(container(|c| {
                        c.state = Some(state(false, true))
                    })),
                    ..Default::default()
                },
                true,
            ),
            (
                "kubelet's PodReadyToStartContainers, False",
                PodStatus {
                    conditions: condition("PodReadyToStartContainers", "False"),
                    ..Default::default()
                },
                true,
            ),
            (
                "kubelet's Initialized",
                PodStatus {
                    conditions: condition("Initialized", "True"),
                    ..Default::default()
                },
                true,
            ),
        ];
        for (case, status, want) in table {
            assert_eq!(started(&status), want, "{case}");
        }
    }

    fn running(uid: &str, sysctls: &[&str]) -> Pod {
        let mut p = pod(uid, sysctls, "Running");
        let st = p.status.as_mut().unwrap();
        st.start_time = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        st.container_statuses = Some(container(|c| c.state = Some(state(true, false))));
        p
    }

    #[test]
    fn started_pods_are_never_failed_whatever_the_mode() {
        for mode in [Mode::Enforce, Mode::Audit] {
            let mut m = Memory::default();
            let p = running("u1", &["kernel.msgmax"]);
            assert_eq!(
                run(&p, mode, &mut m),
                Action::ReportStarted {
                    mode,
                    message: MSG.into()
                },
                "{mode}"
            );
            assert_eq!(run(&p, mode, &mut m), Action::AlreadyDone, "{mode}");
        }
        // Only startTime written yet (phase still Pending): already admitted by kubelet.
        let mut p = pod("u2", &["kernel.msgmax"], "Pending");
        p.status.as_mut().unwrap().start_time = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        assert!(matches!(
            run(&p, Mode::Enforce, &mut Memory::default()),
            Action::ReportStarted { .. }
        ));
    }

    #[test]
    fn policy_turning_enforce_after_start_reports_and_never_fails() {
        let mut m = Memory::default();
        // Audited while pending, then started, then the node turns Enforce.
        let pending = pod("u1", &["kernel.msgmax"], "Pending");
        assert!(matches!(
            run(&pending, Mode::Audit, &mut m),
            Action::Reject {
                mode: Mode::Audit,
                ..
            }
        ));
        let started_pod = running("u1", &["kernel.msgmax"]);
        assert_eq!(run(&started_pod, Mode::Audit, &mut m), Action::AlreadyDone);
        assert!(matches!(
            run(&started_pod, Mode::Enforce, &mut m),
            Action::ReportStarted {
                mode: Mode::Enforce,
                ..
            }
        ));
        // A fresh agent (empty memory, as after a restart) under Enforce: still only a report.
        assert!(matches!(
            run(&started_pod, Mode::Enforce, &mut Memory::default()),
            Action::ReportStarted { .. }
        ));
        // And an allowed started pod is simply admitted.
        assert_eq!(
            run(
                &running("u3", &["kernel.shm_rmid_forced"]),
                Mode::Enforce,
                &mut m
            ),
            Action::Admit
        );
    }

    #[test]
    fn default_install_leaves_started_pods_silent_until_a_policy_is_chosen() {
        let mut m = Memory::default();
        let p = running("u1", &["kernel.msgmax"]);
        // No policy, default Audit: nothing, and nothing remembered.
        assert_eq!(
            run_chosen(&p, Mode::Audit, &mut m, false),
            Action::LeaveStarted
        );
        assert_eq!(
            run_chosen(&p, Mode::Audit, &mut m, false),
            Action::LeaveStarted
        );
        assert!(m.is_empty());
        // An Audit policy is created for the node: now it is reported, once.
        assert!(matches!(
            run_chosen(&p, Mode::Audit, &mut m, true),
            Action::ReportStarted {
                mode: Mode::Audit,
                ..
            }
        ));
        assert_eq!(
            run_chosen(&p, Mode::Audit, &mut m, true),
            Action::AlreadyDone
        );
        // A pending pod is still audited in the default mode (what Enforce would do).
        assert!(matches!(
            run_chosen(
                &pod("u2", &["kernel.msgmax"], "Pending"),
                Mode::Audit,
                &mut m,
                false
            ),
            Action::Reject {
                mode: Mode::Audit,
                ..
            }
        ));
        // Allowed or terminal pods are unaffected by the choice.
        assert_eq!(
            run_chosen(
                &running("u3", &["kernel.shm_rmid_forced"]),
                Mode::Audit,
                &mut m,
                false
            ),
            Action::Admit
        );
    }

    /// Whatever the mode, the choice, the memory (fresh, or what any earlier outcome left) and
    /// whichever started signal is present, a started pod never gets `Reject`.
    #[test]
    fn no_combination_rejects_a_started_pod() {
        let signals: Vec<Pod> = vec![running("u", &["kernel.msgmax"]), {
            let mut p = pod("u", &["kernel.msgmax"], "Pending");
            p.status.as_mut().unwrap().conditions = condition("Initialized", "False");
            p
        }];
        let earlier = [
            None,
            Some(Outcome::Admit),
            Some(Outcome::Reject {
                mode: Mode::Audit,
                message: MSG.into(),
            }),
            Some(Outcome::Reject {
                mode: Mode::Enforce,
                message: "another verdict".into(),
            }),
        ];
        for p in &signals {
            for mode in [Mode::Audit, Mode::Enforce] {
                for chosen in [false, true] {
                    for before in &earlier {
                        let mut m = Memory::default();
                        if let Some(o) = before {
                            m.remember(&PodFacts::of(p), o.clone());
                        }
                        let a = decide(&PodFacts::of(p), outcome(&list(), mode, p), &m, chosen);
                        assert!(
                            !matches!(a, Action::Reject { .. }),
                            "{mode} chosen={chosen} before={before:?}: {a:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn report_event_names_are_stable_distinct_and_valid() {
        let a = report_event_name("web-0", "uid-1", 7, MSG);
        assert_eq!(a, report_event_name("web-0", "uid-1", 7, MSG), "stable");
        assert!(a.starts_with("web-0.sysctl-") && a.len() == "web-0.sysctl-".len() + 16);
        for other in [
            report_event_name("web-0", "uid-2", 7, MSG),
            report_event_name("web-0", "uid-1", 8, MSG),
            report_event_name("web-0", "uid-1", 7, "other"),
        ] {
            assert_ne!(a, other);
        }
        // Pinned: a different value after a toolchain or code change would re-emit every
        // report once after the upgrade.
        assert_eq!(stable_hash(&["a"]), stable_hash(&["a"]));
        assert_ne!(stable_hash(&["ab", "c"]), stable_hash(&["a", "bc"]));
        assert_eq!(stable_hash(&[]), 0xcbf2_9ce4_8422_2325);

        // The cut (229 characters of head) lands right after a '-'.
        let long = format!("{}-{}", "a".repeat(228), "b".repeat(24));
        let n = report_event_name(&long, "u", 1, MSG);
        assert!(n.len() <= 253, "{}", n.len());
        let head = n.split(".sysctl-").next().unwrap();
        assert!(!head.ends_with('-') && !head.ends_with('.'), "{n}");
        assert!(report_event_name("", "u", 1, MSG).starts_with("pod.sysctl-"));
    }

    #[test]
    fn changed_sysctls_are_evaluated_again() {
        let mut m = Memory::default();
        assert_eq!(
            run(
                &pod("u1", &["kernel.shm_rmid_forced"], "Pending"),
                Mode::Enforce,
                &mut m
            ),
            Action::Admit
        );
        assert!(matches!(
            run(
                &pod("u1", &["kernel.msgmax"], "Pending"),
                Mode::Enforce,
                &mut m
            ),
            Action::Reject { .. }
        ));
    }
}
