//! The conntrack fill Event against a real apiserver, as the node-agent's ServiceAccount bound
//! to exactly `node-agent/rbac.yaml`: one Warning Event on the Node per crossing of the
//! threshold (a repeat within minutes counts in the Event's series), none while it stays above
//! or hovers within the hysteresis, none in dry-run.

use std::path::PathBuf;
use std::time::Duration;

use groundskeeper_node_agent::conntrack::pass::fill::{Fill, Notifier, Outcome, REASON};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use kube::api::{ListParams, ObjectMeta};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use testkit::{unique_name, wait_for};

fn fill(percent: u32) -> Fill {
    Fill {
        count: f64::from(percent) * 1000.0,
        max: 100_000.0,
    }
}

/// Events about `node` with the fill reason, in any namespace (filtered here: the field
/// selectors events.k8s.io supports differ between versions).
async fn node_events(c: &Client, node: &str) -> anyhow::Result<Vec<Event>> {
    Ok(Api::<Event>::all(c.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(REASON)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node)
        })
        .collect())
}

#[tokio::test]
async fn one_node_event_per_crossing() -> anyhow::Result<()> {
    let Some(c) = testkit::cluster("one_node_event_per_crossing").await else {
        return Ok(());
    };
    let ns = c.namespace("fill").await?;
    let rules = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("rbac.yaml");
    let kubeconfig = c.as_service_account(&ns, &rules).await?;
    let config = Config::from_custom_kubeconfig(
        Kubeconfig::read_from(&kubeconfig)?,
        &KubeConfigOptions::default(),
    )
    .await?;
    let agent_client = Client::try_from(config)?;
    let mut names = Vec::new();
    for _ in 0..2 {
        let n = c
            .create(&Node {
                metadata: ObjectMeta {
                    name: Some(unique_name("gk-fill")),
                    ..Default::default()
                },
                ..Default::default()
            })
            .await?;
        names.push(n.metadata.name.unwrap());
    }
    let (node, dry_node) = (&names[0], &names[1]);

    let mut n = Notifier::new(agent_client.clone(), node, false);
    // Crossing, still above, hovering within the hysteresis, drained, crossing again.
    let mut outcomes = Vec::new();
    for percent in [50, 85, 95, 78, 83, 60, 90] {
        outcomes.push(n.observe(fill(percent)).await);
    }
    use Outcome::*;
    assert_eq!(
        outcomes,
        [Quiet, Recorded, Quiet, Quiet, Quiet, Quiet, Recorded]
    );
    let mut dry = Notifier::new(agent_client, dry_node, true);
    assert_eq!(dry.observe(fill(99)).await, DryRun);

    // Two crossings within minutes are one Event whose series counts 2: the Recorder
    // aggregates repeats of an Event (same reason, action and object) as kubelet's do.
    wait_for(
        Duration::from_secs(10),
        "the fill Event's series of 2",
        || async {
            Ok(node_events(&c.client, node)
                .await?
                .iter()
                .any(|e| e.series.as_ref().is_some_and(|s| s.count == 2)))
        },
    )
    .await?;
    let events = node_events(&c.client, node).await?;
    assert_eq!(events.len(), 1, "{events:?}");
    let e = &events[0];
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    assert_eq!(
        e.regarding.as_ref().and_then(|r| r.kind.as_deref()),
        Some("Node")
    );
    let note = e.note.as_deref().unwrap_or_default();
    assert!(
        note.starts_with("conntrack table is 85% full (85000 of 100000 entries)"),
        "{note}"
    );
    // Nothing more arrives, and dry-run wrote nothing.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(node_events(&c.client, node).await?.len(), 1);
    assert!(node_events(&c.client, dry_node).await?.is_empty());
    Ok(())
}
