//! The objects the bench makes: 1,000 dual-stack ServiceCIDRs and a parent over them, and
//! dual-stack Services with explicit clusterIPs whose IPAddresses fill them, created through the
//! apiserver or copied into etcd (`testkit::seed`), and the check that the apiserver kept them.

use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Service;
use kube::{Api, Client, api::ListParams};
use serde_json::json;
use testkit::figures::{bench, env_num};
use testkit::seed;

pub(crate) const CREATE_CONCURRENCY: usize = 128;
pub(crate) const NAMESPACES: usize = 20;
pub(crate) const FINALIZER: &str = "networking.k8s.io/service-cidr-finalizer";
pub(crate) const GRACE: Duration = Duration::from_secs(10);

/// The scale's label in figure names: `100k_ips`, `5k_ips`.
pub(crate) fn scale_tag(ips: usize) -> String {
    if ips.is_multiple_of(1000) {
        format!("{}k_ips", ips / 1000)
    } else {
        format!("{ips}_ips")
    }
}

pub(crate) fn cidr_name(i: usize) -> String {
    format!("scale-{i:04}")
}

pub(crate) fn v4(i: usize, host: usize) -> String {
    format!("10.{}.{}.{host}", 100 + i / 256, i % 256)
}

/// Canonical text (RFC 5952), as the apiserver requires of CIDRs and clusterIPs.
pub(crate) fn v6(i: usize, host: usize) -> String {
    let base: u128 = 0xfd00_0100 << 96;
    std::net::Ipv6Addr::from(base | (i as u128) << 16 | host as u128).to_string()
}

/// The `i`th ServiceCIDR: one /24 and one /112 of its own.
pub(crate) fn cidrs_of(i: usize) -> Vec<String> {
    vec![format!("{}/24", v4(i, 0)), format!("{}/112", v6(i, 0))]
}

/// The parent: the first 256 IPv4 ones and every IPv6 one.
pub(crate) const PARENT: &str = "scale-parent";
pub(crate) const PARENT_CIDRS: [&str; 2] = ["10.100.0.0/16", "fd00:100::/96"];

/// Service `j` of ServiceCIDR `i`: dual-stack, its clusterIPs `.j+1` of both of `i`'s CIDRs.
pub(crate) fn service(ns: &str, i: usize, j: usize) -> Service {
    serde_json::from_value(json!({
        "metadata": {"namespace": ns, "name": format!("svc-{i}-{j}"),
                     "labels": {"app": format!("app-{i}-{j}")}},
        "spec": {"selector": {"app": format!("app-{i}-{j}")},
                 "ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv4", "IPv6"],
                 "clusterIP": v4(i, j + 1), "clusterIPs": [v4(i, j + 1), v6(i, j + 1)],
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]},
    }))
    .expect("a valid Service")
}

/// Runs `create` over `items`, `CREATE_CONCURRENCY` at a time, retrying each a few times (the
/// allocator may not know a ServiceCIDR yet); returns how long it took.
pub(crate) async fn create_all<T, F, Fut>(
    what: &str,
    items: Vec<T>,
    create: F,
) -> anyhow::Result<Duration>
where
    T: Clone,
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = Result<(), kube::Error>>,
{
    let total = items.len();
    let t0 = Instant::now();
    let create = &create;
    let mut done = 0usize;
    let mut results = stream::iter(items.into_iter().map(|item| async move {
        let mut tries = 0;
        loop {
            match create(item.clone()).await {
                Ok(()) => return Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 => return Ok(()),
                Err(e) if tries >= 5 => return Err(e),
                Err(_) => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(200 * tries)).await;
                }
            }
        }
    }))
    .buffer_unordered(CREATE_CONCURRENCY);
    while let Some(r) = results.next().await {
        r?;
        done += 1;
        if done.is_multiple_of(10_000) {
            eprintln!(
                "  {what}: {done}/{total} ({:.0}/s)",
                done as f64 / t0.elapsed().as_secs_f64()
            );
        }
    }
    Ok(t0.elapsed())
}

pub(crate) const IPS_PATH: &str = "/apis/networking.k8s.io/v1/ipaddresses";

/// Makes the Services and their IPAddresses as the apiserver would have stored them, without
/// the apiserver's 19 Services/s: the first Service through the apiserver (its allocator writes
/// its two IPAddresses), the rest as copies of those three straight into etcd, each Service
/// with its own name, namespace, UID, labels and clusterIPs, each IPAddress named by its IP,
/// labelled as the allocator labels (family, managed-by: copied from the allocator's own) and
/// with its parentRef to its Service. A Service and its two IPAddresses are written side by
/// side (the same or the next etcd transaction) and dated when written, so the apiserver's repair loop (`repairip`) finds
/// every Service's IPs allocated to it and every IP's Service, and never an IPAddress past its
/// 60 s grace without its Service. Returns the seconds until the apiserver served them all.
pub(crate) async fn seed_services(
    client: &Client,
    cp: &testkit::ControlPlane,
    nss: &[String],
    services: &[(usize, usize)],
) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    let ns_of = |(i, j): (usize, usize)| &nss[(i + j) % NAMESPACES];
    let (i0, j0) = services[0];
    let ns0 = ns_of(services[0]);
    let first = serde_json::to_value(service(ns0, i0, j0))?;
    let name0 = format!("svc-{i0}-{j0}");
    seed::post(
        client,
        &format!("/api/v1/namespaces/{ns0}/services"),
        &first,
    )
    .await?;
    let svc = seed::stored(
        client,
        &format!("/api/v1/namespaces/{ns0}/services/{name0}"),
    )
    .await?;
    let (ip4, ip6) = (v4(i0, j0 + 1), v6(i0, j0 + 1));
    // The allocator writes the IPAddresses before the Service: both are there now.
    let tpl4 = seed::stored(client, &format!("{IPS_PATH}/{ip4}")).await?;
    let tpl6 = seed::stored(client, &format!("{IPS_PATH}/{ip6}")).await?;
    seed::ensure_key(cp, &format!("/registry/services/specs/{ns0}/{name0}"))?;
    seed::ensure_key(cp, &format!("/registry/ipaddresses/{ip4}"))?;
    let put = |k: usize| {
        // Object k of the copies: the IPv4 address of Service k/3 + 1, its IPv6 one, then the
        // Service (its IPs first: the repair loop recreates a Service's missing IP, and gives
        // an IP 60 s to get its Service).
        let s = k / 3 + 1;
        let (i, j) = services[s];
        let (ns, name) = (ns_of((i, j)), format!("svc-{i}-{j}"));
        let (ips, now) = ([v4(i, j + 1), v6(i, j + 1)], seed::created_now());
        let (key, v) = match k % 3 {
            2 => {
                let mut v = svc.clone();
                let m = &mut v["metadata"];
                m["name"] = name.clone().into();
                m["namespace"] = ns.clone().into();
                m["uid"] = seed::uid(1, s).into();
                m["creationTimestamp"] = now.into();
                m["labels"] = json!({"app": format!("app-{i}-{j}")});
                v["spec"]["selector"] = json!({"app": format!("app-{i}-{j}")});
                v["spec"]["clusterIP"] = ips[0].clone().into();
                v["spec"]["clusterIPs"] = json!(ips);
                (format!("/registry/services/specs/{ns}/{name}"), v)
            }
            f => {
                let ip = &ips[f];
                let mut v = if f == 0 { tpl4.clone() } else { tpl6.clone() };
                let m = &mut v["metadata"];
                m["name"] = ip.clone().into();
                m["uid"] = seed::uid(2 + f as u16, s).into();
                m["creationTimestamp"] = now.into();
                let parent = &mut v["spec"]["parentRef"];
                parent["namespace"] = ns.clone().into();
                parent["name"] = name.into();
                (format!("/registry/ipaddresses/{ip}"), v)
            }
        };
        (key, serde_json::to_vec(&v).expect("json"))
    };
    let n = services.len();
    let want = [("/api/v1/services", n as u64), (IPS_PATH, 2 * n as u64)];
    let threads = env_num("SERVICECIDR_SCALE_SEED_THREADS", 4);
    // One object to a transaction: the repair loop's informers watch while they are written,
    // and objects sharing a revision are lost to a watch that restarts between them.
    let batch = (3 * (n - 1), threads, 1);
    let (written, secs) = seed::put_and_wait(client, cp, batch, put, &want).await?;
    println!(
        "seeded {n} dual-stack Services and {} IPAddresses in {:.1} s (the first through the apiserver, the rest written to etcd in {written:.1} s, all served {secs:.1} s after the first write)",
        2 * n,
        t0.elapsed().as_secs_f64()
    );
    Ok(t0.elapsed().as_secs_f64())
}

/// After seeding: waits past the repair loop's 60 s grace from the last write and counts the
/// IPAddresses again, and the Warning Events the repair loop writes when it repairs or removes
/// one (`ClusterIPNotAllocated`, `IPAddressNotAllocated`, `IPAddressWrongReference` …).
pub(crate) async fn check_seeded(client: &Client, want: u64) -> anyhow::Result<()> {
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(75)).await;
    let have = seed::served(client, IPS_PATH).await?;
    let mut reasons = std::collections::BTreeMap::<String, usize>::new();
    let events = seed::stored(
        client,
        "/api/v1/events?fieldSelector=type%3DWarning&limit=5000",
    )
    .await;
    for e in events
        .iter()
        .flat_map(|l| l["items"].as_array().into_iter().flatten())
    {
        let reason = e["reason"].as_str().unwrap_or("").to_string();
        let n = reasons.entry(reason.clone()).or_default();
        if *n < 3 {
            println!(
                "  Warning {reason}: {}",
                e["message"].as_str().unwrap_or("")
            );
        }
        *n += e["count"].as_u64().unwrap_or(1).max(1) as usize;
    }
    println!(
        "{:.0} s after seeding: {have} IPAddresses served ({want} seeded, the `kubernetes` Service's included); Warning Events by reason: {reasons:?}",
        t0.elapsed().as_secs_f64()
    );
    bench(
        "servicecidr_seeded_ips_kept_after_75s",
        have as f64,
        "IPAddresses",
    );
    anyhow::ensure!(
        have >= want,
        "the apiserver removed {} seeded IPAddresses within 75 s (Events {reasons:?})",
        want - have
    );
    Ok(())
}

/// How many objects of `api` exist (one page of one item and the remaining count).
pub(crate) async fn count<K>(api: &Api<K>) -> anyhow::Result<u64>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let l = api.list(&ListParams::default().limit(1)).await?;
    Ok(l.items.len() as u64 + l.metadata.remaining_item_count.unwrap_or(0) as u64)
}
