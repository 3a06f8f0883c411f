//! Streamed list against paged list, side by side in one run: a cluster-wide pod watch into a
//! cache, from start to listed, at `WATCH_LIST_BENCH_PODS` pods (30,000 by default, about
//! 3 KB each). Per mode (`--watch-list=off`, `auto`, and `on` where the server streams):
//! seconds to listed, apiserver requests for pods it answered meanwhile (its
//! `apiserver_request_total`), this process's peak RSS and the apiserver's over the list.
//!
//!   KUBE_APISERVER=path/to/kube-apiserver cargo bench -p groundskeeper-plumbing --bench watch_list
//!
//! Only with a control plane of its own (pods are seeded into its etcd). Peaks are reset
//! before each mode through /proc/<pid>/clear_refs (root).

use std::time::{Duration, Instant};

use futures::StreamExt;
use groundskeeper_plumbing::{
    Readiness, WatchSettings,
    watch::cache::{Projected, Shared, Store, follow},
    watch::list::WatchList,
};
use k8s_openapi::api::core::v1::Pod;
use kube::{Client, ResourceExt, runtime::watcher};
use serde_json::json;
use testkit::{
    figures::{bench, env_num, mib, status_kib},
    seed,
};

fn pod(ns: &str, i: usize) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("load-{i}"), "namespace": ns,
            "labels": {"app": "load", "shard": format!("s{}", i % 50)},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "x".repeat(1500)}},
        "spec": {"nodeName": format!("node-{}", i % 100), "containers": [{"name": "app",
            "image": "registry.example.com/team/app:v1.2.3",
            "env": (0..8).map(|k| json!({"name": format!("SETTING_{k}"), "value": format!("v{k}")})).collect::<Vec<_>>(),
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]}
    })
}

async fn pod_requests(client: &Client) -> f64 {
    let Ok(req) = http::Request::get("/metrics").body(Vec::new()) else {
        return f64::NAN;
    };
    let Ok(text) = client.request_text(req).await else {
        return f64::NAN;
    };
    text.lines()
        .filter(|l| l.starts_with("apiserver_request_total{") && l.contains("resource=\"pods\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn reset_peak(pid: u32) {
    if let Err(e) = std::fs::write(format!("/proc/{pid}/clear_refs"), "5") {
        eprintln!("WARNING: resetting VmHWM of {pid}: {e}: the peak is the process's whole life");
    }
}

/// Watches every pod into a cache with `mode` until listed; the figures, and whether it fell
/// back.
async fn run(client: &Client, apiserver: u32, mode: WatchList, n: usize) -> anyhow::Result<()> {
    let name = format!("{mode:?}").to_lowercase();
    let readiness = Readiness::new(WatchSettings {
        list: mode,
        ..Default::default()
    });
    let registry = prometheus::Registry::new();
    registry.register(readiness.collector())?;
    let before = pod_requests(client).await;
    reset_peak(std::process::id());
    reset_peak(apiserver);
    let cache: Shared<Store<String, ()>> = Shared::default();
    let start = Instant::now();
    let (flag, stream) = follow(
        &readiness,
        "bench",
        client.clone(),
        watcher::Config::default(),
        cache.clone(),
        |s, ev| s.apply_event(ev, |p: Pod| Projected::Yes(p.name_any(), ())),
    );
    let driver = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while stream.next().await.is_some() {}
    });
    // `on` where the server cannot stream would never list: not waited for long.
    let bound = Duration::from_secs(if mode == WatchList::On { 20 } else { 120 });
    let listed = testkit::wait_for(bound, "listed", || async { Ok(flag.is_ready()) }).await;
    let secs = start.elapsed().as_secs_f64();
    let (ours, theirs) = (
        mib(status_kib(std::process::id(), "VmHWM:")),
        mib(status_kib(apiserver, "VmHWM:")),
    );
    driver.abort();
    let after = pod_requests(client).await;
    let fallbacks: f64 = registry
        .gather()
        .iter()
        .filter(|f| f.name() == "groundskeeper_watch_list_fallbacks_total")
        .flat_map(|f| f.get_metric().iter().map(|m| m.get_counter().get_value()))
        .sum();
    if listed.is_err() {
        println!("{name}: not listed within {bound:?} (the server does not stream lists)");
        return Ok(());
    }
    let held = cache.lock().len();
    anyhow::ensure!(held >= n, "{name}: {held} pods in the cache, {n} seeded");
    if fallbacks > 0.0 {
        println!("{name}: the server did not stream the list; fell back to pages");
    }
    bench(&format!("watch_list_{name}_listed"), secs, "s");
    bench(
        &format!("watch_list_{name}_requests"),
        after - before,
        "requests",
    );
    bench(&format!("watch_list_{name}_peak_rss"), ours, "MiB");
    bench(
        &format!("watch_list_{name}_apiserver_peak_rss"),
        theirs,
        "MiB",
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let n = env_num("WATCH_LIST_BENCH_PODS", 30_000);
    let Some((c, cp)) = testkit::private_cluster("watch_list").await else {
        return Ok(());
    };
    let ns = c.namespace("watch-list-bench").await?;
    let api_path = format!("/api/v1/namespaces/{ns}/pods");
    let etcd_prefix = format!("/registry/pods/{ns}");
    let kind = seed::Kind {
        what: "pods",
        api_path: &api_path,
        etcd_prefix: &etcd_prefix,
        uid_kind: 1,
        n,
        threads: 2,
    };
    let vary = |i: usize, v: &mut serde_json::Value| {
        v["metadata"]["name"] = format!("load-{i}").into();
        v["spec"]["nodeName"] = format!("node-{}", i % 100).into();
    };
    seed::seed(&c.client, &cp, kind, pod(&ns, 0), vary).await?;
    let apiserver = cp
        .pids()
        .1
        .ok_or_else(|| anyhow::anyhow!("no apiserver pid"))?;
    for mode in [WatchList::Off, WatchList::Auto, WatchList::On] {
        run(&c.client, apiserver, mode, n).await?;
    }
    drop(c);
    Ok(())
}
