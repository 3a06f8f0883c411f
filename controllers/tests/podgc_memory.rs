//! What PodGC's pod cache costs per pod, counted by the allocator: the bytes a full list leaves
//! held, and the most held at once while that list is applied again (a relist), for the pods
//! the load bench makes (Pending, no conditions) and for running pods as a kubelet reports them
//! (five conditions, two container statuses). The bench measures RSS on a real apiserver; this
//! measures the cache alone, in a second, so a field added to what is kept per pod shows here.
//!
//! The allocator (`testkit::alloc`) counts per thread, so the other tests of this binary do not
//! disturb the count.

use groundskeeper_controllers::podgc::{cache::Caches, wire::WirePod};
use kube::runtime::watcher::Event;
use serde_json::json;
use testkit::alloc::{held, peak, reset_peak};

#[global_allocator]
static ALLOC: testkit::alloc::Counting = testkit::alloc::Counting;

const PODS: usize = 20_000;
const NODES: usize = 2_000;
const NAMESPACES: usize = 4;

fn uid(i: usize) -> String {
    format!("{:08x}-0000-4000-8000-{:012x}", i as u32, i)
}

/// As the load bench's pods come back from the apiserver: bound, Pending, no conditions; the
/// bulk (containers, annotations, managedFields) skipped by the parser.
fn bench_pod(i: usize) -> String {
    json!({
        "metadata": {"name": format!("load-{i}"), "namespace": format!("ns-{}", i % NAMESPACES),
            "uid": uid(i), "resourceVersion": format!("{}", 1000 + i), "generation": 1,
            "creationTimestamp": "2026-11-28T00:00:00Z",
            "labels": {"app": "load", "pod-template-hash": "7d9f8c6b5"},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "x".repeat(1200)},
            "managedFields": [{"manager": "bench", "operation": "Update", "apiVersion": "v1",
                "time": "2026-11-28T00:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {}}]},
        "spec": {"nodeName": format!("node-{}", i % NODES),
            "containers": [{"name": "app", "image": "registry.example.com/team/app:v1"}]},
        "status": {"phase": "Pending", "qosClass": "Burstable"}
    })
    .to_string()
}

/// A running pod as a kubelet reports it: five conditions and two container statuses.
fn running_pod(i: usize) -> String {
    let cond = |t: &str| {
        json!({"type": t, "status": "True",
        "lastProbeTime": null, "lastTransitionTime": "2026-11-28T00:00:05Z"})
    };
    let cs = |n: &str| {
        json!({"name": n, "image": "registry.example.com/team/app:v1",
        "imageID": "", "ready": true, "restartCount": 0, "started": true,
        "state": {"running": {"startedAt": "2026-11-28T00:00:04Z"}}})
    };
    let conditions = [
        "PodReadyToStartContainers",
        "Initialized",
        "Ready",
        "ContainersReady",
        "PodScheduled",
    ]
    .map(cond);
    json!({
        "metadata": {"name": format!("app-7d9f8c6b5-{i:05x}"),
            "namespace": format!("ns-{}", i % NAMESPACES), "uid": uid(i),
            "resourceVersion": format!("{}", 1000 + i), "generation": 1,
            "creationTimestamp": "2026-11-28T00:00:00Z",
            "managedFields": [{"manager": "kubelet", "operation": "Update", "apiVersion": "v1",
                "time": "2026-11-28T00:00:05Z", "subresource": "status",
                "fieldsType": "FieldsV1", "fieldsV1": {}}]},
        "spec": {"nodeName": format!("node-{}", i % NODES)},
        "status": {"phase": "Running", "hostIP": "10.0.0.1", "podIP": "10.1.0.1",
            "conditions": conditions,
            "containerStatuses": [cs("app"), cs("sidecar")]}
    })
    .to_string()
}

/// Folds a full list of `pods` into `c`, each parsed from its JSON as it would come off a page.
fn list(c: &mut Caches, pods: &[String]) {
    c.fold_pod(Event::Init);
    for p in pods {
        let pod: WirePod = serde_json::from_str(p).unwrap();
        c.fold_pod(Event::InitApply(pod));
    }
    c.fold_pod(Event::InitDone);
}

struct Cost {
    steady: f64,
    relist_peak: f64,
}

/// Bytes per pod the cache holds after a list, and the most it held per pod over a relist of
/// the same pods (above nothing: the peak over the empty cache).
fn cost(make: fn(usize) -> String) -> Cost {
    let pods: Vec<String> = (0..PODS).map(make).collect();
    let base = held();
    let mut c = Caches::default();
    list(&mut c, &pods);
    let steady = held() - base;
    reset_peak();
    list(&mut c, &pods);
    let relist_peak = peak() - base;
    assert_eq!(c.pods.len(), PODS);
    drop(c);
    Cost {
        steady: steady as f64 / PODS as f64,
        relist_peak: relist_peak as f64 / PODS as f64,
    }
}

/// The bytes per pod measured with these bounds: a field added to every pod's facts, or a
/// relist that copies the store, fails here.
#[test]
fn pod_cache_bytes_per_pod() {
    for (what, make, steady_max, relist_max) in [
        ("bench pod", bench_pod as fn(usize) -> String, 230.0, 300.0),
        ("running pod", running_pod, 240.0, 320.0),
    ] {
        let c = cost(make);
        println!(
            "{what}: {:.0} bytes held per pod after a list, {:.0} at most over a relist",
            c.steady, c.relist_peak
        );
        assert!(c.steady <= steady_max, "{what}: {:.0} B/pod", c.steady);
        assert!(
            c.relist_peak <= relist_max,
            "{what}: relist peak {:.0} B/pod",
            c.relist_peak
        );
    }
}
