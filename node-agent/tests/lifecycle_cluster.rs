//! The agent's life as the kubelet sees it, against a real apiserver: /healthz at once,
//! /readyz only after every watch listed, /metrics, and SIGTERM drains and exits 0.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::ObjectMeta;
use testkit::{Binary, http_get, wait_for, wait_ready};

#[tokio::test]
async fn ready_after_first_lists_and_sigterm_exits_zero() -> anyhow::Result<()> {
    let Some(c) = testkit::cluster("ready_after_first_lists_and_sigterm_exits_zero").await else {
        return Ok(());
    };
    // The sysctl task is ready only once the SysctlPolicy watch listed.
    c.ensure_crd(&groundskeeper_node_agent::sysctlreport::crd::crd_yaml())
        .await?;
    let node = c
        .create(&Node {
            metadata: ObjectMeta {
                name: Some(testkit::unique_name("gk-lifecycle")),
                ..Default::default()
            },
            ..Default::default()
        })
        .await?;
    let node_name = node.metadata.name.clone().unwrap();
    let (mut agent, admin) = Binary::start_with_admin(
        env!("CARGO_BIN_EXE_node-agent"),
        "node-agent-lifecycle",
        &["--tasks", "sysctl", "--dry-run"],
        &[("NODE_NAME", node_name.as_str())],
    )?;
    wait_for(Duration::from_secs(10), "/healthz", || async {
        Ok(http_get(admin, "/healthz")
            .await
            .map(|(code, _)| code == 200)
            .unwrap_or(false))
    })
    .await?;
    wait_ready(admin, Duration::from_secs(60), "/readyz 200").await?;
    let (code, metrics) = http_get(admin, "/metrics").await?;
    assert_eq!(code, 200);
    assert!(
        metrics.contains("process_resident_memory_bytes"),
        "{metrics}"
    );
    assert!(metrics.contains("groundskeeper_build_info{"), "{metrics}");
    assert!(
        metrics.contains("groundskeeper_sysctl_pods_checked_total"),
        "{metrics}"
    );
    // client-go's REST client metrics: the first lists, GETs answered 200.
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("rest_client_requests_total{code=\"200\"")
                && l.contains("method=\"GET\"")),
        "{metrics}"
    );

    agent.signal("TERM").await?;
    let start = Instant::now();
    let code = agent.wait_exit(Duration::from_secs(15)).await?;
    assert_eq!(code, Some(0), "log:\n{}", agent.logs());
    println!("node-agent exited {:?} after SIGTERM", start.elapsed());
    assert!(
        agent.logs().contains("node-agent stopped"),
        "log:\n{}",
        agent.logs()
    );
    Ok(())
}
