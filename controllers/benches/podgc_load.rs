//! PodGC under load on a real apiserver: creates N pods of about 4 KB each bound to M nodes,
//! runs controller-manager (PodGC only) and prints its RSS once the caches are full, the CPU
//! time of one cycle, and the orphan force-delete rate at the default and a large QPS budget,
//! each beside kube-controller-manager v1.36.2's PodGC on the same apiserver and objects.
//!
//!   KUBE_APISERVER=path/to/kube-apiserver cargo bench -p groundskeeper-controllers --bench podgc_load
//!
//! At the default size it holds etcd, the apiserver and several GiB for 10 to 20 minutes: run it
//! alone on the machine. Measured figures and their commands: docs/benchmarks.md.
//!
//! With `KUBE_APISERVER` the bench starts its own throwaway control plane (testkit), its etcd
//! with `--quota-backend-bytes` PODGC_BENCH_ETCD_QUOTA_GIB (8) GiB, compacted and defragmented
//! between rows, and thrown away at the end (no cleanup of 150k pods). With `KUBECONFIG` it uses
//! that cluster and deletes what it made. With neither it prints one SKIPPED line and exits 0.
//!
//! Knobs (env): PODGC_BENCH_PODS (150000), PODGC_BENCH_NODES (15000), PODGC_BENCH_ORPHAN_NODES_SLOW
//! (orphaned nodes per PodGC for the QPS 20 rows, 60), PODGC_BENCH_ORPHAN_NODES_FAST (300),
//! PODGC_BENCH_FAST_QPS (1000), PODGC_BENCH_CREATE_CONCURRENCY (96), PODGC_BENCH_BIN (binary to
//! run; default: this build's), PODGC_BENCH_KCM (kube-controller-manager; default
//! target/e2e/bin/kube-controller-manager, which `e2e/node.sh` unpacks; its rows are skipped,
//! visibly, without one), PODGC_BENCH_COMPARE (an older controller-manager: its idle RSS and
//! cycle CPU on the same objects, `_compare` figures, for before/after in one run).
//!
//! Objects: with its own control plane, the bench creates the first node and the first pod
//! through the apiserver and writes the rest straight into etcd as copies of what the apiserver
//! stored for them (same defaults, managedFields, size; own names, UIDs, nodes, env values):
//! 150k pods through the apiserver take over 20 minutes on 2 shared cores.
//! PODGC_BENCH_CREATE=api creates every object through the apiserver instead (96 at a time,
//! PODGC_BENCH_CREATE_CONCURRENCY), as it always does with `KUBECONFIG`.
//!
//! The orphan rows: each PodGC gets node sets of its own of the same size (so neither deletes
//! the other's orphans), and runs alone; the rate is taken by the bench's own watch on the pods,
//! from the first DELETED event of an orphan to the last, the same way for both. Ours runs with
//! `--orphan-quarantine=1s`, upstream's quarantine is a fixed 40 s: the time to the first delete
//! is printed, not counted in the rate.
//!
//! The TTL row (PODGC_BENCH_TTL_PODS, 10000, 0 skips it, on PODGC_BENCH_TTL_NODES, 1000): pods
//! finished as a kubelet reports it, PODGC_BENCH_TTL_EXPIRED (7500) of them 2 h ago and the rest
//! a minute ago; PodGC with --terminated-pod-ttl=1h --kube-api-qps=1000 collects the expired
//! ones. It prints the RSS, the collection rate, and the 429 answers PodGC's client received and
//! the apiserver's own count of them (its /metrics). PODGC_BENCH_ONLY=ttl runs only this row;
//! PODGC_BENCH_ONLY=qps20 stops after the QPS 20 rows (with PODGC_BENCH_TTL_PODS=0: no TTL row).
//!
//! The relist row (first after the objects are made; needs the bench's own control plane): a
//! PodGC of its own, steady on every pod and node, is frozen (SIGSTOP) through an apiserver
//! restart after an etcd compaction (testkit's `Outage::FrozenThroughCompaction`), so that once
//! resumed its watches find their resourceVersion gone and list everything again. Its VmHWM is
//! reset (`/proc/PID/clear_refs` 5) just before, so `manager_rss_peak_relist_<size>` is the
//! peak from the freeze to two cycles after the relist, not the first list's;
//! `manager_rss_after_relist_<size>` is the RSS then, `manager_relist_<size>_s` the time from
//! the resume until every watch is healthy again (backoff included). The relist must show, or
//! the row fails: the pod watch's error counted and logged (not a silence), and the restarted
//! apiserver's count of cluster-wide pod LISTs above 0. The same for kube-controller-manager
//! (`kcm_rss_peak_relist_<size>`, `kcm_rss_after_relist_<size>`, `kcm_relist_<size>_s`: until
//! its reflector logs `Caches populated` for pods again), skipped visibly without it.
//! PODGC_BENCH_ONLY=relist makes the objects and runs only this row.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use std::collections::HashSet;

use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, WatchEvent, WatchParams},
};
use serde_json::json;
use testkit::figures::{bench as figure, env_num, mib, status_kib};
use testkit::{Binary, http_get, seed, unique_name, wait_for, wait_ready};

const CREATE_CONCURRENCY: usize = 96;

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
async fn create_nodes(client: &Client, names: &[String]) -> anyhow::Result<f64> {
    let client = client.clone();
    create_all("nodes", names.to_vec(), move |name| {
        post_raw(client.clone(), "/api/v1/nodes".into(), node_json(&name))
    })
    .await
}

/// Creates pods `load-0`..`load-<n-1>` in `ns`, spread round robin over `node_names`.
/// Returns the seconds it took.
async fn create_pods(
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
fn post_raw(
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

async fn create_all<T, F>(what: &str, items: Vec<T>, create: F) -> anyhow::Result<f64>
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

/// A PodGC under test, ours or kube-controller-manager's: a child process whose memory and CPU
/// the bench reads.
struct Run {
    bin: Binary,
    /// Ours only: the admin server (readiness, metrics).
    admin: Option<SocketAddr>,
}

impl Run {
    fn start(path: &str, kubeconfig: &str, extra: &[&str]) -> anyhow::Result<Self> {
        let mut args = vec![
            "--leader-elect=false",
            "--controllers=podgc",
            "--orphan-quarantine=1s",
        ];
        args.extend_from_slice(extra);
        let (bin, admin) =
            Binary::start_with_admin(path, "podgc-bench", &args, &[("KUBECONFIG", kubeconfig)])?;
        Ok(Self {
            bin,
            admin: Some(admin),
        })
    }

    /// kube-controller-manager v1.36.2 with its PodGC only, at `qps`/`burst`.
    fn start_kcm(path: &str, kubeconfig: &str, qps: usize, burst: usize) -> anyhow::Result<Self> {
        let kc = format!("--kubeconfig={kubeconfig}");
        let (qps, burst) = (
            format!("--kube-api-qps={qps}"),
            format!("--kube-api-burst={burst}"),
        );
        let port = format!("--secure-port={}", testkit::free_addr().port());
        let args = [
            kc.as_str(),
            "--controllers=pod-garbage-collector-controller",
            "--leader-elect=false",
            "--use-service-account-credentials=false",
            &qps,
            &burst,
            "--bind-address=127.0.0.1",
            &port,
            "-v=2",
        ];
        let bin = Binary::start(
            path,
            "kcm-podgc-bench",
            &args,
            &[("KUBECONFIG", kubeconfig)],
        )?;
        Ok(Self { bin, admin: None })
    }

    fn admin(&self) -> SocketAddr {
        self.admin.expect("our PodGC has an admin server")
    }

    async fn metric(&self, series: &str) -> anyhow::Result<f64> {
        let (_, body) = http_get(self.admin(), "/metrics").await?;
        Ok(body
            .lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or(0.0))
    }

    fn proc_status(&self, key: &str) -> u64 {
        status_kib(self.bin.pid().expect("running"), key)
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

/// A `/proc/meminfo` value in kB.
fn proc_meminfo(key: &str) -> u64 {
    std::fs::read_to_string("/proc/meminfo")
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
    apiserver_requests(client, &["code=\"429\""]).await
}

/// Requests the apiserver answered since it started, all clients: the sum of its
/// `apiserver_request_total` series whose labels hold every one of `labels` (None if /metrics
/// is not readable).
async fn apiserver_requests(client: &Client, labels: &[&str]) -> Option<f64> {
    let req = http::Request::get("/metrics").body(Vec::new()).ok()?;
    let text = client.request_text(req).await.ok()?;
    Some(
        text.lines()
            .filter(|l| {
                l.starts_with("apiserver_request_total{") && labels.iter().all(|k| l.contains(k))
            })
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
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let result = async {
        create_nodes(&client, &node_names).await?;
        create_pods("ttl pods", &client, &ns, n_pods, &node_names).await?;
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
            &cluster.kubeconfig.display().to_string(),
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

/// Deletes `nodes`, then measures the orphan force-delete rate from the first delete to the
/// last, as the bench's own watch on the namespace sees the DELETED events of the pods bound
/// to them: the same measure for our PodGC and for kube-controller-manager's.
async fn orphan_rate(
    client: &Client,
    ns: &str,
    nodes: &[String],
    pods_expected: usize,
) -> anyhow::Result<Orphans> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut rv = pods
        .list_metadata(&ListParams::default().limit(1))
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let gone: HashSet<&str> = nodes.iter().map(String::as_str).collect();
    let api: Api<Node> = Api::all(client.clone());
    let deleted_nodes = Instant::now();
    stream::iter(nodes)
        .map(|n| {
            let api = api.clone();
            async move { api.delete(n, &DeleteParams::default()).await.map(|_| ()) }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await?;
    let (mut first, mut last, mut seen) = (None, None, 0usize);
    let deadline = Instant::now() + Duration::from_secs(1800);
    while seen < pods_expected {
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {seen} of {pods_expected} orphans deleted after 30 min"
        );
        let wp = WatchParams::default().timeout(60);
        let mut events = pods.watch(&wp, &rv).await?.boxed();
        while let Some(ev) = events.try_next().await? {
            match ev {
                WatchEvent::Deleted(p) => {
                    rv = p.metadata.resource_version.clone().unwrap_or(rv);
                    let node = p.spec.as_ref().and_then(|s| s.node_name.as_deref());
                    if node.is_some_and(|n| gone.contains(n)) {
                        let now = Instant::now();
                        first.get_or_insert(now);
                        last = Some(now);
                        seen += 1;
                        if seen == pods_expected {
                            break;
                        }
                    }
                }
                WatchEvent::Added(p) | WatchEvent::Modified(p) => {
                    rv = p.metadata.resource_version.unwrap_or(rv);
                }
                WatchEvent::Bookmark(b) => rv = b.metadata.resource_version,
                WatchEvent::Error(e) => anyhow::bail!("watching the orphans: {e:?}"),
            }
        }
    }
    let (first, last) = (first.expect("seen"), last.expect("seen"));
    Ok(Orphans {
        pods: pods_expected,
        to_first: first - deleted_nodes,
        per_s: (pods_expected - 1) as f64 / (last - first).as_secs_f64().max(1e-3),
    })
}

struct Orphans {
    pods: usize,
    /// From the nodes' deletion to the first orphan's.
    to_first: Duration,
    /// Deletes per second from the first to the last.
    per_s: f64,
}

/// The two PodGCs on the same objects, one after the other: node sets of the same size, each
/// PodGC's own, so neither deletes the other's orphans.
struct OrphanRow<'a> {
    client: &'a Client,
    ns: &'a str,
    per_node: usize,
}

impl OrphanRow<'_> {
    async fn measure(&self, who: &str, qps: &str, nodes: &[String]) -> anyhow::Result<f64> {
        let o = orphan_rate(self.client, self.ns, nodes, nodes.len() * self.per_node).await?;
        println!(
            "{who} at {qps}: {} orphans of {} deleted nodes, {:.1} pods/s from the first delete to the last (first {:.1}s after the nodes went)",
            o.pods,
            nodes.len(),
            o.per_s,
            o.to_first.as_secs_f64()
        );
        Ok(o.per_s)
    }
}

/// kube-controller-manager: `PODGC_BENCH_KCM`, else the node tarball's copy that
/// `e2e/node.sh` unpacks into target/e2e/bin.
fn kcm_bin() -> Option<String> {
    if let Ok(p) = std::env::var("PODGC_BENCH_KCM") {
        return (!p.is_empty()).then_some(p);
    }
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/e2e/bin/kube-controller-manager");
    p.is_file().then(|| p.display().to_string())
}

/// RSS of etcd and kube-apiserver, when the bench started them.
fn control_plane_rss(cp: Option<&testkit::ControlPlane>) -> String {
    let Some(cp) = cp else {
        return "not ours (KUBECONFIG)".into();
    };
    let (etcd, apiserver) = cp.pids();
    let rss = |p: Option<u32>| p.map(|p| mib(status_kib(p, "VmRSS:"))).unwrap_or(0.0);
    format!(
        "kube-apiserver {:.0} MiB, etcd {:.0} MiB",
        rss(apiserver),
        rss(etcd)
    )
}

/// Compacts and defragments the bench's own etcd (between rows: 150k pods written and
/// deleted fill etcd 3.4's quota otherwise).
fn compact(cp: Option<&testkit::ControlPlane>, when: &str) {
    let Some(cp) = cp else { return };
    let t = Instant::now();
    match cp
        .compact_etcd()
        .and_then(|rev| Ok((rev, cp.defragment_etcd()?)))
    {
        Ok((rev, size)) => eprintln!(
            "etcd compacted at revision {rev} and defragmented {when}: {:.0} MiB, {:.1}s",
            size as f64 / 1048576.0,
            t.elapsed().as_secs_f64()
        ),
        Err(e) => eprintln!("WARNING: compacting etcd {when}: {e:#}"),
    }
}

/// One of our PodGCs idle on the full caches.
struct Steady {
    listed: Duration,
    rss_kib: u64,
    hwm_kib: u64,
    cpu: f64,
    wall: f64,
}

impl Steady {
    async fn measure(run: &Run) -> anyhow::Result<Self> {
        let t0 = Instant::now();
        wait_ready(run.admin(), Duration::from_secs(600), "podgc ready").await?;
        let listed = t0.elapsed();
        // Settle, then measure a few cycles' CPU (the process is otherwise idle).
        run.wait_cycles(2.0).await?;
        let c0 = run.cycles().await?;
        let cpu0 = run.cpu_seconds();
        let sum = "groundskeeper_podgc_cycle_duration_seconds_sum ";
        let wall0 = run.metric(sum).await?;
        run.wait_cycles(c0 + 3.0).await?;
        Ok(Self {
            listed,
            cpu: (run.cpu_seconds() - cpu0) / 3.0,
            wall: (run.metric(sum).await? - wall0) / 3.0,
            rss_kib: run.proc_status("VmRSS:"),
            hwm_kib: run.proc_status("VmHWM:"),
        })
    }

    fn print(&self, suffix: &str, size: &str) {
        println!(
            "caches listed (readyz) after {:.1}s",
            self.listed.as_secs_f64()
        );
        println!(
            "RSS steady: {:.1} MiB; peak (VmHWM): {:.1} MiB",
            mib(self.rss_kib),
            mib(self.hwm_kib)
        );
        println!(
            "one idle cycle: {:.3} s CPU (process total per cycle interval), {:.4} s wall",
            self.cpu, self.wall
        );
        figure(
            &format!("manager_rss_steady_{size}{suffix}"),
            mib(self.rss_kib),
            "MiB",
        );
        figure(
            &format!("manager_rss_peak_{size}{suffix}"),
            mib(self.hwm_kib),
            "MiB",
        );
        figure(
            &format!("podgc_cycle_cpu_{size}{suffix}"),
            self.cpu * 1000.0,
            "ms",
        );
        figure(
            &format!("manager_caches_listed_{size}_s{suffix}"),
            self.listed.as_secs_f64(),
            "s",
        );
    }
}

/// Which row alone PODGC_BENCH_ONLY asks for (`ttl`, `qps20`, `relist`), if any.
fn only(row: &str) -> bool {
    std::env::var("PODGC_BENCH_ONLY").as_deref() == Ok(row)
}

/// Resets the peak RSS (VmHWM) of `pid` to its RSS now, so that the next read of it is the peak
/// of what came after (Linux's `clear_refs` 5; root, as the bench runs).
fn reset_peak(pid: u32) -> anyhow::Result<()> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").map_err(|e| {
        anyhow::anyhow!("resetting VmHWM of pid {pid} (/proc/{pid}/clear_refs): {e}: a relist peak would be the first list's")
    })
}

/// A PodGC's memory around one forced relist of all its watches.
struct Relisted {
    steady_kib: u64,
    /// VmHWM before the reset: the first list's peak.
    first_peak_kib: u64,
    /// VmHWM from the freeze to the settled state after the relist.
    peak_kib: u64,
    after_kib: u64,
    /// From the resume until the relist was done.
    took: Duration,
}

impl Relisted {
    fn print(&self, who: &str, prefix: &str, size: &str) {
        println!(
            "relist row: {who}: RSS steady {:.1} MiB (first list's peak {:.1} MiB); \
             relisted {:.1}s after it resumed; peak across the relist {:.1} MiB, RSS after {:.1} MiB",
            mib(self.steady_kib),
            mib(self.first_peak_kib),
            self.took.as_secs_f64(),
            mib(self.peak_kib),
            mib(self.after_kib)
        );
        figure(
            &format!("{prefix}_rss_peak_relist_{size}"),
            mib(self.peak_kib),
            "MiB",
        );
        figure(
            &format!("{prefix}_rss_after_relist_{size}"),
            mib(self.after_kib),
            "MiB",
        );
        figure(
            &format!("{prefix}_relist_{size}_s"),
            self.took.as_secs_f64(),
            "s",
        );
    }
}

/// The relist row: see the module doc.
async fn relist_row(
    cluster: &testkit::Cluster,
    cp: Option<&testkit::ControlPlane>,
    bin: &str,
    size: &str,
) -> anyhow::Result<()> {
    let Some(cp) = cp else {
        println!(
            "relist row: SKIPPED (it restarts the apiserver: only on the bench's own control plane, KUBE_APISERVER)"
        );
        return Ok(());
    };
    let kubeconfig = cluster.kubeconfig.display().to_string();
    let run = Run::start(bin, &kubeconfig, &["--gc-period=5s"])?;
    wait_ready(run.admin(), Duration::from_secs(600), "podgc ready").await?;
    run.wait_cycles(2.0).await?;
    let ours = relist_ours(cluster, cp, &run).await;
    drop(run);
    ours?.print("groundskeeper", "manager", size);
    match kcm_bin() {
        Some(kcm) => {
            let k = Run::start_kcm(&kcm, &kubeconfig, 20, 30)?;
            k.bin
                .wait_for_log("Caches are synced", Duration::from_secs(900))
                .await?;
            // Two of its 20 s cycles, as in its steady row.
            tokio::time::sleep(Duration::from_secs(45)).await;
            let theirs = relist_kcm(cp, &k).await;
            drop(k);
            theirs?.print("kube-controller-manager", "kcm", size);
        }
        None => println!(
            "relist row: kube-controller-manager SKIPPED (set PODGC_BENCH_KCM, or run `bash e2e/node.sh` once)"
        ),
    }
    Ok(())
}

/// Freezes `bin` through an apiserver restart after an etcd compaction, its peak RSS reset
/// just before: what it reads of the freeze, and when it was resumed.
async fn freeze_through_compaction(
    cp: &testkit::ControlPlane,
    bin: &Binary,
) -> anyhow::Result<(u64, u64, Instant)> {
    let pid = bin.pid().expect("running");
    let (steady, first_peak) = (status_kib(pid, "VmRSS:"), status_kib(pid, "VmHWM:"));
    reset_peak(pid)?;
    // The restarted apiserver reads every pod back from etcd before it is ready.
    cp.set_ready_timeout(Duration::from_secs(900));
    let frozen = Instant::now();
    let resumed = cp
        .restart_while_frozen(bin, testkit::control_plane::Outage::FrozenThroughCompaction)
        .await?;
    println!(
        "relist row: frozen {:.1}s (etcd compacted, kube-apiserver restarted and ready)",
        (resumed - frozen).as_secs_f64()
    );
    Ok((steady, first_peak, resumed))
}

/// Ours: relisted once the pod watch has failed (until the resumed process notices, its
/// caches look current) and every watch is healthy again; proven by the failure in its log and
/// the apiserver's own count of pod LISTs since its restart.
async fn relist_ours(
    cluster: &testkit::Cluster,
    cp: &testkit::ControlPlane,
    run: &Run,
) -> anyhow::Result<Relisted> {
    let errors = "groundskeeper_watch_errors_total{watch=\"podgc/pods\"} ";
    let errors_before = run.metric(errors).await?;
    let log_before = run.bin.logs().len();
    let (steady_kib, first_peak_kib, resumed) = freeze_through_compaction(cp, &run.bin).await?;
    let no_relist = |what: &str| {
        let logs = run.bin.logs();
        anyhow::anyhow!(
            "relist row: NO RELIST: {what}; log since the freeze:\n{}",
            logs.get(log_before..).unwrap_or(&logs)
        )
    };
    wait_for(
        Duration::from_secs(120),
        "the pod watch to fail",
        || async { Ok(run.metric(errors).await? > errors_before) },
    )
    .await
    .map_err(|e| no_relist(&format!("{e:#}")))?;
    wait_for(
        Duration::from_secs(1800),
        "every watch relisted",
        || async {
            let (_, body) = http_get(run.admin(), "/metrics").await?;
            let stale: Vec<f64> = body
                .lines()
                .filter(|l| l.starts_with("groundskeeper_watch_stale_seconds{"))
                .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
                .collect();
            Ok(!stale.is_empty() && stale.iter().all(|s| *s == 0.0))
        },
    )
    .await?;
    let took = resumed.elapsed();
    let logs = run.bin.logs();
    let since = logs.get(log_before..).unwrap_or(&logs);
    let failed: Vec<&str> = since
        .lines()
        .filter(|l| l.contains("watch=podgc/pods") && l.contains("watch failed"))
        .collect();
    for l in &failed {
        println!("  {l}");
    }
    // A silence is re-watched from the last resourceVersion, not relisted. A freeze longer than
    // --watch-silent-after (at 150k pods the restart alone takes ~110 s) fails the watch as
    // silent first; the 410 of its re-watch then relists without a second "watch failed"
    // line, so the apiserver's own count of LISTs below is the proof that always holds.
    let logged_relist = failed
        .iter()
        .any(|l| !l.contains("nothing from the server"));
    // Through a client whose pooled connection died with the old apiserver: a few tries.
    let mut lists = None;
    for _ in 0..5 {
        let labels = ["verb=\"LIST\"", "resource=\"pods\"", "scope=\"cluster\""];
        lists = apiserver_requests(&cluster.client, &labels).await;
        if lists.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    match lists {
        Some(n) if n > 0.0 => println!(
            "relist row: the restarted apiserver answered {n} cluster-wide pod LISTs (one a page)"
        ),
        Some(_) => return Err(no_relist("the restarted apiserver answered no pod LIST")),
        None if logged_relist => println!(
            "relist row: WARNING: the apiserver's /metrics not readable; relist proven by the log alone"
        ),
        None => {
            return Err(no_relist(
                "no failure of the pod watch that leads to a list, and the apiserver's count of LISTs not readable",
            ));
        }
    }
    let c0 = run.cycles().await?;
    run.wait_cycles(c0 + 2.0).await?;
    Ok(Relisted {
        steady_kib,
        first_peak_kib,
        peak_kib: run.proc_status("VmHWM:"),
        after_kib: run.proc_status("VmRSS:"),
        took,
    })
}

/// kube-controller-manager: relisted once its pod reflector logs `Caches populated` again.
async fn relist_kcm(cp: &testkit::ControlPlane, k: &Run) -> anyhow::Result<Relisted> {
    let populated = || {
        k.bin
            .logs()
            .lines()
            .filter(|l| l.contains("Caches populated") && l.contains("*v1.Pod"))
            .count()
    };
    let before = populated();
    anyhow::ensure!(
        before > 0,
        "relist row: kube-controller-manager never logged `Caches populated` for pods (-v=2): its relist could not be seen; log {}",
        k.bin.log_path().display()
    );
    let (steady_kib, first_peak_kib, resumed) = freeze_through_compaction(cp, &k.bin).await?;
    wait_for(
        Duration::from_secs(1800),
        "kube-controller-manager to list pods again",
        || async { Ok(populated() > before) },
    )
    .await
    .map_err(|e| anyhow::anyhow!("relist row: NO RELIST of kube-controller-manager: {e:#}"))?;
    let took = resumed.elapsed();
    tokio::time::sleep(Duration::from_secs(45)).await;
    Ok(Relisted {
        steady_kib,
        first_peak_kib,
        peak_kib: k.proc_status("VmHWM:"),
        after_kib: k.proc_status("VmRSS:"),
        took,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let n_pods = env_num("PODGC_BENCH_PODS", 150_000);
    let n_nodes = env_num("PODGC_BENCH_NODES", 15_000).max(1);
    let slow_nodes = env_num("PODGC_BENCH_ORPHAN_NODES_SLOW", 60).min(n_nodes / 4);
    let fast_nodes = env_num("PODGC_BENCH_ORPHAN_NODES_FAST", 300).min(n_nodes / 4);
    let fast_qps = env_num("PODGC_BENCH_FAST_QPS", 1000);
    let quota_gib = env_num("PODGC_BENCH_ETCD_QUOTA_GIB", 8);
    let bin = std::env::var("PODGC_BENCH_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_controller-manager").to_string());
    let quota = format!("--quota-backend-bytes={}", quota_gib << 30);
    let (cluster, cp) = if std::env::var_os("KUBECONFIG").is_some_and(|v| !v.is_empty()) {
        (
            testkit::cluster("podgc_load")
                .await
                .expect("KUBECONFIG is set"),
            None,
        )
    } else {
        match testkit::private_cluster_with("podgc_load", &[&quota]).await {
            Some((c, cp)) => (c, Some(cp)),
            None => {
                println!("SKIPPED podgc_load: neither KUBECONFIG nor KUBE_APISERVER set");
                return Ok(());
            }
        }
    };
    let result = run(
        &cluster,
        cp.as_deref(),
        &bin,
        n_pods,
        n_nodes,
        [slow_nodes, fast_nodes],
        fast_qps,
    )
    .await;
    let result = match result {
        Ok(()) if env_num("PODGC_BENCH_TTL_PODS", 10_000) > 0 && !only("relist") => {
            compact(cp.as_deref(), "before the TTL row");
            ttl_row(&cluster, &bin).await
        }
        r => r,
    };
    drop(cluster);
    drop(cp);
    result
}

async fn run(
    cluster: &testkit::Cluster,
    cp: Option<&testkit::ControlPlane>,
    bin: &str,
    n_pods: usize,
    n_nodes: usize,
    [slow_nodes, fast_nodes]: [usize; 2],
    fast_qps: usize,
) -> anyhow::Result<()> {
    if only("ttl") {
        return Ok(());
    }
    let client = cluster.client.clone();
    let kubeconfig = cluster.kubeconfig.display().to_string();
    let size = format!("{}k_pods", n_pods / 1000);
    eprintln!("podgc_load: {n_pods} pods on {n_nodes} nodes, binary {bin}");
    let ns = cluster
        .namespace_for_pods("podgc-bench", Duration::from_secs(60))
        .await?;
    let prefix = unique_name("gk-bench-node");
    let node_names: Vec<String> = (0..n_nodes).map(|i| format!("{prefix}-{i}")).collect();

    let result = async {
        let secs = match cp {
            Some(cp) if std::env::var("PODGC_BENCH_CREATE").as_deref() != Ok("api") => {
                let names = node_names.clone();
                let threads = env_num("PODGC_BENCH_SEED_THREADS", 4);
                let nodes = seed::Kind { what: "nodes", api_path: "/api/v1/nodes", etcd_prefix: "/registry/minions",
                    uid_kind: 0, n: n_nodes, threads };
                seed::seed(&client, cp, nodes,
                    node_json(&node_names[0]), move |i, v| {
                        v["metadata"]["name"] = names[i].clone().into();
                        v["metadata"]["labels"]["kubernetes.io/hostname"] = names[i].clone().into();
                    }).await?;
                let (names, ns2) = (node_names.clone(), ns.clone());
                let paths = (format!("/api/v1/namespaces/{ns}/pods"), format!("/registry/pods/{ns}"));
                let pods = seed::Kind { what: "pods", api_path: &paths.0, etcd_prefix: &paths.1, uid_kind: 1, n: n_pods, threads };
                seed::seed(&client, cp, pods,
                    pod_json(&ns, 0, &node_names[0]), move |i, v| {
                        let want = pod_json(&ns2, i, &names[i % names.len()]);
                        v["metadata"]["name"] = want["metadata"]["name"].clone();
                        v["metadata"]["labels"] = want["metadata"]["labels"].clone();
                        v["spec"]["nodeName"] = want["spec"]["nodeName"].clone();
                        for k in 0..2 {
                            for f in ["image", "env"] {
                                v["spec"]["containers"][k][f] = want["spec"]["containers"][k][f].clone();
                            }
                        }
                    }).await?
            }
            _ => {
                create_nodes(&client, &node_names).await?;
                create_pods("pods", &client, &ns, n_pods, &node_names).await?
            }
        };
        figure(&format!("create_{size}_s"), secs, "s");
        compact(cp, "after creating");
        println!("control plane: {}", control_plane_rss(cp));
        relist_row(cluster, cp, bin, &size).await?;
        if only("relist") {
            return anyhow::Ok(());
        }

        // Run 1: the default QPS budget (20/30).
        let run = Run::start(bin, &kubeconfig, &["--gc-period=5s"])?;
        let m = Steady::measure(&run).await?;
        println!("pods={n_pods} nodes={n_nodes}");
        m.print("", &size);
        println!("control plane: {}", control_plane_rss(cp));
        if let Ok(before) = std::env::var("PODGC_BENCH_COMPARE") {
            let old = Run::start(&before, &kubeconfig, &["--gc-period=5s", "--dry-run"])?;
            let m = Steady::measure(&old).await?;
            println!("the same, binary {before} (--dry-run, beside the first):");
            m.print("_compare", &size);
        }

        let row = OrphanRow { client: &client, ns: &ns, per_node: n_pods / n_nodes };
        let mut sets = node_names.chunks(slow_nodes.max(1));
        let slow_qps = "--kube-api-qps=20 --kube-api-burst=30";
        let ours = row.measure("groundskeeper", slow_qps, sets.next().expect("nodes")).await?;
        let hwm = mib(run.proc_status("VmHWM:"));
        println!("RSS after: {:.1} MiB; peak (VmHWM) over the whole run: {hwm:.1} MiB", mib(run.proc_status("VmRSS:")));
        figure(&format!("manager_rss_peak_run_{size}"), hwm, "MiB");
        // Every watch failure of the run (silences included), relists or re-watches: each one
        // stops deletions until the watch is back.
        let logs = run.bin.logs();
        let failures: Vec<&str> = logs.lines().filter(|l| l.contains("watch failed")).collect();
        for l in failures.iter().take(20) {
            println!("  {l}");
        }
        figure(&format!("manager_watch_failures_{size}"), failures.len() as f64, "count");
        drop(run);
        let kcm = kcm_bin();
        let kcm_rate = match &kcm {
            Some(kcm) => {
                println!("memory available before kube-controller-manager starts: {:.0} MiB", mib(proc_meminfo("MemAvailable:")));
                let k = Run::start_kcm(kcm, &kubeconfig, 20, 30)?;
                // Its caches: the log line, then two of its 20 s cycles.
                k.bin.wait_for_log("Caches are synced", Duration::from_secs(900)).await?;
                tokio::time::sleep(Duration::from_secs(45)).await;
                let (rss, hwm) = (k.proc_status("VmRSS:"), k.proc_status("VmHWM:"));
                println!("kube-controller-manager (PodGC only): RSS steady {:.1} MiB; peak (VmHWM) {:.1} MiB", mib(rss), mib(hwm));
                figure(&format!("kcm_rss_steady_{size}"), mib(rss), "MiB");
                figure(&format!("kcm_rss_peak_{size}"), mib(hwm), "MiB");
                let r = row.measure("kube-controller-manager", slow_qps, sets.next().expect("nodes")).await?;
                drop(k);
                Some(r)
            }
            None => {
                println!("kube-controller-manager: SKIPPED (set PODGC_BENCH_KCM, or run `bash e2e/node.sh` once)");
                None
            }
        };
        figure("orphans_per_s_qps20", ours, "pods/s");
        if let Some(k) = kcm_rate {
            figure("kcm_podgc_orphans_per_s_qps20", k, "pods/s");
            figure("orphans_per_s_ratio_qps20", ours / k, "ratio");
        }

        if only("qps20") {
            return anyhow::Ok(());
        }
        let mut sets = node_names[2 * slow_nodes..].chunks(fast_nodes.max(1));
        let (qps, burst) = (fast_qps.to_string(), (fast_qps * 2).to_string());
        let fast = format!("--kube-api-qps={qps} --kube-api-burst={burst}");
        let run = Run::start(
            bin,
            &kubeconfig,
            &["--gc-period=5s", "--kube-api-qps", &qps, "--kube-api-burst", &burst, "--gc-concurrency=64"],
        )?;
        wait_ready(run.admin(), Duration::from_secs(600), "podgc ready").await?;
        run.wait_cycles(1.0).await?;
        let ours = row.measure("groundskeeper (--gc-concurrency=64)", &fast, sets.next().expect("nodes")).await?;
        drop(run);
        let kcm_rate = match &kcm {
            Some(kcm) => {
                let k = Run::start_kcm(kcm, &kubeconfig, fast_qps, fast_qps * 2)?;
                k.bin.wait_for_log("Caches are synced", Duration::from_secs(900)).await?;
                let r = row.measure("kube-controller-manager", &fast, sets.next().expect("nodes")).await?;
                drop(k);
                Some(r)
            }
            None => None,
        };
        figure(&format!("orphans_per_s_qps{qps}"), ours, "pods/s");
        if let Some(k) = kcm_rate {
            figure(&format!("kcm_podgc_orphans_per_s_qps{qps}"), k, "pods/s");
            figure(&format!("orphans_per_s_ratio_qps{qps}"), ours / k, "ratio");
        }
        anyhow::Ok(())
    }
    .await;

    // Our own control plane goes with everything in it; a cluster named by KUBECONFIG is
    // cleaned.
    if cp.is_none() {
        cleanup(&client, &ns).await;
    }
    result
}
