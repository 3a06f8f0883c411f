//! The manager's life as the kubelet sees it, against a real apiserver: /readyz only after
//! every watch listed, /metrics with the controllers' families, SIGTERM drains and exits 0.

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
    ] {
        assert!(metrics.contains(family), "{family} missing:\n{metrics}");
    }
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
