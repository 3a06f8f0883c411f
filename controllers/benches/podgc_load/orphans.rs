//! The orphan rows: the force-delete rate of orphaned pods, each PodGC on node sets of its own,
//! measured from the bench's own watch on the pods the same way for both.

use std::time::{Duration, Instant};

use std::collections::HashSet;

use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams, WatchEvent, WatchParams},
};

/// Deletes `nodes`, then measures the orphan force-delete rate from the first delete to the
/// last, as the bench's own watch on the namespace sees the DELETED events of the pods bound
/// to them: the same measure for our PodGC and for kube-controller-manager's.
pub(crate) async fn orphan_rate(
    client: &Client,
    ns: &str,
    nodes: &[String],
    pods_expected: usize,
) -> anyhow::Result<Orphans> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut rv = pods
        .list_metadata(&ListParams::default().limit(1))
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let gone: HashSet<&str> = nodes.iter().map(String::as_str).collect();
    let api: Api<Node> = Api::all(client.clone());
    let deleted_nodes = Instant::now();
    stream::iter(nodes)
        .map(|n| {
            let api = api.clone();
            async move { api.delete(n, &DeleteParams::default()).await.map(|_| ()) }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await?;
    let (mut first, mut last, mut seen) = (None, None, 0usize);
    let deadline = Instant::now() + Duration::from_secs(1800);
    while seen < pods_expected {
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {seen} of {pods_expected} orphans deleted after 30 min"
        );
        let wp = WatchParams::default().timeout(60);
        let mut events = pods.watch(&wp, &rv).await?.boxed();
        while let Some(ev) = events.try_next().await? {
            match ev {
                WatchEvent::Deleted(p) => {
                    rv = p.metadata.resource_version.clone().unwrap_or(rv);
                    let node = p.spec.as_ref().and_then(|s| s.node_name.as_deref());
                    if node.is_some_and(|n| gone.contains(n)) {
                        let now = Instant::now();
                        first.get_or_insert(now);
                        last = Some(now);
                        seen += 1;
                        if seen == pods_expected {
                            break;
                        }
                    }
                }
                WatchEvent::Added(p) | WatchEvent::Modified(p) => {
                    rv = p.metadata.resource_version.unwrap_or(rv);
                }
                WatchEvent::Bookmark(b) => rv = b.metadata.resource_version,
                WatchEvent::Error(e) => anyhow::bail!("watching the orphans: {e:?}"),
            }
        }
    }
    let (first, last) = (first.expect("seen"), last.expect("seen"));
    Ok(Orphans {
        pods: pods_expected,
        to_first: first - deleted_nodes,
        per_s: (pods_expected - 1) as f64 / (last - first).as_secs_f64().max(1e-3),
    })
}

pub(crate) struct Orphans {
    pub(crate) pods: usize,
    /// From the nodes' deletion to the first orphan's.
    pub(crate) to_first: Duration,
    /// Deletes per second from the first to the last.
    pub(crate) per_s: f64,
}

/// What a bare client asks of the apiserver for each orphan.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Calls {
    /// The force delete alone: the most orphans the apiserver lets go when nothing else is
    /// asked of it.
    DeleteOnly,
    /// What a PodGC asks, upstream's and ours alike: the status patch (phase Failed, the
    /// DisruptionTarget condition, the pod's UID as precondition), then the force delete.
    PatchThenDelete,
}

/// The apiserver's own limit: a bare client that force-deletes the pods bound to `nodes`
/// (listed by field selector once the nodes are gone), `concurrency` pods at a time and with no
/// client-side rate limit, making `calls` for each, measured by the same watch as the PodGCs.
/// With [`Calls::DeleteOnly`] it is the ceiling for deletes; with [`Calls::PatchThenDelete`]
/// the ceiling for the work a PodGC must do.
pub(crate) async fn raw_rate(
    client: &Client,
    ns: &str,
    nodes: &[String],
    per_node: usize,
    concurrency: usize,
    calls: Calls,
) -> anyhow::Result<Orphans> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let deleter = {
        let (pods, nodes) = (pods.clone(), nodes.to_vec());
        tokio::spawn(async move {
            // Give the watch below its start, as PodGC's quarantine gives it to the others.
            tokio::time::sleep(Duration::from_secs(2)).await;
            let mut names = Vec::with_capacity(nodes.len() * per_node);
            for n in &nodes {
                // From the watch cache, by its node-name index: a consistent list with a field
                // selector reads every pod from etcd, seconds a node at this size, and the
                // bench's own bookkeeping is not what is measured.
                let lp = ListParams::default()
                    .fields(&format!("spec.nodeName={n}"))
                    .match_any();
                for p in pods.list_metadata(&lp).await? {
                    if let (Some(name), Some(uid)) = (p.metadata.name, p.metadata.uid) {
                        names.push((name, uid));
                    }
                }
            }
            let force = DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            };
            stream::iter(names)
                .map(|(name, uid)| {
                    let (pods, force) = (pods.clone(), force.clone());
                    async move {
                        if let Calls::PatchThenDelete = calls {
                            let patch = disruption_patch(&uid);
                            pods.patch_status(
                                &name,
                                &PatchParams::default(),
                                &Patch::Strategic(patch),
                            )
                            .await?;
                        }
                        pods.delete(&name, &force).await.map(|_| ())
                    }
                })
                .buffer_unordered(concurrency)
                .try_collect::<Vec<_>>()
                .await?;
            anyhow::Ok(())
        })
    };
    let o = orphan_rate(client, ns, nodes, nodes.len() * per_node).await?;
    deleter.await??;
    Ok(o)
}

/// The status patch a PodGC makes of an orphan before deleting it (`podgc::apply::status_patch`).
fn disruption_patch(uid: &str) -> serde_json::Value {
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    serde_json::json!({
        "metadata": {"uid": uid},
        "status": {
            "phase": "Failed",
            "conditions": [{
                "type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC",
                "message": "PodGC: node no longer exists", "lastTransitionTime": now,
            }],
        },
    })
}

/// The two PodGCs on the same objects, one after the other: node sets of the same size, each
/// PodGC's own, so neither deletes the other's orphans.
pub(crate) struct OrphanRow<'a> {
    pub(crate) client: &'a Client,
    pub(crate) ns: &'a str,
    pub(crate) per_node: usize,
}

impl OrphanRow<'_> {
    pub(crate) async fn measure(
        &self,
        who: &str,
        qps: &str,
        nodes: &[String],
    ) -> anyhow::Result<f64> {
        let o = orphan_rate(self.client, self.ns, nodes, nodes.len() * self.per_node).await?;
        println!(
            "{who} at {qps}: {} orphans of {} deleted nodes, {:.1} pods/s from the first delete to the last (first {:.1}s after the nodes went)",
            o.pods,
            nodes.len(),
            o.per_s,
            o.to_first.as_secs_f64()
        );
        Ok(o.per_s)
    }
}
