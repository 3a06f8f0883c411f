//! The placement's Prometheus metrics: what each evaluation of a gated pod did, and how many
//! pods wait behind the gate.

use groundskeeper_plumbing::metrics::registered;
use prometheus::{IntCounterVec, IntGauge, Opts, Registry};

#[derive(Clone)]
pub struct Metrics {
    /// `result`: placed, anywhere, held, dry_run, conflict, error.
    pub placements: IntCounterVec,
    pub gated: IntGauge,
    /// The creation time of the oldest pod carrying the gate; 0 when none.
    pub oldest_gated: IntGauge,
}

impl Metrics {
    pub fn register(registry: &Registry) -> anyhow::Result<Self> {
        Ok(Self {
            placements: registered(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "groundskeeper_sysctl_placements_total",
                        "Evaluations of a pod carrying the sysctl scheduling gate, by result: placed (required \
                         node affinity narrowed to the nodes that admit it, gate removed), anywhere (every node \
                         admits it: gate removed, spec unchanged), held (no node admits it: it stays gated), \
                         dry_run (would have placed), conflict (the pod changed meanwhile: judged again), error.",
                    ),
                    &["result"],
                ),
            )?,
            gated: registered(
                registry,
                IntGauge::new(
                    "groundskeeper_sysctl_gated_pods",
                    "Pods not yet bound that carry the sysctl scheduling gate, as this replica's cache sees them.",
                ),
            )?,
            oldest_gated: registered(
                registry,
                IntGauge::new(
                    "groundskeeper_sysctl_gated_oldest_timestamp_seconds",
                    "The creation time (Unix seconds) of the oldest pod not yet bound that carries the sysctl \
                     scheduling gate, as this replica's cache sees it; 0 when none does.",
                ),
            )?,
        })
    }
}
