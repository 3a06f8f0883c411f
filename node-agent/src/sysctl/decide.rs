//! The admission decision for one pod bound to this node: plain values in, what to do out,
//! and the memory that makes it happen once per change of the pod's sysctls or of the outcome.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use k8s_openapi::api::core::v1::Pod;

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
            fingerprint: h.finish(),
        }
    }
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
    /// Forbidden: in Enforce fail the pod and warn; in Audit only warn.
    Reject { mode: Mode, message: String },
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
/// turns Audit into Enforce does fail a pod that was only warned about.
pub fn decide(facts: &PodFacts, outcome: Outcome, memory: &Memory) -> Action {
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
        Outcome::Reject { mode, message } => Action::Reject { mode, message },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSecurityContext, PodSpec, PodStatus, Sysctl};
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
        let facts = PodFacts::of(p);
        let out = outcome(&list(), mode, p);
        let action = decide(&facts, out.clone(), memory);
        if matches!(action, Action::Admit | Action::Reject { .. }) {
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
