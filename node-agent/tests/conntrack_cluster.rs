//! node-agent against a real apiserver, cleaning the conntrack table of a network namespace
//! of the test's own (`--conntrack-netns`): scaling an EndpointSlice down removes the UDP
//! flows to the removed endpoint within 2 s and nothing else; a service losing every endpoint
//! or being deleted loses its UDP flows; flows DNATed to a ServiceCIDR IP that no IPAddress
//! holds go even when the service was deleted before the agent started.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use groundskeeper_node_agent::conntrack::netlink::msg::{Entry, IPPROTO_TCP, IPPROTO_UDP};
use groundskeeper_node_agent::conntrack::netns::{self, NetNs};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;
use testkit::services::{self, endpoint_list};
use testkit::{Binary, wait_for};

/// (proto, client port, endpoint) of every IPv4 entry in the namespace.
fn flows(ns: &NetNs) -> BTreeSet<(u8, u16, SocketAddr)> {
    ns.ipv4_flows().unwrap()
}

#[tokio::test]
async fn scaling_down_an_endpointslice_removes_flows_to_the_removed_endpoint() -> anyhow::Result<()>
{
    scale_down(
        "scaling_down_an_endpointslice_removes_flows_to_the_removed_endpoint",
        false,
    )
    .await
}

#[tokio::test]
async fn dry_run_logs_the_stale_flows_and_deletes_nothing() -> anyhow::Result<()> {
    scale_down("dry_run_logs_the_stale_flows_and_deletes_nothing", true).await
}

async fn scale_down(name: &str, dry_run: bool) -> anyhow::Result<()> {
    let Some((c, ns_name)) = setup(name).await? else {
        return Ok(());
    };
    let Some(cluster_ip) = udp_service(&c, &ns_name, "dns", &["10.244.1.5", "10.244.1.6"]).await?
    else {
        testkit::skipped(name, "cluster allocates IPv6 ClusterIPs");
        return Ok(());
    };

    let netns = NetNs::create("cluster")?;
    let frontend = SocketAddr::new(cluster_ip, 53);
    let (kept_ep, removed_ep): (SocketAddr, SocketAddr) =
        ("10.244.1.5:5353".parse()?, "10.244.1.6:5353".parse()?);
    netns.fill(&[
        Entry::dnat(IPPROTO_UDP, client(1000), frontend, kept_ep),
        Entry::dnat(IPPROTO_UDP, client(1001), frontend, removed_ep),
        Entry::dnat(IPPROTO_UDP, client(1002), frontend, removed_ep),
        Entry::dnat(IPPROTO_TCP, client(1003), frontend, removed_ep),
    ])?;

    let extra: &[&str] = if dry_run { &["--dry-run"] } else { &[] };
    let agent = agent_on(&netns, extra).await?;
    assert_eq!(
        flows(&netns).len(),
        4,
        "both endpoints serve: nothing deleted"
    );

    let api: Api<EndpointSlice> = Api::namespaced(c.client.clone(), &ns_name);
    api.patch(
        "dns-1",
        &PatchParams::default(),
        &Patch::Merge(json!({"endpoints": endpoint_list(&["10.244.1.5"])})),
    )
    .await?;
    if dry_run {
        agent
            .wait_for_log("dry-run: would delete", Duration::from_secs(5))
            .await?;
        assert_eq!(flows(&netns).len(), 4, "dry run deleted something");
        return Ok(());
    }
    let want = [
        (IPPROTO_UDP, 1000, kept_ep),
        (IPPROTO_TCP, 1003, removed_ep),
    ]
    .into();
    expect_table(
        &netns,
        &agent,
        Duration::from_secs(2),
        "UDP flows to the removed endpoint deleted",
        &want,
    )
    .await
}

/// The cluster and a fresh namespace, or `None` (after the skip line) when the cluster or the
/// network namespaces this file's tests need are not there.
async fn setup(name: &str) -> anyhow::Result<Option<(testkit::Cluster, String)>> {
    testkit::netns_cluster(name, "conntrack", netns::unavailable()).await
}

/// A UDP service on port 53 (ClusterIP allocated by the apiserver) with one IPv4 slice on
/// 5353 holding `endpoints`. `None` when the cluster allocates IPv6 ClusterIPs.
async fn udp_service(
    c: &testkit::Cluster,
    ns: &str,
    name: &str,
    endpoints: &[&str],
) -> anyhow::Result<Option<IpAddr>> {
    let ip = services::udp_service(c, ns, name, endpoints).await?;
    Ok(ip.is_ipv4().then_some(ip))
}

/// Starts the agent on `netns` and waits for its first pass.
async fn agent_on(netns: &NetNs, extra: &[&str]) -> anyhow::Result<Binary> {
    let bin = env!("CARGO_BIN_EXE_node-agent");
    Binary::conntrack_agent(bin, "node-agent-conntrack", &netns.name, extra).await
}

/// Waits until the namespace's IPv4 table is exactly `want`.
async fn expect_table(
    netns: &NetNs,
    agent: &Binary,
    within: Duration,
    what: &str,
    want: &BTreeSet<(u8, u16, SocketAddr)>,
) -> anyhow::Result<()> {
    let res = wait_for(within, what, || async { Ok(flows(netns) == *want) }).await;
    if let Err(e) = res {
        anyhow::bail!(
            "{e}; table now {:?}, want {want:?}; agent log:\n{}",
            flows(netns),
            agent.logs()
        );
    }
    Ok(())
}

fn client(port: u16) -> SocketAddr {
    SocketAddr::new("10.0.0.1".parse().unwrap(), port)
}

#[tokio::test]
async fn a_service_losing_every_endpoint_loses_its_udp_flows() -> anyhow::Result<()> {
    let name = "a_service_losing_every_endpoint_loses_its_udp_flows";
    let Some((c, ns_name)) = setup(name).await? else {
        return Ok(());
    };
    let Some(ip) = udp_service(&c, &ns_name, "dns", &["10.244.3.5"]).await? else {
        testkit::skipped(name, "cluster allocates IPv6 ClusterIPs");
        return Ok(());
    };
    let netns = NetNs::create("noeps")?;
    let frontend = SocketAddr::new(ip, 53);
    let ep: SocketAddr = "10.244.3.5:5353".parse()?;
    let remote: SocketAddr = "203.0.113.1:53".parse()?;
    netns.fill(&[
        Entry::dnat(IPPROTO_UDP, client(1000), frontend, ep),
        Entry::dnat(IPPROTO_UDP, client(1001), frontend, ep),
        Entry::dnat(IPPROTO_TCP, client(1002), frontend, ep),
        // Not a frontend: untouched.
        Entry::dnat(IPPROTO_UDP, client(1003), remote, remote),
    ])?;
    let agent = agent_on(&netns, &["--conntrack-no-endpoint-settle=1s"]).await?;
    assert_eq!(
        flows(&netns).len(),
        4,
        "the endpoint serves: nothing deleted"
    );

    let api: Api<EndpointSlice> = Api::namespaced(c.client.clone(), &ns_name);
    api.patch(
        "dns-1",
        &PatchParams::default(),
        &Patch::Merge(json!({"endpoints": [
            {"addresses": ["10.244.3.5"], "conditions": {"serving": false, "terminating": true}}
        ]})),
    )
    .await?;
    let want = [(IPPROTO_TCP, 1002, ep), (IPPROTO_UDP, 1003, remote)].into();
    expect_table(
        &netns,
        &agent,
        Duration::from_secs(4),
        "UDP flows of the endpoint-less service deleted, once the settle time has passed",
        &want,
    )
    .await
}

#[tokio::test]
async fn deleting_a_service_removes_its_udp_flows_not_a_neighbours() -> anyhow::Result<()> {
    let name = "deleting_a_service_removes_its_udp_flows_not_a_neighbours";
    let Some((c, ns_name)) = setup(name).await? else {
        return Ok(());
    };
    // Both services are served by the same backend IP:port.
    let Some(gone_ip) = udp_service(&c, &ns_name, "gone", &["10.244.4.5"]).await? else {
        testkit::skipped(name, "cluster allocates IPv6 ClusterIPs");
        return Ok(());
    };
    let Some(live_ip) = udp_service(&c, &ns_name, "live", &["10.244.4.5"]).await? else {
        return Ok(());
    };
    let netns = NetNs::create("deleted")?;
    let ep: SocketAddr = "10.244.4.5:5353".parse()?;
    let (gone, live) = (SocketAddr::new(gone_ip, 53), SocketAddr::new(live_ip, 53));
    netns.fill(&[
        Entry::dnat(IPPROTO_UDP, client(1000), gone, ep),
        Entry::dnat(IPPROTO_UDP, client(1001), live, ep),
        Entry::dnat(IPPROTO_TCP, client(1002), gone, ep),
    ])?;
    let agent = agent_on(&netns, &[]).await?;
    assert_eq!(
        flows(&netns).len(),
        3,
        "both services serve: nothing deleted"
    );

    let api: Api<Service> = Api::namespaced(c.client.clone(), &ns_name);
    api.delete("gone", &DeleteParams::default()).await?;
    let want = [(IPPROTO_UDP, 1001, ep), (IPPROTO_TCP, 1002, ep)].into();
    expect_table(
        &netns,
        &agent,
        Duration::from_secs(3),
        "UDP flows of the deleted service deleted",
        &want,
    )
    .await
}

#[tokio::test]
async fn flows_to_a_service_ip_deleted_before_the_agent_started_go() -> anyhow::Result<()> {
    let name = "flows_to_a_service_ip_deleted_before_the_agent_started_go";
    let Some((c, ns_name)) = setup(name).await? else {
        return Ok(());
    };
    let Some(old_ip) = udp_service(&c, &ns_name, "old", &["10.244.5.5"]).await? else {
        testkit::skipped(name, "cluster allocates IPv6 ClusterIPs");
        return Ok(());
    };
    let Some(live_ip) = udp_service(&c, &ns_name, "live", &["10.244.5.6"]).await? else {
        return Ok(());
    };
    let services: Api<Service> = Api::namespaced(c.client.clone(), &ns_name);
    services.delete("old", &DeleteParams::default()).await?;
    // The apiserver releases the IP (deletes its IPAddress) after the Service is gone.
    let addresses: Api<k8s_openapi::api::networking::v1::IPAddress> = Api::all(c.client.clone());
    let old_name = old_ip.to_string();
    wait_for(
        Duration::from_secs(20),
        "the old ClusterIP released",
        || async { Ok(addresses.get_opt(&old_name).await?.is_none()) },
    )
    .await?;
    assert!(
        addresses.get_opt(&live_ip.to_string()).await?.is_some(),
        "live IP held"
    );

    let netns = NetNs::create("orphan")?;
    let outside: SocketAddr = "10.250.0.1:53".parse()?;
    let (old, live) = (SocketAddr::new(old_ip, 53), SocketAddr::new(live_ip, 53));
    let (ep_old, ep_live): (SocketAddr, SocketAddr) =
        ("10.244.5.5:5353".parse()?, "10.244.5.6:5353".parse()?);
    netns.fill(&[
        Entry::dnat(IPPROTO_UDP, client(1000), old, ep_old),
        Entry::dnat(IPPROTO_UDP, client(1001), live, ep_live),
        Entry::dnat(IPPROTO_TCP, client(1002), old, ep_old),
        // Outside every ServiceCIDR: never judged by this rule.
        Entry::dnat(IPPROTO_UDP, client(1003), outside, ep_old),
        // Not DNATed: not a flow kube-proxy made.
        Entry::dnat(IPPROTO_UDP, client(1004), old, old),
    ])?;
    let agent = agent_on(
        &netns,
        &[
            "--conntrack-orphan-grace=1s",
            "--conntrack-gc-min=1s",
            "--conntrack-gc-max=2s",
        ],
    )
    .await?;
    let want = [
        (IPPROTO_UDP, 1001, ep_live),
        (IPPROTO_TCP, 1002, ep_old),
        (IPPROTO_UDP, 1003, ep_old),
        (IPPROTO_UDP, 1004, old),
    ]
    .into();
    expect_table(
        &netns,
        &agent,
        Duration::from_secs(15),
        "UDP flows DNATed to the released IP deleted",
        &want,
    )
    .await
}
