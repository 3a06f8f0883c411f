//! The controller's metrics (upstream exports none of its own; ours carry the project prefix).

use groundskeeper_plumbing::metrics::registered;
use prometheus::{
    HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
};

#[derive(Clone)]
pub struct Metrics {
    /// `result`: `success` or `error`.
    pub reconciles: IntCounterVec,
    /// `error`: [`SyncError::metric_label`](super::worker::SyncError::metric_label).
    pub sync_errors: IntCounterVec,
    pub reconcile_duration: HistogramVec,
    pub blocked_deletions: IntGauge,
    pub dropped_keys: IntCounter,
    /// `kind`: `status_apply` or `finalizer`.
    pub foreign_writes: IntCounterVec,
    pub conflicting_controller: IntGauge,
}

impl Metrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        Ok(Self {
            reconciles: registered(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "groundskeeper_servicecidr_reconciles_total",
                        "ServiceCIDR syncs by result (success or error).",
                    ),
                    &["result"],
                ),
            )?,
            sync_errors: registered(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "groundskeeper_servicecidr_sync_errors_total",
                        "Failed ServiceCIDR syncs by what the apiserver answered: forbidden, not_found, \
                         conflict, too_many_requests, server_error, transport (no answer), other.",
                    ),
                    &["error"],
                ),
            )?,
            reconcile_duration: registered(
                registry,
                HistogramVec::new(
                    HistogramOpts::new(
                        "groundskeeper_servicecidr_reconcile_duration_seconds",
                        "Time one ServiceCIDR sync took, API calls included, by result.",
                    )
                    .buckets(
                        prometheus::exponential_buckets(0.0005, 2.0, 15).expect("valid buckets"),
                    ),
                    &["result"],
                ),
            )?,
            blocked_deletions: registered(
                registry,
                IntGauge::new(
                    "groundskeeper_servicecidr_blocked_deletions",
                    "ServiceCIDRs being deleted that wait because IPAddresses only they contain still exist.",
                ),
            )?,
            dropped_keys: registered(
                registry,
                IntCounter::new(
                    "groundskeeper_servicecidr_dropped_keys_total",
                    "ServiceCIDRs given up on after 15 failed retries (re-synced on their next change).",
                ),
            )?,
            foreign_writes: registered(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "groundskeeper_servicecidr_foreign_writes_total",
                        "Writes to ServiceCIDRs by another ServiceCIDR controller (kube-controller-manager's), by kind.",
                    ),
                    &["kind"],
                ),
            )?,
            conflicting_controller: registered(
                registry,
                IntGauge::new(
                    "groundskeeper_servicecidr_conflicting_controller_detected",
                    "1 once another ServiceCIDR controller was seen writing since start: disable one of them.",
                ),
            )?,
        })
    }
}
