//! The manager's life as the kubelet sees it, against a real apiserver: /readyz only after
//! every watch listed, /metrics with the controllers' families (the ServiceCIDR queue's under
//! upstream's `workqueue_*` names, client-go's leader and REST client metrics), SIGTERM drains
//! and exits 0.

use std::time::{Duration, Instant};

use testkit::{Binary, http_get, wait_ready};

#[tokio::test]
async fn ready_after_first_lists_and_sigterm_exits_zero() -> anyhow::Result<()> {
    let Some(_c) = testkit::cluster("ready_after_first_lists_and_sigterm_exits_zero").await else {
        return Ok(());
    };
    let (mut manager, admin) = Binary::start_with_admin(
        env!("CARGO_BIN_EXE_controller-manager"),
        "controller-manager-lifecycle",
        // Dry run: this test shares the cluster with others and must change nothing.
        &["--leader-elect=false", "--dry-run"],
        &[],
    )?;
    wait_ready(admin, Duration::from_secs(120), "/readyz 200").await?;
    let (_, metrics) = http_get(admin, "/metrics").await?;
    for family in [
        "groundskeeper_leader_election_is_leader",
        "process_resident_memory_bytes",
        "groundskeeper_build_info{",
        "workqueue_depth{name=\"ipaddresses\"}",
        "workqueue_longest_running_processor_seconds{name=\"ipaddresses\"}",
        // client-go's, for the dashboards built for kube-controller-manager: the election off,
        // this one replica leads under the Lease's name.
        "leader_election_master_status{name=\"groundskeeper-controller-manager\"} 1",
    ] {
        assert!(metrics.contains(family), "{family} missing:\n{metrics}");
    }
    // Every request to the apiserver, counted as client-go counts it: the first lists are GETs
    // answered 200, timed by verb.
    let host = |l: &str| l.contains("host=\"") && !l.contains("host=\"none\"");
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("rest_client_requests_total{code=\"200\"")
                && l.contains("method=\"GET\"")
                && host(l)),
        "no rest_client_requests_total for the first lists:\n{metrics}"
    );
    assert!(
        metrics.lines().any(
            |l| l.starts_with("rest_client_request_duration_seconds_count{")
                && l.contains("verb=\"GET\"")
        ),
        "no rest_client_request_duration_seconds:\n{metrics}"
    );
    // The apiserver's default ServiceCIDR, queued on every replica from the first list on
    // (upstream's queue name, for kube-controller-manager's dashboards).
    let adds = metrics
        .lines()
        .find_map(|l| l.strip_prefix("workqueue_adds_total{name=\"ipaddresses\"} "))
        .and_then(|v| v.parse::<f64>().ok());
    assert!(
        adds.is_some_and(|n| n >= 1.0),
        "workqueue_adds_total{{name=\"ipaddresses\"}} is {adds:?}:\n{metrics}"
    );
    manager.signal("TERM").await?;
    let start = Instant::now();
    let code = manager.wait_exit(Duration::from_secs(30)).await?;
    assert_eq!(code, Some(0), "log:\n{}", manager.logs());
    println!(
        "controller-manager exited {:?} after SIGTERM",
        start.elapsed()
    );
    Ok(())
}
