//! node-agent through control-plane outages, against a private etcd + kube-apiserver: while
//! the apiserver is away no conntrack entry is deleted (the model may be stale), `/readyz` goes
//! 503 past `--watch-stale-after` while `/healthz` stays 200; once the apiserver is back, the
//! watches are back and a removed endpoint's flows are cleaned within 5 s. Twice: a plain
//! apiserver crash and restart, then a restart after etcd was compacted (every resourceVersion
//! the agent knew is gone).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use groundskeeper_node_agent::conntrack::netlink::msg::{
    Entry, IPPROTO_TCP, IPPROTO_UDP, STATUS_ASSURED, STATUS_SEEN_REPLY,
};
use groundskeeper_node_agent::conntrack::netlink::socket::Conntrack;
use groundskeeper_node_agent::conntrack::netns::{self, NetNs};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use testkit::control_plane::Outage;
use testkit::services::{self, endpoint_list};
use testkit::{Binary, http_get, wait_for, wait_ready};

/// The bound the issue sets: acting again within 5 s of the apiserver answering.
const RECOVERY_BOUND: Duration = Duration::from_secs(5);
/// Longer than --watch-stale-after below, and long enough for the backoff to reach its cap.
const OUTAGE: Duration = Duration::from_secs(8);

/// (proto, client port, endpoint) of every IPv4 entry in the namespace.
fn flows(ns: &NetNs) -> BTreeSet<(u8, u16, SocketAddr)> {
    ns.ipv4_flows().unwrap()
}

fn add_flows(ns: &NetNs, entries: &[Entry]) {
    ns.run(|| {
        let r = Conntrack::open()
            .unwrap()
            .create(entries, 600, STATUS_SEEN_REPLY | STATUS_ASSURED)
            .unwrap();
        assert_eq!(r.ok, entries.len(), "{r:?}");
    })
    .unwrap();
}

/// A labelled sample of the agent's /metrics (0 when absent).
async fn sample(admin: SocketAddr, series: &str) -> f64 {
    let Ok((_, body)) = http_get(admin, "/metrics").await else {
        return 0.0;
    };
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn conntrack_cleanup_survives_apiserver_outages_without_acting_on_stale_state()
-> anyhow::Result<()> {
    let name = "conntrack_cleanup_survives_apiserver_outages_without_acting_on_stale_state";
    if let Some(why) = netns::unavailable() {
        testkit::skipped(name, &format!("needs root and ip netns ({why})"));
        return Ok(());
    }
    let Some((c, cp)) = testkit::private_cluster(name).await else {
        return Ok(());
    };
    let ns_name = c.namespace("recovery").await?;
    let ep = |i: u8| format!("10.244.1.{i}");
    let cluster_ip =
        services::udp_service(&c, &ns_name, "dns", &[&ep(5), &ep(6), &ep(7), &ep(8)]).await?;

    let netns = NetNs::create("recovery")?;
    let frontend = SocketAddr::new(cluster_ip, 53);
    let to = |i: u8| -> SocketAddr { format!("{}:5353", ep(i)).parse().unwrap() };
    let client = |port: u16| SocketAddr::new("10.0.0.1".parse().unwrap(), port);
    add_flows(
        &netns,
        &[
            Entry::dnat(IPPROTO_UDP, client(1000), frontend, to(5)),
            Entry::dnat(IPPROTO_UDP, client(1001), frontend, to(6)),
            Entry::dnat(IPPROTO_UDP, client(1002), frontend, to(7)),
            Entry::dnat(IPPROTO_TCP, client(1003), frontend, to(6)),
            Entry::dnat(IPPROTO_UDP, client(1004), frontend, to(8)),
        ],
    );

    let kubeconfig = cp.kubeconfig.display().to_string();
    let (agent, admin) = Binary::start_with_admin(
        env!("CARGO_BIN_EXE_node-agent"),
        "node-agent-recovery",
        &[
            "--tasks",
            "conntrack",
            "--conntrack-netns",
            &netns.name,
            // Periodic passes every 1-2 s: an ungated agent would act during the outage.
            "--conntrack-gc-min=1s",
            "--conntrack-gc-max=2s",
            "--watch-stale-after=5s",
        ],
        &[
            ("NODE_NAME", "recovery-test-node"),
            ("KUBECONFIG", &kubeconfig),
        ],
    )?;
    wait_ready(admin, Duration::from_secs(30), "node-agent ready").await?;
    agent
        .wait_for_log("conntrack cleanup pass", Duration::from_secs(10))
        .await?;
    assert_eq!(
        flows(&netns).len(),
        5,
        "every endpoint serves: nothing deleted"
    );

    // Each round removes one endpoint; its UDP flows must go within the bound.
    let mut serving = vec![ep(5), ep(6), ep(7), ep(8)];
    let mut port = 2000;
    let mut report = Vec::new();
    for (outage, removed) in [
        (Outage::Restart, 6u8),
        (Outage::RestartAfterCompaction, 7),
        (Outage::FrozenThroughCompaction, 8),
    ] {
        let up = if let Outage::FrozenThroughCompaction = outage {
            cp.restart_while_frozen(&agent, outage).await?
        } else {
            let skipped_before = sample(
                admin,
                "groundskeeper_conntrack_passes_skipped_total{reason=\"stale-model\"}",
            )
            .await;
            let deleted_before = sample(
                admin,
                "groundskeeper_conntrack_entries_deleted_total{ip_family=\"IPv4\"}",
            )
            .await;
            cp.stop_apiserver();
            let down = Instant::now();
            // Flows to an endpoint the agent's (now stale) model does not know: exactly what an
            // agent acting on a stale model would delete at its next periodic pass.
            port += 1;
            let unknown: SocketAddr = "10.244.1.99:5353".parse()?;
            add_flows(
                &netns,
                &[Entry::dnat(IPPROTO_UDP, client(port), frontend, unknown)],
            );
            let before = flows(&netns);
            cp.ride_out(outage, admin, down, OUTAGE).await?;
            assert_eq!(
                flows(&netns),
                before,
                "{outage:?}: conntrack entries deleted during the outage; log:\n{}",
                agent.logs()
            );
            assert_eq!(
                sample(
                    admin,
                    "groundskeeper_conntrack_entries_deleted_total{ip_family=\"IPv4\"}"
                )
                .await,
                deleted_before
            );
            let skipped = sample(
                admin,
                "groundskeeper_conntrack_passes_skipped_total{reason=\"stale-model\"}",
            )
            .await;
            assert!(
                skipped > skipped_before,
                "{outage:?}: no pass was skipped (periodic passes run every 1-2 s)"
            );
            let stale = sample(
                admin,
                "groundskeeper_watch_stale_seconds{watch=\"conntrack/endpointslices\"}",
            )
            .await;
            assert!(stale >= 5.0, "{outage:?}: stale gauge {stale}");

            cp.start_apiserver()?;
            Instant::now()
        };
        serving.retain(|e| *e != ep(removed));
        Api::<EndpointSlice>::namespaced(c.client.clone(), &ns_name)
            .patch(
                "dns-1",
                &PatchParams::default(),
                &Patch::Merge(json!({"endpoints": endpoint_list(&serving)})),
            )
            .await?;
        let gone = wait_for(
            RECOVERY_BOUND,
            "UDP flows to the removed endpoint deleted",
            || async {
                Ok(!flows(&netns)
                    .iter()
                    .any(|(p, _, e)| *p == IPPROTO_UDP && *e == to(removed)))
            },
        )
        .await;
        if let Err(e) = gone {
            anyhow::bail!(
                "{outage:?}: {e}; table now {:?}; agent log:\n{}",
                flows(&netns),
                agent.logs()
            );
        }
        let acted = up.elapsed();
        wait_ready(admin, RECOVERY_BOUND, "/readyz 200 after the outage").await?;
        let ready = up.elapsed();
        // Serving endpoints' flows and TCP are never touched.
        let now = flows(&netns);
        for e in &serving {
            let i: u8 = e.rsplit('.').next().unwrap().parse()?;
            assert!(
                now.iter()
                    .any(|(p, _, to_)| *p == IPPROTO_UDP && *to_ == to(i)),
                "{outage:?}: flows to serving endpoint {e} deleted: {now:?}"
            );
        }
        assert!(now.contains(&(IPPROTO_TCP, 1003, to(6))), "{now:?}");
        println!(
            "RECOVERY node-agent {outage:?}: apiserver ready -> removed endpoint cleaned in {:.2}s, /readyz 200 in {:.2}s",
            acted.as_secs_f64(),
            ready.as_secs_f64()
        );
        if let Outage::FrozenThroughCompaction = outage {
            assert!(
                agent.logs().contains("too old resource version"),
                "{outage:?}: the resumed watch was expected to get 410 Gone; log:\n{}",
                agent.logs()
            );
        }
        report.push((outage, acted));
    }
    println!("{report:?}");
    drop(agent);
    drop(c);
    drop(cp);
    Ok(())
}
