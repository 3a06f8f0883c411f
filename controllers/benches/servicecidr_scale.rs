//! The ServiceCIDR controller at scale on a real apiserver, next to kube-controller-manager's
//! service-cidr-controller on the same objects. Prints figures; asserts nothing about time or
//! memory.
//!
//!   KUBE_APISERVER=/path/to/kube-apiserver cargo bench -p groundskeeper-controllers --bench servicecidr_scale [-- IPS]
//!
//! On a private control plane (dual-stack Service ranges) it creates SERVICECIDR_SCALE_CIDRS
//! (default 1,000) dual-stack ServiceCIDRs, `10.<100+i/256>.<i%256>.0/24` and
//! `fd00:100::<i>:0/112`, plus one parent `10.100.0.0/16,fd00:100::/96` covering the first 256
//! and every IPv6 one. The IPAddresses (IPS, default 100,000) are those of dual-stack Services
//! with explicit clusterIPs (IPS/2 Services, half the IPs in each family, spread evenly over the
//! ServiceCIDRs), each IPAddress with its parentRef to its Service, so the apiserver's own
//! repair loop keeps them (it deletes allocator-managed IPAddresses whose Service does not
//! exist). The first Service is created through the apiserver (it allocates only from Ready
//! ServiceCIDRs, so this controller first marks them Ready, a run not measured); the others and
//! their IPAddresses are written straight into etcd as copies of those three objects
//! (`testkit::seed`; the apiserver creates 19 Services/s here), then, 75 s later (past the
//! repair loop's 60 s grace), the IPAddresses are counted again and the bench fails if any went.
//! SERVICECIDR_SCALE_CREATE=api creates every Service through the apiserver instead;
//! SERVICECIDR_SCALE_SEED_THREADS (4) etcd writers.
//!
//! Then, for this build's `controller-manager --controllers servicecidr` and for upstream
//! `kube-controller-manager --controllers=service-cidr-controller` (v1.36.2;
//! SERVICECIDR_SCALE_KCM or target/e2e/bin/kube-controller-manager; skipped when absent), one
//! after the other on the same objects, each started fresh:
//! - RSS once its caches have listed and it has synced every ServiceCIDR once (steady), and its
//!   peak (VmHWM) at the end of the run;
//! - (a) covered: a ServiceCIDR whose IPs the parent also contains is deleted; the figure is
//!   how long after `deletionTimestamp + 10 s` (the grace, measured from the timestamp the
//!   controller reads) the bench's watch saw it gone;
//! - (b) blocked: a ServiceCIDR holding IPs no other one contains is deleted; the figure is the
//!   time from the DELETE call to the bench's watch seeing Ready=False/Terminating.
//!
//! SERVICECIDR_SCALE_COMPARE=/path/to/controller-manager also runs that binary (an older
//! build) on the same objects, its figures named `compared_…`.
//!
//! For this build it also prints the mean time of one sync from its own metrics
//! (`groundskeeper_servicecidr_reconcile_duration_seconds`, API calls included) over the syncs
//! each deletion caused. Every figure is also printed as `bench <name> <value> <unit>`.
//! Without KUBE_APISERVER it prints one SKIPPED line and exits 0.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::{
    core::v1::{Namespace, Service},
    networking::v1::{IPAddress, ServiceCIDR},
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, PostParams, WatchEvent, WatchParams},
};
use serde_json::json;
use testkit::figures::{bench, env_num, mib, status_kib};
use testkit::networking::{self, service_cidr};
use testkit::{Binary, http_get, seed, wait_for, wait_ready};

const CREATE_CONCURRENCY: usize = 128;
const NAMESPACES: usize = 20;
const FINALIZER: &str = "networking.k8s.io/service-cidr-finalizer";
const GRACE: Duration = Duration::from_secs(10);

/// The scale's label in figure names: `100k_ips`, `5k_ips`.
fn scale_tag(ips: usize) -> String {
    if ips.is_multiple_of(1000) {
        format!("{}k_ips", ips / 1000)
    } else {
        format!("{ips}_ips")
    }
}

fn cidr_name(i: usize) -> String {
    format!("scale-{i:04}")
}

fn v4(i: usize, host: usize) -> String {
    format!("10.{}.{}.{host}", 100 + i / 256, i % 256)
}

/// Canonical text (RFC 5952), as the apiserver requires of CIDRs and clusterIPs.
fn v6(i: usize, host: usize) -> String {
    let base: u128 = 0xfd00_0100 << 96;
    std::net::Ipv6Addr::from(base | (i as u128) << 16 | host as u128).to_string()
}

/// The `i`th ServiceCIDR: one /24 and one /112 of its own.
fn cidrs_of(i: usize) -> Vec<String> {
    vec![format!("{}/24", v4(i, 0)), format!("{}/112", v6(i, 0))]
}

/// The parent: the first 256 IPv4 ones and every IPv6 one.
const PARENT: &str = "scale-parent";
const PARENT_CIDRS: [&str; 2] = ["10.100.0.0/16", "fd00:100::/96"];

/// Service `j` of ServiceCIDR `i`: dual-stack, its clusterIPs `.j+1` of both of `i`'s CIDRs.
fn service(ns: &str, i: usize, j: usize) -> Service {
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
async fn create_all<T, F, Fut>(what: &str, items: Vec<T>, create: F) -> anyhow::Result<Duration>
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

const IPS_PATH: &str = "/apis/networking.k8s.io/v1/ipaddresses";

/// Makes the Services and their IPAddresses as the apiserver would have stored them, without
/// the apiserver's 19 Services/s: the first Service through the apiserver (its allocator writes
/// its two IPAddresses), the rest as copies of those three straight into etcd, each Service
/// with its own name, namespace, UID, labels and clusterIPs, each IPAddress named by its IP,
/// labelled as the allocator labels (family, managed-by: copied from the allocator's own) and
/// with its parentRef to its Service. A Service and its two IPAddresses are written side by
/// side (the same or the next etcd transaction) and dated when written, so the apiserver's repair loop (`repairip`) finds
/// every Service's IPs allocated to it and every IP's Service, and never an IPAddress past its
/// 60 s grace without its Service. Returns the seconds until the apiserver served them all.
async fn seed_services(
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
async fn check_seeded(client: &Client, want: u64) -> anyhow::Result<()> {
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
async fn count<K>(api: &Api<K>) -> anyhow::Result<u64>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let l = api.list(&ListParams::default().limit(1)).await?;
    Ok(l.items.len() as u64 + l.metadata.remaining_item_count.unwrap_or(0) as u64)
}

fn is_ready(o: &ServiceCIDR) -> bool {
    o.finalizers().iter().any(|f| f == FINALIZER)
        && ready_condition(o).is_some_and(|c| c.0 == "True")
}

fn ready_condition(o: &ServiceCIDR) -> Option<(String, String)> {
    networking::ready_condition(o).map(|c| (c.status.clone(), c.reason.clone()))
}

async fn all_ready(api: &Api<ServiceCIDR>, want: usize) -> anyhow::Result<bool> {
    let l = api.list(&ListParams::default()).await?;
    Ok(l.items.iter().filter(|o| is_ready(o)).count() >= want)
}

/// A controller-manager binary (this build's unless `bin` names another), the ServiceCIDR
/// controller alone.
fn ours(
    kubeconfig: &Path,
    bin: Option<&str>,
    extra: &[&str],
) -> anyhow::Result<(Binary, SocketAddr)> {
    let mut args = vec!["--leader-elect=false", "--controllers", "servicecidr"];
    args.extend_from_slice(extra);
    let bin = bin.unwrap_or(env!("CARGO_BIN_EXE_controller-manager"));
    let kubeconfig = kubeconfig.display().to_string();
    Binary::start_with_admin(
        bin,
        "servicecidr-scale",
        &args,
        &[("KUBECONFIG", &kubeconfig)],
    )
}

async fn metric_sum(admin: SocketAddr, prefix: &str) -> f64 {
    let body = http_get(admin, "/metrics")
        .await
        .map(|(_, b)| b)
        .unwrap_or_default();
    body.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// (count, sum) of this build's sync-duration histogram.
async fn syncs(admin: SocketAddr) -> (f64, f64) {
    (
        metric_sum(
            admin,
            "groundskeeper_servicecidr_reconcile_duration_seconds_count",
        )
        .await,
        metric_sum(
            admin,
            "groundskeeper_servicecidr_reconcile_duration_seconds_sum",
        )
        .await,
    )
}

/// What the bench's watch saw after a DELETE: `Some(dur)` when `done` held that long after it.
async fn delete_and_watch(
    client: &Client,
    name: &str,
    within: Duration,
    done: impl Fn(&WatchEvent<ServiceCIDR>) -> bool,
) -> anyhow::Result<(Option<Duration>, jiff::Timestamp, Option<jiff::Timestamp>)> {
    let api: Api<ServiceCIDR> = Api::all(client.clone());
    let rv = api
        .get(name)
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let wp = WatchParams::default()
        .fields(&format!("metadata.name={name}"))
        .timeout(within.as_secs().max(1) as u32 + 5);
    let mut events = api.watch(&wp, &rv).await?.boxed();
    let t0 = Instant::now();
    let deleted = api.delete(name, &DeleteParams::default()).await?;
    let deletion_ts = deleted
        .left()
        .and_then(|o| o.metadata.deletion_timestamp)
        .map(|t| t.0)
        .ok_or_else(|| anyhow::anyhow!("{name} was not held by a finalizer"))?;
    let seen = tokio::time::timeout(within, async {
        while let Some(ev) = events.try_next().await? {
            if done(&ev) {
                return anyhow::Ok(Some((t0.elapsed(), jiff::Timestamp::now())));
            }
        }
        anyhow::Ok(None)
    })
    .await
    .unwrap_or(Ok(None))?;
    Ok((seen.map(|s| s.0), deletion_ts, seen.map(|s| s.1)))
}

/// The figures of one controller's run.
struct Row {
    steady_kib: u64,
    peak_kib: u64,
    listed: Duration,
    covered_ms: Option<f64>,
    blocked_ms: Option<f64>,
}

/// Both deletions on a running controller: `covered` (its IPs are in the parent too) and
/// `blocked` (its IPv4 ones are in no other).
async fn deletions(
    client: &Client,
    covered: &str,
    blocked: &str,
) -> anyhow::Result<(Option<f64>, Option<f64>)> {
    // (a): gone past the grace period; how long past the timestamp's 10 s.
    let (_, deletion_ts, gone_at) =
        delete_and_watch(client, covered, Duration::from_secs(40), |ev| {
            matches!(ev, WatchEvent::Deleted(_))
        })
        .await?;
    // The wall clock when the watch saw it gone, against deletionTimestamp + 10 s.
    let covered_ms = gone_at
        .map(|at| (at.duration_since(deletion_ts).as_secs_f64() - GRACE.as_secs_f64()) * 1e3);
    // (b): Ready=False/Terminating.
    let (terminating, _, _) = delete_and_watch(client, blocked, Duration::from_secs(40), |ev| {
        matches!(ev, WatchEvent::Modified(o) if ready_condition(o)
            == Some(("False".into(), "Terminating".into())))
    })
    .await?;
    let blocked_ms = terminating.map(|d| d.as_secs_f64() * 1e3);
    Ok((covered_ms, blocked_ms))
}

fn kcm_bin() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("SERVICECIDR_SCALE_KCM") {
        let p = PathBuf::from(p);
        return p.is_file().then_some(p);
    }
    let p =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/e2e/bin/kube-controller-manager");
    p.is_file().then_some(p)
}

async fn our_row(
    c: &testkit::Cluster,
    bin: Option<&str>,
    tag: &str,
    n_cidrs: usize,
    covered: &str,
    blocked: &str,
) -> anyhow::Result<Row> {
    let t0 = Instant::now();
    let (bin, admin) = ours(&c.kubeconfig, bin, &[])?;
    let pid = bin.pid().expect("running");
    wait_ready(admin, Duration::from_secs(600), "controller-manager ready").await?;
    let listed = t0.elapsed();
    // Steady: every ServiceCIDR synced once since the start, then a few quiet seconds.
    wait_for(
        Duration::from_secs(300),
        "a sync of every ServiceCIDR",
        || async { Ok(syncs(admin).await.0 >= n_cidrs as f64) },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let steady_kib = status_kib(pid, "VmRSS:");
    let (n0, s0) = syncs(admin).await;
    let (covered_ms, blocked_ms) = deletions(&c.client, covered, blocked).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (n1, s1) = syncs(admin).await;
    if n1 > n0 {
        let mean = (s1 - s0) / (n1 - n0) * 1e3;
        println!(
            "groundskeeper: {} syncs during the two deletions, {mean:.2} ms each on average (its reconcile_duration histogram, API calls included)",
            n1 - n0
        );
        bench(
            &format!("{tag}servicecidr_sync_ms_mean_deletions"),
            mean,
            "ms",
        );
    }
    let peak_kib = status_kib(pid, "VmHWM:");
    drop(bin);
    Ok(Row {
        steady_kib,
        peak_kib,
        listed,
        covered_ms,
        blocked_ms,
    })
}

async fn kcm_row(
    c: &testkit::Cluster,
    bin: &PathBuf,
    covered: &str,
    blocked: &str,
) -> anyhow::Result<Row> {
    let log =
        std::env::temp_dir().join(format!("kcm-servicecidr-scale-{}.log", std::process::id()));
    let file = std::fs::File::create(&log)?;
    let kubeconfig = c.kubeconfig.display().to_string();
    let t0 = Instant::now();
    let mut child = tokio::process::Command::new(bin)
        .args([
            "--kubeconfig",
            &kubeconfig,
            "--controllers=service-cidr-controller",
            "--leader-elect=false",
            "--secure-port=0",
            "--v=2",
        ])
        .stdout(file.try_clone()?)
        .stderr(file)
        .kill_on_drop(true)
        .spawn()?;
    let pid = child.id().expect("kube-controller-manager runs");
    println!("kube-controller-manager: pid {pid}, log {}", log.display());
    let logs = || std::fs::read_to_string(&log).unwrap_or_default();
    // Its informers log when they have listed; a minute stands for that if the line changed.
    while !(logs().contains("Caches are synced") && logs().contains("service-cidr"))
        && t0.elapsed() < Duration::from_secs(60)
    {
        anyhow::ensure!(
            status_kib(pid, "VmRSS:") > 0,
            "kube-controller-manager exited; log {}",
            log.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let listed = t0.elapsed();
    // Upstream exports no metric of its own for it: a quiet period stands for "synced once".
    tokio::time::sleep(Duration::from_secs(15)).await;
    anyhow::ensure!(
        status_kib(pid, "VmRSS:") > 0,
        "kube-controller-manager exited; log {}",
        log.display()
    );
    let steady_kib = status_kib(pid, "VmRSS:");
    let (covered_ms, blocked_ms) = deletions(&c.client, covered, blocked).await?;
    let peak_kib = status_kib(pid, "VmHWM:");
    let _ = child.start_kill();
    let _ = child.wait().await;
    Ok(Row {
        steady_kib,
        peak_kib,
        listed,
        covered_ms,
        blocked_ms,
    })
}

fn print_row(who: &str, prefix: &str, tag: &str, r: &Row) {
    println!(
        "{who}: caches listed {:.1} s after start; RSS steady {:.1} MiB, peak {:.1} MiB",
        r.listed.as_secs_f64(),
        mib(r.steady_kib),
        mib(r.peak_kib)
    );
    let fmt =
        |v: Option<f64>| v.map_or("not seen within 40 s".to_string(), |v| format!("{v:.0} ms"));
    println!(
        "{who}: (a) covered ServiceCIDR gone {} after deletionTimestamp + 10 s; (b) blocked one Ready=False/Terminating {} after the DELETE",
        fmt(r.covered_ms),
        fmt(r.blocked_ms)
    );
    bench(
        &format!("{prefix}servicecidr_rss_{tag}"),
        mib(r.steady_kib),
        "MiB",
    );
    bench(
        &format!("{prefix}servicecidr_rss_peak_{tag}"),
        mib(r.peak_kib),
        "MiB",
    );
    bench(
        &format!("{prefix}servicecidr_listed_{tag}"),
        r.listed.as_secs_f64(),
        "s",
    );
    if let Some(v) = r.covered_ms {
        bench(
            &format!("{prefix}servicecidr_delete_decision_ms_{tag}"),
            v,
            "ms",
        );
    }
    if let Some(v) = r.blocked_ms {
        bench(
            &format!("{prefix}servicecidr_blocked_decision_ms_{tag}"),
            v,
            "ms",
        );
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let ips: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .and_then(|a| a.parse().ok())
        .unwrap_or(100_000);
    let n_cidrs = env_num("SERVICECIDR_SCALE_CIDRS", 1000).clamp(300, 256 * 155);
    let Some((c, cp)) = testkit::private_cluster("servicecidr_scale").await else {
        println!("servicecidr_scale: SKIPPED (KUBE_APISERVER not set)");
        return Ok(());
    };
    let tag = scale_tag(ips);
    // Two IPs (one per family) per Service, spread evenly over the ServiceCIDRs.
    let per_cidr = (ips / 2).div_ceil(n_cidrs);
    anyhow::ensure!(per_cidr <= 250, "{ips} IPs do not fit {n_cidrs} /24s");
    let services: Vec<(usize, usize)> = (0..ips / 2).map(|k| (k % n_cidrs, k / n_cidrs)).collect();
    let client = c.client.clone();
    let cidrs: Api<ServiceCIDR> = Api::all(client.clone());

    let took = create_all("ServiceCIDRs", (0..=n_cidrs).collect(), |i| {
        let cidrs = cidrs.clone();
        async move {
            let o = if i == n_cidrs {
                service_cidr(PARENT, PARENT_CIDRS)
            } else {
                service_cidr(&cidr_name(i), cidrs_of(i))
            };
            cidrs.create(&PostParams::default(), &o).await.map(|_| ())
        }
    })
    .await?;
    println!(
        "created {} ServiceCIDRs ({n_cidrs} and a parent) in {:.1} s",
        n_cidrs + 1,
        took.as_secs_f64()
    );
    // The allocator takes IPs only from Ready ServiceCIDRs: this controller marks them so.
    {
        let t0 = Instant::now();
        let (_bin, _) = ours(
            &c.kubeconfig,
            None,
            &["--kube-api-qps=1000", "--kube-api-burst=2000"],
        )?;
        wait_for(
            Duration::from_secs(600),
            "every ServiceCIDR Ready",
            || async { all_ready(&cidrs, n_cidrs + 1).await },
        )
        .await?;
        println!(
            "every ServiceCIDR Ready after {:.1} s (groundskeeper, QPS 1000; not a figure)",
            t0.elapsed().as_secs_f64()
        );
    }

    let nss: Vec<String> = (0..NAMESPACES).map(|n| format!("scale-{n}")).collect();
    for ns in &nss {
        let api: Api<Namespace> = Api::all(client.clone());
        let o: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
        api.create(&PostParams::default(), &o).await?;
    }
    let seeding = std::env::var("SERVICECIDR_SCALE_CREATE").as_deref() != Ok("api");
    let took = if seeding {
        Duration::from_secs_f64(seed_services(&client, &cp, &nss, &services).await?)
    } else {
        create_all("Services", services.clone(), |(i, j)| {
            let client = client.clone();
            let ns = nss[(i + j) % NAMESPACES].clone();
            async move {
                let api: Api<Service> = Api::namespaced(client, &ns);
                api.create(&PostParams::default(), &service(&ns, i, j))
                    .await
                    .map(|_| ())
            }
        })
        .await?
    };
    let n_ips = count(&Api::<IPAddress>::all(client.clone())).await?;
    println!(
        "{} {} dual-stack Services in {:.1} s ({:.0}/s); {n_ips} IPAddresses exist",
        if seeding { "seeded" } else { "created" },
        services.len(),
        took.as_secs_f64(),
        services.len() as f64 / took.as_secs_f64()
    );
    bench(
        &format!("servicecidr_create_{tag}"),
        took.as_secs_f64(),
        "s",
    );
    if seeding {
        check_seeded(&client, n_ips).await?;
    }
    // The ServiceCIDRs each row deletes: covered ones lie in the parent's /16, blocked ones
    // outside it.
    let pair = |row: usize| (cidr_name(5 + row), cidr_name(n_cidrs - 1 - row));
    let (covered, blocked) = pair(0);
    let r = our_row(&c, None, "", n_cidrs + 1, &covered, &blocked).await?;
    print_row("groundskeeper", "", &tag, &r);
    if let Ok(other) = std::env::var("SERVICECIDR_SCALE_COMPARE") {
        let (covered, blocked) = pair(2);
        let r = our_row(
            &c,
            Some(&other),
            "compared_",
            n_cidrs + 1,
            &covered,
            &blocked,
        )
        .await?;
        print_row(&format!("compared ({other})"), "compared_", &tag, &r);
    }
    let (kcm_covered, kcm_blocked) = pair(1);

    match kcm_bin() {
        None => println!(
            "kube-controller-manager: SKIPPED (no target/e2e/bin/kube-controller-manager: run `bash e2e/node.sh` once, or set SERVICECIDR_SCALE_KCM)"
        ),
        Some(bin) => {
            let r = kcm_row(&c, &bin, &kcm_covered, &kcm_blocked).await?;
            print_row("kube-controller-manager v1.36.2", "kcm_", &tag, &r);
        }
    }
    // The objects go with the private control plane.
    drop(c);
    drop(cp);
    Ok(())
}
