//! What the agent does per pod: started signals, the verdict it started under, memory, event
//! names. The verdicts themselves come from the shared table (`groundskeeper_sysctl_rules::cases`).

use super::decide::*;
use groundskeeper_sysctl_rules::cases;
use groundskeeper_sysctl_rules::crd::{Mode, SysctlPolicy};
use groundskeeper_sysctl_rules::verdict::{Verdict, node_policy};
use jiff::Timestamp;
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

/// When the node's policy came into force in these tests.
fn since() -> Timestamp {
    Timestamp::from_second(1_000_000).unwrap()
}

/// kubelet admitted and started the pod at `at` (seconds from [`since`]).
fn started_at(mut p: Pod, at: i64) -> Pod {
    let st = p.status.as_mut().unwrap();
    st.phase = Some("Running".into());
    st.start_time = Some(Time(
        Timestamp::from_second(since().as_second() + at).unwrap(),
    ));
    st.container_statuses = Some(container(|c| c.state = Some(state(true, false))));
    p
}

const MSG: &str = r#"forbidden sysctl: "kernel.msgmax" not allowlisted"#;

fn forbidden(mode: Mode) -> Verdict {
    Verdict::Forbidden {
        mode,
        message: MSG.into(),
    }
}

/// As the worker does it: remember what was handled.
fn run(p: &Pod, verdict: Verdict, memory: &mut Memory, chosen: bool) -> Action {
    let facts = PodFacts::of(p);
    let action = decide(&facts, verdict.clone(), memory, chosen, since());
    if !matches!(
        action,
        Action::Skip | Action::AlreadyDone | Action::LeaveStarted
    ) {
        memory.remember(&facts, verdict);
    }
    action
}

#[test]
fn nothing_is_done_for_a_pod_kubelet_has_not_started() {
    for mode in [Mode::Enforce, Mode::Audit] {
        let mut m = Memory::default();
        let p = pod("u1", &["kernel.msgmax"], "Pending");
        assert_eq!(
            run(&p, forbidden(mode), &mut m, true),
            Action::Await {
                mode,
                message: MSG.into()
            },
            "{mode}"
        );
        assert_eq!(
            run(&p, forbidden(mode), &mut m, true),
            Action::AlreadyDone,
            "{mode}"
        );
    }
}

#[test]
fn seen_pending_then_started_ran_under_the_verdict() {
    for (mode, want) in [
        (
            Mode::Enforce,
            Action::ReportRan {
                message: MSG.into(),
            },
        ),
        (
            Mode::Audit,
            Action::ReportAudit {
                message: MSG.into(),
            },
        ),
    ] {
        let mut m = Memory::default();
        let p = pod("u1", &["kernel.msgmax"], "Pending");
        run(&p, forbidden(mode), &mut m, false);
        // Even with a startTime from before `since` (clock doubt): it was seen pending.
        let ran = started_at(p, -10);
        assert_eq!(run(&ran, forbidden(mode), &mut m, false), want, "{mode}");
        assert_eq!(
            run(&ran, forbidden(mode), &mut m, false),
            Action::AlreadyDone,
            "{mode}"
        );
    }
}

#[test]
fn started_after_the_policy_came_into_force_started_under_it() {
    let p = pod("u1", &["kernel.msgmax"], "Pending");
    assert_eq!(
        run(
            &started_at(p.clone(), 5),
            forbidden(Mode::Enforce),
            &mut Memory::default(),
            true
        ),
        Action::ReportRan {
            message: MSG.into()
        }
    );
    // The same second as `since`, or before: doubt, so "started before" (only reported).
    for at in [0, -5] {
        assert_eq!(
            run(
                &started_at(p.clone(), at),
                forbidden(Mode::Enforce),
                &mut Memory::default(),
                true
            ),
            Action::ReportStarted {
                mode: Mode::Enforce,
                message: MSG.into()
            },
            "{at}"
        );
        assert_eq!(
            run(
                &started_at(p.clone(), at),
                forbidden(Mode::Audit),
                &mut Memory::default(),
                false
            ),
            Action::LeaveStarted,
            "{at}: nobody chose a policy: silent"
        );
    }
    // Seen pending under another verdict (Audit), started under Enforce after `since`.
    let mut m = Memory::default();
    run(&p, forbidden(Mode::Audit), &mut m, true);
    assert!(matches!(
        run(&started_at(p, 5), forbidden(Mode::Enforce), &mut m, true),
        Action::ReportRan { .. }
    ));
}

#[test]
fn kubelets_verdict_and_deleting_pods_are_left_alone() {
    let mut m = Memory::default();
    for phase in ["Succeeded", "Failed"] {
        assert_eq!(
            run(
                &pod("u1", &["kernel.msgmax"], phase),
                forbidden(Mode::Enforce),
                &mut m,
                true
            ),
            Action::Skip,
            "{phase}"
        );
    }
    let mut p = started_at(pod("u2", &["kernel.msgmax"], "Pending"), 5);
    p.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    assert_eq!(
        run(&p, forbidden(Mode::Enforce), &mut m, true),
        Action::Skip
    );
    assert!(m.is_empty());
}

#[test]
fn mirror_pods_are_never_judged() {
    let mut m = Memory::default();
    let mut p = pod("u3", &["kernel.msgmax"], "Pending");
    p.metadata.annotations = Some(
        [(MIRROR_ANNOTATION.to_string(), "hash".to_string())]
            .into_iter()
            .collect(),
    );
    for p in [p.clone(), started_at(p, 5)] {
        for mode in [Mode::Enforce, Mode::Audit] {
            assert_eq!(run(&p, forbidden(mode), &mut m, true), Action::Skip);
        }
    }
    assert!(m.is_empty());
}

#[test]
fn allowed_pods_are_only_remembered_and_changes_are_judged_again() {
    let mut m = Memory::default();
    let p = pod("u1", &["kernel.shm_rmid_forced"], "Pending");
    assert_eq!(run(&p, Verdict::Allowed, &mut m, true), Action::Admit);
    assert_eq!(run(&p, Verdict::Allowed, &mut m, true), Action::AlreadyDone);
    // Started and still allowed: remembered at the new stage, nothing reported.
    assert_eq!(
        run(&started_at(p, 5), Verdict::Allowed, &mut m, true),
        Action::Admit
    );
    // Other sysctls (a new fingerprint) are judged again.
    let other = pod("u1", &["kernel.msgmax"], "Pending");
    assert!(matches!(
        run(&other, forbidden(Mode::Enforce), &mut m, true),
        Action::Await { .. }
    ));
}

/// The shared table: a pod of each row seen pending, then started: under an Enforce verdict it
/// is reported as having run despite the policy, under Audit audited, allowed ones never.
#[test]
fn every_shared_case_is_reported_as_its_verdict_says() {
    for case in cases::cases() {
        let policies = case.policies();
        let refs: Vec<&SysctlPolicy> = policies.iter().collect();
        let node = node_policy(&case.args(), case.kernel().as_ref(), &refs, &case.labels());
        let mut p = Pod {
            spec: Some(case.pod_spec()),
            ..Default::default()
        };
        p.metadata.uid = Some("u".into());
        p.status = Some(PodStatus {
            phase: Some("Pending".into()),
            ..Default::default()
        });
        let verdict = node.verdict(p.spec.as_ref());
        assert_eq!(verdict, case.want(), "case {:?}", case.name);
        let mut m = Memory::default();
        let pending = run(&p, verdict.clone(), &mut m, node.chosen);
        let ran = run(&started_at(p, 5), verdict, &mut m, node.chosen);
        match case.want {
            cases::Want::Allowed => {
                assert_eq!(
                    (&pending, &ran),
                    (&Action::Admit, &Action::Admit),
                    "case {:?}",
                    case.name
                )
            }
            cases::Want::Forbidden(mode, _) => {
                assert!(
                    matches!(pending, Action::Await { .. }),
                    "case {:?}: {pending:?}",
                    case.name
                );
                let want_ran = match mode {
                    Mode::Enforce => matches!(ran, Action::ReportRan { .. }),
                    Mode::Audit => matches!(ran, Action::ReportAudit { .. }),
                };
                assert!(want_ran, "case {:?}: {ran:?}", case.name);
            }
        }
    }
}

/// Whatever the verdict, the choice and the memory (fresh, or what any earlier verdict and
/// stage left), a pod kubelet has not started gets nothing reported, and one it has started is
/// never awaited: the agent follows kubelet's verdict, and no action writes a pod.
#[test]
fn reports_only_ever_follow_kubelets_start() {
    let verdicts = [
        Verdict::Allowed,
        forbidden(Mode::Audit),
        forbidden(Mode::Enforce),
        Verdict::Forbidden {
            mode: Mode::Enforce,
            message: "another".into(),
        },
    ];
    let pending = pod("u", &["kernel.msgmax"], "Pending");
    let mut initialized = pod("u", &["kernel.msgmax"], "Pending");
    initialized.status.as_mut().unwrap().conditions = condition("Initialized", "False");
    let pods = [
        ("pending", pending.clone(), false),
        ("running after since", started_at(pending.clone(), 5), true),
        ("running before since", started_at(pending, -5), true),
        ("Initialized, no startTime", initialized, true),
    ];
    for (what, p, is_started) in &pods {
        for verdict in &verdicts {
            for chosen in [false, true] {
                for before in [None, Some((false, 0)), Some((false, 3)), Some((true, 1))] {
                    let mut m = Memory::default();
                    if let Some((was_started, v)) = before {
                        let mut facts = PodFacts::of(p);
                        facts.started = was_started;
                        m.remember(&facts, verdicts[v].clone());
                    }
                    let a = decide(&PodFacts::of(p), verdict.clone(), &m, chosen, since());
                    let report = matches!(
                        a,
                        Action::ReportRan { .. }
                            | Action::ReportAudit { .. }
                            | Action::ReportStarted { .. }
                    );
                    let ctx =
                        format!("{what} {verdict:?} chosen={chosen} before={before:?}: {a:?}");
                    assert!(
                        *is_started || !report,
                        "reported before kubelet started it: {ctx}"
                    );
                    assert!(
                        !*is_started || !matches!(a, Action::Await { .. }),
                        "awaited a started pod: {ctx}"
                    );
                }
            }
        }
    }
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
