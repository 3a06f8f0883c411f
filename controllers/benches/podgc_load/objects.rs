//! The objects the bench makes: pods of about 4 KB and their nodes, created through the
//! apiserver (or copied into etcd by `testkit::seed`), finished pods for the TTL row, and the
//! cleanup of what it made in a cluster it does not own.

use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams},
};
use serde_json::json;
use testkit::figures::env_num;
use testkit::wait_for;

pub(crate) const CREATE_CONCURRENCY: usize = 96;

/// A pod as a Deployment would make it: labels, a last-applied annotation, two containers
/// with env, probes, resources and mounts (about 4 KB stored, with managedFields).
pub(crate) fn pod_json(ns: &str, i: usize, node: &str) -> serde_json::Value {
    let container = |name: &str, port: u16| {
        json!({
            "name": name,
            "image": format!("registry.example.com/team/{name}:v1.2.{}", i % 7),
            "args": ["--listen", format!(":{port}"), "--log-level=info", "--config=/etc/app/config.yaml"],
            "ports": [{"name": "http", "containerPort": port}, {"name": "metrics", "containerPort": port + 1}],
            "env": (0..8).map(|k| json!({"name": format!("APP_SETTING_{k}"), "value": format!("value-{k}-{i}")})).collect::<Vec<_>>(),
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "500m", "memory": "256Mi"}},
            "livenessProbe": {"httpGet": {"path": "/healthz", "port": port}, "periodSeconds": 10},
            "readinessProbe": {"httpGet": {"path": "/readyz", "port": port}, "periodSeconds": 5},
            "volumeMounts": [{"name": "config", "mountPath": "/etc/app"}, {"name": "scratch", "mountPath": "/tmp"}]
        })
    };
    let last_applied = "x".repeat(1200);
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": format!("load-{i}"), "namespace": ns,
            "labels": {"app": "load", "tier": "backend", "shard": format!("s{}", i % 50),
                "pod-template-hash": "7d9f8c6b5", "groundskeeper.dev/bench": "true"},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": last_applied,
                "prometheus.io/scrape": "true", "prometheus.io/port": "8081"}
        },
        "spec": {
            "nodeName": node,
            "containers": [container("app", 8080), container("sidecar", 9090)],
            "volumes": [{"name": "config", "configMap": {"name": "app-config"}}, {"name": "scratch", "emptyDir": {}}],
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "load", "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 30
        }
    })
}

pub(crate) fn node_json(name: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"groundskeeper.dev/bench": "true",
            "kubernetes.io/hostname": name, "topology.kubernetes.io/zone": "zone-a"}},
    })
}

/// Creates a bench Node per name, both rows' fleet.
pub(crate) async fn create_nodes(client: &Client, names: &[String]) -> anyhow::Result<f64> {
    let client = client.clone();
    create_all("nodes", names.to_vec(), move |name| {
        post_raw(client.clone(), "/api/v1/nodes".into(), node_json(&name))
    })
    .await
}

/// Creates pods `load-0`..`load-<n-1>` in `ns`, spread round robin over `node_names`.
/// Returns the seconds it took.
pub(crate) async fn create_pods(
    what: &str,
    client: &Client,
    ns: &str,
    n: usize,
    node_names: &[String],
) -> anyhow::Result<f64> {
    let (client, ns, names) = (client.clone(), ns.to_string(), node_names.to_vec());
    let path = format!("/api/v1/namespaces/{ns}/pods");
    create_all(what, (0..n).collect(), move |i| {
        post_raw(
            client.clone(),
            path.clone(),
            pod_json(&ns, i, &names[i % names.len()]),
        )
    })
    .await
}

/// One create, the body serialised once and the answer not decoded: at 150k pods the bench
/// shares 2 cores with the apiserver and etcd, and typed round trips cost it a third of them.
pub(crate) fn post_raw(
    client: Client,
    path: String,
    body: serde_json::Value,
) -> futures::future::BoxFuture<'static, Result<(), kube::Error>> {
    Box::pin(async move {
        let body = serde_json::to_vec(&body).expect("json");
        let req = http::Request::post(path)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(body)
            .expect("request");
        client.request_text(req).await.map(|_| ())
    })
}

pub(crate) async fn create_all<T, F>(what: &str, items: Vec<T>, create: F) -> anyhow::Result<f64>
where
    F: Fn(T) -> futures::future::BoxFuture<'static, Result<(), kube::Error>>,
{
    let total = items.len();
    let concurrency = env_num("PODGC_BENCH_CREATE_CONCURRENCY", CREATE_CONCURRENCY);
    let start = Instant::now();
    let mut done = 0usize;
    let mut results = stream::iter(items.into_iter().map(create)).buffer_unordered(concurrency);
    while let Some(r) = results.next().await {
        match r {
            Ok(()) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        done += 1;
        if done.is_multiple_of(10_000) {
            eprintln!(
                "  {what}: {done}/{total} ({:.0}/s)",
                done as f64 / start.elapsed().as_secs_f64()
            );
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "created {total} {what} in {secs:.1}s ({:.0}/s, {concurrency} at a time)",
        total as f64 / secs
    );
    Ok(secs)
}

/// The kubelet's report of a finished pod: phase Succeeded, each container terminated `ago`.
pub(crate) fn finished_status(ago: Duration) -> serde_json::Value {
    let at = |d: Duration| {
        (jiff::Timestamp::now() - jiff::SignedDuration::try_from(d).expect("small"))
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string()
    };
    let container = |name: &str| {
        json!({"name": name, "image": "registry.example.com/team/x:v1", "imageID": "",
            "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 0, "reason": "Completed",
                "startedAt": at(ago + Duration::from_secs(300)), "finishedAt": at(ago)}}})
    };
    json!({"status": {"phase": "Succeeded",
        "containerStatuses": [container("app"), container("sidecar")]}})
}

pub(crate) async fn cleanup(client: &Client, ns: &str) {
    // Pods first, and until none is left: pods whose node is gone would stay, terminating, in
    // a cluster without kubelets (and be orphans for every PodGC that runs next).
    eprintln!("cleaning up (pods with grace 0 until none is left, then nodes)");
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let cleaned = wait_for(Duration::from_secs(1800), "bench pods deleted", || async {
        let _ = pods
            .delete_collection(
                &DeleteParams::default().grace_period(0),
                &ListParams::default(),
            )
            .await;
        Ok(pods
            .list(&ListParams::default().limit(1))
            .await?
            .items
            .is_empty())
    })
    .await;
    if let Err(e) = cleaned {
        eprintln!("WARNING: {e:#}; delete namespace {ns} by hand");
    }
    let nodes: Api<Node> = Api::all(client.clone());
    let _ = nodes
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels("groundskeeper.dev/bench=true"),
        )
        .await;
}
