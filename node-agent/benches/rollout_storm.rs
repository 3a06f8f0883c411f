//! A rollout storm: every endpoint of many UDP services replaced within seconds, the real
//! node-agent cleaning a real conntrack table. Prints figures; exits non-zero only when a flow
//! to a serving endpoint was deleted (a correctness failure, not a timing).
//!
//!   KUBE_APISERVER=/path/to/kube-apiserver cargo bench -p groundskeeper-node-agent --bench rollout_storm [-- SERVICES [ENDPOINTS [FLOWS [WAVES [SECONDS]]]]]
//!
//! On a control plane of its own, creates SERVICES (default 100) UDP Services (port 53), each
//! with one EndpointSlice of ENDPOINTS (default 10) serving endpoints on 5353; puts FLOWS
//! (default 4) conntrack entries per endpoint in a network namespace of its own, shaped as
//! kube-proxy's DNAT makes them (client -> ClusterIP:53, reply from endpoint:5353), and starts
//! `node-agent --tasks=conntrack` (not dry-run, default flags) on that namespace. Then the
//! rollout, in WAVES (default 10) waves over SECONDS (default 10): each wave adds, to every
//! service, a new serving endpoint for each of its next 1/WAVES of old endpoints, creates FLOWS
//! flows to each new one as soon as the apiserver has it (clients follow the rollout; by default
//! no kube-proxy rules lag is modelled, the strictest case: `ROLLOUT_STORM_PROXY_LAG_MS` delays
//! the new flows that long), and half a wave later removes the old endpoints those replace. A thread dumps the namespace's table every 20 ms from before the
//! agent starts and notes when each flow disappears.
//!
//! Prints the passes the agent ran (its pass-duration histogram's count), its CPU time, from the
//! storm's start until the last stale flow was gone, the longest a stale flow survived after the
//! apiserver acknowledged its endpoint's removal, the flows to serving endpoints that were
//! deleted (must be 0), and the agent's RSS. Each also as `bench <name> <value> <unit>`. Without
//! KUBE_APISERVER (or KUBECONFIG) it prints one SKIPPED line and exits 0.
//!
//! `ROLLOUT_STORM_AGENT=/path/to/node-agent` runs that binary instead of this build's (an older
//! build, or a deliberately broken one to see the bench catch it).

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt, stream};
use groundskeeper_node_agent::conntrack::netlink::family::Family::V4;
use groundskeeper_node_agent::conntrack::netlink::msg::{
    Entry, IPPROTO_UDP, STATUS_ASSURED, STATUS_SEEN_REPLY,
};
use groundskeeper_node_agent::conntrack::netlink::socket::{Conntrack, DumpError};
use groundskeeper_node_agent::conntrack::netns::{self, NetNs};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use testkit::figures::{bench, cpu_seconds, mib, status_kib};
use testkit::services::{self, ENDPOINT_PORT, SERVICE_PORT, endpoint_list};
use testkit::{Binary, metric};

const NAME: &str = "rollout_storm";
/// How often the table is dumped to see which flows are gone.
const POLL: Duration = Duration::from_millis(20);
/// How long after the storm the stale flows may take to go before the bench stops waiting
/// (beyond the agent's first periodic pass, 60 s after its start).
const SETTLE_LIMIT: Duration = Duration::from_secs(90);
const CONCURRENCY: usize = 32;
const PASSES: &str = "groundskeeper_conntrack_pass_duration_seconds_count{ip_family=\"IPv4\"}";
const DELETED: &str = "groundskeeper_conntrack_entries_deleted_total{ip_family=\"IPv4\"}";
const SKIPPED: &str = "groundskeeper_conntrack_passes_skipped_total{reason=\"stale-model\"}";

/// The storm's size, from the bench's arguments.
#[derive(Debug, Clone, Copy)]
struct Knobs {
    services: usize,
    endpoints: usize,
    flows: usize,
    waves: usize,
    seconds: u64,
    /// How long after the apiserver acknowledged a new endpoint its first flows appear (what
    /// kube-proxy takes to see it and sync its rules).
    proxy_lag: Duration,
}

impl Knobs {
    fn from_args() -> anyhow::Result<Self> {
        let n = testkit::figures::bench_args()?;
        let at = |i: usize, default: usize| n.get(i).map_or(default, |v| *v as usize);
        let k = Self {
            services: at(0, 100),
            endpoints: at(1, 10),
            flows: at(2, 4),
            waves: at(3, 10),
            seconds: at(4, 10) as u64,
            proxy_lag: Duration::from_millis(match std::env::var("ROLLOUT_STORM_PROXY_LAG_MS") {
                Ok(v) => v
                    .parse()
                    .map_err(|e| anyhow::anyhow!("ROLLOUT_STORM_PROXY_LAG_MS {v:?}: {e}"))?,
                Err(_) => 0,
            }),
        };
        anyhow::ensure!(
            k.services > 0 && k.endpoints > 0 && k.flows > 0 && k.waves > 0 && k.seconds > 0,
            "every knob must be above 0: {k:?}"
        );
        anyhow::ensure!(
            k.services * k.endpoints < 1 << 17,
            "at most 131071 endpoints: {k:?}"
        );
        Ok(k)
    }

    /// The wave that replaces old endpoint `j` of every service.
    fn wave_of(&self, j: usize) -> usize {
        j * self.waves / self.endpoints
    }

    fn period(&self) -> Duration {
        Duration::from_secs(self.seconds) / self.waves as u32
    }
}

/// Endpoint `j` of service `s`: the old ones in 10.244.0.0/15, their replacements in
/// 10.246.0.0/15.
fn endpoint(k: &Knobs, s: usize, j: usize, new: bool) -> Ipv4Addr {
    let base = u32::from(Ipv4Addr::new(10, 244, 0, 0)) + if new { 1 << 17 } else { 0 };
    Ipv4Addr::from(base + (s * k.endpoints + j) as u32 + 1)
}

/// A client's address and port: what tells the flows apart in a dump.
type Client = (Ipv4Addr, u16);

/// Client `n`: 50,000 ports on each address of 10.128.0.0/10.
fn client(n: usize) -> Client {
    let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 128, 0, 0)) + (n / 50_000) as u32);
    (ip, 10_000 + (n % 50_000) as u16)
}

struct Flow {
    endpoint: Ipv4Addr,
    created: Instant,
    /// When a dump first lacked it (it went before then).
    gone: Option<Instant>,
}

/// When an endpoint's removal was sent, and when the apiserver acknowledged it.
#[derive(Clone, Copy)]
struct Removal {
    sent: Instant,
    acked: Option<Instant>,
}

/// What the storm did and what the dumps saw.
#[derive(Default)]
struct Book {
    flows: HashMap<Client, Flow>,
    removals: HashMap<Ipv4Addr, Removal>,
    /// Flows gone while their endpoint still served: (client, endpoint, when seen gone).
    serving_deleted: Vec<(Client, Ipv4Addr, Instant)>,
    dumps: usize,
    interrupted: usize,
}

impl Book {
    /// A dump that ran from `start` to `end` held exactly `present`.
    fn observe(&mut self, start: Instant, end: Instant, present: &HashSet<Client>) {
        self.dumps += 1;
        for (c, f) in &mut self.flows {
            if f.gone.is_some() || f.created > start || present.contains(c) {
                continue;
            }
            f.gone = Some(end);
            // Gone before its removal was even sent: the agent deleted a live flow. (A flow
            // gone between the last dump before the removal was sent and the send is not
            // counted: a 20 ms blind spot, in the agent's favour.)
            if self.removals.get(&f.endpoint).is_none_or(|r| r.sent > end) {
                self.serving_deleted.push((*c, f.endpoint, end));
            }
        }
    }

    /// Per flow to a removed endpoint: how long it outlived the acknowledged removal (`None`
    /// while it is still there).
    fn survivals(&self) -> Vec<Option<Duration>> {
        self.flows
            .values()
            .filter_map(|f| {
                let acked = self.removals.get(&f.endpoint)?.acked?;
                Some(f.gone.map(|g| g.saturating_duration_since(acked)))
            })
            .collect()
    }

    fn record(&mut self, flows: &[(Client, Ipv4Addr)], created: Instant) {
        for (c, endpoint) in flows {
            let f = Flow {
                endpoint: *endpoint,
                created,
                gone: None,
            };
            self.flows.insert(*c, f);
        }
    }
}

type Shared = Arc<Mutex<Book>>;

/// Dumps the namespace's UDP table every [`POLL`] into `book` until `stop`.
fn watch_table(
    netns: String,
    book: Shared,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<anyhow::Result<()>> {
    std::thread::spawn(move || {
        netns::run_in(&netns, || {
            let mut ct = Conntrack::open()?;
            let mut present = HashSet::new();
            while !stop.load(Ordering::Relaxed) {
                present.clear();
                let start = Instant::now();
                let res = ct.dump(V4, Some(IPPROTO_UDP), &mut |e| {
                    if let IpAddr::V4(ip) = e.orig.src {
                        present.insert((ip, e.orig.src_port));
                    }
                });
                let end = Instant::now();
                match res {
                    Ok(_) => book.lock().unwrap().observe(start, end, &present),
                    // Entries deleted during the dump: it may have missed live ones.
                    Err(DumpError::Interrupted) => book.lock().unwrap().interrupted += 1,
                    Err(e) => return Err(anyhow::Error::from(e)),
                }
                std::thread::sleep(POLL);
            }
            Ok(())
        })?
    })
}

/// Puts `flows` (client, ClusterIP, endpoint) in the namespace's table, then books them.
async fn add_flows(
    netns: &str,
    book: &Shared,
    flows: Vec<(Client, Ipv4Addr, Ipv4Addr)>,
) -> anyhow::Result<()> {
    let netns = netns.to_string();
    let entries: Vec<Entry> = flows
        .iter()
        .map(|((ip, port), frontend, ep)| {
            Entry::dnat(
                IPPROTO_UDP,
                SocketAddr::new((*ip).into(), *port),
                SocketAddr::new((*frontend).into(), SERVICE_PORT),
                SocketAddr::new((*ep).into(), ENDPOINT_PORT),
            )
        })
        .collect();
    let report = tokio::task::spawn_blocking(move || {
        netns::run_in(&netns, || {
            Conntrack::open()?.create(&entries, 600, STATUS_SEEN_REPLY | STATUS_ASSURED)
        })
    })
    .await???;
    anyhow::ensure!(
        report.ok == flows.len(),
        "{} of {} flows created: {report:?}",
        report.ok,
        flows.len()
    );
    let booked: Vec<(Client, Ipv4Addr)> = flows.iter().map(|(c, _, ep)| (*c, *ep)).collect();
    book.lock().unwrap().record(&booked, Instant::now());
    Ok(())
}

/// One service's endpoints during wave `w`: after its new endpoints were added (`removed`
/// false), or after the old ones they replace were removed too.
fn endpoints_at(k: &Knobs, s: usize, w: usize, removed: bool) -> Vec<String> {
    let old = (0..k.endpoints)
        .filter(|j| k.wave_of(*j) > w || (k.wave_of(*j) == w && !removed))
        .map(|j| endpoint(k, s, j, false));
    let new = (0..k.endpoints)
        .filter(|j| k.wave_of(*j) <= w)
        .map(|j| endpoint(k, s, j, true));
    old.chain(new).map(|ip| ip.to_string()).collect()
}

/// Writes every service's slice as wave `w` leaves it (`removed`: its old endpoints gone),
/// `CONCURRENCY` at a time; books the removals' send and acknowledgement times.
async fn write_wave(
    slices: &Api<EndpointSlice>,
    k: &Knobs,
    w: usize,
    removed: bool,
    book: &Shared,
) -> anyhow::Result<()> {
    stream::iter(0..k.services)
        .map(|s| async move {
            let gone: Vec<Ipv4Addr> = (0..k.endpoints)
                .filter(|j| removed && k.wave_of(*j) == w)
                .map(|j| endpoint(k, s, j, false))
                .collect();
            let sent = Instant::now();
            for ip in &gone {
                let r = Removal { sent, acked: None };
                book.lock().unwrap().removals.insert(*ip, r);
            }
            let body = json!({"endpoints": endpoint_list(&endpoints_at(k, s, w, removed))});
            let name = format!("{}-1", service_name(s));
            slices
                .patch(&name, &PatchParams::default(), &Patch::Merge(body))
                .await?;
            let acked = Instant::now();
            let mut b = book.lock().unwrap();
            for ip in &gone {
                b.removals.entry(*ip).and_modify(|r| r.acked = Some(acked));
            }
            anyhow::Ok(())
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<()>()
        .await
}

fn service_name(s: usize) -> String {
    format!("storm-{s}")
}

/// The flows, FLOWS per endpoint, to every endpoint `pick` names of each service; clients
/// numbered from `*next`.
fn flows_to(
    k: &Knobs,
    frontends: &[Ipv4Addr],
    next: &mut usize,
    pick: impl Fn(usize) -> Vec<Ipv4Addr>,
) -> Vec<(Client, Ipv4Addr, Ipv4Addr)> {
    let mut out = Vec::new();
    for (s, frontend) in frontends.iter().enumerate() {
        for ep in pick(s) {
            for _ in 0..k.flows {
                out.push((client(*next), *frontend, ep));
                *next += 1;
            }
        }
    }
    out
}

/// The rollout; returns when its last removal was acknowledged.
async fn storm(
    slices: &Api<EndpointSlice>,
    k: &Knobs,
    frontends: &[Ipv4Addr],
    netns: &str,
    book: &Shared,
    next_client: &mut usize,
) -> anyhow::Result<Instant> {
    let t0 = tokio::time::Instant::now();
    let period = k.period();
    for w in 0..k.waves {
        tokio::time::sleep_until(t0 + period * w as u32).await;
        write_wave(slices, k, w, false, book).await?;
        tokio::time::sleep(k.proxy_lag).await;
        let flows = flows_to(k, frontends, next_client, |s| {
            (0..k.endpoints)
                .filter(|j| k.wave_of(*j) == w)
                .map(|j| endpoint(k, s, j, true))
                .collect()
        });
        add_flows(netns, book, flows).await?;
        tokio::time::sleep_until(t0 + period * w as u32 + period / 2).await;
        write_wave(slices, k, w, true, book).await?;
    }
    Ok(Instant::now())
}

/// Waits until every flow to a removed endpoint is gone, or [`SETTLE_LIMIT`] after `from`.
async fn settle(book: &Shared, from: Instant) -> Option<Instant> {
    while from.elapsed() < SETTLE_LIMIT {
        if book.lock().unwrap().survivals().iter().all(Option::is_some) {
            return Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

async fn counter(admin: SocketAddr, name: &str) -> f64 {
    metric(admin, name).await.ok().flatten().unwrap_or(0.0)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let k = Knobs::from_args()?;
    let Some((c, ns)) = testkit::netns_cluster(NAME, "storm", netns::unavailable()).await? else {
        return Ok(());
    };
    let total = k.services * k.endpoints;
    println!(
        "{NAME}: {} UDP services x {} endpoints ({total}), {} flows each, replaced in {} waves over {} s; \
         new flows {} ms after the apiserver has their endpoint",
        k.services,
        k.endpoints,
        k.flows,
        k.waves,
        k.seconds,
        k.proxy_lag.as_millis()
    );
    let t = Instant::now();
    let frontends: Vec<Ipv4Addr> = stream::iter(0..k.services)
        .map(|s| {
            let (c, ns) = (&c, &ns);
            async move {
                let eps: Vec<String> = (0..k.endpoints)
                    .map(|j| endpoint(&k, s, j, false).to_string())
                    .collect();
                let eps: Vec<&str> = eps.iter().map(String::as_str).collect();
                match services::udp_service(c, ns, &service_name(s), &eps).await? {
                    IpAddr::V4(ip) => Ok(ip),
                    IpAddr::V6(ip) => anyhow::bail!("an IPv6 ClusterIP {ip}: IPv4 needed"),
                }
            }
        })
        .buffered(CONCURRENCY)
        .try_collect()
        .await?;
    println!(
        "created {} Services and EndpointSlices in {:.1} s",
        k.services,
        t.elapsed().as_secs_f64()
    );

    let table = NetNs::create("storm")?;
    let book = Shared::default();
    let mut next_client = 0;
    let initial = flows_to(&k, &frontends, &mut next_client, |s| {
        (0..k.endpoints)
            .map(|j| endpoint(&k, s, j, false))
            .collect()
    });
    let initial_flows = initial.len();
    add_flows(&table.name, &book, initial).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let watch_start = Instant::now();
    let watcher = watch_table(table.name.clone(), book.clone(), stop.clone());

    let bin = std::env::var("ROLLOUT_STORM_AGENT")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_node-agent").to_string());
    println!("node-agent: {bin}");
    let (agent, admin) = Binary::conntrack_agent_with_admin(&bin, NAME, &table.name, &[]).await?;
    let pid = agent.pid().expect("the agent runs");
    println!(
        "node-agent ready and past its first pass; {initial_flows} flows in its table, RSS {:.1} MiB",
        mib(status_kib(pid, "VmRSS:"))
    );

    let (passes0, deleted0, skipped0) = (
        counter(admin, PASSES).await,
        counter(admin, DELETED).await,
        counter(admin, SKIPPED).await,
    );
    let cpu0 = cpu_seconds(pid);
    let t0 = Instant::now();
    let slices: Api<EndpointSlice> = Api::namespaced(c.client.clone(), &ns);
    let ended = storm(
        &slices,
        &k,
        &frontends,
        &table.name,
        &book,
        &mut next_client,
    )
    .await?;
    let settled = settle(&book, ended).await;
    let cpu = cpu_seconds(pid) - cpu0;
    let (passes, deleted, skipped) = (
        counter(admin, PASSES).await - passes0,
        counter(admin, DELETED).await - deleted0,
        counter(admin, SKIPPED).await - skipped0,
    );
    let (rss, peak) = (status_kib(pid, "VmRSS:"), status_kib(pid, "VmHWM:"));
    stop.store(true, Ordering::Relaxed);
    watcher
        .join()
        .map_err(|_| anyhow::anyhow!("the table watcher panicked"))??;
    let watched = watch_start.elapsed();
    let b = book.lock().unwrap();

    let survivals = b.survivals();
    let stale = survivals.len();
    let left = survivals.iter().filter(|s| s.is_none()).count();
    let mut gone: Vec<Duration> = survivals.into_iter().flatten().collect();
    gone.sort();
    let longest = gone.last().copied().unwrap_or_default();
    let median = gone.get(gone.len() / 2).copied().unwrap_or_default();
    let over = settled.unwrap_or_else(Instant::now) - t0;
    println!(
        "storm: {total} endpoints replaced in {:.1} s ({} new flows); stale flows all gone {}",
        (ended - t0).as_secs_f64(),
        next_client - initial_flows,
        match settled {
            Some(t) => format!("{:.1} s after the storm began", (t - t0).as_secs_f64()),
            None => format!("NOT within {SETTLE_LIMIT:?} of its end: {left} of {stale} remain"),
        }
    );
    println!(
        "node-agent: {passes} passes ({skipped} skipped on a stale model), {deleted} entries deleted; \
         {:.0} ms of CPU over {:.1} s; RSS {:.1} MiB, peak {:.1} MiB",
        cpu * 1000.0,
        over.as_secs_f64(),
        mib(rss),
        mib(peak)
    );
    println!(
        "stale flows ({stale}): longest survival {:.0} ms after the removal was acknowledged, median {:.0} ms \
         (resolution: a table dump every {:.0} ms on average; {} dumps, {} interrupted)",
        ms(longest),
        ms(median),
        ms(watched) / b.dumps.max(1) as f64,
        b.dumps,
        b.interrupted
    );
    println!(
        "flows to serving endpoints deleted: {} (must be 0)",
        b.serving_deleted.len()
    );
    bench("storm_passes", passes, "passes");
    bench("storm_cpu_ms", cpu * 1000.0, "ms");
    bench("storm_longest_stale_survival_ms", ms(longest), "ms");
    bench("storm_stale_flows_left", left as f64, "flows");
    bench(
        "storm_serving_flows_deleted",
        b.serving_deleted.len() as f64,
        "flows",
    );
    bench("storm_agent_rss", mib(rss), "MiB");
    bench("storm_agent_rss_peak", mib(peak), "MiB");
    if !b.serving_deleted.is_empty() {
        for (cl, ep, when) in b.serving_deleted.iter().take(10) {
            let at = match when.checked_duration_since(t0) {
                Some(d) => format!("{:.3} s after the storm began", d.as_secs_f64()),
                None => format!("{:.3} s before the storm", (t0 - *when).as_secs_f64()),
            };
            println!(
                "  deleted while serving: client {}:{} -> endpoint {ep}, seen gone {at}",
                cl.0, cl.1
            );
        }
        anyhow::bail!(
            "{} flows to serving endpoints were deleted (agent log {})",
            b.serving_deleted.len(),
            agent.log_path().display()
        );
    }
    Ok(())
}
