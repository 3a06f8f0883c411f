//! The IPAddress watch lag that --conntrack-orphan-grace protects against, on a real apiserver.
//! Prints figures; asserts nothing about time.
//!
//!   KUBE_APISERVER=/path/to/kube-apiserver cargo bench -p groundskeeper-node-agent --bench ipaddress_watch_lag [-- SERVICES]
//!
//! The orphan rule deletes flows DNATed to a ServiceCIDR IP that no IPAddress holds. A new
//! service's IPAddress is created before its Service, so kube-proxy (which needs the Service)
//! can DNAT to the IP only after the IPAddress exists; the danger is this agent's IPAddress
//! watch delivering it later than a Service watch delivers the Service, by more than the grace.
//! Two watches (Services, IPAddresses) run side by side, as the agent's and kube-proxy's do;
//! for each of SERVICES (default 300) ClusterIP Services created one at a time, then as many
//! again 30 at a time, it prints the distribution of (IPAddress seen) - (Service seen) and of
//! (IPAddress seen) - (create call started). Without a cluster it prints one SKIPPED line.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::networking::v1::IPAddress;
use kube::Api;
use kube::api::PostParams;
use kube::runtime::watcher::{self, Event};
use serde_json::json;

type Seen = Arc<Mutex<HashMap<String, Instant>>>;

/// Records when each object (by `key`) first arrives on a watch of `api`.
fn watch<K>(
    api: Api<K>,
    key: fn(&K) -> Option<String>,
) -> (Seen, tokio::sync::watch::Receiver<bool>)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let seen: Seen = Arc::default();
    let (ready_tx, ready_rx) = tokio::sync::watch::channel(false);
    let s = seen.clone();
    tokio::spawn(async move {
        let mut events = watcher::watcher(api, watcher::Config::default()).boxed();
        while let Some(ev) = events.next().await {
            let now = Instant::now();
            match ev {
                Ok(Event::Apply(o) | Event::InitApply(o)) => {
                    if let Some(k) = key(&o) {
                        s.lock().unwrap().entry(k).or_insert(now);
                    }
                }
                Ok(Event::InitDone) => {
                    let _ = ready_tx.send(true);
                }
                _ => {}
            }
        }
    });
    (seen, ready_rx)
}

fn cluster_ip(s: &Service) -> Option<String> {
    s.spec.as_ref()?.cluster_ip.clone()
}

fn summary(name: &str, mut v: Vec<f64>) {
    v.sort_by(|a, b| a.total_cmp(b));
    let q = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
    println!(
        "{name:<48} n={:<4} min={:>7.2} ms  p50={:>7.2} ms  p99={:>7.2} ms  max={:>7.2} ms",
        v.len(),
        q(0.0),
        q(0.5),
        q(0.99),
        q(1.0)
    );
}

/// Creates `n` services `concurrency` at a time; returns, per service, its ClusterIP and when
/// its create call started.
async fn create(
    c: &testkit::Cluster,
    ns: &str,
    prefix: &str,
    n: usize,
    concurrency: usize,
) -> Vec<(String, Instant)> {
    let api: Api<Service> = Api::namespaced(c.client.clone(), ns);
    stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                let svc: Service = serde_json::from_value(json!({
                    "metadata": {"name": format!("{prefix}-{i}")},
                    "spec": {"ports": [{"port": 53, "protocol": "UDP"}]},
                }))
                .unwrap();
                let start = Instant::now();
                let s = api.create(&PostParams::default(), &svc).await.unwrap();
                (cluster_ip(&s).expect("ClusterIP allocated"), start)
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await
}

async fn row(
    c: &testkit::Cluster,
    ns: &str,
    label: &str,
    n: usize,
    concurrency: usize,
    services: &Seen,
    addresses: &Seen,
) {
    let created = create(c, ns, label, n, concurrency).await;
    // Every event in (bounded: a lost one shows as a missing sample).
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let all_in = {
            let (a, s) = (addresses.lock().unwrap(), services.lock().unwrap());
            created
                .iter()
                .all(|(ip, _)| a.contains_key(ip) && s.contains_key(ip))
        };
        if all_in {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (a, s) = (addresses.lock().unwrap(), services.lock().unwrap());
    let ms = |d: f64| d * 1000.0;
    let mut vs_service = Vec::new();
    let mut vs_create = Vec::new();
    for (ip, start) in &created {
        let (Some(ta), Some(ts)) = (a.get(ip), s.get(ip)) else {
            println!("{label}: {ip} never seen on one of the watches");
            continue;
        };
        let signed = |x: Instant, y: Instant| {
            if x >= y {
                ms((x - y).as_secs_f64())
            } else {
                -ms((y - x).as_secs_f64())
            }
        };
        vs_service.push(signed(*ta, *ts));
        vs_create.push(signed(*ta, *start));
    }
    summary(
        &format!("{label}: IPAddress seen - Service seen"),
        vs_service,
    );
    summary(
        &format!("{label}: IPAddress seen - create started"),
        vs_create,
    );
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let n: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(300);
    let Some(c) = testkit::cluster("ipaddress_watch_lag").await else {
        return Ok(());
    };
    let ns = c.namespace("lag").await?;
    let (services, mut s_ready) = watch(Api::<Service>::all(c.client.clone()), cluster_ip);
    let (addresses, mut a_ready) = watch(Api::<IPAddress>::all(c.client.clone()), |a| {
        a.metadata.name.clone()
    });
    s_ready.wait_for(|r| *r).await?;
    a_ready.wait_for(|r| *r).await?;
    println!("ipaddress_watch_lag: {n} services one at a time, then {n} 30 at a time");
    row(&c, &ns, "sequential", n, 1, &services, &addresses).await;
    row(&c, &ns, "burst", n, 30, &services, &addresses).await;
    Ok(())
}
