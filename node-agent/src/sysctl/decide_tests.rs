//! The admission decision per pod: started signals, memory, event names.

use super::allowlist::Allowlist;
use super::crd::Mode;
use super::decide::*;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateTerminated, ContainerStateWaiting, ContainerStatus, Pod,
    PodCondition, PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

fn pod(uid: &str, sysctls: &[&str], phase: &str) -> Pod {
    let mut p = Pod::default();
    p.metadata.uid = Some(uid.into());
    p.spec = Some(PodSpec {
        security_context: Some(testkit::sysctls(sysctls)),
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

/// As admission does it: remember what was acted on.
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
            Action::Skip,
            "{phase}"
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

/// A status with `f` applied.
fn status(f: impl FnOnce(&mut PodStatus)) -> PodStatus {
    let mut s = PodStatus::default();
    f(&mut s);
    s
}

/// A status with one container, `f` applied to it.
fn one_container(f: impl FnOnce(&mut ContainerStatus)) -> PodStatus {
    status(|s| s.container_statuses = Some(container(f)))
}

fn phase(p: &str) -> Option<String> {
    Some(p.into())
}

#[test]
fn started_is_read_from_what_kubelet_writes() {
    let t = || Some(Time(jiff::Timestamp::UNIX_EPOCH));
    let table: Vec<(&str, PodStatus, bool)> = vec![
        ("no status at all", PodStatus::default(), false),
        (
            "Pending, nothing else",
            status(|s| s.phase = phase("Pending")),
            false,
        ),
        ("empty phase", status(|s| s.phase = phase("")), false),
        (
            "scheduler's PodScheduled only",
            status(|s| {
                s.phase = phase("Pending");
                s.conditions = condition("PodScheduled", "True");
            }),
            false,
        ),
        (
            "a controller's DisruptionTarget only",
            status(|s| s.conditions = condition("DisruptionTarget", "True")),
            false,
        ),
        (
            "nominatedNodeName and a waiting-free empty container list",
            status(|s| {
                s.nominated_node_name = Some("n".into());
                s.container_statuses = Some(vec![]);
            }),
            false,
        ),
        (
            "container waiting, no id yet",
            one_container(|c| c.state = Some(state(false, false))),
            false,
        ),
        (
            "startTime set, still Pending",
            status(|s| {
                s.phase = phase("Pending");
                s.start_time = t();
            }),
            true,
        ),
        (
            "phase Running",
            status(|s| s.phase = phase("Running")),
            true,
        ),
        (
            "phase Unknown",
            status(|s| s.phase = phase("Unknown")),
            true,
        ),
        (
            "phase Succeeded",
            status(|s| s.phase = phase("Succeeded")),
            true,
        ),
        (
            "container running",
            one_container(|c| c.state = Some(state(true, false))),
            true,
        ),
        (
            "container terminated",
            one_container(|c| c.state = Some(state(false, true))),
            true,
        ),
        (
            "container waiting after a run (last state terminated)",
            one_container(|c| {
                c.state = Some(state(false, false));
                c.last_state = Some(state(false, true));
            }),
            true,
        ),
        (
            "container created (containerID)",
            one_container(|c| c.container_id = Some("containerd://abc".into())),
            true,
        ),
        (
            "container started flag",
            one_container(|c| c.started = Some(true)),
            true,
        ),
        (
            "container restarted",
            one_container(|c| c.restart_count = 1),
            true,
        ),
        (
            "init container running",
            status(|s| {
                s.init_container_statuses = Some(container(|c| c.state = Some(state(true, false))))
            }),
            true,
        ),
        (
            "ephemeral container terminated",
            status(|s| {
                s.ephemeral_container_statuses =
                    Some(container(|c| c.state = Some(state(false, true))))
            }),
            true,
        ),
        (
            "kubelet's PodReadyToStartContainers, False",
            status(|s| s.conditions = condition("PodReadyToStartContainers", "False")),
            true,
        ),
        (
            "kubelet's Initialized",
            status(|s| s.conditions = condition("Initialized", "True")),
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
    let signals: Vec<(&str, Pod)> = vec![
        ("running", running("u", &["kernel.msgmax"])),
        ("Initialized condition", {
            let mut p = pod("u", &["kernel.msgmax"], "Pending");
            p.status.as_mut().unwrap().conditions = condition("Initialized", "False");
            p
        }),
    ];
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
    for (signal, p) in &signals {
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
                        "{signal} {mode} chosen={chosen} before={before:?}: {a:?}"
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
    for (what, other) in [
        ("uid", report_event_name("web-0", "uid-2", 7, MSG)),
        ("revision", report_event_name("web-0", "uid-1", 8, MSG)),
        ("message", report_event_name("web-0", "uid-1", 7, "other")),
    ] {
        assert_ne!(a, other, "another {what}");
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

/// Issue 21, item 7: a mirror pod (the API's copy of a static pod) is kubelet's alone to admit.
/// Recreated for a static pod that is running, it has no status for a few seconds and looked
/// not started: under Enforce it was failed. It is never judged, in any mode or state.
#[test]
fn mirror_pods_are_never_judged() {
    for (phase, mode) in [
        ("", Mode::Enforce),
        ("Pending", Mode::Enforce),
        ("Pending", Mode::Audit),
        ("Running", Mode::Enforce),
    ] {
        let mut p = pod("mirror", &["kernel.msgmax"], phase);
        p.status = (!phase.is_empty()).then(|| p.status.take()).flatten();
        p.metadata.annotations = Some(
            [(MIRROR_ANNOTATION.to_string(), "8f2a".to_string())]
                .into_iter()
                .collect(),
        );
        let mut m = Memory::default();
        assert_eq!(run(&p, mode, &mut m), Action::Skip, "{phase:?} {mode}");
        assert!(m.is_empty(), "nothing remembered");
    }
    // The same pod without the annotation is judged.
    let p = pod("static-looking", &["kernel.msgmax"], "Pending");
    assert!(matches!(
        run(&p, Mode::Enforce, &mut Memory::default()),
        Action::Reject { .. }
    ));
}
