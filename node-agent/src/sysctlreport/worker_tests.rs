//! The worker driven by plain cache changes and ticks, its writes recorded by a fake.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use groundskeeper_plumbing::ObjectKey;
use groundskeeper_plumbing::Readiness;
use groundskeeper_plumbing::events;
use groundskeeper_plumbing::watch::cache::{Shared, Update};
use k8s_openapi::api::core::v1::{Pod, PodSpec, PodStatus};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use super::apply::{Writer, Writes};
use super::cache::{Change, Flags, NodeFacts, ReportCache};
use super::crd::{Mode, SysctlPolicy, SysctlPolicySpec, SysctlPolicyStatus};
use super::kernel::KernelVersion;
use super::metrics::Metrics;
use super::worker::{Settings, Worker};

const MSG: &str = r#"forbidden sysctl: "kernel.msgmax" not allowlisted"#;

/// One write as the apiserver would have taken it.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Write {
    Event {
        pod: String,
        reason: String,
        action: String,
        note: String,
    },
    Status {
        policy: String,
        status: SysctlPolicyStatus,
    },
}

/// Records the writes that succeed; the next writes fail with the queued HTTP codes.
#[derive(Clone, Default)]
pub(super) struct Fake {
    written: Arc<Mutex<Vec<Write>>>,
    failures: Arc<Mutex<VecDeque<u16>>>,
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

    pub(super) fn fail_next(&self, code: u16) {
        self.failures.lock().unwrap().push_back(code);
    }

    pub(super) fn take(&self) -> Vec<Write> {
        std::mem::take(&mut self.written.lock().unwrap())
    }
}

/// The Event writer's sink: the report Events as the apiserver would have taken them.
impl events::Sink for Fake {
    fn create<'a>(&'a self, event: &'a Event) -> BoxFuture<'a, Result<(), kube::Error>> {
        let regarding = event.regarding.as_ref().unwrap();
        let write = Write::Event {
            pod: regarding.name.clone().unwrap(),
            reason: event.reason.clone().unwrap(),
            action: event.action.clone().unwrap(),
            note: event.note.clone().unwrap(),
        };
        Box::pin(async move { self.record(write) })
    }

    fn patch<'a>(&'a self, event: &'a Event) -> BoxFuture<'a, Result<(), kube::Error>> {
        self.create(event)
    }
}

impl Writes for Fake {
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
}

/// A pod of this node, not started, setting `sysctls`.
pub(super) fn pod(name: &str, sysctls: &[&str]) -> Pod {
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

/// The pod as kubelet writes it once it has admitted and started it, long before the tests'
/// policies came into force (a pod seen pending first still started under them).
pub(super) fn started(mut p: Pod) -> Pod {
    let status = p.status.as_mut().unwrap();
    status.phase = Some("Running".into());
    status.start_time = Some(Time(jiff::Timestamp::UNIX_EPOCH));
    p.metadata.resource_version = Some("8".into());
    p
}

/// The pod as kubelet rejects it (`rejectPod`): its verdict, terminal.
fn rejected_by_kubelet(mut p: Pod) -> Pod {
    let status = p.status.as_mut().unwrap();
    status.phase = Some("Failed".into());
    status.reason = Some("SysctlForbidden".into());
    status.message = Some(format!("Pod was rejected: {MSG}"));
    status.start_time = Some(Time(jiff::Timestamp::now()));
    p.metadata.resource_version = Some("8".into());
    p
}

pub(super) fn policy(name: &str, mode: Mode) -> SysctlPolicy {
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

/// The worker on node `node` with its watches listed and healthy, over an empty cache.
pub(super) struct Rig {
    pub(super) worker: Worker<Fake>,
    pub(super) cache: Shared<ReportCache>,
    pub(super) watches: Flags,
    pub(super) fake: Fake,
    pub(super) metrics: Metrics,
}

impl Rig {
    pub(super) async fn new(node: &str, default_mode: Mode, dry_run: bool) -> Self {
        let mut rig = Self::unlisted(node, default_mode, dry_run);
        rig.set_healthy(true);
        rig.worker.on_change(Change::Merge).await;
        rig
    }

    /// The Node in the cache, but no watch listed yet.
    fn unlisted(node: &str, default_mode: Mode, dry_run: bool) -> Self {
        Self::unlisted_on(node, default_mode, dry_run, None)
    }

    /// [`Rig::unlisted`] on a host whose kernel is `kernel`.
    fn unlisted_on(
        node: &str,
        default_mode: Mode,
        dry_run: bool,
        kernel: Option<KernelVersion>,
    ) -> Self {
        let settings = Settings {
            node_name: node.into(),
            kernel,
            flag: vec![],
            default_mode,
            defaults: Default::default(),
        };
        Self::unlisted_with(settings, dry_run)
    }

    /// [`Rig::unlisted`] with these settings.
    pub(super) fn unlisted_with(settings: Settings, dry_run: bool) -> Self {
        let node = settings.node_name.clone();
        let node = node.as_str();
        let readiness = Readiness::default();
        let watches = Flags {
            pods: readiness.register("sysctl/pods"),
            policies: readiness.register("sysctl/sysctlpolicies"),
            node: readiness.register("sysctl/nodes"),
        };
        let cache: Shared<ReportCache> = Shared::default();
        cache
            .lock()
            .nodes
            .apply(Update::Apply(node.into(), NodeFacts::default()));
        let fake = Fake::default();
        let metrics = Metrics::register(&prometheus::Registry::new()).unwrap();
        let events = events::Events::to(
            Arc::new(fake.clone()),
            events::Reporter::on(crate::context::SYSCTL_REPORTER, node),
            dry_run,
        );
        let writer = Writer::new(fake.clone(), dry_run, events);
        Rig {
            worker: Worker::new(
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

    pub(super) fn set_healthy(&self, healthy: bool) {
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
    pub(super) async fn pod(&mut self, p: &Pod) {
        self.cache
            .lock()
            .pods
            .apply(Update::Apply(ObjectKey::of(p), p.clone()));
        self.worker
            .on_change(Change::Pod(Box::new(p.clone())))
            .await;
    }

    /// The policy watch delivers `p`.
    pub(super) async fn policy(&mut self, p: &SysctlPolicy) {
        let name = p.metadata.name.clone().unwrap();
        self.cache
            .lock()
            .policies
            .apply(Update::Apply(name, p.clone()));
        self.worker
            .on_change(Change::Policy(Box::new(p.clone())))
            .await;
    }

    fn ran(&self, mode: Mode) -> u64 {
        let labels = [mode.to_string()];
        self.metrics
            .ran_forbidden
            .with_label_values(&[&labels[0]])
            .get()
    }

    fn started_before(&self, mode: Mode) -> u64 {
        let labels = [mode.to_string()];
        self.metrics
            .started_forbidden
            .with_label_values(&[&labels[0]])
            .get()
    }
}

fn event(pod: &str, reason: &str, action: &str, note: &str) -> Write {
    Write::Event {
        pod: pod.into(),
        reason: reason.into(),
        action: action.into(),
        note: note.into(),
    }
}

fn ran_note() -> String {
    format!(
        "{MSG}: started on this node although its Enforce sysctl policy forbids it \
         (the admission webhook did not keep it off); not stopped"
    )
}

fn ran(pod: &str) -> Write {
    event(pod, "SysctlForbiddenRan", "Ran", &ran_note())
}

fn audited(pod: &str) -> Write {
    event(pod, "SysctlForbidden", "Audit", MSG)
}

#[tokio::test]
async fn a_forbidden_pod_is_not_written_while_pending_and_reported_once_it_runs() {
    let mut r = Rig::new("node-a", Mode::Enforce, false).await;
    let p = pod("web", &["kernel.msgmax"]);
    r.pod(&p).await;
    assert_eq!(
        r.fake.take(),
        [],
        "no pod write, no event before kubelet's verdict"
    );
    r.pod(&started(p)).await;
    assert_eq!(r.fake.take(), [ran("web")]);
    assert_eq!(
        (r.ran(Mode::Enforce), r.started_before(Mode::Enforce)),
        (1, 0)
    );

    let mut r = Rig::new("node-a", Mode::Audit, false).await;
    let p = pod("web", &["kernel.msgmax"]);
    r.pod(&p).await;
    assert_eq!(r.fake.take(), []);
    r.pod(&started(p)).await;
    assert_eq!(r.fake.take(), [audited("web")]);
    assert_eq!(r.ran(Mode::Audit), 1);

    // An allowed pod is remembered and counted, never written.
    let ok = pod("ok", &["kernel.shm_rmid_forced"]);
    r.pod(&ok).await;
    r.pod(&started(ok)).await;
    assert_eq!(r.fake.take(), []);
    assert_eq!(r.metrics.checked.get(), 4);
}

/// The Node's own kubelet version decides, and an in-place kubelet upgrade is picked up from
/// the Node: `net.ipv4.tcp_slow_start_after_idle` is safe from v1.37 on.
#[tokio::test]
async fn the_nodes_own_kubelet_version_decides() {
    let kernel = "6.1.0-18-amd64".parse().ok();
    let mut r = Rig::unlisted_on("node-a", Mode::Enforce, false, kernel);
    let set_kubelet = |r: &Rig, v: &str| {
        let facts = NodeFacts {
            kubelet: Some(v.into()),
            ..Default::default()
        };
        r.cache
            .lock()
            .nodes
            .apply(Update::Apply("node-a".into(), facts));
    };
    set_kubelet(&r, "v1.36.2");
    r.set_healthy(true);
    r.worker.on_change(Change::Merge).await;
    let sysctl = "net.ipv4.tcp_slow_start_after_idle";
    let old = pod("old", &[sysctl]);
    r.pod(&old).await;
    r.pod(&started(old)).await;
    let written = r.fake.take();
    assert!(
        matches!(&written[..], [Write::Event { pod, reason, note, .. }]
            if pod == "old" && reason == "SysctlForbiddenRan"
                && note.contains(r#""net.ipv4.tcp_slow_start_after_idle" not allowlisted"#)),
        "{written:?}"
    );

    set_kubelet(&r, "v1.37.0");
    r.worker.on_change(Change::Merge).await;
    let new = pod("new", &[sysctl]);
    r.pod(&new).await;
    r.pod(&started(new)).await;
    assert_eq!(r.fake.take(), [], "allowed by a v1.37 kubelet");
}

/// Pods kubelet forbids are kubelet's to reject: the agent writes nothing for them.
#[tokio::test]
async fn a_pod_kubelet_rejects_gets_nothing_from_the_agent() {
    for mode in [Mode::Enforce, Mode::Audit] {
        let mut r = Rig::new("node-a", mode, false).await;
        let p = pod("web", &["kernel.msgmax"]);
        r.pod(&p).await;
        r.pod(&rejected_by_kubelet(p)).await;
        r.worker.on_tick().await;
        assert_eq!(r.fake.take(), [], "{mode}");
        assert_eq!(r.ran(mode), 0, "{mode}");
    }
}

/// The three watches list in any order. When the pods list last, no Node or policy event may
/// follow for a long time: the policy must be merged then, or the worker never starts (under
/// load, rbac_cluster's agent lists its pods last).
#[tokio::test]
async fn the_reporter_starts_whichever_watch_lists_last() {
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
            .apply(Update::Apply(ObjectKey::of(&p), p.clone()));
        for watch in order {
            let (flag, change) = match watch {
                "nodes" => (&r.watches.node, Change::Merge),
                "policies" => (&r.watches.policies, Change::Merge),
                _ => (&r.watches.pods, Change::PodsListed),
            };
            flag.mark_ready();
            r.worker.on_change(change).await;
        }
        assert_eq!(r.metrics.checked.get(), 1, "lists in the order {order:?}");
        r.pod(&started(p)).await;
        assert_eq!(r.fake.take(), [ran("web")], "lists in the order {order:?}");
    }
}

#[tokio::test]
async fn a_pod_started_before_the_policy_is_never_written_only_reported() {
    let note = format!(
        "{MSG} (already started when this agent came to judge it under the Enforce \
         policy that forbids it: not stopped)"
    );
    let mut r = Rig::new("node-a", Mode::Enforce, false).await;
    r.pod(&started(pod("web", &["kernel.msgmax"]))).await;
    assert_eq!(
        r.fake.take(),
        [event("web", "SysctlForbidden", "Audit", &note)]
    );
    assert_eq!(
        (r.started_before(Mode::Enforce), r.ran(Mode::Enforce)),
        (1, 0)
    );

    // Default install (Audit, no policy): a started pod is not even reported...
    let mut r = Rig::new("node-a", Mode::Audit, false).await;
    let p = started(pod("web", &["kernel.msgmax"]));
    r.pod(&p).await;
    assert_eq!(r.fake.take(), []);
    // ...until a policy selects the node, and then only reported.
    r.policy(&policy("audit-all", Mode::Audit)).await;
    let audit_note = note.replace("under the Enforce", "under the Audit");
    let reported = r.fake.take();
    assert_eq!(
        reported,
        [event("web", "SysctlForbidden", "Audit", &audit_note)]
    );
}

#[tokio::test]
async fn a_pod_is_not_evaluated_again_when_nothing_changed() {
    let mut r = Rig::new("node-a", Mode::Enforce, false).await;
    let p = started(pod("web", &["kernel.msgmax"]));
    r.pod(&p).await;
    assert_eq!(r.fake.take().len(), 1);
    // The same pod again (a status update, a relist), a merge giving the same policy, a tick.
    let mut updated = p.clone();
    updated.metadata.resource_version = Some("9".into());
    r.pod(&updated).await;
    r.worker.on_change(Change::PodsListed).await;
    r.worker.on_change(Change::Merge).await;
    r.worker.on_tick().await;
    assert_eq!(r.fake.take(), []);
    assert_eq!(r.metrics.checked.get(), 1);
    // Other sysctls are a change: judged again.
    r.pod(&started(pod("web", &["kernel.sem"]))).await;
    assert_eq!(r.fake.take().len(), 1);
    // Deleted and forgotten: the same UID would be judged afresh.
    r.worker.on_change(Change::PodGone("uid-web".into())).await;
    r.pod(&p).await;
    assert_eq!(r.fake.take().len(), 1);
}

#[tokio::test]
async fn failed_reports_are_retried_on_the_tick() {
    let mut r = Rig::new("node-a", Mode::Enforce, false).await;
    let p = pod("web", &["kernel.msgmax"]);
    r.pod(&p).await;
    r.fake.fail_next(500);
    r.pod(&started(p)).await;
    assert_eq!(r.fake.take(), [], "the event was refused");
    assert_eq!(
        r.metrics
            .write_errors
            .with_label_values(&["server_error"])
            .get(),
        1
    );
    assert_eq!(r.ran(Mode::Enforce), 0, "not counted before it is done");
    r.worker.on_tick().await;
    assert_eq!(r.fake.take(), [ran("web")], "retried, still as having run");
    assert_eq!(r.ran(Mode::Enforce), 1);
    r.worker.on_tick().await;
    assert_eq!(r.fake.take(), [], "done: no more retries");
}

#[tokio::test]
async fn an_existing_report_event_counts_as_reported() {
    let mut r = Rig::new("node-a", Mode::Audit, false).await;
    let p = pod("web", &["kernel.msgmax"]);
    r.pod(&p).await;
    r.fake.fail_next(409);
    r.pod(&started(p)).await;
    assert_eq!(r.ran(Mode::Audit), 1, "reported by an earlier process");
    r.worker.on_tick().await;
    assert_eq!(r.fake.take(), [], "not retried");
}

#[tokio::test(start_paused = true)]
async fn dry_run_writes_nothing() {
    let mut r = Rig::new("node-a", Mode::Enforce, true).await;
    let p = pod("web", &["kernel.msgmax"]);
    r.pod(&p).await;
    r.pod(&started(p)).await;
    r.pod(&started(pod("run", &["kernel.msgmax"]))).await;
    r.policy(&policy("p", Mode::Enforce)).await;
    tokio::time::advance(Duration::from_secs(10)).await;
    r.worker.on_tick().await;
    assert_eq!(r.fake.take(), []);
    // Counted as done, as the cluster test reads it: what would have been.
    assert_eq!(r.ran(Mode::Enforce), 1);
}
