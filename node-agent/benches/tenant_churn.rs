//! A tenant's churn: the passes a node-agent runs while a user creates and deletes Services in
//! a loop, TCP-only ones, then UDP ones, in the same run. Prints figures; asserts nothing.
//!
//!   KUBE_APISERVER=/path/to/kube-apiserver cargo bench -p groundskeeper-node-agent --bench tenant_churn [-- SECONDS [PER_SECOND [SERVICES]]]
//!
//! On a control plane of its own: SERVICES (default 100) UDP Services, each with one
//! EndpointSlice of 2 endpoints, one in ten with none (its frontend is in every triggered pass),
//! and 10 UDP flows per served Service in a network namespace of its own, DNATed as kube-proxy
//! makes them. It starts `node-agent --tasks=conntrack` on that namespace with
//! `--conntrack-gc-min=10m --conntrack-gc-max=10m` (no periodic pass within the run, so every
//! pass counted is one the churn caused; the rest defaults), waits for its first pass, then
//! runs three phases of SECONDS (default 30) each, 3 s apart:
//!
//! - idle: nothing changes;
//! - tcp: a tenant creates a TCP-only Service and deletes the one before, PER_SECOND (default
//!   5) times a second: each ClusterIP's IPAddress allocated, then released;
//! - udp: the same with UDP Services, each with an EndpointSlice of one endpoint.
//!
//! For each phase: the Services created per second, the passes per second (passes that read the
//! table: the pass-latency histogram's count, both families), how many of those were full and
//! how many triggered (from the agent's log), and the agent's CPU per second. Each also as
//! `bench <name> <value> <unit>`. Without KUBE_APISERVER (or KUBECONFIG) it prints one SKIPPED
//! line and exits 0.
//!
//! `TENANT_CHURN_AGENT=/path/to/node-agent` runs that binary instead of this build's (an older
//! build, to compare).

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt, stream};
use groundskeeper_node_agent::conntrack::netlink::msg::{Entry, IPPROTO_UDP};
use groundskeeper_node_agent::conntrack::netns::{self, NetNs};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;
use testkit::figures::{bench, cpu_seconds};
use testkit::services::{self, ENDPOINT_PORT, SERVICE_PORT, endpoint_list};
use testkit::{Binary, metric};

const NAME: &str = "tenant_churn";
const CONCURRENCY: usize = 32;
const FLOWS_PER_SERVICE: u16 = 10;
const PASSES: [&str; 2] = [
    "groundskeeper_conntrack_pass_duration_seconds_count{ip_family=\"IPv4\"}",
    "groundskeeper_conntrack_pass_duration_seconds_count{ip_family=\"IPv6\"}",
];
/// Before each phase, and after its last change (for the watches to deliver it).
const GAP: Duration = Duration::from_secs(3);

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    Idle,
    Tcp,
    Udp,
}

impl Phase {
    fn label(self) -> &'static str {
        match self {
            Phase::Idle => "idle",
            Phase::Tcp => "tcp",
            Phase::Udp => "udp",
        }
    }
}

/// The run's size, from the bench's arguments.
#[derive(Debug, Clone, Copy)]
struct Knobs {
    seconds: u64,
    per_second: u64,
    services: usize,
}

impl Knobs {
    fn from_args() -> anyhow::Result<Self> {
        let n = testkit::figures::bench_args()?;
        let at = |i: usize, default: u64| n.get(i).copied().unwrap_or(default);
        let k = Self {
            seconds: at(0, 30),
            per_second: at(1, 5),
            services: at(2, 100) as usize,
        };
        anyhow::ensure!(
            k.seconds > 0 && k.per_second > 0 && k.services > 0 && k.services <= 3000,
            "every knob above 0, at most 3000 services: {k:?}"
        );
        Ok(k)
    }
}

/// Passes the agent has run that read the table (both families).
async fn passes(admin: SocketAddr) -> f64 {
    let mut n = 0.0;
    for name in PASSES {
        n += metric(admin, name).await.ok().flatten().unwrap_or(0.0);
    }
    n
}

/// The pass lines of the agent's log from byte `from` on: (full, triggered).
fn logged_passes(agent: &Binary, from: usize) -> (usize, usize) {
    let logs = agent.logs();
    let lines = logs
        .get(from..)
        .unwrap_or("")
        .lines()
        .filter(|l| l.contains("conntrack cleanup pass"));
    let (mut full, mut triggered) = (0, 0);
    for l in lines {
        if l.contains("triggered=true") {
            triggered += 1;
        } else {
            full += 1;
        }
    }
    (full, triggered)
}

/// A Service the tenant creates: TCP-only, or UDP (then with a slice of one endpoint).
fn tenant_service(ns: &str, name: &str, udp: bool) -> anyhow::Result<Service> {
    let (port, protocol) = if udp { (53, "UDP") } else { (80, "TCP") };
    Ok(serde_json::from_value(json!({
        "metadata": {"namespace": ns, "name": name},
        "spec": {"ports": [{"name": "p", "port": port, "protocol": protocol}]},
    }))?)
}

fn tenant_slice(ns: &str, name: &str) -> anyhow::Result<EndpointSlice> {
    Ok(serde_json::from_value(json!({
        "metadata": {"namespace": ns, "name": format!("{name}-1"),
                     "labels": {"kubernetes.io/service-name": name}},
        "addressType": "IPv4",
        "ports": [{"name": "p", "port": 5353, "protocol": "UDP"}],
        "endpoints": endpoint_list(&["10.250.0.1"]),
    }))?)
}

/// What one phase did and cost.
struct Figures {
    created: usize,
    elapsed: Duration,
    passes: f64,
    full: usize,
    triggered: usize,
    cpu: f64,
}

/// Runs `phase` for `k.seconds`, then [`GAP`] for its last changes to be taken in.
async fn run_phase(
    c: &testkit::Cluster,
    ns: &str,
    phase: Phase,
    k: Knobs,
    (agent, admin, pid): (&Binary, SocketAddr, u32),
) -> anyhow::Result<Figures> {
    let services: Api<Service> = Api::namespaced(c.client.clone(), ns);
    let slices: Api<EndpointSlice> = Api::namespaced(c.client.clone(), ns);
    let (passes0, cpu0, log0) = (passes(admin).await, cpu_seconds(pid), agent.logs().len());
    let t0 = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(1) / k.per_second as u32);
    let mut created = 0;
    let mut previous: Option<String> = None;
    while phase != Phase::Idle && t0.elapsed() < Duration::from_secs(k.seconds) {
        tick.tick().await;
        let udp = phase == Phase::Udp;
        let name = format!("{}-{created}", phase.label());
        services
            .create(&PostParams::default(), &tenant_service(ns, &name, udp)?)
            .await?;
        if udp {
            slices
                .create(&PostParams::default(), &tenant_slice(ns, &name)?)
                .await?;
        }
        created += 1;
        if let Some(old) = previous.replace(name) {
            services.delete(&old, &DeleteParams::default()).await?;
            if udp {
                slices
                    .delete(&format!("{old}-1"), &DeleteParams::default())
                    .await?;
            }
        }
    }
    if let Some(old) = previous {
        services.delete(&old, &DeleteParams::default()).await?;
    }
    let remaining = Duration::from_secs(k.seconds).saturating_sub(t0.elapsed());
    tokio::time::sleep(remaining + GAP).await;
    let (full, triggered) = logged_passes(agent, log0);
    Ok(Figures {
        created,
        elapsed: t0.elapsed(),
        passes: passes(admin).await - passes0,
        full,
        triggered,
        cpu: cpu_seconds(pid) - cpu0,
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let k = Knobs::from_args()?;
    let Some((c, ns)) = testkit::netns_cluster(NAME, "churn", netns::unavailable()).await? else {
        return Ok(());
    };
    println!(
        "{NAME}: {} UDP services (one in ten without endpoints), phases of {} s, {} Services \
         created and deleted per second",
        k.services, k.seconds, k.per_second
    );
    let frontends: Vec<(usize, IpAddr)> = stream::iter(0..k.services)
        .map(|s| {
            let (c, ns) = (&c, &ns);
            async move {
                let eps: Vec<String> = if s % 10 == 9 {
                    vec![]
                } else {
                    (1..=2)
                        .map(|j| format!("10.244.{}.{}", s / 100, (s % 100) * 2 + j))
                        .collect()
                };
                let eps: Vec<&str> = eps.iter().map(String::as_str).collect();
                let ip = services::udp_service(c, ns, &format!("bg-{s}"), &eps).await?;
                anyhow::Ok((s, ip))
            }
        })
        .buffered(CONCURRENCY)
        .try_collect()
        .await?;
    let table = NetNs::create("churn")?;
    let entries: Vec<Entry> = frontends
        .iter()
        .filter(|(s, _)| s % 10 != 9)
        .flat_map(|(s, ip)| {
            let backend: IpAddr = format!("10.244.{}.{}", s / 100, (s % 100) * 2 + 1)
                .parse()
                .unwrap();
            (0..FLOWS_PER_SERVICE).map(move |f| {
                Entry::dnat(
                    IPPROTO_UDP,
                    SocketAddr::new("10.128.0.1".parse().unwrap(), 10_000 + (*s as u16) * 16 + f),
                    SocketAddr::new(*ip, SERVICE_PORT),
                    SocketAddr::new(backend, ENDPOINT_PORT),
                )
            })
        })
        .collect();
    let n = entries.len();
    table.fill(&entries)?;
    let bin = std::env::var("TENANT_CHURN_AGENT")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_node-agent").to_string());
    println!("node-agent: {bin}; {n} UDP flows in its table");
    let flags = ["--conntrack-gc-min=10m", "--conntrack-gc-max=10m"];
    let (agent, admin) =
        Binary::conntrack_agent_with_admin(&bin, NAME, &table.name, &flags).await?;
    let pid = agent.pid().expect("the agent runs");
    for phase in [Phase::Idle, Phase::Tcp, Phase::Udp] {
        tokio::time::sleep(GAP).await;
        let f = run_phase(&c, &ns, phase, k, (&agent, admin, pid)).await?;
        let secs = f.elapsed.as_secs_f64();
        let label = phase.label();
        println!(
            "{label}: {} Services created and deleted in {:.1} s; {} passes ({} full, {} \
             triggered), {:.2} per second; agent CPU {:.1} ms per second",
            f.created,
            secs,
            f.passes,
            f.full,
            f.triggered,
            f.passes / secs,
            f.cpu * 1000.0 / secs
        );
        bench(
            &format!("churn_{label}_services_per_s"),
            f.created as f64 / secs,
            "services/s",
        );
        bench(
            &format!("churn_{label}_passes_per_s"),
            f.passes / secs,
            "passes/s",
        );
        bench(
            &format!("churn_{label}_full_passes"),
            f.full as f64,
            "passes",
        );
        bench(
            &format!("churn_{label}_triggered_passes"),
            f.triggered as f64,
            "passes",
        );
        bench(
            &format!("churn_{label}_agent_cpu_ms_per_s"),
            f.cpu * 1000.0 / secs,
            "ms/s",
        );
    }
    Ok(())
}
