//! One PodGC cycle against a scripted API: what each pass deletes, reads live, and leaves.

use std::{sync::Arc, time::Duration};

use futures::future::BoxFuture;
use kube::runtime::watcher::Event;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use groundskeeper_plumbing::watch::cache::Shared;

use super::{
    apply::{Applier, KubeWrites, Writes},
    cache::Caches,
    cycle::Cycle,
    decide::{Mode, Sweep},
    facts::PodFacts,
    metrics::Metrics,
    notice::Reported,
    quarantine::Quarantine,
    recheck::Always,
    wire::{WireNode, WirePod},
};
use testkit::api::Mock;

fn caches(pods: &[(&str, &str)], nodes: &[&str]) -> Shared<Caches> {
    let mut c = Caches::default();
    c.fold_pod(Event::Init);
    for (name, node) in pods {
        let p: WirePod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                "generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"nodeName": node},
            "status": {"phase": "Running"}
        }))
        .unwrap();
        c.fold_pod(Event::InitApply(p));
    }
    c.fold_pod(Event::InitDone);
    c.fold_node(Event::Init);
    for n in nodes {
        let node = serde_json::from_value(json!({"metadata": {"name": n}})).unwrap();
        c.fold_node(Event::InitApply(node));
    }
    c.fold_node(Event::InitDone);
    Shared::new(c)
}

/// The pod writes go to the scripted API; the Events it is asked for are recorded.
struct Events {
    pods: KubeWrites,
    seen: std::sync::Mutex<Vec<(String, String)>>,
}

impl Events {
    fn new(mock: &Mock) -> Arc<Self> {
        Arc::new(Self {
            pods: KubeWrites::new(mock.client()),
            seen: Default::default(),
        })
    }
}

impl Writes for Events {
    fn patch_status<'a>(
        &'a self,
        pod: &'a PodFacts,
        patch: serde_json::Value,
    ) -> BoxFuture<'a, Result<Option<u64>, kube::Error>> {
        self.pods.patch_status(pod, patch)
    }

    fn delete<'a>(&'a self, pod: &'a PodFacts) -> BoxFuture<'a, Result<Option<u64>, kube::Error>> {
        self.pods.delete(pod)
    }
}

/// The Event writer's sink.
impl groundskeeper_plumbing::events::Sink for Events {
    fn create<'a>(
        &'a self,
        e: &'a k8s_openapi::api::events::v1::Event,
    ) -> BoxFuture<'a, Result<(), kube::Error>> {
        let namespace = e.regarding.as_ref().and_then(|r| r.name.clone());
        self.seen.lock().unwrap().push((
            namespace.unwrap_or_default(),
            e.note.clone().unwrap_or_default(),
        ));
        Box::pin(async { Ok(()) })
    }

    fn patch<'a>(
        &'a self,
        e: &'a k8s_openapi::api::events::v1::Event,
    ) -> BoxFuture<'a, Result<(), kube::Error>> {
        self.create(e)
    }
}

fn event_writer(events: &Arc<Events>, dry_run: bool) -> groundskeeper_plumbing::events::Events {
    groundskeeper_plumbing::events::Events::to(
        events.clone(),
        groundskeeper_plumbing::events::Reporter::on("test", "test"),
        dry_run,
    )
}

fn cycle_with(mock: &Mock, quarantine: Duration, events: Arc<Events>) -> Cycle {
    Cycle {
        ttl: None,
        reported: Reported::default(),
        events: event_writer(&events, false),
        client: mock.client(),
        applier: Applier::new(
            events,
            Metrics::register(&prometheus::Registry::new()).unwrap(),
            4,
            false,
            CancellationToken::new(),
            crate::leader::Fence::unbounded(),
        ),
        quarantine: Quarantine::new(quarantine),
        mode: Mode::All,
        threshold: 12500,
    }
}

fn cycle(mock: &Mock, quarantine: Duration) -> Cycle {
    cycle_with(mock, quarantine, Events::new(mock))
}

#[tokio::test]
async fn only_a_not_found_node_orphans_its_pods() {
    let caches = caches(
        &[
            ("on-gone", "gone"),
            ("on-erroring", "erroring"),
            ("on-still-there", "still-there"),
            ("on-live", "live"),
        ],
        &["live"],
    );
    let mock = Mock::default()
        .route("GET /api/v1/nodes/gone", 404)
        .route("GET /api/v1/nodes/erroring", 500)
        .route("GET /api/v1/nodes/still-there", 200);
    let mut c = cycle(&mock, Duration::ZERO);
    let summary = c.run(&caches).await;
    let mut calls = mock.calls();
    calls.sort();
    assert_eq!(
        calls,
        [
            "DELETE /api/v1/namespaces/ns/pods/on-gone",
            "GET /api/v1/nodes/erroring",
            "GET /api/v1/nodes/gone",
            "GET /api/v1/nodes/still-there",
            "PATCH /api/v1/namespaces/ns/pods/on-gone/status",
        ]
    );
    assert_eq!(summary.nodes_gone, 1);
    assert_eq!(summary.passes[Sweep::Orphaned as usize].deleted, 1);
    assert_eq!(
        c.applier.metrics.counts("ns", Sweep::Orphaned),
        (1, 0),
        "counted once, no error"
    );
}

#[tokio::test]
async fn nothing_is_checked_or_deleted_during_quarantine() {
    let caches = caches(&[("on-gone", "gone")], &[]);
    let mock = Mock::default().route("GET /api/v1/nodes/gone", 404);
    let mut c = cycle(&mock, Duration::from_secs(3600));
    let summary = c.run(&caches).await;
    assert!(mock.calls().is_empty(), "{:?}", mock.calls());
    assert!(summary.is_empty());
    assert_eq!(c.quarantine.len(), 1);
}

fn terminated_pods(c: &mut Caches, pods: &[(&str, &str, &str, Option<&str>)]) {
    let mut fold = |ev| {
        c.fold_pod(ev);
    };
    fold(Event::Init);
    for (ns, name, phase, finished) in pods {
        let mut p = json!({
            "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}"),
                "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"nodeName": "live"},
            "status": {"phase": phase}
        });
        if let Some(f) = finished {
            p["status"]["containerStatuses"] =
                json!([{"state": {"terminated": {"finishedAt": f}}}]);
        }
        fold(Event::InitApply(serde_json::from_value(p).unwrap()));
    }
    fold(Event::InitDone);
}

fn annotate(c: &mut Caches, ns: &str, annotations: serde_json::Value) {
    let meta = serde_json::from_value(json!({
        "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
        "metadata": {"name": ns, "annotations": annotations}
    }))
    .unwrap();
    c.fold_namespace(Event::Apply(meta));
}

#[tokio::test]
async fn ttl_deletes_only_old_finished_pods_and_malformed_is_reported_once() {
    let caches = caches(&[], &["live"]);
    {
        let mut c = caches.lock();
        terminated_pods(
            &mut c,
            &[
                ("ns", "old", "Succeeded", Some("2020-01-01T00:00:00Z")),
                ("ns", "young", "Succeeded", Some("2999-01-01T00:00:00Z")),
                ("ns", "no-end", "Failed", None),
                ("ns", "running", "Running", Some("2020-01-01T00:00:00Z")),
                ("bad", "old-in-bad", "Failed", Some("2020-01-01T00:00:00Z")),
            ],
        );
        annotate(
            &mut c,
            "bad",
            json!({crate::podgc::policy::TTL_ANNOTATION: "1 week"}),
        );
    }
    let mock = Mock::default();
    let events = Events::new(&mock);
    let mut c = cycle_with(&mock, Duration::from_secs(3600), events.clone());
    c.ttl = Some(Duration::from_secs(3600));
    let summary = c.run(&caches).await;
    assert_eq!(
        mock.calls(),
        ["DELETE /api/v1/namespaces/ns/pods/old"],
        "only the pod that finished long ago; the malformed namespace is left alone"
    );
    assert_eq!(summary.passes[Sweep::Ttl as usize].deleted, 1);
    assert_eq!(c.applier.metrics.terminated_count("ttl"), 1);
    assert_eq!(
        c.applier.metrics.ttl_first_listed.get(),
        1,
        "listed already terminated: chosen by its own times"
    );
    c.run(&caches).await;
    let events = events.seen.lock().unwrap().clone();
    assert_eq!(events.len(), 1, "one Event for one bad value: {events:?}");
    assert_eq!(events[0].0, "bad");
    assert!(events[0].1.contains("\"1 week\""), "{}", events[0].1);
}

fn node(name: &str, ready: bool, out_of_service: bool) -> WireNode {
    let taints = if out_of_service {
        json!([{"key": crate::podgc::facts::OUT_OF_SERVICE_TAINT, "effect": "NoExecute"}])
    } else {
        json!([])
    };
    let status = if ready { "True" } else { "False" };
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"taints": taints},
        "status": {"conditions": [{"type": "Ready", "status": status}]}
    }))
    .unwrap()
}

/// Makes the pod writes on the scripted API; while the first pass deletes `done`, the
/// admin brings node `n1` back (untainted, Ready) and the node watch folds it in, if
/// `comes_back`.
struct NodeComesBack {
    pods: KubeWrites,
    caches: Shared<Caches>,
    comes_back: bool,
}

impl Writes for NodeComesBack {
    fn patch_status<'a>(
        &'a self,
        pod: &'a PodFacts,
        patch: serde_json::Value,
    ) -> BoxFuture<'a, Result<Option<u64>, kube::Error>> {
        self.pods.patch_status(pod, patch)
    }

    fn delete<'a>(&'a self, pod: &'a PodFacts) -> BoxFuture<'a, Result<Option<u64>, kube::Error>> {
        if self.comes_back && pod.name() == "done" {
            self.caches
                .lock()
                .fold_node(Event::Apply(node("n1", true, false)));
        }
        self.pods.delete(pod)
    }
}

/// Deleting on stale state is the worst bug: the out-of-service pass runs behind the threshold and TTL passes,
/// minutes after the cycle's snapshot at a low QPS. A node the admin took back meanwhile
/// (taint removed, Ready) must keep its terminating pods, as upstream's lister read at pass
/// time would; one still out of service loses them.
#[tokio::test]
async fn out_of_service_deletions_read_the_live_node_not_the_snapshot() {
    for (comes_back, want) in [
        (true, vec!["DELETE /api/v1/namespaces/ns/pods/done"]),
        (
            false,
            vec![
                "DELETE /api/v1/namespaces/ns/pods/done",
                "PATCH /api/v1/namespaces/ns/pods/stuck/status",
                "DELETE /api/v1/namespaces/ns/pods/stuck",
            ],
        ),
    ] {
        let caches = caches(&[], &[]);
        {
            let mut c = caches.lock();
            c.fold_node(Event::Apply(node("n1", false, true)));
            c.fold_node(Event::Apply(node("n2", true, false)));
            let pods = [
                json!({"metadata": {"name": "done", "namespace": "ns", "uid": "u-done",
                    "creationTimestamp": "2026-01-01T00:00:00Z"},
                    "spec": {"nodeName": "n2"}, "status": {"phase": "Succeeded"}}),
                json!({"metadata": {"name": "kept", "namespace": "ns", "uid": "u-kept",
                    "creationTimestamp": "2026-01-02T00:00:00Z"},
                    "spec": {"nodeName": "n2"}, "status": {"phase": "Succeeded"}}),
                json!({"metadata": {"name": "stuck", "namespace": "ns", "uid": "u-stuck",
                    "creationTimestamp": "2026-01-01T00:00:00Z",
                    "deletionTimestamp": "2026-01-03T00:00:00Z"},
                    "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}),
            ];
            for p in pods {
                c.fold_pod(Event::Apply(serde_json::from_value(p).unwrap()));
            }
        }
        let mock = Mock::default();
        let mut c = cycle(&mock, Duration::from_secs(3600));
        c.threshold = 1;
        c.applier.live = Some(caches.clone());
        c.applier.nodes = Some(Always::out_of_service());
        let writes: Arc<dyn Writes> = Arc::new(NodeComesBack {
            pods: KubeWrites::new(mock.client()),
            caches: caches.clone(),
            comes_back,
        });
        c.applier.writes = writes;
        let summary = c.run(&caches).await;
        assert_eq!(mock.calls(), want, "node taken back: {comes_back}");
        let oos = &summary.passes[Sweep::OutOfService as usize];
        assert_eq!(
            (oos.deleted, oos.skipped),
            if comes_back { (0, 1) } else { (1, 0) },
            "node taken back: {comes_back}"
        );
        assert_eq!(
            c.applier.metrics.counts("ns", Sweep::OutOfService),
            if comes_back { (0, 0) } else { (1, 0) },
            "a pod left alone is neither a deletion nor an error"
        );
    }
}

/// The Node cache can lag the apiserver: the taint removed a moment ago is still in it when the
/// pass decides. Before force-deleting, the node is read live, once per node for the whole
/// pass however many pods it has; a node the apiserver has gone, back in service or unreadable
/// keeps every pod on it (nothing sent, nothing counted as a deletion or error, the kept pods
/// counted by what the read said), and one still out of service loses them.
#[tokio::test]
async fn out_of_service_deletions_wait_for_a_live_read_of_the_node() {
    let facts = |ready, out_of_service| {
        Some(crate::podgc::facts::NodeFacts {
            ready,
            out_of_service,
        })
    };
    for (live, kept_as) in [
        (facts(false, true), None),
        (facts(false, false), Some("in_service")),
        (facts(true, true), Some("in_service")),
        (None, Some("gone")),
    ] {
        let caches = caches(&[], &[]);
        {
            let mut c = caches.lock();
            c.fold_node(Event::Apply(node("n1", false, true)));
            for i in 0..5 {
                c.fold_pod(Event::Apply(
                    serde_json::from_value(json!({"metadata": {"name": format!("p{i}"),
                        "namespace": "ns", "uid": format!("u{i}"),
                        "creationTimestamp": "2026-01-01T00:00:00Z",
                        "deletionTimestamp": "2026-01-03T00:00:00Z"},
                        "spec": {"nodeName": "n1"}, "status": {"phase": "Failed"}}))
                    .unwrap(),
                ));
            }
        }
        let mock = Mock::default();
        let mut c = cycle(&mock, Duration::from_secs(3600));
        c.applier.live = Some(caches.clone());
        let reads = Arc::new(Always(live, Default::default()));
        c.applier.nodes = Some(reads.clone());
        let summary = c.run(&caches).await;
        let oos = &summary.passes[Sweep::OutOfService as usize];
        assert_eq!(reads.reads(), 1, "{live:?}: one read for the five pods");
        match kept_as {
            None => {
                assert_eq!(mock.calls().len(), 5, "{:?}", mock.calls());
                assert_eq!(oos.deleted, 5);
            }
            Some(label) => {
                assert!(mock.calls().is_empty(), "{live:?}: {:?}", mock.calls());
                assert_eq!((oos.deleted, oos.skipped), (0, 5), "{live:?}");
                assert_eq!(c.applier.metrics.out_of_service_kept_count(label), 5);
                assert_eq!(
                    c.applier.metrics.counts("ns", Sweep::OutOfService),
                    (0, 0),
                    "{live:?}: kept pods are neither deletions nor errors"
                );
            }
        }
    }

    // No way to read the node: the cache alone deletes nothing.
    let caches = caches(&[], &[]);
    caches
        .lock()
        .fold_node(Event::Apply(node("n1", false, true)));
    caches.lock().fold_pod(Event::Apply(
        serde_json::from_value(
            json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u",
            "deletionTimestamp": "2026-01-03T00:00:00Z"},
            "spec": {"nodeName": "n1"}, "status": {"phase": "Failed"}}),
        )
        .unwrap(),
    ));
    let mock = Mock::default();
    let mut c = cycle(&mock, Duration::from_secs(3600));
    c.run(&caches).await;
    assert!(mock.calls().is_empty(), "{:?}", mock.calls());
    assert_eq!(c.applier.metrics.out_of_service_kept_count("unread"), 1);
}

#[tokio::test]
async fn dry_run_reports_malformed_annotations_without_an_event() {
    let caches = caches(&[], &["live"]);
    annotate(
        &mut caches.lock(),
        "bad",
        json!({crate::podgc::policy::THRESHOLD_ANNOTATION: "-3"}),
    );
    let mock = Mock::default();
    let events = Events::new(&mock);
    let mut c = cycle_with(&mock, Duration::from_secs(3600), events.clone());
    c.applier.dry_run = true;
    c.events = event_writer(&events, true);
    c.run(&caches).await;
    assert!(
        events.seen.lock().unwrap().is_empty(),
        "dry-run writes nothing"
    );
}

/// `--pod-gc-mode=ttl-only` beside kube-controller-manager's PodGC: of a cluster where every
/// upstream pass would delete (terminated pods over the threshold, a pod terminating on an
/// out-of-service node, a pod on a node confirmed gone, a terminating pod never scheduled), only
/// the pod the TTL chose is deleted, and no node is looked up. The same cluster in `all` mode
/// deletes through each of the four passes (the threshold pass takes the expired pod first), so
/// the test cannot pass on a cluster that gives those passes nothing to do.
#[tokio::test]
async fn ttl_only_deletes_through_the_policy_passes_alone() {
    for mode in [Mode::TtlOnly, Mode::All] {
        let caches = caches(&[], &["live"]);
        {
            let mut c = caches.lock();
            c.fold_node(Event::Apply(node("oos", false, true)));
            // Listed, as after a restart: the TTL counts from the pods' own finish times.
            c.fold_pod(Event::Init);
            for p in [
                json!({"metadata": {"name": "on-gone", "namespace": "ns", "uid": "u-on-gone",
                    "creationTimestamp": "2026-01-01T00:00:00Z"},
                    "spec": {"nodeName": "gone"}, "status": {"phase": "Running"}}),
                json!({"metadata": {"name": "expired", "namespace": "ns", "uid": "u-expired",
                    "creationTimestamp": "2026-01-01T00:00:00Z"},
                    "spec": {"nodeName": "live"}, "status": {"phase": "Succeeded",
                    "containerStatuses": [{"state": {"terminated": {"finishedAt": "2020-01-01T00:00:00Z"}}}]}}),
                json!({"metadata": {"name": "finished", "namespace": "ns", "uid": "u-finished",
                    "creationTimestamp": "2026-01-02T00:00:00Z"},
                    "spec": {"nodeName": "live"}, "status": {"phase": "Failed",
                    "containerStatuses": [{"state": {"terminated": {"finishedAt": "2999-01-01T00:00:00Z"}}}]}}),
                json!({"metadata": {"name": "stuck", "namespace": "ns", "uid": "u-stuck",
                    "creationTimestamp": "2026-01-01T00:00:00Z",
                    "deletionTimestamp": "2026-01-03T00:00:00Z"},
                    "spec": {"nodeName": "oos"}, "status": {"phase": "Running"}}),
                json!({"metadata": {"name": "unscheduled", "namespace": "ns", "uid": "u-unscheduled",
                    "creationTimestamp": "2026-01-01T00:00:00Z",
                    "deletionTimestamp": "2026-01-03T00:00:00Z"},
                    "spec": {}, "status": {"phase": "Pending"}}),
            ] {
                c.fold_pod(Event::InitApply(serde_json::from_value(p).unwrap()));
            }
            c.fold_pod(Event::InitDone);
        }
        let mock = Mock::default().route("GET /api/v1/nodes/gone", 404);
        let mut c = cycle(&mock, Duration::ZERO);
        c.mode = mode;
        c.threshold = 1;
        c.ttl = Some(Duration::from_secs(3600));
        c.applier.live = Some(caches.clone());
        let reads = Always::out_of_service();
        c.applier.nodes = Some(reads.clone());
        let summary = c.run(&caches).await;
        assert_eq!(
            reads.reads(),
            usize::from(mode == Mode::All),
            "{mode:?}: the out-of-service node is read live only when its pass runs"
        );
        let mut calls = mock.calls();
        calls.retain(|call| !call.starts_with("PATCH "));
        calls.sort();
        let want: &[&str] = match mode {
            Mode::TtlOnly => &["DELETE /api/v1/namespaces/ns/pods/expired"],
            Mode::All => &[
                "DELETE /api/v1/namespaces/ns/pods/expired",
                "DELETE /api/v1/namespaces/ns/pods/on-gone",
                "DELETE /api/v1/namespaces/ns/pods/stuck",
                "DELETE /api/v1/namespaces/ns/pods/unscheduled",
                "GET /api/v1/nodes/gone",
            ],
        };
        assert_eq!(calls, want, "{mode:?}");
        for sweep in Sweep::ALL {
            let chosen = summary.passes[sweep as usize].chosen();
            assert_eq!(
                chosen,
                usize::from(mode == Mode::All),
                "{mode:?}: {sweep:?}"
            );
        }
        for sweep in Sweep::EVERY {
            let chosen = summary.passes[sweep as usize].chosen();
            assert!(
                mode.runs(sweep) || chosen == 0,
                "{mode:?}: {sweep:?} chose {chosen}"
            );
        }
    }
}
