//! The projection's rule, over generated pods and nodes: what PodGC keeps, read off the wire
//! (`wire.rs` skips every other field while parsing) and folded into the cache, equals what the
//! whole objects say, read here through k8s-openapi's full types by a reference written
//! independently of `facts.rs`.

use std::sync::Arc;

use groundskeeper_plumbing::ObjectKey;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{ContainerStatus, Node, Pod};
use kube::runtime::watcher::Event;
use serde_json::{Value, json};
use testkit::rng::Rng;

use super::{
    cache::Caches,
    facts::{
        DISRUPTION_TARGET, Interner, NodeFacts, OUT_OF_SERVICE_TAINT, Phase, PodFacts, example,
    },
    wire::{WireNode, WirePod},
};

const CASES: u64 = 2000;

fn time(rng: &mut Rng) -> String {
    let t = Timestamp::from_second(1_700_000_000 + rng.below_u64(10_000_000) as i64).unwrap();
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// `value` under `key` in `obj`, or the key left out, at `percent`% for the value.
fn maybe(obj: &mut Value, key: &str, percent: u64, rng: &mut Rng, value: Value) {
    if rng.chance(percent) {
        obj[key] = value;
    }
}

fn condition(rng: &mut Rng) -> Value {
    let types = [
        "Ready",
        "ContainersReady",
        "PodScheduled",
        "Initialized",
        DISRUPTION_TARGET,
        "PodReadyToStartContainers",
    ];
    let mut c =
        json!({"type": rng.pick(&types), "status": rng.pick(&["True", "False", "Unknown"])});
    let t = time(rng);
    maybe(&mut c, "lastTransitionTime", 80, rng, json!(t));
    maybe(&mut c, "reason", 50, rng, json!("SomeReason"));
    maybe(&mut c, "message", 30, rng, json!("x".repeat(40)));
    c
}

fn container_status(rng: &mut Rng, name: &str) -> Value {
    let state = match rng.below(5) {
        0 => json!({}),
        1 => json!({"running": {"startedAt": time(rng)}}),
        2 => json!({"waiting": {"reason": "CrashLoopBackOff"}}),
        3 => json!({"terminated": {"exitCode": 1, "reason": "Error"}}),
        _ => json!({"terminated": {"exitCode": 0, "reason": "Completed",
            "startedAt": time(rng), "finishedAt": time(rng)}}),
    };
    let mut s = json!({"name": name, "image": "registry.example.com/app:v1", "imageID": "",
        "ready": rng.chance(50), "restartCount": rng.below(3)});
    maybe(&mut s, "state", 90, rng, state);
    let last = json!({"terminated": {"exitCode": 2, "finishedAt": time(rng)}});
    maybe(&mut s, "lastState", 30, rng, last);
    s
}

/// A pod as the apiserver serves it, every field PodGC reads varied, and the bulk it does not
/// read (containers, managedFields, annotations, owner references) around them.
fn gen_pod(rng: &mut Rng, i: usize) -> Value {
    let mut meta = json!({
        "labels": {"app": "a", "pod-template-hash": "7d9f8c6b5"},
        "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "x".repeat(200)},
        "managedFields": [{"manager": "kube-controller-manager", "operation": "Update",
            "apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {}}}],
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
            "uid": "7d0c1a4e-0000-4000-8000-000000000001", "controller": true}],
        "resourceVersion": format!("{}", 1000 + i),
    });
    maybe(&mut meta, "name", 98, rng, json!(format!("pod-{i}")));
    let ns = rng.pick(&["default", "ci", "kube-system", "team-a"]);
    maybe(&mut meta, "namespace", 98, rng, json!(ns));
    let uid = if rng.chance(80) {
        format!(
            "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
            rng.next_u64() as u32,
            rng.below(1 << 16),
            rng.below(1 << 12),
            rng.below(1 << 12),
            rng.next_u64() & 0xffff_ffff_ffff
        )
    } else {
        format!("uid-{i}")
    };
    maybe(&mut meta, "uid", 97, rng, json!(uid));
    let generation = rng.below(5);
    maybe(&mut meta, "generation", 80, rng, json!(generation));
    let t = time(rng);
    maybe(&mut meta, "creationTimestamp", 90, rng, json!(t));
    let t = time(rng);
    maybe(&mut meta, "deletionTimestamp", 20, rng, json!(t));
    let grace = rng.pick(&[0, 0, 30]);
    maybe(
        &mut meta,
        "deletionGracePeriodSeconds",
        30,
        rng,
        json!(grace),
    );
    // Entries for the status subresource (the kubelet's, a controller's), with or without a
    // time, and of another subresource: only the latest status write counts.
    for manager in ["kubelet", "some-controller", "kubectl"] {
        if rng.chance(60) {
            let mut entry = json!({"manager": manager, "operation": "Update", "apiVersion": "v1",
                "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:phase": {}}}});
            let t = time(rng);
            maybe(&mut entry, "time", 85, rng, json!(t));
            let sub = rng.pick(&["status", "status", "resize", ""]);
            if !sub.is_empty() {
                entry["subresource"] = json!(sub);
            }
            meta["managedFields"].as_array_mut().unwrap().push(entry);
        }
    }

    let mut spec = json!({"containers": [
        {"name": "app", "image": "registry.example.com/app:v1",
         "env": [{"name": "A", "value": "b"}], "ports": [{"containerPort": 8080}]},
        {"name": "sidecar", "image": "registry.example.com/sidecar:v1"}]});
    let node = rng.pick(&["", "node-a", "node-b", "node-c"]);
    maybe(&mut spec, "nodeName", 85, rng, json!(node));

    let mut status = json!({"hostIP": "10.0.0.1", "podIP": "10.1.0.1", "qosClass": "Burstable"});
    let phase = rng.pick(&[
        "Pending",
        "Running",
        "Succeeded",
        "Failed",
        "Unknown",
        "",
        "Weird",
    ]);
    maybe(&mut status, "phase", 90, rng, json!(phase));
    let reason = rng.pick(&["Evicted", "OOMKilled", "", "NodeLost"]);
    maybe(&mut status, "reason", 40, rng, json!(reason));
    let conditions: Vec<Value> = (0..rng.below(6)).map(|_| condition(rng)).collect();
    maybe(&mut status, "conditions", 85, rng, json!(conditions));
    let main: Vec<Value> = ["app", "sidecar"]
        .iter()
        .take(rng.below(3))
        .map(|n| container_status(rng, n))
        .collect();
    maybe(&mut status, "containerStatuses", 80, rng, json!(main));
    let init: Vec<Value> = (0..rng.below(3))
        .map(|k| container_status(rng, &format!("init-{k}")))
        .collect();
    maybe(&mut status, "initContainerStatuses", 40, rng, json!(init));

    let mut pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec});
    maybe(&mut pod, "status", 90, rng, status);
    pod
}

fn gen_node(rng: &mut Rng, i: usize) -> Value {
    let conditions: Vec<Value> = (0..rng.below(5))
        .map(|_| {
            let t = rng.pick(&[
                "Ready",
                "MemoryPressure",
                "DiskPressure",
                "NetworkUnavailable",
            ]);
            json!({"type": t, "status": rng.pick(&["True", "False", "Unknown"]),
                "lastHeartbeatTime": time(rng), "reason": "KubeletReady"})
        })
        .collect();
    let taints: Vec<Value> = (0..rng.below(4))
        .map(|_| {
            let key = rng.pick(&[
                OUT_OF_SERVICE_TAINT,
                "node.kubernetes.io/unreachable",
                "dedicated",
            ]);
            json!({"key": key, "value": rng.pick(&["", "nodeshutdown"]),
                "effect": rng.pick(&["NoExecute", "NoSchedule"])})
        })
        .collect();
    let mut spec = json!({"podCIDR": "10.1.0.0/24"});
    maybe(&mut spec, "taints", 70, rng, json!(taints));
    let mut status = json!({
        "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
        "images": [{"names": ["registry.example.com/app:v1"], "sizeBytes": 1000}],
        "nodeInfo": {"kubeletVersion": "v1.36.2", "machineID": "m", "systemUUID": "s",
            "bootID": "b", "kernelVersion": "6", "osImage": "Debian", "containerRuntimeVersion": "c",
            "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
    });
    maybe(&mut status, "conditions", 85, rng, json!(conditions));
    let mut node = json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": format!("node-{i}"), "labels": {"kubernetes.io/hostname": "h"}}});
    maybe(&mut node, "spec", 90, rng, spec);
    maybe(&mut node, "status", 90, rng, status);
    node
}

/// The reference: the facts of a whole Pod, or None when it cannot be kept.
fn whole_pod_facts(p: &Pod) -> Option<PodFacts> {
    let m = &p.metadata;
    let status = p.status.clone().unwrap_or_default();
    let phase = Phase::parse(status.phase.as_deref());
    let conditions = status.conditions.clone().unwrap_or_default();
    let dt = conditions.iter().find(|c| c.type_ == DISRUPTION_TARGET);
    let finished = |cs: &Option<Vec<ContainerStatus>>| {
        cs.iter()
            .flatten()
            .filter_map(|c| c.state.as_ref()?.terminated.as_ref()?.finished_at.as_ref())
            .map(|t| t.0)
            .max()
    };
    let terminated_at = match finished(&status.container_statuses) {
        Some(main) => Some(main.max(finished(&status.init_container_statuses).unwrap_or(main))),
        None => conditions
            .iter()
            .filter(|c| c.type_ == "Ready" || c.type_ == "ContainersReady")
            .filter(|c| c.status == "False")
            .filter_map(|c| c.last_transition_time.as_ref().map(|t| t.0))
            .max(),
    };
    // Never before the apiserver's last record of the pod: its last status write, or else
    // its creation.
    let last_status_write = m
        .managed_fields
        .iter()
        .flatten()
        .filter(|e| e.subresource.as_deref() == Some("status"))
        .filter_map(|e| e.time.as_ref().map(|t| t.0))
        .max();
    let recorded = last_status_write.max(m.creation_timestamp.as_ref().map(|t| t.0));
    let terminated_at = terminated_at.map(|end| recorded.map_or(end, |r| end.max(r)));
    let mut facts = PodFacts {
        key: ObjectKey::new(m.namespace.as_deref()?, m.name.as_deref()?),
        uid: m.uid.as_deref()?.into(),
        node_name: p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .filter(|n| !n.is_empty())
            .map(Arc::from),
        phase,
        evicted: phase == Phase::Failed && status.reason.as_deref() == Some("Evicted"),
        terminating: m.deletion_timestamp.is_some(),
        force_deleted: m.deletion_timestamp.is_some() && m.deletion_grace_period_seconds == Some(0),
        created: m
            .creation_timestamp
            .as_ref()
            .map(|t| t.0)
            .unwrap_or(Timestamp::MIN)
            .into(),
        generation: m.generation.into(),
        condition_types: conditions.iter().map(|c| Arc::from(&*c.type_)).collect(),
        ..example::pod("", "", phase)
    };
    facts.set_disruption_target_true(
        dt.filter(|c| c.status == "True")
            .map(|c| c.last_transition_time.as_ref().map(|t| t.0)),
    );
    facts.set_terminated_at(terminated_at);
    Some(facts)
}

fn whole_node_facts(n: &Node) -> NodeFacts {
    let conditions = n.status.as_ref().and_then(|s| s.conditions.clone());
    let taints = n.spec.as_ref().and_then(|s| s.taints.clone());
    NodeFacts {
        ready: conditions
            .unwrap_or_default()
            .iter()
            .find(|c| c.type_ == "Ready")
            .is_some_and(|c| c.status == "True"),
        out_of_service: taints
            .unwrap_or_default()
            .iter()
            .any(|t| t.key == OUT_OF_SERVICE_TAINT),
    }
}

#[test]
fn projected_pod_facts_equal_the_whole_pods_facts() {
    let seed = 0x26_0001;
    let mut rng = Rng(seed);
    let mut names = Interner::default();
    let mut kept = 0;
    for i in 0..CASES as usize {
        let v = gen_pod(&mut rng, i);
        let whole: Pod = serde_json::from_value(v.clone()).expect("a valid pod");
        let wire: WirePod = serde_json::from_value(v.clone()).expect("parses off the wire");
        let projected = PodFacts::from_wire(wire, &mut names).ok();
        assert_eq!(
            projected,
            whole_pod_facts(&whole),
            "seed {seed:#x} case {i}: {v}"
        );
        kept += usize::from(projected.is_some());
    }
    assert!(
        kept > CASES as usize * 8 / 10,
        "most cases keepable: {kept}"
    );
}

#[test]
fn projected_node_facts_equal_the_whole_nodes_facts() {
    let seed = 0x26_0002;
    let mut rng = Rng(seed);
    for i in 0..CASES as usize {
        let v = gen_node(&mut rng, i);
        let whole: Node = serde_json::from_value(v.clone()).expect("a valid node");
        let wire: WireNode = serde_json::from_value(v.clone()).expect("parses off the wire");
        assert_eq!(
            NodeFacts::from_wire(&wire),
            whole_node_facts(&whole),
            "seed {seed:#x} case {i}: {v}"
        );
    }
}

/// The same through the cache: a list folded in, then a snapshot, holds every keepable pod's
/// facts exactly once (the store shares them with the snapshot, it does not copy them).
#[test]
fn a_listed_cache_snapshots_the_whole_objects_facts() {
    let seed = 0x26_0003;
    let mut rng = Rng(seed);
    for round in 0..20 {
        let pods: Vec<Value> = (0..100).map(|i| gen_pod(&mut rng, i)).collect();
        let nodes: Vec<Value> = (0..10).map(|i| gen_node(&mut rng, i)).collect();
        let mut c = Caches::default();
        c.fold_pod(Event::Init);
        for p in &pods {
            c.fold_pod(Event::InitApply(serde_json::from_value(p.clone()).unwrap()));
        }
        c.fold_pod(Event::InitDone);
        c.fold_node(Event::Init);
        for n in &nodes {
            c.fold_node(Event::InitApply(serde_json::from_value(n.clone()).unwrap()));
        }
        c.fold_node(Event::InitDone);
        let snap = c.snapshot();

        let mut want: Vec<PodFacts> = pods
            .iter()
            .filter_map(|p| whole_pod_facts(&serde_json::from_value(p.clone()).unwrap()))
            .collect();
        // Names are unique per round; only the keepable ones are kept.
        let key = |p: &PodFacts| p.key.clone();
        want.sort_by_key(|p| p.key.to_string());
        let mut got: Vec<PodFacts> = snap.pods.iter().map(|p| (**p).clone()).collect();
        got.sort_by_key(|p| p.key.to_string());
        assert_eq!(got, want, "seed {seed:#x} round {round}");
        for p in &snap.pods {
            let live = c.pods.get(&key(p)).expect("in the store");
            assert!(
                Arc::ptr_eq(live, p),
                "the snapshot shares the store's facts"
            );
        }

        let want_nodes: std::collections::HashMap<Arc<str>, NodeFacts> = nodes
            .iter()
            .map(|n| {
                let whole: Node = serde_json::from_value(n.clone()).unwrap();
                (
                    Arc::from(whole.metadata.name.as_deref().unwrap()),
                    whole_node_facts(&whole),
                )
            })
            .collect();
        assert_eq!(snap.nodes, want_nodes, "seed {seed:#x} round {round}");
    }
}
