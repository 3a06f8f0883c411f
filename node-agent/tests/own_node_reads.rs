//! What the node-agent reads of the pods (a DaemonSet's reads multiply by the nodes): the sysctl task lists and watches
//! only the pods bound to its own node (`fieldSelector=spec.nodeName=<node>`) and only its own
//! Node, and the conntrack task reads no pod at all (Services, EndpointSlices, ServiceCIDRs,
//! IPAddresses, its Node). Checked on the requests themselves, against a scripted apiserver.
//! RBAC can not narrow a list by field selector, so this is what the agent asks for, not what
//! its token may read: docs/sysctl.md says what a stolen token can do.

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use groundskeeper_node_agent::{conntrack, context::Context, sysctlreport};
use groundskeeper_plumbing::{Readiness, Shutdown, process::Base, watch::cache::Shared};
use testkit::api::Mock;

const NODE: &str = "node-x";

fn context(mock: &Mock) -> Context {
    Context {
        base: Base {
            client: mock.client(),
            unretried_client: mock.client(),
            registry: prometheus::Registry::new(),
            readiness: Readiness::default(),
            dry_run: true,
            token: Shutdown::new().token(),
        },
        node_name: NODE.into(),
    }
}

/// The paths and queries of the reads made, by resource.
fn reads(mock: &Mock, path: &str) -> Vec<String> {
    mock.seen()
        .into_iter()
        .filter(|s| s.method == "GET")
        .map(|s| s.uri)
        .filter(|u| u.split('?').next() == Some(path))
        .collect()
}

#[tokio::test]
async fn the_sysctl_task_reads_only_its_nodes_pods_and_node() {
    let mock = Mock::default();
    let ctx = context(&mock);
    let (_health, changes) = sysctlreport::cache::follow_all(
        &ctx.base.readiness,
        &ctx.base.client,
        NODE,
        &Shared::default(),
    );
    // The scripted apiserver answers no list well: each is asked again after a backoff, which
    // gives a few requests of each watch.
    let _ = tokio::time::timeout(Duration::from_secs(2), changes.for_each(|_| async {})).await;
    let pods = reads(&mock, "/api/v1/pods");
    assert!(!pods.is_empty(), "the pods were read: {:?}", mock.calls());
    for uri in &pods {
        assert!(
            uri.contains(&format!("fieldSelector=spec.nodeName%3D{NODE}")),
            "a pod read not narrowed to this node: {uri}"
        );
    }
    let nodes = reads(&mock, "/api/v1/nodes");
    assert!(!nodes.is_empty());
    for uri in &nodes {
        assert!(
            uri.contains(&format!("fieldSelector=metadata.name%3D{NODE}")),
            "a Node read not narrowed to this node: {uri}"
        );
    }
}

#[tokio::test]
async fn the_conntrack_task_reads_no_pod() {
    let mock = Mock::default();
    let ctx = context(&mock);
    let (_watched, run) = conntrack::cache::start(
        &ctx,
        Duration::from_secs(60),
        Duration::from_secs(1),
        Arc::new(tokio::sync::Notify::new()),
    );
    let _ = tokio::time::timeout(Duration::from_secs(2), run).await;
    let seen: Vec<String> = mock.seen().into_iter().map(|s| s.uri).collect();
    assert!(!seen.is_empty(), "it read something");
    assert!(
        !seen.iter().any(|u| u.contains("/pods")),
        "conntrack read pods: {seen:?}"
    );
    for uri in reads(&mock, "/api/v1/nodes") {
        assert!(
            uri.contains(&format!("fieldSelector=metadata.name%3D{NODE}")),
            "a Node read not narrowed to this node: {uri}"
        );
    }
}
