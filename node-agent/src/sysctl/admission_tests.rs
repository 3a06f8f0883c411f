//! Admission driven by plain cache changes and ticks, its writes recorded by a fake.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use groundskeeper_plumbing::Readiness;
use groundskeeper_plumbing::cache::{Shared, Update};
use k8s_openapi::api::core::v1::{Pod, PodSpec, PodStatus};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use super::admission::{Admission, Settings, status_offset};
use super::apply::{Writer, Writes};
use super::cache::{Cache, Change, Health, Labels, PodKey};
use super::crd::{Mode, SysctlPolicy, SysctlPolicySpec, SysctlPolicyStatus};
use super::metrics::Metrics;

const MSG: &str = r#"forbidden sysctl: "kernel.msgmax" not allowlisted"#;

/// One write as the apiserver would have taken it.
#[derive(Clone, Debug, PartialEq)]
enum Write {
    Failed {
        pod: String,
        resource_version: String,
        message: String,
    },
    Event {
        pod: String,
        action: String,
        note: String,
    },
    Status {
        policy: String,
        status: SysctlPolicyStatus,
    },
}

/// The policies and the Node's labels a fresh read finds.
type FreshView = (Vec<SysctlPolicy>, Option<Labels>);

/// Records the writes that succeed; the next writes fail with the queued HTTP codes.
#[derive(Clone, Default)]
struct Fake {
    written: Arc<Mutex<Vec<Write>>>,
    failures: Arc<Mutex<VecDeque<u16>>>,
    /// Every fail patch is answered with this code while set (an admission policy's 403).
    refuse_fail_patches: Arc<Mutex<Option<u16>>>,
    /// When each fail patch was sent, refused or not.
    fail_patches: Arc<Mutex<Vec<tokio::time::Instant>>>,
    /// What a fresh read finds: the rig's cache (the watches are current), unless set.
    cache: Arc<Mutex<Option<Shared<Cache>>>>,
    fresh: Arc<Mutex<Option<FreshView>>>,
    fresh_reads: Arc<Mutex<usize>>,
}

impl Fake {
    fn record(&self, w: Write) -> Result<(), kube::Error> {
        if let Some(code) = self.failures.lock().unwrap().pop_front() {
            return Err(kube::Error::Api(
                kube::core::Status::failure("injected", "Injected")
                    .with_code(code)
                    .boxed(),
            ));
        }
        self.written.lock().unwrap().push(w);
        Ok(())
    }

    fn fail_next(&self, code: u16) {
        self.failures.lock().unwrap().push_back(code);
    }

    fn take(&self) -> Vec<Write> {
        std::mem::take(&mut self.written.lock().unwrap())
    }
}

impl Writes for Fake {
    async fn fail_pod(
        &self,
        _namespace: &str,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<(), kube::Error> {
        self.fail_patches
            .lock()
            .unwrap()
            .push(tokio::time::Instant::now());
        if let Some(code) = *self.refuse_fail_patches.lock().unwrap() {
            return Err(kube::Error::Api(
                kube::core::Status::failure("denied by the own-node policy", "Forbidden")
                    .with_code(code)
                    .boxed(),
            ));
        }
        self.record(Write::Failed {
            pod: name.into(),
            resource_version: patch["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .into(),
            message: patch["status"]["message"].as_str().unwrap().into(),
        })
    }

    async fn create_event(&self, event: &Event) -> Result<(), kube::Error> {
        let regarding = event.regarding.as_ref().unwrap();
        self.record(Write::Event {
            pod: regarding.name.clone().unwrap(),
            action: event.action.clone().unwrap(),
            note: event.note.clone().unwrap(),
        })
    }

    async fn apply_policy_status(
        &self,
        name: &str,
        status: &SysctlPolicyStatus,
    ) -> Result<(), kube::Error> {
        self.record(Write::Status {
            policy: name.into(),
            status: status.clone(),
        })
    }

    async fn read_fresh(
        &self,
        _node: &str,
    ) -> Result<(Vec<SysctlPolicy>, Option<Labels>), kube::Error> {
        *self.fresh_reads.lock().unwrap() += 1;
        if let Some(fresh) = self.fresh.lock().unwrap().clone() {
            return Ok(fresh);
        }
        let cache = self.cache.lock().unwrap().clone().expect("the rig's cache");
        let c = cache.lock();
        Ok((
            c.policies.values().cloned().collect(),
            c.nodes.values().next().cloned(),
        ))
    }
}

/// A pod of this node, not started, setting `sysctls`.
fn pod(name: &str, sysctls: &[&str]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            uid: Some(format!("uid-{name}")),
            resource_version: Some("7".into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            security_context: Some(testkit::sysctls(sysctls)),
            ..Default::default()
        }),
        status: Some(PodStatus {
            phase: Some("Pending".into()),
            ..Default::default()
        }),
    }
}

/// The pod as kubelet writes it once it has admitted and started it.
fn started(mut p: Pod) -> Pod {
    let status = p.status.as_mut().unwrap();
    status.phase = Some("Running".into());
    status.start_time = Some(Time(jiff::Timestamp::UNIX_EPOCH));
    p.metadata.resource_version = Some("8".into());
    p
}

fn policy(name: &str, mode: Mode) -> SysctlPolicy {
    let mut p = SysctlPolicy::new(
        name,
        SysctlPolicySpec {
            allowed_unsafe_sysctls: vec!["net.core.*".into()],
            node_selector: None,
            mode,
        },
    );
    p.metadata.generation = Some(1);
    p
}

/// Admission on node `node` with its watches listed and healthy, over an empty cache.
struct Rig {
    admission: Admission<Fake>,
    cache: Shared<Cache>,
    watches: Health,
    fake: Fake,
    metrics: Metrics,
}

impl Rig {
    async fn new(node: &str, default_mode: Mode, dry_run: bool) -> Self {
        let mut rig = Self::unlisted(node, default_mode, dry_run);
        rig.set_healthy(true);
        rig.admission.on_change(Change::Merge).await;
        rig
    }

    /// The Node in the cache, but no watch listed yet.
    fn unlisted(node: &str, default_mode: Mode, dry_run: bool) -> Self {
        let readiness = Readiness::default();
        let watches = Health {
            pods: readiness.register("sysctl/pods"),
            policies: readiness.register("sysctl/sysctlpolicies"),
            node: readiness.register("sysctl/nodes"),
        };
        let cache: Shared<Cache> = Shared::default();
        cache
            .lock()
            .nodes
            .apply(Update::Apply(node.into(), Labels::new()));
        let fake = Fake::default();
        *fake.cache.lock().unwrap() = Some(cache.clone());
        let metrics = Metrics::register(&prometheus::Registry::new()).unwrap();
        let settings = Settings {
            node_name: node.into(),
            safe: vec!["kernel.shm_rmid_forced"],
            flag: vec![],
            default_mode,
        };
        let writer = Writer::new(fake.clone(), dry_run, node.into());
        Rig {
            admission: Admission::new(
                settings,
                cache.clone(),
                watches.clone(),
                writer,
                metrics.clone(),
            ),
            cache,
            watches,
            fake,
            metrics,
        }
    }

    fn set_healthy(&self, healthy: bool) {
        for flag in [
            &self.watches.pods,
            &self.watches.policies,
            &self.watches.node,
        ] {
            if healthy {
                flag.mark_ready()
            } else {
                flag.relist_started()
            }
        }
    }

    /// The pod watch delivers `p`.
    async fn pod(&mut self, p: &Pod) {
        self.cache
            .lock()
            .pods
            .apply(Update::Apply(PodKey::of(p), p.clone()));
        self.admission
            .on_change(Change::Pod(Box::new(p.clone())))
            .await;
    }

    /// The policy watch delivers `p`.
    async fn policy(&mut self, p: &SysctlPolicy) {
        let name = p.metadata.name.clone().unwrap();
        self.cache
            .lock()
            .policies
            .apply(Update::Apply(name, p.clone()));
        self.admission
            .on_change(Change::Policy(Box::new(p.clone())))
            .await;
    }

    fn rejected(&self, mode: Mode) -> u64 {
        let labels = ["SysctlForbidden", &mode.to_string()];
        self.metrics.rejected.with_label_values(&labels).get()
    }
}

fn failed(pod: &str) -> Write {
    Write::Failed {
        pod: pod.into(),
        resource_version: "7".into(),
        message: format!("Pod was rejected: {MSG}"),
    }
}

fn event(pod: &str, action: &str, note: &str) -> Write {
    Write::Event {
        pod: pod.into(),
        action: action.into(),
        note: note.into(),
    }
}

#[tokio::test]
async fn a_pending_forbidden_pod_is_failed_in_enforce_and_only_warned_in_audit() {
    let mut r = Rig::new("node-a", Mode::Enforce, false).await;
    r.pod(&pod("web", &["kernel.msgmax"])).await;
    assert_eq!(r.fake.take(), [failed("web"), event("web", "Reject", MSG)]);
    assert_eq!(r.rejected(Mode::Enforce), 1);

    let mut r = Rig::new("node-a", Mode::Audit, false).await;
    r.pod(&pod("web", &["kernel.msgmax"])).await;
    assert_eq!(r.fake.take(), [event("web", "Audit", MSG)], "no fail patch");
    assert_eq!(r.rejected(Mode::Audit), 1);

    // An allowed pod is remembered and counted, never written.
    r.pod(&pod("ok", &["kernel.shm_rmid_forced"])).await;
    assert_eq!(r.fake.take(), []);
    assert_eq!(r.metrics.checked.get(), 2);
}

/// The three watches list in any order. When the pods list last, no Node or policy event may
/// follow for a long time: the policy must be merged then, or admission never starts (seen
/// under load in rbac_cluster before this was fixed).
#[tokio::test]
async fn admission_starts_whichever_watch_lists_last() {
    for order in [
        ["nodes", "policies", "pods"],
        ["pods", "nodes", "policies"],
        ["policies", "pods", "nodes"],
    ] {
        let mut r = Rig::unlisted("node-a", Mode::Enforce, false);
        let p = pod("web", &["kernel.msgmax"]);
        r.cache
            .lock()
            .pods
            .apply(Update::Apply(PodKey::of(&p), p.clone()));
        for watch in order {
            let (flag, change) = match watch {
                "nodes" => (&r.watches.node, Change::Merge),
                "policies" => (&r.watches.policies, Change::Merge),
                _ => (&r.watches.pods, Change::PodsListed),
            };
            flag.mark_ready();
            r.admission.on_change(change).await;
        }
        assert_eq!(
            r.fake.take(),
            [failed("web"), event("web", "Reject", MSG)],
            "lists in the order {order:?}"
        );
    }
}

#[tokio::test]
async fn a_started_pod_is_never_failed_only_reported() {
    let note =
        format!("{MSG} (pod already started: not failed; Enforce applies to pods not yet started)");
    let mut r = Rig::new("node-a", Mode::Enforce, false).await;
    r.pod(&started(pod("web", &["kernel.msgmax"]))).await;
    assert_eq!(r.fake.take(), [event("web", "Audit", &note)]);
    let labels = ["Enforce"];
    assert_eq!(
        r.metrics.started_forbidden.with_label_values(&labels).get(),
        1
    );
    assert_eq!(r.rejected(Mode::Enforce), 0);

    // Judged pending, failing it refused (409: kubelet started it meanwhile), judged again
    // from the started version: reported, never failed.
    let mut r = Rig::new("node-a", Mode::Enforce, false).await;
    r.fake.fail_next(409);
    r.pod(&pod("raced", &["kernel.msgmax"])).await;
    assert_eq!(r.fake.take(), []);
    r.pod(&started(pod("raced", &["kernel.msgmax"]))).await;
    r.admission.on_tick().await;
    assert_eq!(r.fake.take(), [event("raced", "Audit", &note)]);
    assert_eq!(r.rejected(Mode::Enforce), 0);

    // Default install (Audit, no policy): a started pod is not even reported...
    let mut r = Rig::new("node-a", Mode::Audit, false).await;
    let p = started(pod("web", &["kernel.msgmax"]));
    r.pod(&p).await;
    assert_eq!(r.fake.take(), []);
    // ...until a policy selects the node, and then only reported.
    r.policy(&policy("audit-all", Mode::Audit)).await;
    let audit_note = note.replace("Enforce applies", "Audit applies");
    let reported = r.fake.take();
    assert!(
        reported.contains(&event("web", "Audit", &audit_note)),
        "{reported:?}"
    );
    assert!(!reported.iter().any(|w| matches!(w, Write::Failed { .. })));
}

#[tokio::test]
async fn a_pod_is_not_evaluated_again_when_nothing_changed() {
    let mut r = Rig::new("node-a", Mode::Enforce, false).await;
    let p = pod("web", &["kernel.msgmax"]);
    r.pod(&p).await;
    assert_eq!(r.fake.take().len(), 2);
    // The same pod again (a status update, a relist), a merge giving the same policy, a tick.
    let mut updated = p.clone();
    updated.metadata.resource_version = Some("9".into());
    r.pod(&updated).await;
    r.admission.on_change(Change::PodsListed).await;
    r.admission.on_change(Change::Merge).await;
    r.admission.on_tick().await;
    assert_eq!(r.fake.take(), []);
    assert_eq!(r.metrics.checked.get(), 1);
    // Other sysctls are a change: judged again.
    r.pod(&pod("web", &["kernel.sem"])).await;
    assert_eq!(r.fake.take().len(), 2);
    // Deleted and forgotten: the same UID would be judged afresh.
    r.admission
        .on_change(Change::PodGone("uid-web".into()))
        .await;
    r.pod(&p).await;
    assert_eq!(r.fake.take().len(), 2);
}

#[tokio::test]
async fn failed_writes_are_retried_on_the_tick() {
    let mut r = Rig::new("node-a", Mode::Enforce, false).await;
    r.fake.fail_next(500);
    r.pod(&pod("web", &["kernel.msgmax"])).await;
    assert_eq!(r.fake.take(), [], "the fail patch was refused");
    assert_eq!(
        r.rejected(Mode::Enforce),
        0,
        "not counted before it is done"
    );
    r.admission.on_tick().await;
    assert_eq!(r.fake.take(), [failed("web"), event("web", "Reject", MSG)]);
    assert_eq!(r.rejected(Mode::Enforce), 1);
    r.admission.on_tick().await;
    assert_eq!(r.fake.take(), [], "done: no more retries");

    // While a watch is relisting, a pod is not failed; it is once the watches are current.
    r.set_healthy(false);
    r.pod(&pod("db", &["kernel.msgmax"])).await;
    r.admission.on_tick().await;
    assert_eq!(r.fake.take(), []);
    r.set_healthy(true);
    r.admission.on_tick().await;
    assert_eq!(r.fake.take(), [failed("db"), event("db", "Reject", MSG)]);

    // A report that fails is retried too.
    r.fake.fail_next(500);
    r.pod(&started(pod("run", &["kernel.msgmax"]))).await;
    assert_eq!(r.fake.take(), []);
    r.admission.on_tick().await;
    assert_eq!(r.fake.take().len(), 1);
}

#[tokio::test]
async fn an_existing_report_event_counts_as_reported() {
    let mut r = Rig::new("node-a", Mode::Audit, false).await;
    r.fake.fail_next(409);
    r.pod(&pod("web", &["kernel.msgmax"])).await;
    assert_eq!(r.rejected(Mode::Audit), 1, "reported by an earlier process");
    r.admission.on_tick().await;
    assert_eq!(r.fake.take(), [], "not retried");
}

#[tokio::test(start_paused = true)]
async fn dry_run_writes_nothing() {
    let mut r = Rig::new("node-a", Mode::Enforce, true).await;
    r.pod(&pod("web", &["kernel.msgmax"])).await;
    r.pod(&started(pod("run", &["kernel.msgmax"]))).await;
    r.policy(&policy("p", Mode::Enforce)).await;
    tokio::time::advance(Duration::from_secs(10)).await;
    r.admission.on_tick().await;
    assert_eq!(r.fake.take(), []);
    // Counted as done, as the cluster test reads it: what would have been.
    assert_eq!(r.rejected(Mode::Enforce), 1);
}

#[tokio::test(start_paused = true)]
async fn policy_status_writes_are_spread_by_node_and_not_repeated_when_unchanged() {
    let (a, b) = ("node-a", "node-b");
    assert_ne!(status_offset(a), status_offset(b));
    assert!(status_offset(a) < Duration::from_secs(5) && status_offset(b) < Duration::from_secs(5));

    for node in [a, b] {
        let start = tokio::time::Instant::now();
        let mut r = Rig::new(node, Mode::Audit, false).await;
        let p = policy("p", Mode::Audit);
        r.policy(&p).await;
        // Seen again before it is due: still one write.
        r.policy(&p).await;
        let due = start + status_offset(node);
        tokio::time::advance(due - tokio::time::Instant::now() - Duration::from_millis(1)).await;
        r.admission.on_tick().await;
        assert_eq!(r.fake.take(), [], "{node}: not before its turn");
        tokio::time::advance(Duration::from_millis(1)).await;
        r.admission.on_tick().await;
        let written = r.fake.take();
        let [Write::Status { policy, status }] = &written[..] else {
            panic!("{node}: one status write, got {written:?}");
        };
        assert_eq!(policy, "p");
        assert_eq!(status.conditions[0].reason, "PatternsValid", "{node}");

        // The watch brings the written status back: nothing is due any more.
        let mut with_status = p.clone();
        with_status.status = Some(status.clone());
        r.policy(&with_status).await;
        tokio::time::advance(Duration::from_secs(10)).await;
        r.admission.on_tick().await;
        assert_eq!(r.fake.take(), [], "{node}: not repeated");
    }
}

#[tokio::test(start_paused = true)]
async fn a_status_already_written_by_another_agent_is_not_written_again() {
    let mut r = Rig::new("node-a", Mode::Audit, false).await;
    let p = policy("p", Mode::Audit);
    r.policy(&p).await;
    // Before this node's turn, another agent's write reaches the cache.
    let mut other = Rig::new("node-b", Mode::Audit, false).await;
    other.policy(&p).await;
    tokio::time::advance(Duration::from_secs(5)).await;
    other.admission.on_tick().await;
    let [Write::Status { status, .. }] = &other.fake.take()[..] else {
        panic!("node-b writes")
    };
    let mut with_status = p.clone();
    with_status.status = Some(status.clone());
    r.cache
        .lock()
        .policies
        .apply(Update::Apply("p".into(), with_status));
    r.admission.on_tick().await;
    assert_eq!(r.fake.take(), []);
}

/// Item 10 of issue 21: a fail patch answered 403 (the own-node admission policy) was retried
/// every second for ever. It backs off (next tick, then 2 s, 4 s ... 5 min), each refusal is
/// counted by code, one Event on the pod says why it is not failed, and once the apiserver
/// accepts the patch the pod is failed.
#[tokio::test(start_paused = true)]
async fn a_refused_fail_patch_is_retried_with_exponential_backoff_and_reported() {
    let mut r = Rig::new("node-a", Mode::Enforce, false).await;
    *r.fake.refuse_fail_patches.lock().unwrap() = Some(403);
    let start = tokio::time::Instant::now();
    r.pod(&pod("web", &["kernel.msgmax"])).await;
    // Ten minutes of ticks, and pod updates (kubelet writing its status) meanwhile.
    for i in 1..=600 {
        tokio::time::advance(Duration::from_secs(1)).await;
        if i % 7 == 0 {
            let mut p = pod("web", &["kernel.msgmax"]);
            p.metadata.resource_version = Some(format!("{}", 7 + i));
            r.pod(&p).await;
        }
        r.admission.on_tick().await;
    }
    let attempts: Vec<Duration> = r
        .fake
        .fail_patches
        .lock()
        .unwrap()
        .iter()
        .map(|t| *t - start)
        .collect();
    // 0, 1, 3, 7, 15, 31, 63, 127, 255, 511 s: ten, where every tick made 601.
    assert!(
        (8..=12).contains(&attempts.len()),
        "{} attempts: {attempts:?}",
        attempts.len()
    );
    let gaps: Vec<Duration> = attempts.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        gaps.windows(2).all(|g| g[1] >= g[0]),
        "the waits never shrink: {gaps:?}"
    );
    assert!(
        gaps.iter()
            .all(|g| *g <= super::admission::POD_RETRY_MAX + Duration::from_secs(1)),
        "capped: {gaps:?}"
    );
    let refused = r
        .metrics
        .pod_write_failures
        .with_label_values(&["403"])
        .get();
    assert_eq!(refused as usize, attempts.len(), "each refusal counted");
    assert_eq!(
        r.rejected(Mode::Enforce),
        0,
        "not failed, not counted as such"
    );
    let written = r.fake.take();
    let events: Vec<&Write> = written
        .iter()
        .filter(|w| matches!(w, Write::Event { action, .. } if action == "WriteRefused"))
        .collect();
    assert_eq!(events.len(), 1, "one Event: {written:?}");
    let Write::Event { note, .. } = events[0] else {
        unreachable!()
    };
    assert!(note.contains("403") && note.contains("backoff"), "{note}");

    // The policy is fixed: the next attempt (within the cap) fails the pod.
    *r.fake.refuse_fail_patches.lock().unwrap() = None;
    for _ in 0..=300 {
        tokio::time::advance(Duration::from_secs(1)).await;
        r.admission.on_tick().await;
    }
    assert_eq!(r.rejected(Mode::Enforce), 1);
    let written = r.fake.take();
    assert!(
        written
            .iter()
            .any(|w| matches!(w, Write::Failed { pod, .. } if pod == "web")),
        "{written:?}"
    );
}

#[test]
fn pod_retry_delays_double_up_to_the_cap() {
    let s = Duration::from_secs;
    for (refused, want) in [
        (0, s(0)),
        (1, s(0)),
        (2, s(2)),
        (3, s(4)),
        (9, s(256)),
        (10, s(300)),
        (40, s(300)),
        (u32::MAX, s(300)),
    ] {
        assert_eq!(
            super::admission::pod_retry_delay(refused),
            want,
            "{refused}"
        );
    }
}

/// Issue 21, item 6: the pod arrives before a policy change (or a Node relabel) that allows it,
/// which was made earlier but has not come through its watch yet. The fresh read disagrees
/// with the cache: the pod is not failed. When the fresh read agrees, it is.
#[tokio::test]
async fn a_pod_is_failed_only_when_a_fresh_read_agrees() {
    let mut r = Rig::new("node-a", Mode::Enforce, false).await;
    // On the apiserver: a policy selecting every node, allowing kernel.msg*, in Enforce.
    let mut allows = policy("allow-msg", Mode::Enforce);
    allows.spec.allowed_unsafe_sysctls = vec!["kernel.msg*".into()];
    *r.fake.fresh.lock().unwrap() = Some((vec![allows.clone()], Some(Labels::new())));
    r.pod(&pod("web", &["kernel.msgmax"])).await;
    assert_eq!(r.fake.take(), [], "not failed: the fresh policies allow it");
    assert_eq!(*r.fake.fresh_reads.lock().unwrap(), 1);
    assert_eq!(r.rejected(Mode::Enforce), 0);

    // The policy arrives through its watch: allowed, nothing written.
    r.policy(&allows).await;
    r.admission.on_tick().await;
    assert!(
        r.fake
            .take()
            .iter()
            .all(|w| matches!(w, Write::Status { .. })),
        "no pod write"
    );
    assert_eq!(r.rejected(Mode::Enforce), 0);

    // The Node is gone on the apiserver: nothing is failed without its labels.
    let mut r = Rig::new("node-a", Mode::Enforce, false).await;
    *r.fake.fresh.lock().unwrap() = Some((vec![], None));
    r.pod(&pod("db", &["kernel.msgmax"])).await;
    assert_eq!(r.fake.take(), []);

    // The fresh read agrees (the watches were current): failed as before.
    *r.fake.fresh.lock().unwrap() = None;
    r.admission.on_tick().await;
    assert_eq!(r.fake.take(), [failed("db"), event("db", "Reject", MSG)]);
}
