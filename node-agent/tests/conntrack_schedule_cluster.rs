//! When passes run, black-box, against a real apiserver and the kernel's conntrack table of a
//! network namespace of the test's own:
//!
//! 1. the periodic full pass is not starved by triggered ones: a UDP flow DNATed to an IP of
//!    the ServiceCIDR that nothing holds (only a full pass judges it) goes within 3 × gc-max
//!    while another UDP service's EndpointSlice changes every 3 s;
//! 2. a tenant creating and deleting TCP-only Services (their IPAddresses come and go) makes
//!    the agent read its table not once, even beside a UDP service without endpoints; a change
//!    to a UDP service still does.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use groundskeeper_node_agent::conntrack::netlink::msg::{Entry, IPPROTO_TCP, IPPROTO_UDP};
use groundskeeper_node_agent::conntrack::netns::{self, NetNs};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::IPAddress;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::services::{ENDPOINT_PORT, SERVICE_PORT, endpoint_list, udp_service};
use testkit::{Binary, holds_for, metric, wait_for};
use tokio::sync::Mutex;

/// Every agent watches every namespace: one test at a time, so one's UDP changes (and their
/// cleanup, which ends before the guard is let go) are not passes in the other's count.
static SERIAL: LazyLock<Mutex<()>> = LazyLock::new(|| Mutex::new(()));

/// The flags of the case: a periodic pass every 5 to 15 s, orphans deleted 2 s after a full
/// pass first saw them.
const FLAGS: [&str; 3] = [
    "--conntrack-gc-min=5s",
    "--conntrack-gc-max=15s",
    "--conntrack-orphan-grace=2s",
];
const GC_MAX: Duration = Duration::from_secs(15);
/// How often the busy service's EndpointSlice changes.
const CHURN_EVERY: Duration = Duration::from_secs(3);
/// Passes that read the table, per family (upstream's latency histogram counts one per pass).
const PASSES: [&str; 2] = [
    "groundskeeper_conntrack_pass_duration_seconds_count{ip_family=\"IPv4\"}",
    "groundskeeper_conntrack_pass_duration_seconds_count{ip_family=\"IPv6\"}",
];

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// A flow from client port `port` to `dst`, its reply from `reply` (`dst`: not DNATed).
fn flow(proto: u8, port: u16, dst: SocketAddr, reply: SocketAddr) -> Entry {
    Entry::dnat(proto, sa(&format!("10.0.0.1:{port}")), dst, reply)
}

fn key(e: &Entry) -> (u8, u16, SocketAddr) {
    (
        e.orig.proto,
        e.orig.src_port,
        SocketAddr::new(e.reply.src, e.reply.src_port),
    )
}

/// Passes the agent has run that read the table (both families).
async fn passes(admin: SocketAddr) -> anyhow::Result<f64> {
    let mut n = 0.0;
    for name in PASSES {
        n += metric(admin, name).await?.unwrap_or(0.0);
    }
    Ok(n)
}

/// Changes slice `name`'s endpoints every [`CHURN_EVERY`] (one endpoint, then two) until
/// dropped; counts the changes made.
struct Churn {
    task: tokio::task::JoinHandle<()>,
    made: Arc<AtomicUsize>,
}

impl Churn {
    fn start(slices: Api<EndpointSlice>, name: String, ips: [&'static str; 2]) -> Self {
        let made = Arc::new(AtomicUsize::new(0));
        let counted = made.clone();
        let task = tokio::spawn(async move {
            for i in 0.. {
                let eps = if i % 2 == 0 { &ips[..] } else { &ips[..1] };
                let body = json!({"endpoints": endpoint_list(eps)});
                let patched = slices
                    .patch(&name, &PatchParams::default(), &Patch::Merge(body))
                    .await;
                if patched.is_ok() {
                    counted.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(CHURN_EVERY).await;
            }
        });
        Self { task, made }
    }

    fn made(&self) -> usize {
        self.made.load(Ordering::Relaxed)
    }
}

impl Drop for Churn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test]
async fn an_orphan_flow_goes_within_three_gc_max_while_a_slice_changes_every_3s()
-> anyhow::Result<()> {
    let name = "an_orphan_flow_goes_within_three_gc_max_while_a_slice_changes_every_3s";
    let _serial = SERIAL.lock().await;
    let Some((c, ns)) = testkit::netns_cluster(name, "ctgc", netns::unavailable()).await? else {
        return Ok(());
    };
    let busy = udp_service(&c, &ns, "busy", &["10.244.41.5", "10.244.41.6"]).await?;
    // In the ServiceCIDR (10.96.0.0/16), held by no Service and no IPAddress.
    let orphan: IpAddr = "10.96.255.241".parse()?;
    let addresses: Api<IPAddress> = Api::all(c.client.clone());
    anyhow::ensure!(
        addresses.get_opt(&orphan.to_string()).await?.is_none(),
        "{orphan} is allocated: pick another"
    );
    let netns = NetNs::create("ctgc-orphan")?;
    let bin = env!("CARGO_BIN_EXE_node-agent");
    // Started, listed, past its first (full) pass.
    let agent = Binary::conntrack_agent(bin, "node-agent-ctgc", &netns.name, &FLAGS).await?;
    let churn = Churn::start(
        Api::namespaced(c.client.clone(), &ns),
        "busy-1".into(),
        ["10.244.41.5", "10.244.41.6"],
    );

    // After the first pass: only a later full pass can see it.
    let (o, ep) = (
        SocketAddr::new(orphan, SERVICE_PORT),
        sa("10.244.41.9:5353"),
    );
    let gone = flow(IPPROTO_UDP, 41000, o, ep);
    let serving = SocketAddr::new("10.244.41.5".parse()?, ENDPOINT_PORT);
    let stay = [
        // Through the busy service to an endpoint that serves throughout.
        flow(
            IPPROTO_UDP,
            41100,
            SocketAddr::new(busy, SERVICE_PORT),
            serving,
        ),
        flow(IPPROTO_TCP, 41101, o, ep),
        // Not DNATed: someone's own traffic to that address.
        flow(IPPROTO_UDP, 41102, o, o),
    ];
    netns.fill(&[gone])?;
    netns.fill(&stay)?;
    let appeared = Instant::now();
    let want: BTreeSet<_> = stay.iter().map(key).collect();
    let within = GC_MAX * 3;
    let res = wait_for(
        within,
        "the flow to the orphaned service IP deleted",
        || async { Ok(netns.flows()? == want) },
    )
    .await;
    let changes = churn.made();
    drop(churn);
    let logs = agent.logs();
    let triggered = logs
        .lines()
        .filter(|l| l.contains("conntrack cleanup pass") && l.contains("triggered=true"))
        .count();
    if let Err(e) = res {
        anyhow::bail!(
            "{e}; table {:?}, want {want:?}; {changes} slice changes; agent log:\n{logs}",
            netns.flows()
        );
    }
    println!(
        "orphan flow gone {:.1} s after it appeared (bound {within:?}); {changes} slice changes, \
         {triggered} triggered passes meanwhile",
        appeared.elapsed().as_secs_f64()
    );
    anyhow::ensure!(
        changes >= 2 && triggered >= 2,
        "the slice must have kept changing and triggering passes: {changes} changes, \
         {triggered} triggered passes; agent log:\n{logs}"
    );
    Ok(())
}

/// A TCP-only Service as a tenant creates it (the apiserver allocates its IPAddress).
fn tcp_service(ns: &str, name: &str) -> anyhow::Result<Service> {
    Ok(serde_json::from_value(json!({
        "metadata": {"namespace": ns, "name": name},
        "spec": {"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]},
    }))?)
}

#[tokio::test]
async fn tcp_only_services_created_and_deleted_run_no_pass() -> anyhow::Result<()> {
    let name = "tcp_only_services_created_and_deleted_run_no_pass";
    let _serial = SERIAL.lock().await;
    let Some((c, ns)) = testkit::netns_cluster(name, "cttcp", netns::unavailable()).await? else {
        return Ok(());
    };
    let udp = udp_service(&c, &ns, "dns", &["10.244.42.5"]).await?;
    // A UDP service whose slice holds no endpoint: every triggered pass looks at its
    // frontend, and any event about UDP services runs a pass over it.
    let idle = udp_service(&c, &ns, "idle", &[]).await?;
    let netns = NetNs::create("ctgc-tcp")?;
    let flows = [
        flow(
            IPPROTO_UDP,
            42000,
            SocketAddr::new(udp, SERVICE_PORT),
            sa("10.244.42.5:5353"),
        ),
        flow(
            IPPROTO_TCP,
            42001,
            SocketAddr::new(idle, 80),
            sa("10.244.42.9:8080"),
        ),
    ];
    netns.fill(&flows)?;
    let bin = env!("CARGO_BIN_EXE_node-agent");
    // No periodic pass in the test's time; the settle over before the tenant starts.
    let (agent, admin) = Binary::conntrack_agent_with_admin(
        bin,
        "node-agent-cttcp",
        &netns.name,
        &["--conntrack-gc-min=10m", "--conntrack-gc-max=10m"],
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = passes(admin).await?;

    let services: Api<Service> = Api::namespaced(c.client.clone(), &ns);
    let addresses: Api<IPAddress> = Api::all(c.client.clone());
    let mut released = 0;
    for i in 0..8 {
        let svc = services
            .create(
                &PostParams::default(),
                &tcp_service(&ns, &format!("tcp{i}"))?,
            )
            .await?;
        let ip = svc.spec.and_then(|s| s.cluster_ip).unwrap_or_default();
        services
            .delete(&format!("tcp{i}"), &DeleteParams::default())
            .await?;
        wait_for(Duration::from_secs(20), "the ClusterIP released", || {
            let (addresses, ip) = (addresses.clone(), ip.clone());
            async move { Ok(addresses.get_opt(&ip).await?.is_none()) }
        })
        .await?;
        released += 1;
    }
    // Whatever the watches deliver late has 2 s more to run a pass.
    let held = holds_for(Duration::from_secs(2), "no pass", || async {
        Ok(passes(admin).await? == before)
    })
    .await;
    if let Err(e) = held {
        anyhow::bail!(
            "{e}: {} passes during {released} TCP-only Services created and deleted; agent log:\n{}",
            passes(admin).await? - before,
            agent.logs()
        );
    }
    let kept: BTreeSet<_> = flows.iter().map(key).collect();
    assert_eq!(netns.flows()?, kept, "nothing deleted");

    // A UDP change still runs a pass.
    let slices: Api<EndpointSlice> = Api::namespaced(c.client.clone(), &ns);
    slices
        .patch(
            "dns-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"endpoints": endpoint_list(&["10.244.42.5", "10.244.42.6"])})),
        )
        .await?;
    wait_for(
        Duration::from_secs(10),
        "a pass after the UDP change",
        || async { Ok(passes(admin).await? > before) },
    )
    .await?;
    println!("{released} TCP-only Services created and deleted: no pass; a UDP change: a pass");
    Ok(())
}
