//! PodGC under load on a real apiserver: creates N pods of a few KB each bound to M nodes,
//! runs controller-manager (PodGC only) and prints its RSS once the caches are full, the CPU
//! time of one cycle, and the force-delete rate for orphans at a default and a large QPS budget.
//!
//!   KUBECONFIG=... cargo bench -p groundskeeper-controllers --bench podgc_load
//!
//! Knobs (env): PODGC_BENCH_PODS (50000), PODGC_BENCH_NODES (5000), PODGC_BENCH_ORPHAN_NODES_SLOW
//! (orphaned nodes for the QPS 20 run, 60), PODGC_BENCH_ORPHAN_NODES_FAST (300),
//! PODGC_BENCH_FAST_QPS (1000), PODGC_BENCH_BIN (binary to run; default: this build's).
//! Without KUBECONFIG it prints one SKIPPED line and exits 0.
//!
//! The TTL row (PODGC_BENCH_TTL_PODS, 10000, on PODGC_BENCH_TTL_NODES, 1000): pods finished as
//! a kubelet reports it, PODGC_BENCH_TTL_EXPIRED (7500) of them 2 h ago and the rest a minute
//! ago; PodGC with --terminated-pod-ttl=1h --kube-api-qps=1000 collects the expired ones. It
//! prints the RSS, the collection rate, and the 429 answers PodGC's client received and the
//! apiserver's own count of them (its /metrics). PODGC_BENCH_ONLY=ttl runs only this row.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, PostParams},
};
use serde_json::json;
use testkit::{Binary, http_get, unique_name, wait_for, wait_ready};

const CREATE_CONCURRENCY: usize = 96;

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A pod as a Deployment would make it: labels, a last-applied annotation, two containers
/// with env, probes, resources and mounts (about 4 KB stored, with managedFields).
fn pod_json(ns: &str, i: usize, node: &str) -> serde_json::Value {
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

fn node_json(name: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"groundskeeper.dev/bench": "true",
            "kubernetes.io/hostname": name, "topology.kubernetes.io/zone": "zone-a"}},
    })
}

/// Creates a bench Node per name, both rows' fleet.
async fn create_nodes(nodes: &Api<Node>, names: &[String]) -> anyhow::Result<()> {
    let nodes = nodes.clone();
    create_all("nodes", names.to_vec(), move |name| {
        let nodes = nodes.clone();
        Box::pin(async move {
            let n: Node = serde_json::from_value(node_json(&name)).expect("node json");
            nodes.create(&PostParams::default(), &n).await.map(|_| ())
        })
    })
    .await
}

/// Creates pods `load-0`..`load-<n-1>` in `ns`, spread round robin over `node_names`.
async fn create_pods(
    what: &str,
    pods: &Api<Pod>,
    ns: &str,
    n: usize,
    node_names: &[String],
) -> anyhow::Result<()> {
    let (pods, ns, names) = (pods.clone(), ns.to_string(), node_names.to_vec());
    create_all(what, (0..n).collect(), move |i| {
        let pods = pods.clone();
        let v = pod_json(&ns, i, &names[i % names.len()]);
        Box::pin(async move {
            let p: Pod = serde_json::from_value(v).expect("pod json");
            pods.create(&PostParams::default(), &p).await.map(|_| ())
        })
    })
    .await
}

async fn create_all<T, F>(what: &str, items: Vec<T>, create: F) -> anyhow::Result<()>
where
    F: Fn(T) -> futures::future::BoxFuture<'static, Result<(), kube::Error>>,
{
    let total = items.len();
    let start = Instant::now();
    let mut done = 0usize;
    let mut results =
        stream::iter(items.into_iter().map(create)).buffer_unordered(CREATE_CONCURRENCY);
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
    eprintln!(
        "created {total} {what} in {:.1}s ({:.0}/s)",
        start.elapsed().as_secs_f64(),
        total as f64 / start.elapsed().as_secs_f64()
    );
    Ok(())
}

struct Run {
    bin: Binary,
    admin: SocketAddr,
}

impl Run {
    fn start(path: &str, extra: &[&str]) -> anyhow::Result<Self> {
        let mut args = vec![
            "--leader-elect=false",
            "--controllers=podgc",
            "--orphan-quarantine=1s",
        ];
        args.extend_from_slice(extra);
        let (bin, admin) = Binary::start_with_admin(path, "podgc-bench", &args, &[])?;
        Ok(Self { bin, admin })
    }

    async fn metric(&self, series: &str) -> anyhow::Result<f64> {
        let (_, body) = http_get(self.admin, "/metrics").await?;
        Ok(body
            .lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or(0.0))
    }

    fn proc_status(&self, key: &str) -> u64 {
        let pid = self.bin.pid().expect("running");
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| {
                l.strip_prefix(key)?
                    .trim()
                    .trim_end_matches(" kB")
                    .parse()
                    .ok()
            })
            .unwrap_or(0)
    }

    /// utime + stime of the process, in seconds.
    fn cpu_seconds(&self) -> f64 {
        let pid = self.bin.pid().expect("running");
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let after_comm = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        let f: Vec<&str> = after_comm.split_whitespace().collect();
        let ticks: f64 = f[11].parse::<f64>().unwrap_or(0.0) + f[12].parse::<f64>().unwrap_or(0.0);
        ticks / 100.0
    }

    async fn cycles(&self) -> anyhow::Result<f64> {
        self.metric("groundskeeper_podgc_cycle_duration_seconds_count ")
            .await
    }

    async fn wait_cycles(&self, n: f64) -> anyhow::Result<()> {
        wait_for(Duration::from_secs(600), "podgc cycles", || async {
            Ok(self.cycles().await? >= n)
        })
        .await
        .map(|_| ())
    }
}

/// The kubelet's report of a finished pod: phase Succeeded, each container terminated `ago`.
fn finished_status(ago: Duration) -> serde_json::Value {
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

/// 429s the apiserver itself answered so far, all clients: the sum of its
/// `apiserver_request_total{code="429"}` series (None if /metrics is not readable).
async fn apiserver_429s(client: &Client) -> Option<f64> {
    let req = http::Request::get("/metrics").body(Vec::new()).ok()?;
    let text = client.request_text(req).await.ok()?;
    Some(
        text.lines()
            .filter(|l| l.starts_with("apiserver_request_total{") && l.contains("code=\"429\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum(),
    )
}

/// The TTL row: see the module doc.
async fn ttl_row(cluster: &testkit::Cluster, bin: &str) -> anyhow::Result<()> {
    let client = cluster.client.clone();
    let n_pods = env_num("PODGC_BENCH_TTL_PODS", 10_000);
    let n_nodes = env_num("PODGC_BENCH_TTL_NODES", 1_000).max(1);
    let expired = env_num("PODGC_BENCH_TTL_EXPIRED", 7_500).min(n_pods);
    let ns = cluster
        .namespace_for_pods("podgc-bench-ttl", Duration::from_secs(60))
        .await?;
    let prefix = unique_name("gk-bench-ttl-node");
    let node_names: Vec<String> = (0..n_nodes).map(|i| format!("{prefix}-{i}")).collect();
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let result = async {
        create_nodes(&nodes, &node_names).await?;
        create_pods("ttl pods", &pods, &ns, n_pods, &node_names).await?;
        let api = pods.clone();
        create_all("finished statuses", (0..n_pods).collect(), move |i| {
            let pods = api.clone();
            let ago = if i < expired {
                Duration::from_secs(7200)
            } else {
                Duration::from_secs(60)
            };
            Box::pin(async move {
                pods.patch_status(
                    &format!("load-{i}"),
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(finished_status(ago)),
                )
                .await
                .map(|_| ())
            })
        })
        .await?;

        let server_429_before = apiserver_429s(&client).await;
        let run = Run::start(
            bin,
            &[
                "--gc-period=5s",
                "--terminated-pod-ttl=1h",
                "--kube-api-qps=1000",
                "--kube-api-burst=2000",
                "--gc-concurrency=64",
            ],
        )?;
        let series = "groundskeeper_podgc_terminated_deleted_total{reason=\"ttl\"} ";
        let t0 = Instant::now();
        wait_for(Duration::from_secs(600), "first TTL deletion", || async {
            Ok(run.metric(series).await? > 0.0)
        })
        .await?;
        let listed_to_first = t0.elapsed();
        let start = Instant::now();
        let first = run.metric(series).await?;
        wait_for(Duration::from_secs(1800), "all expired pods deleted", || async {
            Ok(run.metric(series).await? >= expired as f64)
        })
        .await?;
        let secs = start.elapsed().as_secs_f64();
        let rss_peak_kib = run.proc_status("VmHWM:");
        let rss_kib = run.proc_status("VmRSS:");
        let throttled = run.metric("groundskeeper_podgc_api_throttled_total ").await?;
        let server_429 = match (server_429_before, apiserver_429s(&client).await) {
            (Some(a), Some(b)) => format!("{}", b - a),
            _ => "unknown (/metrics not readable)".into(),
        };
        let limit = run
            .metric("groundskeeper_podgc_delete_concurrency_limit ")
            .await?;
        let errors = run
            .metric(&format!(
                "pod_gc_collector_force_delete_pod_errors_total{{namespace=\"{ns}\",reason=\"terminated\"}} "
            ))
            .await?;
        // Two cycles more: nothing younger than the TTL goes.
        let c0 = run.cycles().await?;
        run.wait_cycles(c0 + 2.0).await?;
        let left = pods.list(&ListParams::default().limit(1)).await?;
        let remaining = left.items.len() as u64 + left.metadata.remaining_item_count.unwrap_or(0) as u64;
        println!(
            "ttl row: {n_pods} pods on {n_nodes} nodes, {expired} finished 2h ago, TTL 1h, \
             --kube-api-qps=1000 --kube-api-burst=2000 --gc-concurrency=64"
        );
        println!(
            "ttl row: {:.0} expired pods collected in {secs:.1}s: {:.1} pods/s (first deletion {:.1}s after start)",
            expired as f64 - first,
            (expired as f64 - first) / secs,
            listed_to_first.as_secs_f64()
        );
        println!(
            "ttl row: 429 answers counted by PodGC's client: {throttled}; by the apiserver (apiserver_request_total, all clients, during the run): {server_429}; delete errors: {errors}; concurrency limit at the end: {limit}"
        );
        println!(
            "ttl row: RSS {:.1} MiB, peak (VmHWM) {:.1} MiB; pods left: {remaining} (expected {})",
            rss_kib as f64 / 1024.0,
            rss_peak_kib as f64 / 1024.0,
            n_pods - expired
        );
        drop(run);
        anyhow::Ok(())
    }
    .await;
    cleanup(&client, &ns).await;
    result
}

async fn cleanup(client: &Client, ns: &str) {
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

/// Deletes `nodes`, then measures the orphan force-delete rate from the first to the last.
async fn orphan_rate(
    client: &Client,
    run: &Run,
    ns: &str,
    nodes: &[String],
    pods_expected: usize,
) -> anyhow::Result<f64> {
    let series = format!(
        "pod_gc_collector_force_delete_pods_total{{namespace=\"{ns}\",reason=\"orphaned\"}} "
    );
    let before = run.metric(&series).await?;
    let api: Api<Node> = Api::all(client.clone());
    stream::iter(nodes)
        .map(|n| {
            let api = api.clone();
            async move { api.delete(n, &DeleteParams::default()).await.map(|_| ()) }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await?;
    let target = before + pods_expected as f64;
    wait_for(Duration::from_secs(600), "first orphan deleted", || async {
        Ok(run.metric(&series).await? > before)
    })
    .await?;
    let start = Instant::now();
    let first = run.metric(&series).await?;
    wait_for(Duration::from_secs(1800), "all orphans deleted", || async {
        Ok(run.metric(&series).await? >= target)
    })
    .await?;
    let secs = start.elapsed().as_secs_f64();
    Ok((target - first) / secs)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if std::env::var_os("KUBECONFIG").is_none() {
        println!("SKIPPED podgc_load: KUBECONFIG not set");
        return Ok(());
    }
    let n_pods = env_num("PODGC_BENCH_PODS", 50_000);
    let n_nodes = env_num("PODGC_BENCH_NODES", 5_000).max(1);
    let slow_nodes = env_num("PODGC_BENCH_ORPHAN_NODES_SLOW", 60).min(n_nodes / 2);
    let fast_nodes = env_num("PODGC_BENCH_ORPHAN_NODES_FAST", 300).min(n_nodes / 2);
    let fast_qps = env_num("PODGC_BENCH_FAST_QPS", 1000);
    let bin = std::env::var("PODGC_BENCH_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_controller-manager").to_string());
    let cluster = testkit::cluster("podgc_load")
        .await
        .expect("KUBECONFIG is set");
    if std::env::var("PODGC_BENCH_ONLY").as_deref() == Ok("ttl") {
        return ttl_row(&cluster, &bin).await;
    }
    let client = cluster.client.clone();
    eprintln!("podgc_load: {n_pods} pods on {n_nodes} nodes, binary {bin}");

    let ns = cluster
        .namespace_for_pods("podgc-bench", Duration::from_secs(60))
        .await?;
    let prefix = unique_name("gk-bench-node");
    let node_names: Vec<String> = (0..n_nodes).map(|i| format!("{prefix}-{i}")).collect();
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);

    let result = async {
        create_nodes(&nodes, &node_names).await?;
        create_pods("pods", &pods, &ns, n_pods, &node_names).await?;

        // Run 1: the default QPS budget (20/30).
        let run = Run::start(&bin, &["--gc-period=5s"])?;
        let t0 = Instant::now();
        wait_ready(run.admin, Duration::from_secs(600), "podgc ready").await?;
        let listed = t0.elapsed();
        run.wait_cycles(1.0).await?;
        // Settle, then measure a few cycles' CPU (the process is otherwise idle).
        run.wait_cycles(2.0).await?;
        let c0 = run.cycles().await?;
        let cpu0 = run.cpu_seconds();
        let wall0 = run.metric("groundskeeper_podgc_cycle_duration_seconds_sum ").await?;
        run.wait_cycles(c0 + 3.0).await?;
        let cpu = (run.cpu_seconds() - cpu0) / 3.0;
        let wall = (run.metric("groundskeeper_podgc_cycle_duration_seconds_sum ").await? - wall0) / 3.0;
        let rss_kib = run.proc_status("VmRSS:");
        let hwm_kib = run.proc_status("VmHWM:");
        println!("pods={n_pods} nodes={n_nodes}");
        println!("caches listed (readyz) after {:.1}s", listed.as_secs_f64());
        println!("RSS steady: {:.1} MiB; peak (VmHWM): {:.1} MiB", rss_kib as f64 / 1024.0, hwm_kib as f64 / 1024.0);
        println!("one idle cycle: {:.3} s CPU (process total per cycle interval), {:.4} s wall", cpu, wall);

        let per_node = n_pods / n_nodes;
        let slow = &node_names[..slow_nodes];
        let rate = orphan_rate(&client, &run, &ns, slow, slow.len() * per_node).await?;
        println!(
            "orphans at --kube-api-qps=20 --kube-api-burst=30: {} pods, {:.1} pods/s (budget limit 10)",
            slow.len() * per_node,
            rate
        );
        println!("RSS after: {:.1} MiB", run.proc_status("VmRSS:") as f64 / 1024.0);
        drop(run);

        let qps = fast_qps.to_string();
        let burst = (fast_qps * 2).to_string();
        let run = Run::start(
            &bin,
            &["--gc-period=5s", "--kube-api-qps", &qps, "--kube-api-burst", &burst, "--gc-concurrency=64"],
        )?;
        wait_ready(run.admin, Duration::from_secs(600), "podgc ready").await?;
        run.wait_cycles(1.0).await?;
        let fast = &node_names[slow_nodes..slow_nodes + fast_nodes];
        let rate = orphan_rate(&client, &run, &ns, fast, fast.len() * per_node).await?;
        println!(
            "orphans at --kube-api-qps={qps} --kube-api-burst={burst} --gc-concurrency=64: {} pods, {:.1} pods/s",
            fast.len() * per_node,
            rate
        );
        drop(run);
        anyhow::Ok(())
    }
    .await;

    cleanup(&client, &ns).await;
    result?;
    ttl_row(&cluster, &bin).await
}
