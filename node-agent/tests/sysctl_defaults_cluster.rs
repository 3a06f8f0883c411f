//! Kubelet's default pod sysctls against a real apiserver: the agent runs out of cluster as the
//! node-agent of a Node the test creates, whose kubelet reports v1.37 on a 4.14 kernel. A default
//! that kernel does not have in the pod's network namespace gets exactly one Warning Event on
//! the Node: not again when the node's policy is merged again, nor from a restarted agent.
//!
//! No sleeps decide an outcome: a merge judges the defaults before it logs the node's policy,
//! and a pod is judged only once the first merge is done.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use groundskeeper_node_agent::sysctlreport::apply::DEFAULT_UNAVAILABLE_REASON;
use groundskeeper_node_agent::sysctlreport::crd::{Mode, SysctlPolicy, SysctlPolicySpec, crd_yaml};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Api;
use kube::api::ListParams;
use testkit::{Binary, Cluster, metric, unique_name, wait_for, wait_ready};

const WAIT: Duration = Duration::from_secs(30);
const LABEL: &str = "groundskeeper.dev/sysctl-defaults-test-node";
const DEFAULTS: &str = "net.core.somaxconn=1024,net.ipv4.tcp_rmem=4096 87380 6291456";
const UNAVAILABLE: &str =
    r#"groundskeeper_sysctl_default_pod_sysctls{state="unavailable",sysctl="net.ipv4.tcp_rmem"}"#;
const APPLIED: &str =
    r#"groundskeeper_sysctl_default_pod_sysctls{state="applied",sysctl="net.core.somaxconn"}"#;
const CHECKED: &str = "groundskeeper_sysctl_pods_checked_total";

struct Agent {
    admin: SocketAddr,
    bin: Binary,
}

async fn agent(node: &str) -> anyhow::Result<Agent> {
    let args = [
        "--tasks",
        "sysctl",
        "--kernel-version",
        "4.14.0",
        "--default-pod-sysctls",
        DEFAULTS,
    ];
    let (bin, admin) = Binary::start_with_admin(
        env!("CARGO_BIN_EXE_node-agent"),
        "node-agent-sysctl-defaults",
        &args,
        &[("NODE_NAME", node)],
    )?;
    wait_ready(admin, WAIT, "node-agent /readyz")
        .await
        .map_err(|e| anyhow::anyhow!("{e}\nagent log:\n{}", bin.logs()))?;
    Ok(Agent { admin, bin })
}

/// The agent's flags about `node`, in any namespace: (type, note).
async fn flags(c: &Cluster, node: &str) -> anyhow::Result<Vec<(String, String)>> {
    Ok(Api::<Event>::all(c.client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(DEFAULT_UNAVAILABLE_REASON)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node)
                && e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("Node")
        })
        .map(|e| (e.type_.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect())
}

/// Waits until the agent has judged `n` pods: its first merge, defaults and all, is done.
async fn wait_checked(agent: &Agent, n: f64) -> anyhow::Result<()> {
    wait_for(WAIT, &format!("{n} pods checked"), || async {
        Ok(metric(agent.admin, CHECKED).await?.unwrap_or(0.0) >= n)
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nagent log:\n{}", agent.bin.logs()))?;
    Ok(())
}

#[tokio::test]
async fn a_default_the_node_can_not_apply_gets_exactly_one_warning_event() -> anyhow::Result<()> {
    let Some(c) =
        testkit::cluster("a_default_the_node_can_not_apply_gets_exactly_one_warning_event").await
    else {
        return Ok(());
    };
    c.ensure_crd(&crd_yaml()).await?;
    let node = unique_name("gk-defaults-node");
    let labels = BTreeMap::from([(LABEL.to_string(), node.clone())]);
    let mut n = testkit::webhook::node(&node, labels, Some("4.14.0"));
    let info = n.status.as_mut().and_then(|s| s.node_info.as_mut());
    info.expect("nodeInfo").kubelet_version = "v1.37.0".into();
    c.create(&n).await?;
    let ns = c.namespace("sysctl-defaults").await?;

    let a = agent(&node).await?;
    wait_for(WAIT, "the Warning Event on the Node", || async {
        Ok(!flags(&c, &node).await?.is_empty())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nagent log:\n{}", a.bin.logs()))?;
    let note = "default pod sysctl \"net.ipv4.tcp_rmem\" (kubelet defaultPodSysctls) can not be \
                applied on this node: not in the pod's Net namespace on kernel 4.14.0 (from 4.15 \
                on): kubelet fails the sandbox of every pod it applies to (pods without \
                hostNetwork)";
    let want = vec![("Warning".to_string(), note.to_string())];
    assert_eq!(flags(&c, &node).await?, want);
    assert_eq!(metric(a.admin, UNAVAILABLE).await?, Some(1.0));
    assert_eq!(metric(a.admin, APPLIED).await?, Some(1.0));

    // A policy selecting the node: merged again (the defaults judged again first), not flagged
    // again.
    let policy = unique_name("gk-defaults");
    c.create(&SysctlPolicy::new(
        &policy,
        SysctlPolicySpec {
            allowed_unsafe_sysctls: vec!["net.core.*".into()],
            node_selector: Some(LabelSelector {
                match_labels: Some([(LABEL.to_string(), node.clone())].into()),
                ..Default::default()
            }),
            mode: Mode::Audit,
        },
    ))
    .await?;
    wait_for(
        WAIT,
        "the node policy with the new SysctlPolicy",
        || async {
            Ok(a.bin
                .logs()
                .lines()
                .any(|l| l.contains("sysctl policy for this node") && l.contains(&policy)))
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nagent log:\n{}", a.bin.logs()))?;
    assert_eq!(
        flags(&c, &node).await?,
        want,
        "not flagged again on a merge"
    );

    // A restarted agent finds the Event it would create: still one.
    drop(a);
    let a = agent(&node).await?;
    let pod = unique_name("after-restart");
    c.create(&testkit::bound_pod(&ns, &pod, &node)).await?;
    wait_checked(&a, 1.0).await?;
    assert_eq!(metric(a.admin, UNAVAILABLE).await?, Some(1.0));
    assert_eq!(
        flags(&c, &node).await?,
        want,
        "not flagged again by a restart"
    );
    a.bin.assert_no_api_refusals();
    assert!(
        !a.bin
            .logs()
            .contains("flagging the default pod sysctl on the Node failed"),
        "{}",
        a.bin.logs()
    );
    Ok(())
}
