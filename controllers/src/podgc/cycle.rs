//! One PodGC cycle: snapshot the caches, run the four passes in upstream order, confirm
//! quarantined nodes gone with a live GET, apply, and summarise.

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
    time::Instant,
};

use futures::{StreamExt, stream};
use kube::{Api, Client};

use super::{
    apply::{Applier, Tally},
    cache::Caches,
    passes::{self, Pass},
    quarantine::Quarantine,
    wire::WireNode,
};

pub struct Cycle {
    pub client: Client,
    pub applier: Applier,
    pub quarantine: Quarantine,
    pub threshold: i64,
}

/// What a cycle did, per pass in upstream order.
#[derive(Default, Debug)]
pub struct Summary {
    pub passes: [Tally; 4],
    pub nodes_gone: usize,
}

impl Cycle {
    pub async fn run(&mut self, caches: &Mutex<Caches>) -> Summary {
        let snap = caches.lock().expect("podgc cache lock").snapshot();
        let mut summary = Summary::default();

        let chosen = passes::terminated(&snap.pods, self.threshold);
        summary.passes[0] = self.applier.apply(chosen).await;

        let chosen = passes::out_of_service(&snap);
        summary.passes[1] = self.applier.apply(chosen).await;

        let now = Instant::now();
        for node in passes::missing_nodes(&snap) {
            if self.quarantine.observe(&node, now) {
                tracing::info!(node = %node, quarantine = ?self.quarantine.delay(), "pods are bound to a node missing from the cache; quarantined before a live check");
            }
        }
        let in_cache: HashSet<&str> = snap.nodes.keys().map(|n| &**n).collect();
        let due = self.quarantine.take_due(now, &in_cache);
        let gone = self.confirm_gone(due).await;
        summary.nodes_gone = gone.len();
        let chosen = passes::orphaned(&snap.pods, &gone);
        summary.passes[2] = self.applier.apply(chosen).await;

        let chosen = passes::unscheduled(&snap.pods);
        summary.passes[3] = self.applier.apply(chosen).await;
        summary
    }

    /// Live GET of each quarantined node: only NotFound counts as gone. Other errors and nodes
    /// that exist after all are left alone; still missing next cycle, they are quarantined again.
    async fn confirm_gone(&self, due: Vec<Arc<str>>) -> HashSet<Arc<str>> {
        let api: Api<WireNode> = Api::all(self.client.clone());
        let api = &api;
        stream::iter(due)
            .map(|node| async move {
                match api.get(&node).await {
                    Err(kube::Error::Api(s)) if s.code == 404 => {
                        tracing::info!(node = %node, "node confirmed deleted after quarantine");
                        Some(node)
                    }
                    Err(e) => {
                        tracing::warn!(node = %node, error = %e, "checking quarantined node failed; not treating it as deleted");
                        None
                    }
                    Ok(_) => {
                        tracing::info!(node = %node, "quarantined node still exists; its pods are kept");
                        None
                    }
                }
            })
            .buffer_unordered(self.applier.concurrency.max(1))
            .filter_map(|n| async { n })
            .collect()
            .await
    }
}

impl Summary {
    pub fn is_empty(&self) -> bool {
        self.nodes_gone == 0 && self.passes.iter().all(Tally::is_empty)
    }

    pub fn log(&self, quarantined: usize, seconds: f64) {
        if self.is_empty() {
            tracing::debug!(quarantined, seconds, "podgc cycle: nothing to do");
            return;
        }
        let total = self.passes.iter().fold(Tally::default(), |mut acc, t| {
            acc.deleted += t.deleted;
            acc.would_delete += t.would_delete;
            acc.skipped += t.skipped;
            acc.failed += t.failed;
            acc
        });
        let chosen = |p: Pass| {
            let t = &self.passes[p as usize];
            t.deleted + t.would_delete + t.skipped + t.failed
        };
        tracing::info!(
            terminated = chosen(Pass::Terminated),
            out_of_service = chosen(Pass::OutOfService),
            orphaned = chosen(Pass::Orphaned),
            unscheduled = chosen(Pass::Unscheduled),
            deleted = total.deleted,
            would_delete = total.would_delete,
            skipped = total.skipped,
            failed = total.failed,
            nodes_gone = self.nodes_gone,
            quarantined,
            seconds,
            "podgc cycle"
        );
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use kube::runtime::watcher::Event;
    use serde_json::json;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::podgc::{metrics::Metrics, mock_api::Mock, wire::WirePod};

    fn caches(pods: &[(&str, &str)], nodes: &[&str]) -> Mutex<Caches> {
        let mut c = Caches::default();
        let mut fold_pod = |ev| {
            let u = c.pod_update(ev).unwrap();
            c.pods.update(u);
        };
        fold_pod(Event::Init);
        for (name, node) in pods {
            let p: WirePod = serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                    "generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z"},
                "spec": {"nodeName": node},
                "status": {"phase": "Running"}
            }))
            .unwrap();
            fold_pod(Event::InitApply(p));
        }
        fold_pod(Event::InitDone);
        let mut fold_node = |ev| {
            let u = c.node_update(ev).unwrap();
            c.nodes.update(u);
        };
        fold_node(Event::Init);
        for n in nodes {
            let node = serde_json::from_value(json!({"metadata": {"name": n}})).unwrap();
            fold_node(Event::InitApply(node));
        }
        fold_node(Event::InitDone);
        Mutex::new(c)
    }

    fn cycle(mock: &Mock, quarantine: Duration) -> Cycle {
        Cycle {
            client: mock.client(),
            applier: Applier::new(
                mock.client(),
                Metrics::new(),
                4,
                false,
                CancellationToken::new(),
            ),
            quarantine: Quarantine::new(quarantine),
            threshold: 12500,
        }
    }

    #[tokio::test]
    async fn only_a_not_found_node_orphans_its_pods() {
        let caches = caches(
            &[
                ("on-gone", "gone"),
                ("on-erroring", "erroring"),
                ("on-still-there", "still-there"),
                ("on-live", "live"),
            ],
            &["live"],
        );
        let mock = Mock::default()
            .route("GET /api/v1/nodes/gone", 404)
            .route("GET /api/v1/nodes/erroring", 500)
            .route("GET /api/v1/nodes/still-there", 200);
        let mut c = cycle(&mock, Duration::ZERO);
        let summary = c.run(&caches).await;
        let mut calls = mock.calls();
        calls.sort();
        assert_eq!(
            calls,
            [
                "DELETE /api/v1/namespaces/ns/pods/on-gone",
                "GET /api/v1/nodes/erroring",
                "GET /api/v1/nodes/gone",
                "GET /api/v1/nodes/still-there",
                "PATCH /api/v1/namespaces/ns/pods/on-gone/status",
            ]
        );
        assert_eq!(summary.nodes_gone, 1);
        assert_eq!(summary.passes[Pass::Orphaned as usize].deleted, 1);
        assert_eq!(
            c.applier.metrics.counts("ns", Pass::Orphaned),
            (1, 0),
            "counted once, no error"
        );
    }

    #[tokio::test]
    async fn nothing_is_checked_or_deleted_during_quarantine() {
        let caches = caches(&[("on-gone", "gone")], &[]);
        let mock = Mock::default().route("GET /api/v1/nodes/gone", 404);
        let mut c = cycle(&mock, Duration::from_secs(3600));
        let summary = c.run(&caches).await;
        assert!(mock.calls().is_empty(), "{:?}", mock.calls());
        assert!(summary.is_empty());
        assert_eq!(c.quarantine.len(), 1);
    }
}
