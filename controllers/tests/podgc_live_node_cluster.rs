//! PodGC's out-of-service pass against a real apiserver when its Node cache lags: the pass
//! decides on a cache that still shows the out-of-service taint an admin has just removed.
//! Right before the force delete, the live GET of the node refuses it (the pod stays,
//! untouched); on a node still out of service the pod goes. No kubelet: pods stay terminating
//! where the test puts them.

use std::{sync::Arc, time::Duration};

use groundskeeper_controllers::{
    leader::Fence,
    podgc::{
        apply::{Applier, KubeWrites},
        cache::Caches,
        decide,
        metrics::Metrics,
        recheck::KubeNodes,
        wire::{WireNode, WirePod},
    },
};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams},
    runtime::watcher::Event,
};
use serde_json::json;
use testkit::{Cluster, unique_name};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(30);

/// A Node, not Ready, with the out-of-service taint (NoSchedule: no taint-eviction of the
/// test's pods by whatever else runs in the cluster).
async fn out_of_service_node(c: &Cluster) -> anyhow::Result<String> {
    let name = unique_name("gk-podgc-live");
    let n: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"groundskeeper.dev/test": "true"}},
        "spec": {"taints": [{"key": "node.kubernetes.io/out-of-service",
            "value": "nodeshutdown", "effect": "NoSchedule"}]}
    }))?;
    c.create(&n).await?;
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let status = json!({"status": {"conditions": [{
        "type": "Ready", "status": "False", "reason": "Test", "message": "set by the test",
        "lastHeartbeatTime": now, "lastTransitionTime": now}]}});
    Api::<Node>::all(c.client.clone())
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(name)
}

/// A Running pod bound to `node`, deleted gracefully: with no kubelet it stays terminating.
async fn terminating_pod(c: &Cluster, ns: &str, name: &str, node: &str) -> anyhow::Result<()> {
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {"nodeName": node, "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 30,
            "containers": [{"name": "c", "image": "registry.invalid/pause:1"}]}
    }))?;
    c.create(&p).await?;
    let pods = Api::<Pod>::namespaced(c.client.clone(), ns);
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running"}})),
    )
    .await?;
    pods.delete(name, &DeleteParams::default()).await?;
    Ok(())
}

/// The PodGC cache as its watches would have filled it now.
async fn cache_now(c: &Cluster, ns: &str, nodes: &[&str]) -> anyhow::Result<Caches> {
    let mut caches = Caches::default();
    let node_api = Api::<WireNode>::all(c.client.clone());
    for n in nodes {
        caches.fold_node(Event::Apply(node_api.get(n).await?));
    }
    let pods = Api::<WirePod>::namespaced(c.client.clone(), ns);
    for p in pods.list(&Default::default()).await? {
        caches.fold_pod(Event::Apply(p));
    }
    Ok(caches)
}

fn kept_total(registry: &prometheus::Registry, live_node: &str) -> f64 {
    registry
        .gather()
        .iter()
        .filter(|f| f.name() == "groundskeeper_podgc_out_of_service_kept_total")
        .flat_map(|f| f.get_metric().iter())
        .filter(|m| {
            m.get_label()
                .iter()
                .any(|l| l.name() == "live_node" && l.value() == live_node)
        })
        .map(|m| m.get_counter().get_value())
        .sum()
}

#[tokio::test]
async fn a_taint_removed_after_the_cache_saw_it_keeps_the_pod() -> anyhow::Result<()> {
    let Some(c) = testkit::cluster("a_taint_removed_after_the_cache_saw_it_keeps_the_pod").await
    else {
        return Ok(());
    };
    let ns = c.namespace_for_pods("podgc-live-node", WAIT).await?;
    let (taken_back, still_out) = (
        out_of_service_node(&c).await?,
        out_of_service_node(&c).await?,
    );
    terminating_pod(&c, &ns, "on-taken-back", &taken_back).await?;
    terminating_pod(&c, &ns, "on-still-out", &still_out).await?;

    // The cache sees both nodes tainted; then the admin takes one back.
    let caches = cache_now(&c, &ns, &[&taken_back, &still_out]).await?;
    Api::<Node>::all(c.client.clone())
        .patch(
            &taken_back,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": null}})),
        )
        .await?;
    let chosen = decide::out_of_service(&caches.snapshot());
    let mut names: Vec<&str> = chosen.iter().map(|d| d.pod.name()).collect();
    names.sort();
    assert_eq!(
        names,
        ["on-still-out", "on-taken-back"],
        "the pass decides on the cache, which still shows both taints"
    );

    let registry = prometheus::Registry::new();
    let applier = Applier::new(
        Arc::new(KubeWrites::new(c.client.clone())),
        Metrics::register(&registry)?,
        4,
        false,
        CancellationToken::new(),
        Fence::unbounded(),
    )
    .with_node_reads(Arc::new(KubeNodes::new(c.client.clone())));
    let tally = applier.apply(chosen).await;
    assert_eq!((tally.deleted, tally.skipped, tally.failed), (1, 1, 0));

    let pods = Api::<Pod>::namespaced(c.client.clone(), &ns);
    assert!(
        pods.get_opt("on-still-out").await?.is_none(),
        "the node still out of service lets its pod go"
    );
    let kept = pods.get("on-taken-back").await?;
    assert_eq!(
        kept.status.and_then(|s| s.phase).as_deref(),
        Some("Running"),
        "the refused pod is not even marked Failed"
    );
    assert!(kept.metadata.deletion_timestamp.is_some());
    assert_eq!(kept_total(&registry, "in_service"), 1.0);
    Ok(())
}
