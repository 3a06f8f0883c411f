//! PodGC against a real apiserver (no kubelet: pods stay where the test puts them). Each test
//! runs its own controller-manager with short periods; PodGC is cluster-wide, so tests run one
//! at a time and assert only about pods in their own namespace.

use std::{net::SocketAddr, sync::LazyLock, time::Duration};

use futures::StreamExt;
use groundskeeper_controllers::podgc::{
    apply::{KubeWrites, Outcome, Skip, force_delete},
    decide::{Deletion, Sweep},
    facts::{Interner, PodFacts},
    wire::WirePod,
};
use k8s_openapi::api::{
    core::v1::{Namespace, Node, Pod},
    events::v1::Event,
};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, WatchParams},
    core::WatchEvent,
};
use serde_json::json;
use testkit::{Binary, Cluster, holds_for, http_get, unique_name, wait_for};
use tokio::sync::Mutex;

/// PodGC acts on the whole cluster: one manager at a time.
static SERIAL: LazyLock<Mutex<()>> = LazyLock::new(|| Mutex::new(()));

const WAIT: Duration = Duration::from_secs(30);

struct Manager {
    bin: Binary,
    admin: SocketAddr,
}

async fn manager(extra: &[&str]) -> anyhow::Result<Manager> {
    // A large budget: other namespaces' leftovers (pods stuck on deleted nodes) must not hold
    // this test's pods back.
    let mut args = vec![
        "--leader-elect=false",
        "--controllers=podgc",
        "--kube-api-qps=500",
        "--kube-api-burst=1000",
        "--gc-concurrency=64",
    ];
    for default in ["--gc-period=500ms", "--orphan-quarantine=2s"] {
        let flag = default.split('=').next().unwrap();
        if !extra.iter().any(|a| a.starts_with(flag)) {
            args.push(default);
        }
    }
    args.extend_from_slice(extra);
    let (bin, admin) = Binary::start_with_admin(
        env!("CARGO_BIN_EXE_controller-manager"),
        "controller-manager-podgc",
        &args,
        &[],
    )?;
    bin.wait_for_log("podgc running", WAIT).await?;
    Ok(Manager { bin, admin })
}

impl Manager {
    /// The manager's log without colour codes.
    fn logs(&self) -> String {
        let raw = self.bin.logs();
        let mut out = String::with_capacity(raw.len());
        let mut chars = raw.chars();
        while let Some(ch) = chars.next() {
            if ch == '\u{1b}' {
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            } else {
                out.push(ch);
            }
        }
        out
    }

    async fn wait_for_log(&self, what: &str, line: impl Fn(&str) -> bool) -> anyhow::Result<()> {
        wait_for(WAIT, what, || async { Ok(self.logs().lines().any(&line)) })
            .await
            .map(|_| ())
    }

    /// A labelled PodGC counter for one namespace and reason (0 when not exported yet).
    async fn counter(&self, name: &str, ns: &str, reason: &str) -> anyhow::Result<f64> {
        let (_, body) = http_get(self.admin, "/metrics").await?;
        // Summed over any further labels (groundskeeper_podgc_delete_errors_total's `error`).
        let series = format!("{name}{{namespace=\"{ns}\",reason=\"{reason}\"");
        Ok(body
            .lines()
            .filter_map(|l| l.strip_prefix(&series))
            .filter(|rest| rest.starts_with('}') || rest.starts_with(','))
            .filter_map(|rest| rest.rsplit_once(' ')?.1.trim().parse::<f64>().ok())
            .sum())
    }
}

/// A Node object; `ready: None` leaves it without a Ready condition. The out-of-service taint
/// has effect NoSchedule here: with NoExecute the cluster's taint-eviction controller would
/// delete the test's pods itself (PodGC matches the key whatever the effect).
async fn node(c: &Cluster, ready: Option<bool>, out_of_service: bool) -> anyhow::Result<String> {
    let name = unique_name("gk-podgc-node");
    let taints = if out_of_service {
        json!([{"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoSchedule"}])
    } else {
        json!([])
    };
    let n: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"groundskeeper.dev/test": "true"}},
        "spec": {"taints": taints}
    }))?;
    c.create(&n).await?;
    if let Some(ready) = ready {
        let now = jiff::Timestamp::now()
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        let status = json!({"status": {"conditions": [{
            "type": "Ready", "status": if ready { "True" } else { "False" },
            "reason": "Test", "message": "set by the test",
            "lastHeartbeatTime": now, "lastTransitionTime": now}]}});
        Api::<Node>::all(c.client.clone())
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await?;
    }
    Ok(name)
}

async fn pod(
    c: &Cluster,
    ns: &str,
    name: &str,
    node: Option<&str>,
    finalizer: bool,
) -> anyhow::Result<Pod> {
    let mut spec = json!({
        "containers": [{"name": "c", "image": "registry.invalid/pause:1"}],
        "automountServiceAccountToken": false,
        "terminationGracePeriodSeconds": 30
    });
    if let Some(n) = node {
        spec["nodeName"] = json!(n);
    }
    let mut meta = json!({"name": name, "namespace": ns});
    if finalizer {
        meta["finalizers"] = json!(["groundskeeper.dev/test-hold"]);
    }
    let p: Pod = serde_json::from_value(json!({"metadata": meta, "spec": spec}))?;
    c.create(&p).await
}

fn pods_api(c: &Cluster, ns: &str) -> Api<Pod> {
    Api::namespaced(c.client.clone(), ns)
}

async fn set_phase(c: &Cluster, ns: &str, name: &str, phase: &str, reason: Option<&str>) {
    let mut status = json!({"phase": phase});
    if let Some(r) = reason {
        status["reason"] = json!(r);
    }
    Api::<Pod>::namespaced(c.client.clone(), ns)
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
        .unwrap_or_else(|e| panic!("setting {ns}/{name} to {phase}: {e}"));
}

/// Graceful delete: a pod bound to a node (or held by a finalizer) stays, terminating.
async fn start_terminating(c: &Cluster, ns: &str, name: &str) {
    Api::<Pod>::namespaced(c.client.clone(), ns)
        .delete(name, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("deleting {ns}/{name}: {e}"));
}

async fn release_finalizer(c: &Cluster, ns: &str, name: &str) {
    let _ = Api::<Pod>::namespaced(c.client.clone(), ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await;
}

async fn delete_node(c: &Cluster, name: &str) {
    Api::<Node>::all(c.client.clone())
        .delete(name, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("deleting node {name}: {e}"));
}

async fn exists(c: &Cluster, ns: &str, name: &str) -> anyhow::Result<bool> {
    Ok(Api::<Pod>::namespaced(c.client.clone(), ns)
        .get_opt(name)
        .await?
        .is_some())
}

async fn get(c: &Cluster, ns: &str, name: &str) -> Pod {
    Api::<Pod>::namespaced(c.client.clone(), ns)
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("getting {ns}/{name}: {e}"))
}

fn phase(p: &Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

fn has_disruption_target(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.type_ == "DisruptionTarget"
                    && c.status == "True"
                    && c.reason.as_deref() == Some("DeletionByPodGC")
                    && c.message.as_deref() == Some("PodGC: node no longer exists")
            })
        })
}

#[tokio::test]
async fn orphaned_pod_is_marked_then_deleted_after_quarantine() -> anyhow::Result<()> {
    let Some(c) = testkit::cluster("orphaned_pod_is_marked_then_deleted_after_quarantine").await
    else {
        return Ok(());
    };
    let _serial = SERIAL.lock().await;
    let ns = c.namespace_for_pods("podgc-orphan", WAIT).await?;
    let doomed_node = node(&c, Some(true), false).await?;
    let live_node = node(&c, Some(true), false).await?;
    pod(&c, &ns, "orphan", Some(&doomed_node), false).await?;
    set_phase(&c, &ns, "orphan", "Running", None).await;
    // Conditions a kubelet would have set: DisruptionTarget must be added after them.
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let conditions = json!({"status": {"conditions": [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
        {"type": "Ready", "status": "True", "lastTransitionTime": now}]}});
    pods_api(&c, &ns)
        .patch_status(
            "orphan",
            &PatchParams::default(),
            &Patch::Merge(&conditions),
        )
        .await?;
    pod(&c, &ns, "on-live-node", Some(&live_node), false).await?;
    set_phase(&c, &ns, "on-live-node", "Running", None).await;
    let m = manager(&["--orphan-quarantine=3s"]).await?;

    // Watch the orphan from now on: the condition must be seen before the pod goes.
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), &ns);
    let wp = WatchParams::default().fields("metadata.name=orphan");
    let rv = pods.get("orphan").await?.resource_version().unwrap();
    let mut events = pods.watch(&wp, &rv).await?.boxed();

    delete_node(&c, &doomed_node).await;
    m.wait_for_log("the node quarantined", |l| {
        l.contains("quarantined") && l.contains(&doomed_node)
    })
    .await?;
    let mut marked = None;
    let deleted = tokio::time::timeout(WAIT, async {
        while let Some(ev) = events.next().await {
            match ev? {
                WatchEvent::Modified(p) if has_disruption_target(&p) => marked = Some(p),
                WatchEvent::Deleted(_) => return anyhow::Ok(true),
                _ => {}
            }
        }
        anyhow::Ok(false)
    })
    .await??;
    assert!(deleted, "watch ended before the orphan was deleted");
    let marked = marked.expect("DisruptionTarget=True was visible before the delete");
    assert_eq!(phase(&marked), "Failed");
    // As kube-controller-manager's patch ($setElementOrder/conditions): the existing
    // conditions keep their order and DisruptionTarget comes last.
    let types: Vec<String> = marked
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(|cs| cs.iter().map(|c| c.type_.clone()).collect())
        .unwrap_or_default();
    assert_eq!(types, ["PodScheduled", "Ready", "DisruptionTarget"]);
    // The watch can report the delete before the manager has logged it.
    let line = format!("pod=\"{ns}/orphan\"");
    m.wait_for_log("the orphan's log line", |l| {
        l.contains("force-deleted pod") && l.contains(&line) && l.contains("pass=\"orphaned\"")
    })
    .await?;
    assert!(
        exists(&c, &ns, "on-live-node").await?,
        "a pod on a live node is untouched"
    );
    assert_eq!(phase(&get(&c, &ns, "on-live-node").await), "Running");
    assert_eq!(
        m.counter("pod_gc_collector_force_delete_pods_total", &ns, "orphaned")
            .await?,
        1.0
    );
    assert_eq!(
        m.counter(
            "pod_gc_collector_force_delete_pod_errors_total",
            &ns,
            "orphaned"
        )
        .await?,
        0.0
    );
    assert_eq!(
        m.counter("groundskeeper_podgc_delete_errors_total", &ns, "orphaned")
            .await?,
        0.0
    );
    Ok(())
}

#[tokio::test]
async fn node_back_during_quarantine_keeps_its_pods() -> anyhow::Result<()> {
    let Some(c) = testkit::cluster("node_back_during_quarantine_keeps_its_pods").await else {
        return Ok(());
    };
    let _serial = SERIAL.lock().await;
    let ns = c.namespace_for_pods("podgc-back", WAIT).await?;
    let flaky = node(&c, Some(true), false).await?;
    pod(&c, &ns, "stays", Some(&flaky), false).await?;
    set_phase(&c, &ns, "stays", "Running", None).await;
    let m = manager(&["--orphan-quarantine=6s"]).await?;

    delete_node(&c, &flaky).await;
    // The manager saw it missing and quarantined it...
    m.wait_for_log("the node quarantined", |l| {
        l.contains("quarantined") && l.contains(&flaky)
    })
    .await?;
    // ...and it comes back before the quarantine ends.
    let n: Node = serde_json::from_value(json!({"metadata": {"name": flaky}}))?;
    c.create(&n).await?;
    holds_for(
        Duration::from_secs(10),
        "pod on the returned node exists",
        || exists(&c, &ns, "stays"),
    )
    .await?;
    assert_eq!(phase(&get(&c, &ns, "stays").await), "Running");
    Ok(())
}

#[tokio::test]
async fn threshold_deletes_the_oldest_terminated_and_keeps_the_newest() -> anyhow::Result<()> {
    let Some(c) =
        testkit::cluster("threshold_deletes_the_oldest_terminated_and_keeps_the_newest").await
    else {
        return Ok(());
    };
    let _serial = SERIAL.lock().await;
    let ns = c.namespace_for_pods("podgc-threshold", WAIT).await?;
    let n = node(&c, Some(true), false).await?;
    // Evicted pods sort first, so with the threshold set just below the cluster's count only
    // this test's pods are chosen; another namespace's evicted pods would break that.
    let all: Api<Pod> = Api::all(c.client.clone());
    let elsewhere = all.list(&Default::default()).await?.items;
    let terminated = |p: &&Pod| !matches!(phase(p).as_str(), "Pending" | "Running" | "Unknown");
    let others: Vec<&Pod> = elsewhere.iter().filter(terminated).collect();
    if others
        .iter()
        .any(|p| p.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("Evicted"))
    {
        anyhow::bail!("another namespace holds evicted pods: this test could choose them");
    }
    let names = ["evicted-0", "evicted-1", "evicted-2", "evicted-3"];
    for name in names {
        pod(&c, &ns, name, Some(&n), false).await?;
        set_phase(&c, &ns, name, "Failed", Some("Evicted")).await;
        // Creation timestamps have 1 s resolution: space them so age decides, not the name.
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    pod(&c, &ns, "running", Some(&n), false).await?;
    set_phase(&c, &ns, "running", "Running", None).await;
    let threshold = (others.len() + 2).to_string();
    let m = manager(&["--terminated-pod-gc-threshold", &threshold]).await?;

    for gone in &names[..2] {
        wait_for(WAIT, &format!("{gone} deleted"), || async {
            Ok(!exists(&c, &ns, gone).await?)
        })
        .await?;
    }
    drop(m);
    for kept in ["evicted-2", "evicted-3", "running"] {
        assert!(exists(&c, &ns, kept).await?, "{kept} must be kept");
    }
    // Other tests sharing this cluster bail out when evicted pods are left around.
    for name in ["evicted-2", "evicted-3"] {
        Api::<Pod>::namespaced(c.client.clone(), &ns)
            .delete(name, &DeleteParams::default().grace_period(0))
            .await?;
    }
    Ok(())
}

#[tokio::test]
async fn terminating_pods_on_out_of_service_nodes_are_deleted() -> anyhow::Result<()> {
    let Some(c) = testkit::cluster("terminating_pods_on_out_of_service_nodes_are_deleted").await
    else {
        return Ok(());
    };
    let _serial = SERIAL.lock().await;
    let ns = c.namespace_for_pods("podgc-oos", WAIT).await?;
    let oos = node(&c, Some(false), true).await?;
    let no_ready_condition = node(&c, None, true).await?;
    let ready_tainted = node(&c, Some(true), true).await?;
    let down_untainted = node(&c, Some(false), false).await?;
    let cases = [
        ("on-oos", &oos, true, true),
        ("on-oos-not-terminating", &oos, false, false),
        ("on-no-ready-condition", &no_ready_condition, true, true),
        ("on-ready-tainted", &ready_tainted, true, false),
        ("on-down-untainted", &down_untainted, true, false),
    ];
    for (name, node, terminating, _) in cases {
        pod(&c, &ns, name, Some(node), false).await?;
        set_phase(&c, &ns, name, "Running", None).await;
        if terminating {
            start_terminating(&c, &ns, name).await;
        }
    }
    let m = manager(&[]).await?;
    for (name, _, _, deleted) in cases.iter().filter(|c| c.3) {
        assert!(deleted);
        wait_for(WAIT, &format!("{name} force-deleted"), || async {
            Ok(!exists(&c, &ns, name).await?)
        })
        .await?;
    }
    // Several cycles later the others are still there.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for (name, ..) in cases.iter().filter(|c| !c.3) {
        assert!(exists(&c, &ns, name).await?, "{name} must not be deleted");
    }
    assert_eq!(
        m.counter(
            "pod_gc_collector_force_delete_pods_total",
            &ns,
            "out-of-service"
        )
        .await?,
        2.0
    );
    Ok(())
}

/// A pod never scheduled is deleted at once by the apiserver (grace 0): one that a finalizer
/// holds is the only kind the unscheduled pass meets. It is marked Failed (what the Job
/// controller reads) and sent no DELETE, which could not move it.
#[tokio::test]
async fn unscheduled_terminating_pod_is_marked_failed_and_not_deleted_again() -> anyhow::Result<()>
{
    let Some(c) =
        testkit::cluster("unscheduled_terminating_pod_is_marked_failed_and_not_deleted_again")
            .await
    else {
        return Ok(());
    };
    let _serial = SERIAL.lock().await;
    let ns = c.namespace_for_pods("podgc-unscheduled", WAIT).await?;
    // A finalizer holds the deleted pod, so PodGC's work stays visible.
    pod(&c, &ns, "held", None, true).await?;
    pod(&c, &ns, "pending", None, false).await?;
    start_terminating(&c, &ns, "held").await;
    let held = get(&c, &ns, "held").await;
    assert_eq!(
        held.metadata.deletion_grace_period_seconds,
        Some(0),
        "the apiserver deletes an unscheduled pod with grace 0"
    );
    let m = manager(&[]).await?;
    wait_for(WAIT, "the held pod marked Failed", || async {
        Ok(phase(&get(&c, &ns, "held").await) == "Failed")
    })
    .await?;
    let held = get(&c, &ns, "held").await;
    assert!(
        !has_disruption_target(&held),
        "only orphans get the condition"
    );
    wait_for(WAIT, "the skip counted", || async {
        Ok(series(
            &m,
            "groundskeeper_podgc_force_delete_skipped_total{reason=\"unscheduled\"}",
        )
        .await?
            >= 1.0)
    })
    .await?;
    assert!(
        m.logs().lines().any(|l| l.contains("skipped pod")
            && l.contains(&format!("pod=\"{ns}/held\""))
            && l.contains("pass=\"unscheduled\"")
            && l.contains("force delete was already accepted")),
        "one log line for the pod"
    );
    for counter in [
        "pod_gc_collector_force_delete_pods_total",
        "pod_gc_collector_force_delete_pod_errors_total",
    ] {
        assert_eq!(
            m.counter(counter, &ns, "unscheduled").await?,
            0.0,
            "{counter}: no DELETE sent"
        );
    }
    assert_eq!(
        phase(&get(&c, &ns, "pending").await),
        "Pending",
        "not terminating: untouched"
    );
    drop(m);
    release_finalizer(&c, &ns, "held").await;
    wait_for(WAIT, "the held pod gone", || async {
        Ok(!exists(&c, &ns, "held").await?)
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn dry_run_logs_every_pass_and_touches_nothing() -> anyhow::Result<()> {
    let Some(c) = testkit::cluster("dry_run_logs_every_pass_and_touches_nothing").await else {
        return Ok(());
    };
    let _serial = SERIAL.lock().await;
    let ns = c.namespace_for_pods("podgc-dry", WAIT).await?;
    let gone = node(&c, Some(true), false).await?;
    let oos = node(&c, Some(false), true).await?;
    pod(&c, &ns, "orphan", Some(&gone), false).await?;
    set_phase(&c, &ns, "orphan", "Running", None).await;
    pod(&c, &ns, "terminated", Some(&oos), false).await?;
    set_phase(&c, &ns, "terminated", "Succeeded", None).await;
    // The threshold of 1 keeps the cluster's newest terminated pod: make sure it is not ours.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    pod(&c, &ns, "terminated-newer", Some(&oos), false).await?;
    set_phase(&c, &ns, "terminated-newer", "Succeeded", None).await;
    pod(&c, &ns, "out-of-service", Some(&oos), false).await?;
    set_phase(&c, &ns, "out-of-service", "Running", None).await;
    start_terminating(&c, &ns, "out-of-service").await;
    pod(&c, &ns, "unscheduled", None, true).await?;
    start_terminating(&c, &ns, "unscheduled").await;
    delete_node(&c, &gone).await;

    let m = manager(&["--dry-run", "--terminated-pod-gc-threshold=1"]).await?;
    for (name, pass) in [
        ("terminated", "terminated"),
        ("out-of-service", "out-of-service"),
        ("orphan", "orphaned"),
        ("unscheduled", "unscheduled"),
    ] {
        let pod = format!("pod=\"{ns}/{name}\"");
        let pass = format!("pass=\"{pass}\"");
        m.wait_for_log(&format!("dry-run line for {name}"), |l| {
            l.contains("would force-delete") && l.contains(&pod) && l.contains(&pass)
        })
        .await?;
    }
    for (name, want) in [
        ("orphan", "Running"),
        ("terminated", "Succeeded"),
        ("out-of-service", "Running"),
        ("unscheduled", "Pending"),
    ] {
        let p = get(&c, &ns, name).await;
        assert_eq!(phase(&p), want, "{name} untouched");
        assert!(!has_disruption_target(&p), "{name} has no condition");
    }
    assert!(!m.logs().contains("force-deleted pod"));
    drop(m);
    release_finalizer(&c, &ns, "unscheduled").await;
    Ok(())
}

/// The UID precondition, on the real apiserver: facts about a pod that was since deleted and
/// recreated under the same name must not touch the new pod, on either path (status patch
/// first, or delete only).
#[tokio::test]
async fn recreated_pod_with_the_same_name_is_never_deleted() -> anyhow::Result<()> {
    let Some(c) = testkit::cluster("recreated_pod_with_the_same_name_is_never_deleted").await
    else {
        return Ok(());
    };
    let _serial = SERIAL.lock().await;
    let ns = c.namespace_for_pods("podgc-recreated", WAIT).await?;
    let wire: Api<WirePod> = Api::namespaced(c.client.clone(), &ns);
    for (phase_before, pass) in [
        ("Running", Sweep::Orphaned),
        ("Succeeded", Sweep::Terminated),
    ] {
        let name = format!("same-name-{}", phase_before.to_lowercase());
        pod(&c, &ns, &name, None, false).await?;
        set_phase(&c, &ns, &name, phase_before, None).await;
        let stale = PodFacts::from_wire(wire.get(&name).await?, &mut Interner::default())?;

        Api::<Pod>::namespaced(c.client.clone(), &ns)
            .delete(&name, &DeleteParams::default().grace_period(0))
            .await?;
        wait_for(WAIT, "the first pod gone", || async {
            Ok(!exists(&c, &ns, &name).await?)
        })
        .await?;
        let again = pod(&c, &ns, &name, None, false).await?;
        set_phase(&c, &ns, &name, "Running", None).await;
        assert_ne!(again.uid(), Some(stale.uid.to_string()));

        let d = Deletion {
            pod: stale,
            pass,
            why: "stale cache".into(),
        };
        let o = force_delete(
            &KubeWrites::new(c.client.clone()),
            &groundskeeper_controllers::leader::Fence::unbounded(),
            &d,
            jiff::Timestamp::now(),
        )
        .await;
        assert_eq!(o, Outcome::Skipped(Skip::Recreated), "{phase_before}");
        let now = get(&c, &ns, &name).await;
        assert_eq!(now.uid(), again.uid(), "the new pod is still there");
        assert_eq!(phase(&now), "Running", "and its status untouched");
        assert!(!has_disruption_target(&now));
    }
    Ok(())
}

const TTL_ANNOTATION: &str = "groundskeeper.dev/terminated-pod-ttl";
const THRESHOLD_ANNOTATION: &str = "groundskeeper.dev/terminated-pod-gc-threshold";

/// Marks a pod Succeeded/Failed as a kubelet would, its container finished `ago` ago; `None`
/// leaves it without container statuses (no finish time at all).
async fn finish(c: &Cluster, ns: &str, name: &str, phase: &str, ago: Option<Duration>) {
    let mut status = json!({"phase": phase});
    if let Some(ago) = ago {
        let at = |d: Duration| {
            (jiff::Timestamp::now() - jiff::SignedDuration::try_from(d).unwrap())
                .strftime("%Y-%m-%dT%H:%M:%SZ")
                .to_string()
        };
        status["containerStatuses"] = json!([{
            "name": "c", "image": "registry.invalid/pause:1", "imageID": "",
            "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": if phase == "Failed" { 1 } else { 0 },
                "startedAt": at(ago + Duration::from_secs(60)), "finishedAt": at(ago)}}
        }]);
    }
    Api::<Pod>::namespaced(c.client.clone(), ns)
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
        .unwrap_or_else(|e| panic!("finishing {ns}/{name}: {e}"));
}

/// Sets (`Some`) or removes (`None`) one annotation of a namespace.
async fn annotate(c: &Cluster, ns: &str, key: &str, value: Option<&str>) {
    Api::<Namespace>::all(c.client.clone())
        .patch(
            ns,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {key: value}}})),
        )
        .await
        .unwrap_or_else(|e| panic!("annotating {ns}: {e}"));
}

/// The value of an unlabelled-by-namespace counter series, e.g. `name{reason="ttl"}`.
async fn series(m: &Manager, series: &str) -> anyhow::Result<f64> {
    let (_, body) = http_get(m.admin, "/metrics").await?;
    let prefix = format!("{series} ");
    Ok(body
        .lines()
        .find_map(|l| l.strip_prefix(&prefix)?.trim().parse().ok())
        .unwrap_or(0.0))
}

async fn kept(c: &Cluster, ns: &str, names: &[&str], what: &str) -> anyhow::Result<()> {
    holds_for(Duration::from_secs(4), what, || async {
        for n in names {
            if !exists(c, ns, n).await? {
                anyhow::bail!("{ns}/{n} was deleted: {what}");
            }
        }
        Ok(true)
    })
    .await
}

async fn gone(c: &Cluster, ns: &str, names: &[&str]) -> anyhow::Result<()> {
    for n in names {
        wait_for(WAIT, &format!("{ns}/{n} deleted"), || async {
            Ok(!exists(c, ns, n).await?)
        })
        .await?;
    }
    Ok(())
}

/// The TTL counts on the cluster's clock: a pod is as old as the apiserver's record of its
/// status says, never older, whatever its node's clock wrote in `finishedAt`.
const SHORT_TTL: Duration = Duration::from_secs(20);

#[tokio::test]
async fn ttl_deletes_pods_finished_longer_ago_and_nothing_else() -> anyhow::Result<()> {
    let Some(c) = testkit::cluster("ttl_deletes_pods_finished_longer_ago_and_nothing_else").await
    else {
        return Ok(());
    };
    let _serial = SERIAL.lock().await;
    let ns = c.namespace_for_pods("podgc-ttl", WAIT).await?;
    let n = node(&c, Some(true), false).await?;
    let hours = |h: u64| Some(Duration::from_secs(h * 3600));
    for (name, phase, ago, finalizer) in [
        ("old-succeeded", "Succeeded", hours(2), false),
        ("old-failed", "Failed", Some(Duration::from_secs(5)), false),
        ("old-held", "Succeeded", hours(2), true),
    ] {
        pod(&c, &ns, name, Some(&n), finalizer).await?;
        finish(&c, &ns, name, phase, ago).await;
    }
    // The TTL passes on the cluster's clock for those, not for the ones finished now.
    tokio::time::sleep(SHORT_TTL + Duration::from_secs(1)).await;
    for (name, phase, ago) in [
        ("young", "Succeeded", Some(Duration::from_secs(5))),
        // Finished now, on a node whose clock is two hours behind: it says 2 h ago.
        ("node-clock-behind", "Failed", hours(2)),
        ("no-finish-time", "Failed", None),
        ("running", "Running", None),
    ] {
        pod(&c, &ns, name, Some(&n), false).await?;
        finish(&c, &ns, name, phase, ago).await;
    }
    let ttl = format!("--terminated-pod-ttl={}s", SHORT_TTL.as_secs());
    let m = manager(&[&ttl]).await?;
    gone(&c, &ns, &["old-succeeded", "old-failed"]).await?;
    // The finalizer holds it, as it holds upstream's deletes: deleted means terminating.
    wait_for(WAIT, "old-held terminating", || async {
        Ok(get(&c, &ns, "old-held")
            .await
            .metadata
            .deletion_timestamp
            .is_some())
    })
    .await?;
    kept(
        &c,
        &ns,
        &["young", "node-clock-behind", "no-finish-time", "running"],
        "younger than the TTL on the cluster's clock, no finish time, or running",
    )
    .await?;
    assert_eq!(phase(&get(&c, &ns, "running").await), "Running");
    assert!(
        series(
            &m,
            "groundskeeper_podgc_terminated_deleted_total{reason=\"ttl\"}"
        )
        .await?
            >= 3.0
    );
    let line = format!("pod=\"{ns}/old-failed\"");
    assert!(
        m.logs().lines().any(|l| l.contains("force-deleted pod")
            && l.contains(&line)
            && l.contains("pass=\"ttl\"")),
        "one log line per TTL deletion"
    );
    drop(m);
    release_finalizer(&c, &ns, "old-held").await;
    Ok(())
}

#[tokio::test]
async fn ttl_dry_run_deletes_nothing() -> anyhow::Result<()> {
    let Some(c) = testkit::cluster("ttl_dry_run_deletes_nothing").await else {
        return Ok(());
    };
    let _serial = SERIAL.lock().await;
    let ns = c.namespace_for_pods("podgc-ttl-dry", WAIT).await?;
    let n = node(&c, Some(true), false).await?;
    pod(&c, &ns, "old", Some(&n), false).await?;
    finish(&c, &ns, "old", "Succeeded", Some(Duration::from_secs(7200))).await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let m = manager(&["--dry-run", "--terminated-pod-ttl=5s"]).await?;
    let line = format!("pod=\"{ns}/old\"");
    m.wait_for_log("the dry-run line", |l| {
        l.contains("would force-delete") && l.contains(&line) && l.contains("pass=\"ttl\"")
    })
    .await?;
    assert!(exists(&c, &ns, "old").await?);
    Ok(())
}

#[tokio::test]
async fn namespace_annotations_valid_malformed_and_removed() -> anyhow::Result<()> {
    let Some(c) = testkit::cluster("namespace_annotations_valid_malformed_and_removed").await
    else {
        return Ok(());
    };
    let _serial = SERIAL.lock().await;
    let n = node(&c, Some(true), false).await?;
    let hours2 = Some(Duration::from_secs(7200));
    // TTLs count on the cluster's clock (from the apiserver's record of each pod's status),
    // so the pods meant to be past a TTL are made that long before the manager starts.
    let start = std::time::Instant::now();

    // short: its own TTL of 20s, shorter than the cluster's 40s.
    let short = c.namespace_for_pods("podgc-ns-ttl", WAIT).await?;
    annotate(&c, &short, TTL_ANNOTATION, Some("20s")).await;
    pod(&c, &short, "finished-early", Some(&n), false).await?;
    finish(
        &c,
        &short,
        "finished-early",
        "Failed",
        Some(Duration::from_secs(1200)),
    )
    .await;
    // counted: its own threshold of 2 (no finish times: only the count acts).
    let counted = c.namespace_for_pods("podgc-ns-threshold", WAIT).await?;
    annotate(&c, &counted, THRESHOLD_ANNOTATION, Some("2")).await;
    for name in ["c-0", "c-1", "c-2", "c-3"] {
        pod(&c, &counted, name, Some(&n), false).await?;
        finish(&c, &counted, name, "Succeeded", None).await;
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    // bad: malformed values suspend both rules there, even the cluster's TTL...
    let bad = c.namespace_for_pods("podgc-ns-bad", WAIT).await?;
    annotate(&c, &bad, TTL_ANNOTATION, Some("1 week")).await;
    annotate(&c, &bad, THRESHOLD_ANNOTATION, Some("-1")).await;
    for name in ["b-0", "b-1"] {
        pod(&c, &bad, name, Some(&n), false).await?;
        finish(
            &c,
            &bad,
            name,
            "Succeeded",
            Some(Duration::from_secs(2 * 86400)),
        )
        .await;
    }
    tokio::time::sleep(Duration::from_secs(21).saturating_sub(start.elapsed())).await;
    pod(&c, &short, "finished-late", Some(&n), false).await?;
    finish(
        &c,
        &short,
        "finished-late",
        "Failed",
        Some(Duration::from_secs(60)),
    )
    .await;
    // plain: no policy; finished now (its node says 2h ago), under the cluster's 40s TTL and
    // the global threshold.
    let plain = c.namespace_for_pods("podgc-ns-plain", WAIT).await?;
    pod(&c, &plain, "p-0", Some(&n), false).await?;
    finish(&c, &plain, "p-0", "Succeeded", hours2).await;

    let m = manager(&["--terminated-pod-ttl=40s"]).await?;
    gone(&c, &counted, &["c-0", "c-1"]).await?;
    gone(&c, &short, &["finished-early"]).await?;
    kept(&c, &counted, &["c-2", "c-3"], "the newest two are kept").await?;
    kept(
        &c,
        &short,
        &["finished-late"],
        "younger than the namespace TTL",
    )
    .await?;
    kept(
        &c,
        &bad,
        &["b-0", "b-1"],
        "a malformed annotation never deletes",
    )
    .await?;
    kept(
        &c,
        &plain,
        &["p-0"],
        "no policy, under the global threshold and cluster TTL",
    )
    .await?;

    // Reported once per bad value, in the log and as Events on the Namespace, over many cycles.
    let events: Api<Event> = Api::all(c.client.clone());
    let ours = || async {
        let list = events.list(&Default::default()).await?;
        anyhow::Ok(
            list.items
                .into_iter()
                .filter(|e| {
                    e.regarding.as_ref().is_some_and(|r| {
                        r.kind.as_deref() == Some("Namespace") && r.name.as_deref() == Some(&*bad)
                    }) && e.reason.as_deref() == Some("InvalidPodGCPolicy")
                })
                .map(|e| e.note.unwrap_or_default())
                .collect::<Vec<_>>(),
        )
    };
    wait_for(WAIT, "two Events on the bad namespace", || async {
        Ok(ours().await?.len() >= 2)
    })
    .await?;
    let notes = ours().await?;
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(notes.iter().any(|n| n.contains("\"1 week\"")), "{notes:?}");
    assert!(notes.iter().any(|n| n.contains("\"-1\"")), "{notes:?}");
    let warned = |value: &str| {
        let ns = format!("namespace={bad} ");
        // logfmt: quoted only when it needs to be.
        let value = if groundskeeper_plumbing::telemetry::needs_quotes(value) {
            format!("value={value:?}")
        } else {
            format!("value={value}")
        };
        m.logs()
            .lines()
            .filter(|l| {
                l.contains("malformed PodGC policy annotation")
                    && l.contains(&ns)
                    && l.contains(&value)
            })
            .count()
    };
    assert_eq!(warned("1 week"), 1, "logged once, not every cycle");
    assert_eq!(warned("-1"), 1);

    // Removed: the namespace falls back to the cluster defaults. bad's pods finished (their
    // node says two days ago) before the cluster's 40s; counted no longer has a count.
    annotate(&c, &bad, TTL_ANNOTATION, None).await;
    annotate(&c, &bad, THRESHOLD_ANNOTATION, None).await;
    annotate(&c, &counted, THRESHOLD_ANNOTATION, None).await;
    pod(&c, &counted, "c-4", Some(&n), false).await?;
    finish(&c, &counted, "c-4", "Succeeded", None).await;
    gone(&c, &bad, &["b-0", "b-1"]).await?;
    kept(
        &c,
        &counted,
        &["c-2", "c-3", "c-4"],
        "no namespace threshold any more",
    )
    .await?;

    for (reason, at_least) in [("ttl", 3.0), ("namespace-threshold", 2.0)] {
        let v = series(
            &m,
            &format!("groundskeeper_podgc_terminated_deleted_total{{reason=\"{reason}\"}}"),
        )
        .await?;
        assert!(v >= at_least, "{reason}: {v}");
    }
    Ok(())
}

#[tokio::test]
async fn global_threshold_counts_every_pod_and_policies_act_on_the_rest() -> anyhow::Result<()> {
    let Some(c) =
        testkit::cluster("global_threshold_counts_every_pod_and_policies_act_on_the_rest").await
    else {
        return Ok(());
    };
    let _serial = SERIAL.lock().await;
    let n = node(&c, Some(true), false).await?;
    let all: Api<Pod> = Api::all(c.client.clone());
    let terminated = |p: &&Pod| !matches!(phase(p).as_str(), "Pending" | "Running" | "Unknown");
    // The previous test's cleanup (its Cluster drops after its SERIAL guard) may still be
    // deleting pods: the global count must be steady before the threshold is set from it.
    let mut elsewhere = all.list(&Default::default()).await?.items;
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let again = all.list(&Default::default()).await?.items;
        let count = |ps: &[Pod]| ps.iter().filter(terminated).count();
        let steady = count(&again) == count(&elsewhere);
        elsewhere = again;
        if steady {
            break;
        }
    }
    let others: Vec<&Pod> = elsewhere.iter().filter(terminated).collect();
    if others
        .iter()
        .any(|p| p.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("Evicted"))
    {
        anyhow::bail!("another namespace holds evicted pods: this test could choose them");
    }
    // x keeps 1 of its own; y has no policy.
    let x = c.namespace_for_pods("podgc-global-x", WAIT).await?;
    annotate(&c, &x, THRESHOLD_ANNOTATION, Some("1")).await;
    let y = c.namespace_for_pods("podgc-global-y", WAIT).await?;
    pod(&c, &x, "x-evicted", Some(&n), false).await?;
    set_phase(&c, &x, "x-evicted", "Failed", Some("Evicted")).await;
    for name in ["x-0", "x-1"] {
        pod(&c, &x, name, Some(&n), false).await?;
        finish(&c, &x, name, "Succeeded", None).await;
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    for name in ["y-0", "y-1"] {
        pod(&c, &y, name, Some(&n), false).await?;
        finish(&c, &y, name, "Succeeded", None).await;
    }
    // Five terminated pods here: the global threshold is one short, so it deletes the
    // cluster's first in its order (the evicted one), counting x's pods like any others.
    let threshold = (others.len() + 4).to_string();
    let m = manager(&["--terminated-pod-gc-threshold", &threshold]).await?;
    gone(&c, &x, &["x-evicted", "x-0"]).await?;
    kept(&c, &x, &["x-1"], "x keeps its newest").await?;
    kept(
        &c,
        &y,
        &["y-0", "y-1"],
        "no policy and under the global threshold",
    )
    .await?;
    let line = |name: &str, pass: &str| {
        let pod = format!("pod=\"{x}/{name}\"");
        let pass = format!("pass=\"{pass}\"");
        m.logs()
            .lines()
            .filter(|l| l.contains("force-deleted pod") && l.contains(&pod) && l.contains(&pass))
            .count()
    };
    assert_eq!(
        line("x-evicted", "terminated"),
        1,
        "upstream's pass took it, once"
    );
    assert_eq!(
        line("x-evicted", "namespace-threshold"),
        0,
        "and no other pass"
    );
    assert_eq!(line("x-0", "namespace-threshold"), 1);
    assert_eq!(
        m.counter("pod_gc_collector_force_delete_pods_total", &x, "terminated")
            .await?,
        2.0,
        "both under upstream's reason, each once"
    );
    assert_eq!(
        m.counter(
            "pod_gc_collector_force_delete_pod_errors_total",
            &x,
            "terminated"
        )
        .await?,
        0.0
    );
    Ok(())
}

/// A real apiserver that answers 429 as soon as two writes overlap (max-inflight filter, no
/// priority-and-fairness): PodGC's deletes come down to what it accepts, wait out each 429 and
/// retry through the limit, and collect every expired pod and nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_collection_adapts_to_an_apiserver_answering_429() -> anyhow::Result<()> {
    let Some((c, cp)) =
        testkit::private_cluster("ttl_collection_adapts_to_an_apiserver_answering_429").await
    else {
        return Ok(());
    };
    let ns = c.namespace_for_pods("podgc-429", WAIT).await?;
    let n = node(&c, Some(true), false).await?;
    let names: Vec<String> = (0..120).map(|i| format!("done-{i}")).collect();
    futures::stream::iter(&names)
        .map(|name| {
            let (c, ns, n) = (&c, &ns, &n);
            async move {
                pod(c, ns, name, Some(n), false).await?;
                finish(c, ns, name, "Succeeded", Some(Duration::from_secs(7200))).await;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<Vec<_>>>()?;
    let finished = std::time::Instant::now();
    // Never to expire while the test runs: its namespace's TTL is an hour.
    let young_ns = c.namespace_for_pods("podgc-429-young", WAIT).await?;
    annotate(&c, &young_ns, TTL_ANNOTATION, Some("1h")).await;
    pod(&c, &young_ns, "young", Some(&n), false).await?;
    finish(
        &c,
        &young_ns,
        "young",
        "Succeeded",
        Some(Duration::from_secs(7200)),
    )
    .await;

    // Not the admin kubeconfig: the max-inflight filter lets system:masters through.
    let rules = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("rbac.yaml");
    let kubeconfig = c.as_service_account(&ns, &rules).await?;
    cp.set_apiserver_args(&[
        "--enable-priority-and-fairness=false",
        "--max-mutating-requests-inflight=1",
    ]);
    let restart = {
        let cp = &*cp;
        tokio::task::block_in_place(|| cp.restart_apiserver())
    };
    restart?;
    // The TTL counts on the cluster's clock, from each pod's last status write.
    tokio::time::sleep(Duration::from_secs(11).saturating_sub(finished.elapsed())).await;

    let (bin, admin) = Binary::start_with_admin(
        env!("CARGO_BIN_EXE_controller-manager"),
        "controller-manager-podgc-429",
        &[
            "--leader-elect=false",
            "--controllers=podgc",
            "--kube-api-qps=1000",
            "--kube-api-burst=2000",
            "--gc-concurrency=64",
            "--gc-period=500ms",
            "--terminated-pod-ttl=10s",
        ],
        &[("KUBECONFIG", kubeconfig.to_str().unwrap())],
    )?;
    bin.wait_for_log("podgc running", WAIT).await?;
    let m = Manager { bin, admin };
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), &ns);
    wait_for(
        Duration::from_secs(120),
        "every expired pod deleted",
        || async { Ok(pods.list(&Default::default()).await?.items.is_empty()) },
    )
    .await?;
    assert!(
        exists(&c, &young_ns, "young").await?,
        "younger than its namespace's TTL"
    );
    let throttled = series(&m, "groundskeeper_podgc_api_throttled_total").await?;
    assert!(throttled > 0.0, "the apiserver did answer 429: {throttled}");
    let limit = series(&m, "groundskeeper_podgc_delete_concurrency_limit").await?;
    assert!(limit < 64.0, "the limit came down: {limit}");
    // A pod throttled on every one of its attempts is left for the next cycle and counted as
    // an error there; none is lost, and none is deleted that should not be.
    let errors = m
        .counter(
            "pod_gc_collector_force_delete_pod_errors_total",
            &ns,
            "terminated",
        )
        .await?;
    assert!(
        errors <= throttled,
        "errors {errors} are throttled pods only"
    );
    drop(m);
    drop(c);
    drop(cp);
    Ok(())
}

/// Pods a finalizer holds once PodGC force-deleted them (the apiserver keeps them with
/// deletionGracePeriodSeconds 0): the following cycles still choose them, as upstream's
/// threshold does, and send them no DELETE; the count shows in the metrics.
#[tokio::test]
async fn finalizer_held_pods_are_force_deleted_once() -> anyhow::Result<()> {
    let Some(c) = testkit::cluster("finalizer_held_pods_are_force_deleted_once").await else {
        return Ok(());
    };
    let _serial = SERIAL.lock().await;
    let ns = c.namespace_for_pods("podgc-held", WAIT).await?;
    annotate(&c, &ns, THRESHOLD_ANNOTATION, Some("1")).await;
    let n = node(&c, Some(true), false).await?;
    let names = ["h-0", "h-1", "h-2", "h-3"];
    for name in names {
        pod(&c, &ns, name, Some(&n), true).await?;
        finish(&c, &ns, name, "Succeeded", None).await;
        // Distinct creation seconds: the threshold keeps the newest.
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    let m = manager(&[]).await?;
    wait_for(WAIT, "the three oldest force-deleted", || async {
        let mut held = 0;
        for name in &names[..3] {
            held += usize::from(
                get(&c, &ns, name)
                    .await
                    .metadata
                    .deletion_timestamp
                    .is_some(),
            );
        }
        Ok(held == 3)
    })
    .await?;
    for name in &names[..3] {
        let p = get(&c, &ns, name).await;
        assert_eq!(
            p.metadata.deletion_grace_period_seconds,
            Some(0),
            "{name}: force-deleted, held by its finalizer"
        );
    }
    let sent = format!(
        "pod_gc_collector_force_delete_pods_total{{namespace=\"{ns}\",reason=\"terminated\"}}"
    );
    assert_eq!(series(&m, &sent).await?, 3.0);
    // Eight cycles or more (--gc-period=500ms) choosing the same three pods.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(series(&m, &sent).await?, 3.0, "no DELETE sent again");
    let skipped = series(
        &m,
        "groundskeeper_podgc_force_delete_skipped_total{reason=\"terminated\"}",
    )
    .await?;
    assert!(skipped >= 3.0 * 6.0, "skipped every cycle: {skipped}");
    assert!(series(&m, "groundskeeper_podgc_finalizer_held_pods").await? >= 3.0);
    assert!(
        get(&c, &ns, "h-3")
            .await
            .metadata
            .deletion_timestamp
            .is_none(),
        "the newest is kept"
    );
    drop(m);
    for name in names {
        release_finalizer(&c, &ns, name).await;
    }
    Ok(())
}
