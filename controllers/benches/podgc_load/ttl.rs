//! The TTL row: pods finished long ago, collected by `--terminated-pod-ttl` at a large QPS
//! budget, with the 429 answers counted by PodGC's client and by the apiserver.

use std::time::{Duration, Instant};

use crate::{
    objects::{cleanup, create_all, create_nodes, create_pods, finished_status},
    process::{Run, apiserver_429s},
};
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, api::ListParams};
use testkit::figures::env_num;
use testkit::{unique_name, wait_for};

/// The TTL row's TTL: the expired pods' statuses are written this long before the young
/// ones', and the collection (and two cycles after it) must end before the young ones expire.
const TTL_ROW_TTL: Duration = Duration::from_secs(180);

/// The TTL row: see the module doc.
pub(crate) async fn ttl_row(cluster: &testkit::Cluster, bin: &str) -> anyhow::Result<()> {
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
        // The TTL counts from the apiserver's record of each pod's status (its clock), so
        // the expired ones are finished first and the TTL is waited out before the others.
        let finish = |what: &'static str, range: std::ops::Range<usize>, ago: Duration| {
            let api = pods.clone();
            create_all(what, range.collect(), move |i| {
                let pods = api.clone();
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
        };
        finish("expired statuses", 0..expired, Duration::from_secs(7200)).await?;
        tokio::time::sleep(TTL_ROW_TTL).await;
        finish("young statuses", expired..n_pods, Duration::from_secs(60)).await?;

        let server_429_before = apiserver_429s(&client).await;
        let run = Run::start(
            bin,
            &cluster.kubeconfig.display().to_string(),
            &[
                "--gc-period=5s",
                &format!("--terminated-pod-ttl={}s", TTL_ROW_TTL.as_secs()),
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
            "ttl row: {n_pods} pods on {n_nodes} nodes, {expired} finished {}s before the rest, TTL {}s, \
             --kube-api-qps=1000 --kube-api-burst=2000 --gc-concurrency=64",
            TTL_ROW_TTL.as_secs(),
            TTL_ROW_TTL.as_secs()
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
