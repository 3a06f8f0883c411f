//! One PodGC cycle: snapshot, passes, live node checks, deletes, summary.
//!
//! Snapshot the caches, run the four passes in upstream order (with the policy passes right
//! after upstream's threshold pass, see `policy.rs`) or, in `--pod-gc-mode=ttl-only`, the
//! policy passes alone, confirm quarantined nodes gone with a live GET, apply, and summarise.

use std::{
    collections::{HashMap, HashSet},
    fmt,
    sync::Arc,
    time::{Duration, Instant},
};

use futures::{StreamExt, stream};
use groundskeeper_plumbing::{events::Events, logging::klog::KObj, watch::cache::Shared};
use kube::{Api, Client};

use super::{
    apply::{Applier, Tally},
    cache::Caches,
    decide::{self, Mode, Snapshot, Sweep},
    facts::Uid,
    notice::{Reported, invalid_policy},
    policy::{self, NsPolicy, Policy},
    quarantine::Quarantine,
    wire::WireNode,
};

pub struct Cycle {
    pub client: Client,
    pub applier: Applier,
    pub quarantine: Quarantine,
    /// Which sweeps run (`--pod-gc-mode`).
    pub mode: Mode,
    pub threshold: i64,
    /// `--terminated-pod-ttl`; `None` is off.
    pub ttl: Option<Duration>,
    pub reported: Reported,
    /// The policy Events (fenced like the deletes; only logged in dry-run).
    pub events: Events,
}

/// What a cycle did, per pass (indexed by `Sweep as usize`).
#[derive(Default, Debug)]
pub struct Summary {
    pub passes: [Tally; Sweep::EVERY.len()],
    pub nodes_gone: usize,
}

impl Cycle {
    pub async fn run(&mut self, caches: &Shared<Caches>) -> Summary {
        let snap = caches.lock().snapshot();
        let mut summary = Summary::default();
        let held = snap.pods.iter().filter(|p| p.force_deleted).count();
        self.applier.metrics.finalizer_held.set(held as i64);

        // Upstream's threshold on every terminated pod, whatever the policies say; what it
        // chose is not chosen again by the policy passes.
        let chosen = if self.mode.runs(Sweep::Terminated) {
            decide::terminated(&snap.pods, self.threshold)
        } else {
            Vec::new()
        };
        let taken: HashSet<Uid> = chosen.iter().map(|d| d.pod.uid.clone()).collect();
        summary.passes[Sweep::Terminated as usize] = self.applier.apply(chosen).await;

        self.report_malformed(&snap).await;
        let namespaces: HashMap<Arc<str>, NsPolicy> = snap
            .namespaces
            .iter()
            .map(|(ns, a)| (ns.clone(), NsPolicy::parse(a)))
            .collect();
        let taken: HashSet<&Uid> = taken.iter().collect();
        let (ttl, ns_threshold) = policy::policy_passes(
            &snap.pods,
            &taken,
            &Policy {
                cluster_ttl: self.ttl,
                namespaces: &namespaces,
                now: jiff::Timestamp::now(),
                local_now: Instant::now(),
            },
        );
        let first_listed = ttl.iter().filter(|d| d.pod.seen_final().is_none()).count();
        self.applier
            .metrics
            .ttl_first_listed
            .inc_by(first_listed as u64);
        summary.passes[Sweep::Ttl as usize] = self.applier.apply(ttl).await;
        summary.passes[Sweep::NamespaceThreshold as usize] = self.applier.apply(ns_threshold).await;

        if self.mode.runs(Sweep::OutOfService) {
            let chosen = decide::out_of_service(&snap);
            summary.passes[Sweep::OutOfService as usize] = self.applier.apply(chosen).await;
        }
        if self.mode.runs(Sweep::Orphaned) {
            summary.nodes_gone = self.orphans(&snap, &mut summary).await;
        }
        if self.mode.runs(Sweep::Unscheduled) {
            let chosen = decide::unscheduled(&snap.pods);
            summary.passes[Sweep::Unscheduled as usize] = self.applier.apply(chosen).await;
        }
        summary
    }

    /// The orphan sweep: quarantine the nodes missing from the cache, confirm the due ones gone
    /// with a live GET, delete their pods; how many nodes were confirmed gone.
    async fn orphans(&mut self, snap: &Snapshot, summary: &mut Summary) -> usize {
        let now = Instant::now();
        for node in decide::missing_nodes(snap) {
            if self.quarantine.observe(&node, now) {
                tracing::info!(node = KObj::cluster(&node).field(), quarantine = ?self.quarantine.delay(), "pods are bound to a node missing from the cache; quarantined before a live check");
            }
        }
        let in_cache: HashSet<&str> = snap.nodes.keys().map(|n| &**n).collect();
        let due = self.quarantine.take_due(now, &in_cache);
        let gone = self.confirm_gone(due).await;
        let chosen = decide::orphaned(&snap.pods, &gone);
        summary.passes[Sweep::Orphaned as usize] = self.applier.apply(chosen).await;
        gone.len()
    }

    /// Logs each malformed annotation value once, with an Event on its Namespace.
    async fn report_malformed(&mut self, snap: &Snapshot) {
        for (ns, annotation, value) in self.reported.fresh(&snap.namespaces) {
            tracing::warn!(
                namespace = %ns, annotation, value,
                "malformed PodGC policy annotation; that rule is suspended in this namespace until it is fixed"
            );
            let note = format!(
                "{annotation}: {value:?} is not valid; this rule is off in the namespace until it is fixed (TTL: a duration such as 30m or 24h; threshold: a whole number)"
            );
            if let Err(e) = self.events.publish(&invalid_policy(&ns, note)).await {
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
                        tracing::info!(node = KObj::cluster(&node).field(), "node confirmed deleted after quarantine");
                        Some(node)
                    }
                    Err(e) => {
                        tracing::warn!(node = KObj::cluster(&node).field(), error = %e, "checking quarantined node failed; not treating it as deleted");
                        None
                    }
                    Ok(_) => {
                        tracing::info!(node = KObj::cluster(&node).field(), "quarantined node still exists; its pods are kept");
                        None
                    }
                }
            })
            .buffer_unordered(self.applier.concurrency().max(1))
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
        tracing::info!(
            chosen = %Chosen(self),
            outcomes = %self.passes.iter().sum::<Tally>(),
            nodes_gone = self.nodes_gone,
            quarantined,
            seconds,
            "podgc cycle"
        );
    }
}

/// The pods each pass chose, by the pass's name: `terminated=2 out-of-service=0 ...`.
struct Chosen<'a>(&'a Summary);

impl fmt::Display for Chosen<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in Sweep::EVERY.into_iter().enumerate() {
            let sep = if i == 0 { "" } else { " " };
            write!(
                f,
                "{sep}{}={}",
                p.name(),
                self.0.passes[p as usize].chosen()
            )?;
        }
        Ok(())
    }
}
