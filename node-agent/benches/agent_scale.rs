//! The node-agent's conntrack cleanup at cluster scale, next to kube-proxy on the same objects.
//! Prints figures; asserts nothing about time or memory.
//!
//!   KUBE_APISERVER=/path/to/kube-apiserver cargo bench -p groundskeeper-node-agent --bench agent_scale [-- SERVICES]
//!
//! Creates SERVICES (default 10,000) Services, each with a UDP and a TCP port, and one
//! EndpointSlice of 10 endpoints per Service (100k endpoints), shaped as the endpointslice
//! controller writes them (owner reference, labels, trigger-time annotation, targetRef, nodeName,
//! zone, conditions), on a private control plane. Then it runs, each in a network namespace of
//! its own, `node-agent --tasks=conntrack --dry-run` and kube-proxy v1.36.2 (iptables mode;
//! from the node tarball, `AGENT_SCALE_KUBE_PROXY` or target/e2e/bin/kube-proxy; skipped when
//! absent), and prints each one's RSS once it is ready (the agent: ready and past its first
//! pass; kube-proxy: its first sync logged, or `AGENT_SCALE_KUBE_PROXY_WAIT` seconds, default
//! 90), its peak RSS, and the time to get there. Then, for the agent: 10 s, then 22 s idle (no
//! change) whose CPU is its background (`agent_idle_cpu_ms_per_s_…`: periodic passes,
//! re-watches, timers) and after which its RSS is the steady one (`agent_rss_…`, over 30 s after
//! its first pass, nothing changed since). Then endpoint churn: one slice changed every 100 ms
//! for 20 s, and 2 s for the last to be taken in; it prints the agent's CPU time per change, raw
//! (`agent_cpu_per_change_…`), net of the idle background over the same time
//! (`…_net_of_idle_…`), and split between the round thread (`…_rounds_…`: the triggered passes,
//! at most one per `--conntrack-min-interval` whatever the number of changes it covers, each
//! walking the kernel's whole conntrack hash) and the rest (`…_watch_and_model_…`: decoding the
//! watch events, the facts, the model); its RSS at most during the churn (sampled after each
//! change, `agent_rss_churn_max_…`) and after it. The agent's rows run twice: first with a tenth
//! of the services created (1k of 10k), then with all, so the CPU per change shows whether it
//! grows with the cluster.
//!
//! The goals, at 10k Services: steady RSS under 32 MiB, RSS under 40 MiB at any time during the
//! churn, at most 0.7 ms of CPU per slice change; each figure is also printed over its goal
//! (`…_ratio_to_goal`, under 1 when met). The CPU goal is judged on the raw figure: it holds
//! everything the agent spent while the changes came, so background work cannot hide in it; the
//! net figure shows how much of it is background (the idle CPU is measured in the same run).
//!
//! `AGENT_SCALE_COMPARE=/path/to/node-agent` also runs that binary (an older build) on the same
//! objects, its figures named `compared_…`; several paths separated by commas run each, the
//! second one's figures named `compared2_…` and so on (a wrapper that runs the agent under a
//! heap profiler, for one).
//! Every figure is also printed as `bench <name> <value> <unit>`. Without KUBE_APISERVER it
//! prints one SKIPPED line and exits 0.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::figures::{bench, cpu_seconds, mib, status_kib};
use testkit::{Binary, wait_ready};

const CREATE_CONCURRENCY: usize = 64;
const ENDPOINTS_PER_SLICE: usize = 10;
const NAMESPACES: usize = 20;
/// The churn: one slice changed this often, for this long, then this long for the last
/// changes to be taken in.
const CHURN_EVERY: Duration = Duration::from_millis(100);
const CHURN_FOR: Duration = Duration::from_secs(20);
const SETTLE_AFTER_CHURN: Duration = Duration::from_secs(2);
/// The goals at 10k Services: steady RSS, RSS at any time during the churn, CPU per change.
const GOAL_RSS_MIB: f64 = 32.0;
const GOAL_RSS_CHURN_MIB: f64 = 40.0;
const GOAL_CPU_PER_CHANGE_MS: f64 = 0.7;

/// CPU seconds of `pid`'s threads named `name` (the round thread is `conntrack`).
fn thread_cpu_seconds(pid: u32, name: &str) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0.0;
    };
    tasks
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name))
        .map(|t| {
            let tid = t.file_name().to_string_lossy().parse().unwrap_or(0);
            task_cpu_seconds(pid, tid)
        })
        .sum()
}

/// CPU seconds of thread `tid` of `pid` (its `stat` has the process's layout).
fn task_cpu_seconds(pid: u32, tid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    // SAFETY: sysconf has no preconditions.
    let hz = match unsafe { libc::sysconf(libc::_SC_CLK_TCK) } {
        t if t > 0 => t as f64,
        _ => 100.0,
    };
    (f.get(11).unwrap_or(&0.0) + f.get(12).unwrap_or(&0.0)) / hz
}

/// `perf record` of the agent over one phase, when `AGENT_SCALE_PERF` names a folder: one
/// `TAGagent-SIZE-PHASE.data` there per phase. Ends the recording when dropped.
struct Profile(Option<std::process::Child>);

impl Profile {
    fn start(pid: u32, tag: &str, size: &str, phase: &str) -> Self {
        let Ok(dir) = std::env::var("AGENT_SCALE_PERF") else {
            return Self(None);
        };
        let out = PathBuf::from(dir).join(format!("{tag}agent-{size}-{phase}.data"));
        let child = Command::new("perf")
            .args([
                "record",
                "-q",
                "-F",
                "999",
                "-g",
                "-p",
                &pid.to_string(),
                "-o",
            ])
            .arg(&out)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
        match child {
            Ok(c) => Self(Some(c)),
            Err(e) => {
                println!("perf record not started: {e}");
                Self(None)
            }
        }
    }
}

impl Drop for Profile {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            // SIGINT: perf writes its file and exits.
            // SAFETY: kill with a pid we spawned.
            unsafe { libc::kill(c.id() as i32, libc::SIGINT) };
            let _ = c.wait();
        }
    }
}

fn netns(name: &str) -> anyhow::Result<()> {
    // One left by an interrupted run; none is the usual case, and not worth a line.
    let _ = Command::new("ip")
        .args(["netns", "del", name])
        .stderr(std::process::Stdio::null())
        .status();
    let ok = Command::new("ip")
        .args(["netns", "add", name])
        .status()?
        .success();
    anyhow::ensure!(ok, "ip netns add {name} failed");
    Command::new("ip")
        .args(["-n", name, "link", "set", "lo", "up"])
        .status()?;
    Ok(())
}

fn service(ns: &str, i: usize) -> Service {
    serde_json::from_value(json!({
        "metadata": {"namespace": ns, "name": format!("svc-{i}"),
                     "labels": {"app": format!("app-{i}"), "tier": "backend"}},
        "spec": {"selector": {"app": format!("app-{i}")},
                 "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353},
                           {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 5353}]},
    }))
    .expect("a valid Service")
}

/// The slice of service `i` as the endpointslice controller writes it; `generation` varies
/// the endpoints' addresses so churn replaces them.
fn slice(ns: &str, i: usize, uid: &str, generation: usize) -> EndpointSlice {
    let endpoints: Vec<_> = (0..ENDPOINTS_PER_SLICE)
        .map(|e| {
            let n = (i * ENDPOINTS_PER_SLICE + e + generation * 7) % (250 * 250 * 60);
            let ip = format!("10.{}.{}.{}", 64 + n / 62_500, (n / 250) % 250, n % 250 + 1);
            json!({
                "addresses": [ip],
                "conditions": {"ready": true, "serving": true, "terminating": false},
                "nodeName": format!("node-{}", n % 5000),
                "zone": format!("zone-{}", n % 3),
                "targetRef": {"kind": "Pod", "namespace": ns,
                              "name": format!("app-{i}-{generation}-{e}-7d9f8c6b5-x2x9z"),
                              "uid": format!("0b6b7a1e-3c1d-4d2a-9b8e-{:012}", n)},
            })
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {
            "namespace": ns, "name": format!("svc-{i}-abcde"),
            "labels": {"kubernetes.io/service-name": format!("svc-{i}"),
                       "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                       "app": format!("app-{i}"), "tier": "backend"},
            "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2026-11-25T18:00:00Z"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": format!("svc-{i}"),
                                 "uid": uid, "controller": true, "blockOwnerDeletion": true}],
        },
        "addressType": "IPv4",
        "ports": [{"name": "dns", "port": 5353, "protocol": "UDP"},
                  {"name": "dns-tcp", "port": 5353, "protocol": "TCP"}],
        "endpoints": endpoints,
    }))
    .expect("a valid EndpointSlice")
}

async fn namespaces(c: &testkit::Cluster) -> anyhow::Result<Vec<String>> {
    let nss: Vec<String> = (0..NAMESPACES).map(|n| format!("scale-{n}")).collect();
    for ns in &nss {
        let api: Api<Namespace> = Api::all(c.client.clone());
        let o: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
        api.create(&PostParams::default(), &o).await?;
    }
    Ok(nss)
}

/// Creates services `from..to` and their slices.
async fn create_objects(
    c: &testkit::Cluster,
    nss: &[String],
    from: usize,
    to: usize,
) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let client = c.client.clone();
    let nss2 = nss.to_vec();
    let failures = stream::iter(from..to)
        .map(|i| {
            let client = client.clone();
            let ns = nss2[i % NAMESPACES].clone();
            async move {
                let svcs: Api<Service> = Api::namespaced(client.clone(), &ns);
                let svc = svcs
                    .create(&PostParams::default(), &service(&ns, i))
                    .await?;
                let uid = svc.metadata.uid.unwrap_or_default();
                let slices: Api<EndpointSlice> = Api::namespaced(client, &ns);
                slices
                    .create(&PostParams::default(), &slice(&ns, i, &uid, 0))
                    .await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .filter(|r| std::future::ready(r.is_err()))
        .count()
        .await;
    anyhow::ensure!(failures == 0, "{failures} services or slices not created");
    let took = t0.elapsed().as_secs_f64();
    let n = to - from;
    println!(
        "created {n} Services and {n} EndpointSlices ({} endpoints) in {took:.1} s; {to} Services in all",
        n * ENDPOINTS_PER_SLICE
    );
    Ok(())
}

/// `10k` for 10,000 services, `1k` for 1,000, else the number: the figures' size tag.
fn size_tag(services: usize) -> String {
    match services {
        n if n >= 1000 && n % 1000 == 0 => format!("{}k", n / 1000),
        n => n.to_string(),
    }
}

/// Samples `pid` every 200 ms until `done` says so or `limit` passes; returns (ready after,
/// RSS then, peak RSS) with `None` for a process that never got there.
async fn until_ready(
    pid: u32,
    limit: Duration,
    mut done: impl FnMut() -> bool,
) -> (Option<Duration>, u64, u64) {
    let t0 = Instant::now();
    let mut when = None;
    while t0.elapsed() < limit {
        if done() {
            when = Some(t0.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    (when, status_kib(pid, "VmRSS:"), status_kib(pid, "VmHWM:"))
}

/// One node-agent binary's row; `tag` prefixes its figures' names ("" for this build's).
async fn agent_row(
    c: &testkit::Cluster,
    services: usize,
    nss: &[String],
    bin: &str,
    tag: &str,
    churn_round: usize,
) -> anyhow::Result<()> {
    let ns_name = format!("gk-agent-scale-{}", std::process::id());
    netns(&ns_name)?;
    let t0 = Instant::now();
    println!("node-agent: {bin}");
    let kubeconfig = c.kubeconfig.display().to_string();
    let (agent, admin) = Binary::start_with_admin(
        bin,
        "agent-scale",
        &[
            "--tasks",
            "conntrack",
            "--conntrack-netns",
            &ns_name,
            "--dry-run",
        ],
        &[("NODE_NAME", "scale-node"), ("KUBECONFIG", &kubeconfig)],
    )?;
    let pid = agent.pid().expect("the agent runs");
    if let Err(e) = wait_ready(admin, Duration::from_secs(300), "node-agent ready").await {
        anyhow::bail!("{e:#}; its log ends: {}", tail(&agent.logs()));
    }
    let (first_pass, rss, _) = until_ready(pid, Duration::from_secs(120), || {
        agent.logs().contains("conntrack cleanup pass")
    })
    .await;
    anyhow::ensure!(first_pass.is_some(), "the agent made no pass");
    let ready = t0.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let early = status_kib(pid, "VmRSS:");
    println!(
        "node-agent: ready and past its first pass {ready:.1} s after start; RSS then {:.1} MiB, 10 s later {:.1} MiB",
        mib(rss),
        mib(early),
    );
    let size = size_tag(services);
    bench(&format!("{tag}agent_ready_{size}_services"), ready, "s");

    // Idle: as long as the churn, with nothing changing: the agent's background (periodic
    // passes, re-watches, bookmarks, timers), which the churn's CPU also contains.
    let profile = Profile::start(pid, tag, &size, "idle");
    let cpu0 = cpu_seconds(pid);
    let t0 = Instant::now();
    tokio::time::sleep(CHURN_FOR + SETTLE_AFTER_CHURN).await;
    let idle_cpu = cpu_seconds(pid) - cpu0;
    let idle_for = t0.elapsed().as_secs_f64();
    drop(profile);
    // Steady: over 30 s after the first pass, nothing changed meanwhile.
    let steady = status_kib(pid, "VmRSS:");
    let peak = status_kib(pid, "VmHWM:");
    println!(
        "node-agent idle: {idle_for:.1} s without a change cost {idle_cpu:.3} s of CPU ({:.2} ms per s); RSS then {:.1} MiB, peak {:.1} MiB",
        idle_cpu * 1000.0 / idle_for,
        mib(steady),
        mib(peak)
    );
    bench(
        &format!("{tag}agent_rss_{size}_services"),
        mib(steady),
        "MiB",
    );
    bench(
        &format!("{tag}agent_rss_peak_{size}_services"),
        mib(peak),
        "MiB",
    );
    bench(
        &format!("{tag}agent_idle_cpu_ms_per_s_{size}_services"),
        idle_cpu * 1000.0 / idle_for,
        "ms",
    );

    // Churn: one slice's endpoints replaced every 100 ms.
    let changes = (CHURN_FOR.as_millis() / CHURN_EVERY.as_millis()) as usize;
    let profile = Profile::start(pid, tag, &size, "churn");
    let cpu0 = cpu_seconds(pid);
    let rounds0 = thread_cpu_seconds(pid, "conntrack");
    let t0 = Instant::now();
    let mut churn_max = 0;
    for k in 0..changes {
        let i = (k * 37) % services;
        let ns = &nss[i % NAMESPACES];
        let api: Api<EndpointSlice> = Api::namespaced(c.client.clone(), ns);
        // Each row's churn writes addresses no earlier row wrote: every patch is a change.
        let s = slice(ns, i, "", 1 + churn_round * changes + k);
        api.patch(
            &format!("svc-{i}-abcde"),
            &PatchParams::default(),
            &Patch::Merge(json!({"endpoints": s.endpoints})),
        )
        .await?;
        churn_max = churn_max.max(status_kib(pid, "VmRSS:"));
        let next = CHURN_EVERY * (k as u32 + 1);
        if let Some(wait) = next.checked_sub(t0.elapsed()) {
            tokio::time::sleep(wait).await;
        }
    }
    tokio::time::sleep(SETTLE_AFTER_CHURN).await;
    let cpu = cpu_seconds(pid) - cpu0;
    let rounds = thread_cpu_seconds(pid, "conntrack") - rounds0;
    let churn_for = t0.elapsed().as_secs_f64();
    drop(profile);
    let (churn_rss, churn_peak) = (status_kib(pid, "VmRSS:"), status_kib(pid, "VmHWM:"));
    churn_max = churn_max.max(churn_rss);
    // The background the same time costs when nothing changes, taken out.
    let net = (cpu - idle_cpu * churn_for / idle_for).max(0.0);
    println!(
        "node-agent under churn: {changes} slice changes in {churn_for:.1} s cost {cpu:.3} s of CPU ({:.3} ms per change; {:.3} ms net of the idle background); RSS {:.1} MiB (at most {:.1} MiB during the churn), peak {:.1} MiB",
        cpu * 1000.0 / changes as f64,
        net * 1000.0 / changes as f64,
        mib(churn_rss),
        mib(churn_max),
        mib(churn_peak)
    );
    let per_change = cpu * 1000.0 / changes as f64;
    bench(
        &format!("{tag}agent_cpu_per_change_{size}_services"),
        per_change,
        "ms",
    );
    // Of which the round thread (the triggered passes' dumps: one per --conntrack-min-interval,
    // whatever the number of changes it covers) and the rest (watch events, the model).
    bench(
        &format!("{tag}agent_cpu_per_change_rounds_{size}_services"),
        rounds * 1000.0 / changes as f64,
        "ms",
    );
    bench(
        &format!("{tag}agent_cpu_per_change_watch_and_model_{size}_services"),
        (cpu - rounds) * 1000.0 / changes as f64,
        "ms",
    );
    bench(
        &format!("{tag}agent_cpu_per_change_net_of_idle_{size}_services"),
        net * 1000.0 / changes as f64,
        "ms",
    );
    bench(
        &format!("{tag}agent_rss_churn_{size}_services"),
        mib(churn_rss),
        "MiB",
    );
    bench(
        &format!("{tag}agent_rss_churn_max_{size}_services"),
        mib(churn_max),
        "MiB",
    );
    bench(
        &format!("{tag}agent_rss_churn_peak_{size}_services"),
        mib(churn_peak),
        "MiB",
    );
    // The goals (see the module doc): each figure over its goal, under 1 when met.
    for (name, value, goal) in [
        ("agent_rss", mib(steady), GOAL_RSS_MIB),
        ("agent_rss_churn_max", mib(churn_max), GOAL_RSS_CHURN_MIB),
        ("agent_cpu_per_change", per_change, GOAL_CPU_PER_CHANGE_MS),
    ] {
        bench(
            &format!("{tag}{name}_{size}_services_ratio_to_goal"),
            value / goal,
            "ratio",
        );
    }
    drop(agent);
    let _ = Command::new("ip").args(["netns", "del", &ns_name]).status();
    Ok(())
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(5)..].join("\n")
}

fn kube_proxy_bin() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("AGENT_SCALE_KUBE_PROXY") {
        let p = PathBuf::from(p);
        return p.is_file().then_some(p);
    }
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/e2e/bin/kube-proxy");
    p.is_file().then_some(p)
}

async fn kube_proxy_row(c: &testkit::Cluster, services: usize) -> anyhow::Result<()> {
    let Some(bin) = kube_proxy_bin() else {
        println!(
            "kube-proxy: SKIPPED (no target/e2e/bin/kube-proxy: run `bash e2e/cluster.sh binaries` once, or set AGENT_SCALE_KUBE_PROXY)"
        );
        return Ok(());
    };
    let wait = std::env::var("AGENT_SCALE_KUBE_PROXY_WAIT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(90);
    let ns_name = format!("gk-kp-scale-{}", std::process::id());
    netns(&ns_name)?;
    let log = std::env::temp_dir().join(format!("kube-proxy-scale-{}.log", std::process::id()));
    let file = std::fs::File::create(&log)?;
    // The apiserver listens on the host's loopback only: a proxy listening inside the
    // namespace carries kube-proxy's connections to it.
    let upstream = testkit::proxy::apiserver_addr(&c.kubeconfig)?
        .ok_or_else(|| anyhow::anyhow!("the test kubeconfig names no IP:port"))?;
    let proxy = testkit::proxy::Proxy::start_in_netns(upstream, &ns_name).await?;
    let kubeconfig = testkit::proxy::kubeconfig_with_server(&c.kubeconfig, &proxy.url())?
        .display()
        .to_string();
    let t0 = Instant::now();
    let mut child = tokio::process::Command::new("ip")
        .args(["netns", "exec", &ns_name])
        .arg(&bin)
        .args([
            "--kubeconfig",
            &kubeconfig,
            "--hostname-override",
            "scale-node",
            "--proxy-mode",
            "iptables",
            "--conntrack-max-per-core",
            "0",
            "--v",
            "2",
        ])
        .stdout(file.try_clone()?)
        .stderr(file)
        .kill_on_drop(true)
        .spawn()?;
    let pid = child.id().expect("kube-proxy runs");
    // `ip netns exec` execs kube-proxy in place: the pid is kube-proxy's.
    let synced = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("SyncProxyRules complete")
    };
    let (ready, rss, peak) = until_ready(pid, Duration::from_secs(wait), synced).await;
    match ready {
        Some(d) => println!(
            "kube-proxy v1.36.2 (iptables): first sync complete {:.1} s after start; RSS {:.1} MiB, peak {:.1} MiB",
            d.as_secs_f64(),
            mib(rss),
            mib(peak)
        ),
        None => println!(
            "kube-proxy v1.36.2 (iptables): first sync not complete after {wait} s ({:.1} s); RSS {:.1} MiB, peak {:.1} MiB (log {})",
            t0.elapsed().as_secs_f64(),
            mib(rss),
            mib(peak),
            log.display()
        ),
    }
    let size = size_tag(services);
    bench(&format!("kube_proxy_rss_{size}_services"), mib(rss), "MiB");
    bench(
        &format!("kube_proxy_rss_peak_{size}_services"),
        mib(peak),
        "MiB",
    );
    let _ = child.start_kill();
    let _ = child.wait().await;
    drop(proxy);
    let _ = Command::new("ip").args(["netns", "del", &ns_name]).status();
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let services: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    let Some((c, cp)) = testkit::private_cluster("agent_scale").await else {
        println!("agent_scale: SKIPPED (KUBE_APISERVER not set)");
        return Ok(());
    };
    let nss = namespaces(&c).await?;
    let compare = std::env::var("AGENT_SCALE_COMPARE").ok();
    let mut churn_round = 0;
    // First a tenth of the services (1k of 10k), then all: the CPU per change at both sizes
    // shows whether it grows with the cluster or with the change.
    let mut created = 0;
    for size in [services / 10, services] {
        if size == 0 || size == created {
            continue;
        }
        create_objects(&c, &nss, created, size).await?;
        created = size;
        let bin = env!("CARGO_BIN_EXE_node-agent");
        agent_row(&c, size, &nss, bin, "", churn_round).await?;
        churn_round += 1;
        for (n, other) in compare.iter().flat_map(|c| c.split(',')).enumerate() {
            let tag = match n {
                0 => "compared_".to_string(),
                n => format!("compared{}_", n + 1),
            };
            agent_row(&c, size, &nss, other, &tag, churn_round).await?;
            churn_round += 1;
        }
    }
    kube_proxy_row(&c, services).await?;
    // The objects go with the private control plane.
    drop(c);
    drop(cp);
    Ok(())
}
