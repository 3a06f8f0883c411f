//! node-agent against a real apiserver, cleaning the conntrack table of a network namespace
//! of the test's own (`--conntrack-netns`): scaling an EndpointSlice down removes the UDP
//! flows to the removed endpoint within 2 s and nothing else.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use groundskeeper_node_agent::conntrack::msg::{
    AF_INET, Entry, IPPROTO_TCP, IPPROTO_UDP, STATUS_ASSURED, STATUS_SEEN_REPLY,
};
use groundskeeper_node_agent::conntrack::netns::{self, NetNs};
use groundskeeper_node_agent::conntrack::socket::Conntrack;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use testkit::{Binary, free_addr, http_get, wait_for};

/// (proto, client port, endpoint) of every IPv4 entry in the namespace.
fn flows(ns: &NetNs) -> BTreeSet<(u8, u16, SocketAddr)> {
    ns.run(|| {
        let mut ct = Conntrack::open().unwrap();
        let mut out = BTreeSet::new();
        ct.dump(AF_INET, None, &mut |e| {
            out.insert((
                e.orig.proto,
                e.orig.src_port,
                SocketAddr::new(e.reply.src, e.reply.src_port),
            ));
        })
        .unwrap();
        out
    })
    .unwrap()
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
    let Some(c) = testkit::cluster(name).await else {
        return Ok(());
    };
    if let Some(why) = netns::unavailable() {
        testkit::skipped(name, &format!("needs root and ip netns ({why})"));
        return Ok(());
    }
    let ns_name = c.namespace("conntrack").await?;
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"namespace": ns_name, "name": "dns"},
        "spec": {"ports": [{"name": "dns", "port": 53, "protocol": "UDP"}]},
    }))?;
    let svc = c.create(&svc).await?;
    let cluster_ip: IpAddr = svc
        .spec
        .and_then(|s| s.cluster_ip)
        .ok_or_else(|| anyhow::anyhow!("no clusterIP allocated"))?
        .parse()?;
    if !cluster_ip.is_ipv4() {
        testkit::skipped(name, "cluster allocates IPv6 ClusterIPs");
        return Ok(());
    }
    let endpoints = |ips: &[&str]| -> serde_json::Value {
        ips.iter().map(|ip| json!({"addresses": [ip]})).collect()
    };
    let slice: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"namespace": ns_name, "name": "dns-1",
                     "labels": {"kubernetes.io/service-name": "dns"}},
        "addressType": "IPv4",
        "ports": [{"name": "dns", "port": 5353, "protocol": "UDP"}],
        "endpoints": endpoints(&["10.244.1.5", "10.244.1.6"]),
    }))?;
    c.create(&slice).await?;

    let netns = NetNs::create("cluster")?;
    let frontend = SocketAddr::new(cluster_ip, 53);
    let (kept_ep, removed_ep): (SocketAddr, SocketAddr) =
        ("10.244.1.5:5353".parse()?, "10.244.1.6:5353".parse()?);
    let client = |port: u16| SocketAddr::new("10.0.0.1".parse().unwrap(), port);
    let entries = vec![
        Entry::dnat(IPPROTO_UDP, client(1000), frontend, kept_ep),
        Entry::dnat(IPPROTO_UDP, client(1001), frontend, removed_ep),
        Entry::dnat(IPPROTO_UDP, client(1002), frontend, removed_ep),
        Entry::dnat(IPPROTO_TCP, client(1003), frontend, removed_ep),
    ];
    netns.run(|| {
        let r = Conntrack::open()
            .unwrap()
            .create(&entries, 600, STATUS_SEEN_REPLY | STATUS_ASSURED)
            .unwrap();
        assert_eq!(r.ok, entries.len(), "{r:?}");
    })?;

    let admin = free_addr();
    let admin_s = admin.to_string();
    let mut args = vec![
        "--admin-addr",
        &admin_s,
        "--tasks",
        "conntrack",
        "--conntrack-netns",
        &netns.name,
    ];
    if dry_run {
        args.push("--dry-run");
    }
    let agent = Binary::start(
        env!("CARGO_BIN_EXE_node-agent"),
        "node-agent-conntrack",
        &args,
        &[("NODE_NAME", "conntrack-test-node")],
    )?;
    wait_for(Duration::from_secs(30), "node-agent ready", || async {
        Ok(matches!(http_get(admin, "/readyz").await, Ok((200, _))))
    })
    .await?;
    agent
        .wait_for_log("conntrack cleanup pass", Duration::from_secs(10))
        .await?;
    assert_eq!(
        flows(&netns).len(),
        4,
        "both endpoints serve: nothing deleted"
    );

    let api: Api<EndpointSlice> = Api::namespaced(c.client.clone(), &ns_name);
    api.patch(
        "dns-1",
        &PatchParams::default(),
        &Patch::Merge(json!({"endpoints": endpoints(&["10.244.1.5"])})),
    )
    .await?;
    if dry_run {
        agent
            .wait_for_log("dry run: would delete", Duration::from_secs(5))
            .await?;
        assert_eq!(flows(&netns).len(), 4, "dry run deleted something");
        return Ok(());
    }
    let want: BTreeSet<(u8, u16, SocketAddr)> = [
        (IPPROTO_UDP, 1000, kept_ep),
        (IPPROTO_TCP, 1003, removed_ep),
    ]
    .into();
    let res = wait_for(
        Duration::from_secs(2),
        "UDP flows to the removed endpoint deleted",
        || async { Ok(flows(&netns) == want) },
    )
    .await;
    if let Err(e) = res {
        anyhow::bail!(
            "{e}; table now {:?}; agent log:\n{}",
            flows(&netns),
            agent.logs()
        );
    }
    Ok(())
}
