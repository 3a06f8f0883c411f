//! One PodGC cycle: snapshot the caches, run the four passes in upstream order (with the
//! policy passes right after upstream's threshold pass, see `policy.rs`), confirm quarantined
//! nodes gone with a live GET, apply, and summarise.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::{StreamExt, stream};
use kube::{Api, Client};

use super::{
    apply::{Applier, Tally},
    cache::Caches,
    notice::{NamespaceEvents, Reported},
    passes::{self, Pass, Snapshot},
    policy::{self, NsPolicy, Policy},
    quarantine::Quarantine,
    wire::WireNode,
};

pub struct Cycle {
    pub client: Client,
    pub applier: Applier,
    pub quarantine: Quarantine,
    pub threshold: i64,
    /// `--terminated-pod-ttl`; `None` is off.
    pub ttl: Option<Duration>,
    pub events: Arc<dyn NamespaceEvents>,
    pub reported: Reported,
}

/// What a cycle did, per pass (indexed by `Pass as usize`).
#[derive(Default, Debug)]
pub struct Summary {
    pub passes: [Tally; Pass::EVERY.len()],
    pub nodes_gone: usize,
}

impl Cycle {
    pub async fn run(&mut self, caches: &Mutex<Caches>) -> Summary {
        let snap = caches.lock().expect("podgc cache lock").snapshot();
        let mut summary = Summary::default();

        // Upstream's threshold on every terminated pod, whatever the policies say; what it
        // chose is not chosen again by the policy passes.
        let chosen = passes::terminated(&snap.pods, self.threshold);
        let taken: HashSet<Box<str>> = chosen.iter().map(|d| d.pod.uid.clone()).collect();
        summary.passes[Pass::Terminated as usize] = self.applier.apply(chosen).await;

        self.report_malformed(&snap).await;
        let namespaces: HashMap<Arc<str>, NsPolicy> = snap
            .namespaces
            .iter()
            .map(|(ns, a)| (ns.clone(), NsPolicy::parse(a)))
            .collect();
        let taken: HashSet<&str> = taken.iter().map(|u| &**u).collect();
        let (ttl, ns_threshold) = policy::policy_passes(
            &snap.pods,
            &taken,
            &Policy {
                cluster_ttl: self.ttl,
                namespaces: &namespaces,
                now: jiff::Timestamp::now(),
            },
        );
        summary.passes[Pass::Ttl as usize] = self.applier.apply(ttl).await;
        summary.passes[Pass::NamespaceThreshold as usize] = self.applier.apply(ns_threshold).await;

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

    /// Logs each malformed annotation value once, with an Event on its Namespace (not in
    /// dry-run, which writes nothing).
    async fn report_malformed(&mut self, snap: &Snapshot) {
        for (ns, annotation, value) in self.reported.fresh(&snap.namespaces) {
            tracing::warn!(
                namespace = %ns, annotation, value,
                "malformed PodGC policy annotation; that rule is suspended in this namespace until it is fixed"
            );
            if self.applier.dry_run {
                continue;
            }
            let note = format!(
                "{annotation}: {value:?} is not valid; this rule is off in the namespace until it is fixed (TTL: a duration such as 30m or 24h; threshold: a whole number)"
            );
            if let Err(e) = self.events.warn(&ns, note).await {
                tracing::warn!(namespace = %ns, error = %e, "recording the policy Event failed");
            }
        }
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
            acc.fenced += t.fenced;
            acc
        });
        let chosen = |p: Pass| {
            let t = &self.passes[p as usize];
            t.deleted + t.would_delete + t.skipped + t.failed + t.fenced
        };
        tracing::info!(
            terminated = chosen(Pass::Terminated),
            ttl = chosen(Pass::Ttl),
            namespace_threshold = chosen(Pass::NamespaceThreshold),
            out_of_service = chosen(Pass::OutOfService),
            orphaned = chosen(Pass::Orphaned),
            unscheduled = chosen(Pass::Unscheduled),
            deleted = total.deleted,
            would_delete = total.would_delete,
            skipped = total.skipped,
            failed = total.failed,
            fenced = total.fenced,
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

    /// Records the Events it is asked for.
    #[derive(Default)]
    struct Events(std::sync::Mutex<Vec<(String, String)>>);

    impl NamespaceEvents for Events {
        fn warn(
            &self,
            namespace: &str,
            note: String,
        ) -> futures::future::BoxFuture<'_, Result<(), kube::Error>> {
            self.0.lock().unwrap().push((namespace.into(), note));
            Box::pin(async { Ok(()) })
        }
    }

    fn cycle(mock: &Mock, quarantine: Duration) -> Cycle {
        Cycle {
            ttl: None,
            events: Arc::new(Events::default()),
            reported: Reported::default(),
            client: mock.client(),
            applier: Applier::new(
                mock.client(),
                Metrics::new(),
                4,
                false,
                CancellationToken::new(),
                crate::leader::Fence::unbounded(),
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

    fn terminated_pods(c: &mut Caches, pods: &[(&str, &str, &str, Option<&str>)]) {
        let mut fold = |ev| {
            let u = c.pod_update(ev).unwrap();
            c.pods.update(u);
        };
        fold(Event::Init);
        for (ns, name, phase, finished) in pods {
            let mut p = json!({
                "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}"),
                    "creationTimestamp": "2026-01-01T00:00:00Z"},
                "spec": {"nodeName": "live"},
                "status": {"phase": phase}
            });
            if let Some(f) = finished {
                p["status"]["containerStatuses"] =
                    json!([{"state": {"terminated": {"finishedAt": f}}}]);
            }
            fold(Event::InitApply(serde_json::from_value(p).unwrap()));
        }
        fold(Event::InitDone);
    }

    fn annotate(c: &mut Caches, ns: &str, annotations: serde_json::Value) {
        let meta = serde_json::from_value(json!({
            "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": {"name": ns, "annotations": annotations}
        }))
        .unwrap();
        if let Some(u) = c.namespace_update(Event::Apply(meta)) {
            c.namespaces.update(u);
        }
    }

    #[tokio::test]
    async fn ttl_deletes_only_old_finished_pods_and_malformed_is_reported_once() {
        let caches = caches(&[], &["live"]);
        {
            let mut c = caches.lock().unwrap();
            terminated_pods(
                &mut c,
                &[
                    ("ns", "old", "Succeeded", Some("2020-01-01T00:00:00Z")),
                    ("ns", "young", "Succeeded", Some("2999-01-01T00:00:00Z")),
                    ("ns", "no-end", "Failed", None),
                    ("ns", "running", "Running", Some("2020-01-01T00:00:00Z")),
                    ("bad", "old-in-bad", "Failed", Some("2020-01-01T00:00:00Z")),
                ],
            );
            annotate(
                &mut c,
                "bad",
                json!({crate::podgc::policy::TTL_ANNOTATION: "1 week"}),
            );
        }
        let mock = Mock::default();
        let events = Arc::new(Events::default());
        let mut c = cycle(&mock, Duration::from_secs(3600));
        c.ttl = Some(Duration::from_secs(3600));
        c.events = events.clone();
        let summary = c.run(&caches).await;
        assert_eq!(
            mock.calls(),
            ["DELETE /api/v1/namespaces/ns/pods/old"],
            "only the pod that finished long ago; the malformed namespace is left alone"
        );
        assert_eq!(summary.passes[Pass::Ttl as usize].deleted, 1);
        assert_eq!(c.applier.metrics.terminated_count("ttl"), 1);
        c.run(&caches).await;
        let events = events.0.lock().unwrap().clone();
        assert_eq!(events.len(), 1, "one Event for one bad value: {events:?}");
        assert_eq!(events[0].0, "bad");
        assert!(events[0].1.contains("\"1 week\""), "{}", events[0].1);
    }

    #[tokio::test]
    async fn dry_run_reports_malformed_annotations_without_an_event() {
        let caches = caches(&[], &["live"]);
        annotate(
            &mut caches.lock().unwrap(),
            "bad",
            json!({crate::podgc::policy::THRESHOLD_ANNOTATION: "-3"}),
        );
        let mock = Mock::default();
        let events = Arc::new(Events::default());
        let mut c = cycle(&mock, Duration::from_secs(3600));
        c.applier.dry_run = true;
        c.events = events.clone();
        c.run(&caches).await;
        assert!(
            events.0.lock().unwrap().is_empty(),
            "dry-run writes nothing"
        );
    }
}
