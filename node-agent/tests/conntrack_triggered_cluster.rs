//! Triggered passes black-box, against a real apiserver and the kernel's conntrack table of a network
//! namespace of the test's own: a triggered pass (after a change to a service) deletes what a
//! full pass would among the flows touching that service, IPv4 and IPv6, and never someone
//! else's flows.
//!
//! 1. un-NATed flows to every frontend go when the service gets endpoints;
//! 2. flows DNATed to an address that was never an endpoint (node IP:nodePort) go;
//! 3. a slice whose port name matches no service port: the service has no endpoints;
//! 4. an un-NATed flow to this node's own IP on a nodePort goes;
//! 5. after a restart, flows to the ClusterIP of a service deleted meanwhile go within 10 s;
//!
//! And never someone else's flows:
//!
//! - A: a Service claiming kube-dns's ClusterIP as an ExternalIP does not cut DNS flows;
//! - B: an EndpointSlice deleted and re-created cuts no flow of its live service; a deleted
//!   service's flows still go at once.
//!
//! Every change is made after the agent's first (full) pass, and the flows it must delete are
//! created after that pass too (case 1: before it, while the service is settling and nothing is
//! judged; case 5 is about that first pass): only the triggered pass can delete them.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use groundskeeper_node_agent::conntrack::netlink::msg::{Entry, IPPROTO_TCP, IPPROTO_UDP};
use groundskeeper_node_agent::conntrack::netns::{self, NetNs};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::IPAddress;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;
use testkit::services::{cluster_ips, dual_stack_service, endpoint_list, node_port, slice};
use testkit::{Binary, holds_for, wait_for};

/// (proto, client port, reply source) of an entry: what the tests compare.
type Flow = (u8, u16, SocketAddr);

/// How soon a triggered pass must have acted.
const TRIGGERED: Duration = Duration::from_secs(5);

/// `--conntrack-orphan-grace` where a test has flows to a backend never an endpoint: those wait
/// it (a proxy may DNAT to a new endpoint before our watch has it), then go.
const GRACE: Duration = Duration::from_secs(2);

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// A flow from this test's client (IPv4 or IPv6, as `dst`) port `port` to `dst`, whose reply
/// comes from `reply` (`dst` itself: not DNATed).
fn flow(proto: u8, port: u16, dst: SocketAddr, reply: SocketAddr) -> Entry {
    let client: IpAddr = if dst.is_ipv4() {
        "10.0.0.1".parse().unwrap()
    } else {
        "2001:db8:c::1".parse().unwrap()
    };
    Entry::dnat(proto, SocketAddr::new(client, port), dst, reply)
}

fn udp(port: u16, dst: SocketAddr, reply: SocketAddr) -> Entry {
    flow(IPPROTO_UDP, port, dst, reply)
}

fn key(e: &Entry) -> Flow {
    (
        e.orig.proto,
        e.orig.src_port,
        SocketAddr::new(e.reply.src, e.reply.src_port),
    )
}

fn keys(entries: &[Entry]) -> BTreeSet<Flow> {
    entries.iter().map(key).collect()
}

/// The cluster and a fresh namespace, or `None` (after the skip line).
async fn setup(name: &str) -> anyhow::Result<Option<(testkit::Cluster, String)>> {
    testkit::netns_cluster(name, "ct24", netns::unavailable()).await
}

/// A namespace that owns `addrs` (on its loopback): this node's addresses for the NodePort rule.
fn netns_owning(tag: &str, addrs: &[&str]) -> anyhow::Result<NetNs> {
    let ns = NetNs::create(tag)?;
    ns.exec("ip", &["link", "set", "lo", "up"])?;
    for a in addrs {
        let (cidr, v6) = if a.contains(':') {
            (format!("{a}/128"), true)
        } else {
            (format!("{a}/32"), false)
        };
        let mut args = vec!["addr", "add", cidr.as_str(), "dev", "lo"];
        if v6 {
            args.push("nodad");
        }
        ns.exec("ip", &args)?;
    }
    Ok(ns)
}

/// Starts the agent on `netns` and waits for its first pass.
async fn agent_on(netns: &NetNs, extra: &[&str]) -> anyhow::Result<Binary> {
    let bin = env!("CARGO_BIN_EXE_node-agent");
    Binary::conntrack_agent(bin, "node-agent-ct24", &netns.name, extra).await
}

/// Waits until the table is exactly `want`.
async fn expect_table(
    netns: &NetNs,
    agent: &Binary,
    within: Duration,
    what: &str,
    want: &BTreeSet<Flow>,
) -> anyhow::Result<Duration> {
    let res = wait_for(within, what, || async { Ok(netns.flows()? == *want) }).await;
    match res {
        Ok(took) => Ok(took),
        Err(e) => anyhow::bail!(
            "{e}; table now {:?}, want {want:?}; agent log:\n{}",
            netns.flows(),
            agent.logs()
        ),
    }
}

/// Asserts the table stays exactly `want` for `period`.
async fn table_holds(
    netns: &NetNs,
    agent: &Binary,
    period: Duration,
    what: &str,
    want: &BTreeSet<Flow>,
) -> anyhow::Result<()> {
    if let Err(e) = holds_for(period, what, || async { Ok(netns.flows()? == *want) }).await {
        anyhow::bail!(
            "{e}; table now {:?}, want {want:?}; agent log:\n{}",
            netns.flows(),
            agent.logs()
        );
    }
    Ok(())
}

/// Both families' slices of `svc` on the port named `port_name`.
async fn slices(
    c: &testkit::Cluster,
    ns: &str,
    svc: &str,
    port_name: &str,
    v4: &[&str],
    v6: &[&str],
) -> anyhow::Result<()> {
    c.create(&slice(ns, svc, port_name, v4)?).await?;
    c.create(&slice(ns, svc, port_name, v6)?).await?;
    Ok(())
}

fn pair(ips: &[IpAddr]) -> (IpAddr, IpAddr) {
    assert_eq!(ips.len(), 2, "dual-stack ClusterIPs: {ips:?}");
    (ips[0], ips[1])
}

#[tokio::test]
async fn case1_unnated_flows_to_every_frontend_go_when_the_service_gets_endpoints()
-> anyhow::Result<()> {
    let name = "case1_unnated_flows_to_every_frontend_go_when_the_service_gets_endpoints";
    let Some((c, ns)) = setup(name).await? else {
        return Ok(());
    };
    let svc = dual_stack_service(
        &c,
        &ns,
        "web",
        json!({"type": "LoadBalancer", "externalIPs": ["192.0.2.10", "2001:db8::10"]}),
    )
    .await?;
    let api: Api<Service> = Api::namespaced(c.client.clone(), &ns);
    api.patch_status(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [
            {"ip": "198.51.100.10"}, {"ip": "2001:db8:1::10"}]}}})),
    )
    .await?;
    let (cip4, cip6) = pair(&cluster_ips(&svc));
    let frontends: Vec<SocketAddr> = [
        cip4,
        "192.0.2.10".parse()?,
        "198.51.100.10".parse()?,
        cip6,
        "2001:db8::10".parse()?,
        "2001:db8:1::10".parse()?,
    ]
    .into_iter()
    .map(|ip| SocketAddr::new(ip, 53))
    .collect();
    let netns = NetNs::create("ct24-case1")?;
    // The service has no endpoint: its frontends settle for 10 minutes (not judged), so the
    // un-NATed flows made meanwhile are there when the endpoints come.
    let (ep4, ep6) = (sa("10.244.21.5:5353"), sa("[fd00:244:21::5]:5353"));
    let gone: Vec<Entry> = frontends
        .iter()
        .enumerate()
        .map(|(i, f)| udp(1000 + i as u16, *f, *f))
        .collect();
    let stay = vec![
        flow(IPPROTO_TCP, 1100, frontends[0], frontends[0]),
        udp(1101, SocketAddr::new(cip4, 54), SocketAddr::new(cip4, 54)),
        udp(1102, frontends[0], ep4),
        udp(1103, frontends[3], ep6),
        udp(1104, sa("203.0.113.21:53"), sa("203.0.113.21:53")),
        flow(IPPROTO_TCP, 1105, frontends[3], frontends[3]),
    ];
    netns.fill(&gone)?;
    netns.fill(&stay)?;
    let agent = agent_on(&netns, &["--conntrack-no-endpoint-settle=10m"]).await?;
    let all: BTreeSet<Flow> = keys(&gone).union(&keys(&stay)).copied().collect();
    assert_eq!(netns.flows()?, all, "no endpoint yet: nothing judged");

    slices(&c, &ns, "web", "dns", &["10.244.21.5"], &["fd00:244:21::5"]).await?;
    expect_table(
        &netns,
        &agent,
        TRIGGERED,
        "un-NATed UDP flows to the ClusterIPs, ExternalIPs and VIPs deleted",
        &keys(&stay),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn case2_flows_dnated_to_an_address_never_an_endpoint_go() -> anyhow::Result<()> {
    let name = "case2_flows_dnated_to_an_address_never_an_endpoint_go";
    let Some((c, ns)) = setup(name).await? else {
        return Ok(());
    };
    let svc = dual_stack_service(&c, &ns, "np", json!({"type": "NodePort"})).await?;
    let (cip4, cip6) = pair(&cluster_ips(&svc));
    let np = node_port(&svc).expect("nodePort allocated");
    slices(&c, &ns, "np", "dns", &["10.244.22.5"], &["fd00:244:22::5"]).await?;
    let netns = netns_owning("ct24-case2", &["192.168.22.7", "fd00:22::7"])?;
    let agent = agent_on(
        &netns,
        &[&format!("--conntrack-orphan-grace={}ms", GRACE.as_millis())],
    )
    .await?;

    let (node4, node6) = (
        SocketAddr::new("192.168.22.7".parse()?, np),
        SocketAddr::new("fd00:22::7".parse()?, np),
    );
    let (never4, never6) = (sa("10.244.99.9:5353"), sa("[fd00:244:99::9]:5353"));
    let gone = [
        udp(2000, node4, never4),
        udp(2001, node6, never6),
        udp(2002, SocketAddr::new(cip4, 53), never4),
        udp(2003, SocketAddr::new(cip6, 53), never6),
    ];
    let stay = [
        udp(2100, node4, sa("10.244.22.5:5353")),
        udp(2101, node6, sa("[fd00:244:22::5]:5353")),
        // Not an address of this node: a pod's flow to a remote host on that port number.
        udp(2102, SocketAddr::new("203.0.113.22".parse()?, np), never4),
        flow(IPPROTO_TCP, 2103, node4, never4),
    ];
    netns.fill(&gone)?;
    netns.fill(&stay)?;

    // The change: one more endpoint per family. Nothing was removed.
    for (fam, ips) in [
        ("ipv4", ["10.244.22.5", "10.244.22.6"]),
        ("ipv6", ["fd00:244:22::5", "fd00:244:22::6"]),
    ] {
        let api: Api<EndpointSlice> = Api::namespaced(c.client.clone(), &ns);
        api.patch(
            &format!("np-{fam}"),
            &PatchParams::default(),
            &Patch::Merge(json!({"endpoints": endpoint_list(&ips)})),
        )
        .await?;
    }
    // Never seen serving: they may be a new endpoint's that the proxy knows before our watch
    // does, so they wait the grace, then go.
    expect_table(
        &netns,
        &agent,
        TRIGGERED + GRACE,
        "flows DNATed to an address in no slice deleted after the grace",
        &keys(&stay),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn case3_a_slice_port_matching_no_service_port_leaves_the_service_without_endpoints()
-> anyhow::Result<()> {
    let name = "case3_a_slice_port_matching_no_service_port_leaves_the_service_without_endpoints";
    let Some((c, ns)) = setup(name).await? else {
        return Ok(());
    };
    let named = dual_stack_service(&c, &ns, "named", json!({})).await?;
    // Another service served by the same endpoints: its flows are not the changed service's.
    let other = dual_stack_service(&c, &ns, "other", json!({})).await?;
    let (b4, b6) = ("10.244.23.5", "fd00:244:23::5");
    slices(&c, &ns, "named", "dns", &[b4], &[b6]).await?;
    slices(&c, &ns, "other", "dns", &[b4], &[b6]).await?;
    let (n4, n6) = pair(&cluster_ips(&named));
    let (o4, o6) = pair(&cluster_ips(&other));
    let netns = NetNs::create("ct24-case3")?;
    let agent = agent_on(&netns, &["--conntrack-no-endpoint-settle=2s"]).await?;

    let (ep4, ep6) = (sa("10.244.23.5:5353"), sa("[fd00:244:23::5]:5353"));
    let (f4, f6) = (SocketAddr::new(n4, 53), SocketAddr::new(n6, 53));
    let gone = [
        udp(3000, f4, ep4),
        udp(3001, f6, ep6),
        udp(3002, f4, sa("10.244.99.9:5353")),
        udp(3003, f6, sa("[fd00:244:99::9]:5353")),
        udp(3004, f4, f4),
    ];
    let stay = [
        udp(3100, SocketAddr::new(o4, 53), ep4),
        udp(3101, SocketAddr::new(o6, 53), ep6),
        flow(IPPROTO_TCP, 3102, f4, ep4),
    ];
    netns.fill(&gone)?;
    netns.fill(&stay)?;

    // The slices' port is renamed: it matches no port of "named" any more.
    let api: Api<EndpointSlice> = Api::namespaced(c.client.clone(), &ns);
    for fam in ["ipv4", "ipv6"] {
        api.patch(
            &format!("named-{fam}"),
            &PatchParams::default(),
            &Patch::Merge(
                json!({"ports": [{"name": "dns-renamed", "port": 5353, "protocol": "UDP"}]}),
            ),
        )
        .await?;
    }
    expect_table(
        &netns,
        &agent,
        TRIGGERED + Duration::from_secs(2),
        "UDP flows of the service without endpoints deleted once settled",
        &keys(&stay),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn case4_an_unnated_flow_to_this_node_on_a_node_port_goes() -> anyhow::Result<()> {
    let name = "case4_an_unnated_flow_to_this_node_on_a_node_port_goes";
    let Some((c, ns)) = setup(name).await? else {
        return Ok(());
    };
    let svc = dual_stack_service(&c, &ns, "np4", json!({"type": "NodePort"})).await?;
    let np = node_port(&svc).expect("nodePort allocated");
    slices(&c, &ns, "np4", "dns", &["10.244.24.5"], &["fd00:244:24::5"]).await?;
    let netns = netns_owning("ct24-case4", &["192.168.24.7", "fd00:24::7"])?;
    let agent = agent_on(&netns, &[]).await?;

    let (node4, node6) = (
        SocketAddr::new("192.168.24.7".parse()?, np),
        SocketAddr::new("fd00:24::7".parse()?, np),
    );
    let gone = [udp(4000, node4, node4), udp(4001, node6, node6)];
    // 40024 is outside the nodePort range: no service's port.
    let off = SocketAddr::new(node4.ip(), 40024);
    let remote = SocketAddr::new("203.0.113.24".parse()?, np);
    let stay = [
        udp(4100, node4, sa("10.244.24.5:5353")),
        udp(4101, node6, sa("[fd00:244:24::5]:5353")),
        udp(4102, off, off),
        // Not this node's address: never judged when not DNATed.
        udp(4103, remote, remote),
        flow(IPPROTO_TCP, 4104, node4, node4),
    ];
    netns.fill(&gone)?;
    netns.fill(&stay)?;

    let api: Api<EndpointSlice> = Api::namespaced(c.client.clone(), &ns);
    api.patch(
        "np4-ipv4",
        &PatchParams::default(),
        &Patch::Merge(json!({"endpoints": endpoint_list(&["10.244.24.5", "10.244.24.6"])})),
    )
    .await?;
    expect_table(
        &netns,
        &agent,
        TRIGGERED,
        "un-NATed UDP flows to this node's nodePort deleted",
        &keys(&stay),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn case5_after_a_restart_flows_to_a_service_deleted_meanwhile_go_within_10s()
-> anyhow::Result<()> {
    let name = "case5_after_a_restart_flows_to_a_service_deleted_meanwhile_go_within_10s";
    let Some((c, ns)) = setup(name).await? else {
        return Ok(());
    };
    let old = dual_stack_service(&c, &ns, "old", json!({})).await?;
    let live = dual_stack_service(&c, &ns, "live", json!({})).await?;
    slices(
        &c,
        &ns,
        "live",
        "dns",
        &["10.244.25.6"],
        &["fd00:244:25::6"],
    )
    .await?;
    let (old4, old6) = pair(&cluster_ips(&old));
    let (live4, live6) = pair(&cluster_ips(&live));
    // Deleted while no agent runs; the apiserver releases its IPs after the Service is gone.
    let services: Api<Service> = Api::namespaced(c.client.clone(), &ns);
    services.delete("old", &DeleteParams::default()).await?;
    let addresses: Api<IPAddress> = Api::all(c.client.clone());
    for ip in [old4, old6] {
        let n = ip.to_string();
        wait_for(
            Duration::from_secs(20),
            "the old ClusterIPs released",
            || {
                let (addresses, n) = (addresses.clone(), n.clone());
                async move { Ok(addresses.get_opt(&n).await?.is_none()) }
            },
        )
        .await?;
    }

    let netns = NetNs::create("ct24-case5")?;
    let (e4, e6) = (sa("10.244.25.5:5353"), sa("[fd00:244:25::5]:5353"));
    let (o4, o6) = (SocketAddr::new(old4, 53), SocketAddr::new(old6, 53));
    let gone = [udp(5000, o4, e4), udp(5001, o6, e6)];
    let stay = [
        udp(5100, SocketAddr::new(live4, 53), sa("10.244.25.6:5353")),
        udp(
            5101,
            SocketAddr::new(live6, 53),
            sa("[fd00:244:25::6]:5353"),
        ),
        flow(IPPROTO_TCP, 5102, o4, e4),
        // Not DNATed: not a flow kube-proxy made.
        udp(5103, o4, o4),
        // Outside every ServiceCIDR.
        udp(5104, sa("10.250.0.1:53"), e4),
    ];
    netns.fill(&gone)?;
    netns.fill(&stay)?;
    let started = Instant::now();
    let agent = agent_on(&netns, &[]).await?;
    expect_table(
        &netns,
        &agent,
        Duration::from_secs(10).saturating_sub(started.elapsed()),
        "UDP flows to the released ClusterIPs deleted within 10 s of the start",
        &keys(&stay),
    )
    .await?;
    println!(
        "case 5: flows to the released ClusterIPs gone {:?} after the agent started",
        started.elapsed()
    );
    Ok(())
}

#[tokio::test]
async fn a_service_claiming_kube_dns_clusterip_does_not_cut_dns_flows() -> anyhow::Result<()> {
    let name = "a_service_claiming_kube_dns_clusterip_does_not_cut_dns_flows";
    let Some((c, ns)) = setup(name).await? else {
        return Ok(());
    };
    let dns = dual_stack_service(&c, &ns, "kube-dns", json!({})).await?;
    let (x4, x6) = pair(&cluster_ips(&dns));
    slices(
        &c,
        &ns,
        "kube-dns",
        "dns",
        &["10.244.26.5", "10.244.26.6"],
        &["fd00:244:26::5"],
    )
    .await?;
    let netns = NetNs::create("ct24-dns")?;
    let (f4, f6) = (SocketAddr::new(x4, 53), SocketAddr::new(x6, 53));
    let dns_flows = [
        udp(6000, f4, sa("10.244.26.5:5353")),
        udp(6001, f4, sa("10.244.26.6:5353")),
        udp(6002, f4, sa("10.244.26.5:5353")),
        udp(6003, f6, sa("[fd00:244:26::5]:5353")),
    ];
    netns.fill(&dns_flows)?;
    let grace = format!("--conntrack-orphan-grace={}ms", GRACE.as_millis());
    let agent = agent_on(&netns, &["--conntrack-no-endpoint-settle=1s", &grace]).await?;

    // Through the same frontend: to a backend never an endpoint (goes after the grace), to the
    // second claimant's own endpoint (stays: one claimant serves it).
    let gone = [
        udp(6100, f4, sa("10.244.99.9:5353")),
        udp(6101, f6, sa("[fd00:244:99::9]:5353")),
        udp(6102, f4, f4),
    ];
    let theirs = udp(6200, f4, sa("10.244.26.99:5353"));
    netns.fill(&gone)?;
    netns.fill(&[theirs])?;
    // Later in namespace/name order than kube-dns, both declaring its ClusterIPs as
    // ExternalIPs on 53/UDP: one without endpoints, one with an endpoint of its own.
    let x = json!({"externalIPs": [x4.to_string(), x6.to_string()]});
    dual_stack_service(&c, &ns, "zz-claims-dns", x.clone()).await?;
    dual_stack_service(&c, &ns, "zzz-claims-dns", x).await?;
    c.create(&slice(&ns, "zzz-claims-dns", "dns", &["10.244.26.99"])?)
        .await?;
    let mut want = keys(&dns_flows);
    want.insert(key(&theirs));
    expect_table(
        &netns,
        &agent,
        TRIGGERED + GRACE + Duration::from_secs(1),
        "flows through the shared frontend judged against both claimants",
        &want,
    )
    .await?;
    table_holds(
        &netns,
        &agent,
        Duration::from_secs(3),
        "DNS flows kept",
        &want,
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn an_endpointslice_recreated_cuts_no_flow_and_a_deleted_service_loses_its_flows()
-> anyhow::Result<()> {
    let name = "an_endpointslice_recreated_cuts_no_flow_and_a_deleted_service_loses_its_flows";
    let Some((c, ns)) = setup(name).await? else {
        return Ok(());
    };
    let svc = dual_stack_service(&c, &ns, "flap", json!({})).await?;
    let (c4, c6) = pair(&cluster_ips(&svc));
    let (b4, b6) = ("10.244.27.5", "fd00:244:27::5");
    slices(&c, &ns, "flap", "dns", &[b4], &[b6]).await?;
    let netns = NetNs::create("ct24-flap")?;
    let (f4, f6) = (SocketAddr::new(c4, 53), SocketAddr::new(c6, 53));
    let (ep4, ep6) = (sa("10.244.27.5:5353"), sa("[fd00:244:27::5]:5353"));
    let healthy = [
        udp(7000, f4, ep4),
        udp(7001, f4, ep4),
        udp(7002, f6, ep6),
        flow(IPPROTO_TCP, 7003, f4, ep4),
    ];
    netns.fill(&healthy)?;
    // The grace (over the 1.5 s hold below) keeps the flow to a backend never an endpoint
    // until after the flap; it must not be what the hold sees go.
    let agent = agent_on(
        &netns,
        &[
            "--conntrack-no-endpoint-settle=3s",
            "--conntrack-orphan-grace=3s",
        ],
    )
    .await?;
    let dead = udp(7100, f4, sa("10.244.99.9:5353"));
    netns.fill(&[dead])?;

    // Deleted, then re-created 1.5 s later (over the 100 ms debounce and the 1 s minimum
    // interval between triggered passes, under the 3 s settle).
    let api: Api<EndpointSlice> = Api::namespaced(c.client.clone(), &ns);
    for fam in ["ipv4", "ipv6"] {
        api.delete(&format!("flap-{fam}"), &DeleteParams::default())
            .await?;
    }
    let mut all = keys(&healthy);
    all.insert(key(&dead));
    table_holds(
        &netns,
        &agent,
        Duration::from_millis(1500),
        "nothing judged while the service has had no endpoint for less than the settle time",
        &all,
    )
    .await?;
    slices(&c, &ns, "flap", "dns", &[b4], &[b6]).await?;
    expect_table(
        &netns,
        &agent,
        TRIGGERED + Duration::from_secs(3),
        "only the flow to the dead backend deleted (after the grace: never seen serving)",
        &keys(&healthy),
    )
    .await?;
    table_holds(
        &netns,
        &agent,
        Duration::from_secs(4),
        "healthy flows kept past the settle time",
        &keys(&healthy),
    )
    .await?;

    // A deleted service is not held back: its UDP flows go at once.
    let services: Api<Service> = Api::namespaced(c.client.clone(), &ns);
    services.delete("flap", &DeleteParams::default()).await?;
    let tcp = [key(&healthy[3])].into();
    let took = expect_table(
        &netns,
        &agent,
        Duration::from_secs(3),
        "UDP flows of the deleted service deleted without a settle",
        &tcp,
    )
    .await?;
    assert!(took < Duration::from_secs(3), "{took:?}");
    Ok(())
}
