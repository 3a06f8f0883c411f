//! What the sysctl watches cost per held pod, counted by the allocator: 20,000 pods that set a
//! sysctl and can never be placed (a nodeSelector no node matches), gated and held as the
//! placement leaves them, folded into the process's one sysctl cache (both its stores: every
//! pending pod's facts, and the gated pods). The bytes a full list leaves held, and the most
//! held at once while the list is applied again (a relist), against the chart's memory limit.
//!
//! The allocator (`testkit::alloc`) counts per thread, so the other tests of this binary do not
//! disturb the count.

use groundskeeper_controllers::sysctl::cache::{SysctlCache, fold_pod};
use groundskeeper_controllers::sysctl::facts::{CONDITION, GATE};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::Event;
use serde_json::json;
use testkit::alloc::{held, peak, reset_peak};

#[global_allocator]
static ALLOC: testkit::alloc::Counting = testkit::alloc::Counting;

const PODS: usize = 20_000;
/// The chart's `controllerManager.resources.limits.memory`.
const CHART_LIMIT: usize = 256 << 20;

/// A held pod as the apiserver returns it: a ReplicaSet's, gated, with its sysctl, a
/// nodeSelector no node matches, the placement's condition, a container with resources and
/// env, and managedFields.
fn held_pod(i: usize) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": format!("web-5f7d8c9b6-{i:05x}"), "namespace": format!("team-{}", i % 8),
            "uid": format!("{:08x}-0000-4000-8000-{:012x}", i as u32, i),
            "resourceVersion": format!("{}", 5000 + i), "generateName": "web-5f7d8c9b6-",
            "creationTimestamp": "2026-12-06T00:00:00Z",
            "labels": {"app": "web", "pod-template-hash": "5f7d8c9b6"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5f7d8c9b6",
                "uid": "6d2c0a9e-0000-4000-8000-000000000001", "controller": true, "blockOwnerDeletion": true}],
            "managedFields": [{"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
                "time": "2026-12-06T00:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]},
        "spec": {
            "nodeSelector": {"pool": "nowhere"},
            "schedulingGates": [{"name": GATE}],
            "securityContext": {"sysctls": [{"name": "net.core.somaxconn", "value": "4096"}]},
            "containers": [{"name": "web", "image": "registry.example.com/team/web:v1",
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                "env": [{"name": "MODE", "value": "production"}],
                "ports": [{"containerPort": 8080, "protocol": "TCP"}]}],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst", "serviceAccountName": "default",
            "schedulerName": "default-scheduler", "enableServiceLinks": true,
            "preemptionPolicy": "PreemptLowerPriority", "priority": 0,
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]
        },
        "status": {"phase": "Pending", "qosClass": "Burstable",
            "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated",
                 "message": "Scheduling is blocked due to non-empty scheduling gates"},
                {"type": CONDITION, "status": "False", "reason": "NoNodeAdmitsSysctls",
                 "lastTransitionTime": "2026-12-06T00:00:01Z",
                 "message": "no node admits net.core.somaxconn: no node that the pod's own node selector and affinity allow is known"}]}
    }))
    .unwrap()
}

/// Folds a full list of `pods` into `c`, each decoded as it would come off a page.
fn list(c: &mut SysctlCache, pods: &[String]) {
    fold_pod(c, Event::Init);
    for p in pods {
        let pod: Pod = serde_json::from_str(p).unwrap();
        fold_pod(c, Event::InitApply(pod));
    }
    fold_pod(c, Event::InitDone);
}

#[test]
fn held_pods_cost_a_bounded_few_hundred_bytes_each() {
    let pods: Vec<String> = (0..PODS)
        .map(|i| serde_json::to_string(&held_pod(i)).unwrap())
        .collect();
    let mut cache = SysctlCache::default();
    let before = held();
    list(&mut cache, &pods);
    assert_eq!(cache.gated.len(), PODS, "every pod is gated");
    assert!(cache.gated.values().all(|g| g.held.is_some()), "and held");
    let steady = (held() - before) as f64;
    reset_peak();
    list(&mut cache, &pods);
    let relist_peak = (peak() - before) as f64;
    let per_pod = steady / PODS as f64;
    println!(
        "bench sysctl_cache_bytes_per_held_pod {per_pod:.0} bytes\n\
         bench sysctl_cache_bytes_per_held_pod_relist_peak {:.0} bytes\n\
         sysctl cache: {PODS} held pods hold {:.1} MiB after a list, {:.1} MiB at most across a relist \
         (the chart's memory limit: {} MiB)",
        relist_peak / PODS as f64,
        steady / 1048576.0,
        relist_peak / 1048576.0,
        CHART_LIMIT >> 20,
    );
    // A held pod keeps its sysctls, constraints, gates, condition message and keys: nothing
    // of its containers, env or managedFields.
    assert!(per_pod < 2048.0, "{per_pod:.0} bytes per held pod");
    // Twenty thousand of them, relist included, fit a quarter of the chart's limit.
    assert!(
        relist_peak < (CHART_LIMIT / 4) as f64,
        "{:.1} MiB across a relist",
        relist_peak / 1048576.0
    );
}
